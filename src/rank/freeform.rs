//! FreeForm expressions: a small arithmetic language over named features, parsed once when a
//! ranker loads (never `eval`ed as text) and evaluated in f32 like the other transforms.
//!
//! Grammar (whitespace is ignored between tokens):
//! ```text
//! expr    := term (('+' | '-') term)*
//! term    := unary (('*' | '/') unary)*
//! unary   := '-' unary | primary
//! primary := NUMBER | FEATURE | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
//! NUMBER  := digits ['.' digits] [('e'|'E') ['+'|'-'] digits]   (or '.' digits ...)
//! FEATURE := [A-Za-z_][A-Za-z0-9_.]*  |  '"' any characters but '"' '"'
//! FUNC    := ln | exp | min | max       (ln, exp: one argument; min, max: two)
//! ```
//! An identifier followed by `(` is a function call; any other identifier names a feature of the
//! ranker's feature map (so a feature may be called `ln`). Names with other characters (`-`,
//! spaces) are written in double quotes. Errors give the 1-based character column. An
//! expression nests at most [`MAX_NESTING`] levels.

use crate::rank::model::{BinaryOp, Expr, FeatureIdx, Func};

/// How many levels an expression may nest: each parenthesis, function call, unary minus and
/// binary operator is a level over its operands (so `a + b + c` nests 2). Parsing refuses
/// deeper expressions before recursing further, and evaluating, checking, compiling and
/// dropping the tree recurse once per level, so this bounds every one of them to a few
/// kilobytes of stack; real expressions nest a handful of levels.
pub const MAX_NESTING: usize = 128;

/// Why a FreeForm expression does not parse; `column` is 1-based, in characters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FreeFormError {
    #[error("column {column}: unexpected character {found:?}")]
    UnexpectedChar { column: usize, found: char },
    #[error("column {column}: expected {expected}, got {found}")]
    UnexpectedToken {
        column: usize,
        expected: &'static str,
        found: String,
    },
    #[error("column {column}: unknown feature {name:?} (not in the ranker's `features`)")]
    UnknownFeature { column: usize, name: String },
    #[error("column {column}: unknown function {name:?} (expected ln, exp, min or max)")]
    UnknownFunction { column: usize, name: String },
    #[error("column {column}: {name} takes {expected} argument(s), got {got}")]
    WrongArity {
        column: usize,
        name: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("column {column}: number {text:?} is not a finite f32")]
    BadNumber { column: usize, text: String },
    #[error("column {column}: unterminated quoted feature name")]
    UnterminatedQuote { column: usize },
    #[error(
        "column {column}: the expression nests more than {MAX_NESTING} levels deep (each \
         parenthesis, function call, unary minus and binary operator is a level)"
    )]
    TooDeep { column: usize },
}

/// Parses `src` into an expression whose features are indices into `features`.
///
/// # Errors
/// A [`FreeFormError`] naming the column of the first problem.
pub fn parse(src: &str, features: &[String]) -> Result<Expr, FreeFormError> {
    let tokens = tokenize(src)?;
    let mut parser = Parser {
        tokens,
        pos: 0,
        features,
        open: 0,
    };
    let parsed = parser.expr()?;
    match parser.peek() {
        (Tok::End, _) => Ok(parsed.expr),
        (tok, column) => Err(FreeFormError::UnexpectedToken {
            column,
            expected: "an operator or the end",
            found: tok.describe(),
        }),
    }
}

/// Evaluates `expr` in f32 on one document's feature values (`f32(x)` for each feature, a
/// missing value, NaN, reading as 0 as in the other transforms).
pub fn eval(expr: &Expr, doc_features: &[f64]) -> f32 {
    match expr {
        Expr::Const(c) => *c,
        Expr::Feature(idx) => {
            let x = doc_features[*idx as usize];
            if x.is_nan() {
                0.0
            } else {
                x as f32
            }
        }
        Expr::Neg(e) => -eval(e, doc_features),
        Expr::Binary(op, a, b) => {
            let (a, b) = (eval(a, doc_features), eval(b, doc_features));
            match op {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div => a / b,
            }
        }
        Expr::Call(func, args) => match func {
            Func::Ln => eval(&args[0], doc_features).ln(),
            Func::Exp => eval(&args[0], doc_features).exp(),
            Func::Min => eval(&args[0], doc_features).min(eval(&args[1], doc_features)),
            Func::Max => eval(&args[0], doc_features).max(eval(&args[1], doc_features)),
        },
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f32),
    Ident(String),
    Quoted(String),
    Op(char),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Num(n) => format!("number {n}"),
            Tok::Ident(s) => format!("name {s:?}"),
            Tok::Quoted(s) => format!("feature \"{s}\""),
            Tok::Op(c) => format!("{c:?}"),
            Tok::End => "the end of the expression".to_string(),
        }
    }
}

fn tokenize(src: &str) -> Result<Vec<(Tok, usize)>, FreeFormError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text: String = chars[start..i].iter().collect();
            match text.parse::<f32>() {
                Ok(v) if v.is_finite() => out.push((Tok::Num(v), column)),
                _ => return Err(FreeFormError::BadNumber { column, text }),
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), column));
        } else if c == '"' {
            let start = i + 1;
            i = start;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            if i == chars.len() {
                return Err(FreeFormError::UnterminatedQuote { column });
            }
            out.push((Tok::Quoted(chars[start..i].iter().collect()), column));
            i += 1;
        } else if "+-*/(),".contains(c) {
            out.push((Tok::Op(c), column));
            i += 1;
        } else {
            return Err(FreeFormError::UnexpectedChar { column, found: c });
        }
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<(Tok, usize)>,
    pos: usize,
    features: &'a [String],
    /// Parentheses, calls and unary minuses open around the current token: the parser
    /// recurses once per such level, so this is checked before it recurses (a chain of
    /// binary operators is a loop, checked as its nodes are built, see [`nest`]).
    open: usize,
}

/// A parsed subexpression and the levels it nests (0 for a number or a feature).
struct Nested {
    expr: Expr,
    levels: usize,
}

/// `expr` one level over operands nesting `levels`; refused past [`MAX_NESTING`] at `column`.
fn nest(expr: Expr, levels: usize, column: usize) -> Result<Nested, FreeFormError> {
    if levels >= MAX_NESTING {
        return Err(FreeFormError::TooDeep { column });
    }
    Ok(Nested {
        expr,
        levels: levels + 1,
    })
}

fn leaf(expr: Expr) -> Nested {
    Nested { expr, levels: 0 }
}

impl Parser<'_> {
    fn peek(&self) -> (Tok, usize) {
        self.tokens[self.pos].clone()
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.peek();
        if t.0 != Tok::End {
            self.pos += 1;
        }
        t
    }

    /// Opens a level at `column` before recursing into it; [`Parser::close`] ends it.
    fn open(&mut self, column: usize) -> Result<(), FreeFormError> {
        if self.open >= MAX_NESTING {
            return Err(FreeFormError::TooDeep { column });
        }
        self.open += 1;
        Ok(())
    }

    fn close(&mut self) {
        self.open -= 1;
    }

    fn eat(&mut self, op: char) -> bool {
        if self.tokens[self.pos].0 == Tok::Op(op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<Nested, FreeFormError> {
        let mut lhs = self.term()?;
        loop {
            let column = self.tokens[self.pos].1;
            let op = if self.eat('+') {
                BinaryOp::Add
            } else if self.eat('-') {
                BinaryOp::Sub
            } else {
                return Ok(lhs);
            };
            let rhs = self.term()?;
            lhs = binary(op, lhs, rhs, column)?;
        }
    }

    fn term(&mut self) -> Result<Nested, FreeFormError> {
        let mut lhs = self.unary()?;
        loop {
            let column = self.tokens[self.pos].1;
            let op = if self.eat('*') {
                BinaryOp::Mul
            } else if self.eat('/') {
                BinaryOp::Div
            } else {
                return Ok(lhs);
            };
            let rhs = self.unary()?;
            lhs = binary(op, lhs, rhs, column)?;
        }
    }

    fn unary(&mut self) -> Result<Nested, FreeFormError> {
        let column = self.tokens[self.pos].1;
        if self.eat('-') {
            self.open(column)?;
            let operand = self.unary()?;
            self.close();
            nest(Expr::Neg(Box::new(operand.expr)), operand.levels, column)
        } else {
            self.primary()
        }
    }

    fn primary(&mut self) -> Result<Nested, FreeFormError> {
        match self.bump() {
            (Tok::Num(v), _) => Ok(leaf(Expr::Const(v))),
            (Tok::Op('('), column) => {
                self.open(column)?;
                let inner = self.expr()?;
                self.expect(')', "')'")?;
                self.close();
                nest(inner.expr, inner.levels, column)
            }
            (Tok::Ident(name), column) if self.tokens[self.pos].0 == Tok::Op('(') => {
                self.pos += 1;
                self.call(&name, column)
            }
            (Tok::Ident(name) | Tok::Quoted(name), column) => self.feature(name, column).map(leaf),
            (tok, column) => Err(FreeFormError::UnexpectedToken {
                column,
                expected: "a number, a feature, a function or '('",
                found: tok.describe(),
            }),
        }
    }

    fn expect(&mut self, op: char, expected: &'static str) -> Result<(), FreeFormError> {
        match self.bump() {
            (Tok::Op(c), _) if c == op => Ok(()),
            (tok, column) => Err(FreeFormError::UnexpectedToken {
                column,
                expected,
                found: tok.describe(),
            }),
        }
    }

    fn feature(&self, name: String, column: usize) -> Result<Expr, FreeFormError> {
        match self.features.iter().position(|f| *f == name) {
            Some(idx) => Ok(Expr::Feature(idx as FeatureIdx)),
            None => Err(FreeFormError::UnknownFeature { column, name }),
        }
    }

    fn call(&mut self, name: &str, column: usize) -> Result<Nested, FreeFormError> {
        let (func, fname, arity) = match name {
            "ln" => (Func::Ln, "ln", 1),
            "exp" => (Func::Exp, "exp", 1),
            "min" => (Func::Min, "min", 2),
            "max" => (Func::Max, "max", 2),
            _ => {
                return Err(FreeFormError::UnknownFunction {
                    column,
                    name: name.to_string(),
                })
            }
        };
        self.open(column)?;
        let mut levels = 0;
        let mut args = Vec::with_capacity(arity);
        loop {
            let arg = self.expr()?;
            levels = levels.max(arg.levels);
            args.push(arg.expr);
            if !self.eat(',') {
                break;
            }
        }
        self.expect(')', "',' or ')'")?;
        self.close();
        if args.len() != arity {
            return Err(FreeFormError::WrongArity {
                column,
                name: fname,
                expected: arity,
                got: args.len(),
            });
        }
        nest(Expr::Call(func, args), levels, column)
    }
}

/// `lhs op rhs`, the operator at `column`.
fn binary(op: BinaryOp, lhs: Nested, rhs: Nested, column: usize) -> Result<Nested, FreeFormError> {
    nest(
        Expr::Binary(op, Box::new(lhs.expr), Box::new(rhs.expr)),
        lhs.levels.max(rhs.levels),
        column,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        ["body.bm25f", "title.len", "ln", "odd-name"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn value(src: &str, doc: &[f64]) -> f32 {
        eval(&parse(src, &names()).unwrap(), doc)
    }

    #[test]
    fn precedence_and_associativity() {
        let doc = [2.0, 3.0, 5.0, 7.0];
        assert_eq!(value("1 + 2 * 3", &doc), 7.0);
        assert_eq!(value("(1 + 2) * 3", &doc), 9.0);
        assert_eq!(value("8 - 2 - 1", &doc), 5.0);
        assert_eq!(value("8 / 2 / 2", &doc), 2.0);
        assert_eq!(value("-2 * -3", &doc), 6.0);
        assert_eq!(value("--2", &doc), 2.0);
        assert_eq!(value("2 - -1", &doc), 3.0);
    }

    #[test]
    fn features_functions_and_constants() {
        let doc = [2.0, 3.0, 5.0, 7.0];
        assert_eq!(value("body.bm25f * title.len", &doc), 6.0);
        assert_eq!(value("ln(body.bm25f - 1)", &doc), 0.0);
        assert_eq!(value("exp(0)", &doc), 1.0);
        assert_eq!(value("min(body.bm25f, title.len) + max(1, 0.5)", &doc), 3.0);
        assert_eq!(
            value("ln", &doc),
            5.0,
            "a feature may be called like a function"
        );
        assert_eq!(value("\"odd-name\" / 7", &doc), 1.0);
        assert_eq!(value("1.5e1 + .5 + 2E-1", &doc), 15.7);
        assert_eq!(
            value("ln(body.bm25f + 1) * max(title.len, 0.5)", &doc),
            (3f32).ln() * 3.0
        );
    }

    #[test]
    fn evaluates_in_f32_and_missing_reads_as_zero() {
        let doc = [0.1, f64::NAN, 0.0, 0.0];
        assert_eq!(value("body.bm25f", &doc), 0.1f32);
        assert_eq!(value("title.len + 1", &doc), 1.0);
        assert_eq!(value("1 / ln", &doc), f32::INFINITY);
    }

    /// `n` levels of `open` around `inner`, each closed by `close`.
    fn nested(open: &str, inner: &str, close: &str, n: usize) -> String {
        format!("{}{inner}{}", open.repeat(n), close.repeat(n))
    }

    /// Runs `f` on a thread with a small stack: a parser, evaluator or drop that recursed once
    /// per level of an over-deep expression would overflow it (aborting the test binary)
    /// instead of passing because the default stack happened to be large enough.
    fn on_small_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn nesting_up_to_the_limit_parses_and_evaluates() {
        on_small_stack(|| {
            let doc = [2.0, 3.0, 5.0, 7.0];
            let n = MAX_NESTING;
            assert_eq!(value(&nested("(", "body.bm25f", ")", n), &doc), 2.0);
            assert_eq!(value(&format!("{}3", "-".repeat(n)), &doc), 3.0);
            let ln_exp = (0..n / 2).fold(0.5f32, |v, _| v.exp().ln());
            assert_eq!(value(&nested("ln(exp(", "0.5", "))", n / 2), &doc), ln_exp);
            // ln of a negative is NaN after a few steps; its sign bit is the platform's (and
            // the optimiser's) choice, so NaN is compared as NaN.
            let ln_of_ln = (0..n).fold(7f32, |v, _| v.ln());
            let got = value(&nested("ln(", "\"odd-name\"", ")", n), &doc);
            assert!(got.to_bits() == ln_of_ln.to_bits() || (got.is_nan() && ln_of_ln.is_nan()));
            // A chain of binary operators nests one level per operator, as it evaluates.
            let sum = vec!["1"; n + 1].join(" + ");
            assert_eq!(value(&sum, &doc), (n + 1) as f32);
            assert_eq!(
                value(&nested("1 + (", "1", ")", n / 2), &doc),
                (n / 2 + 1) as f32
            );
        });
    }

    #[test]
    fn nesting_past_the_limit_is_refused() {
        on_small_stack(|| {
            let refused_at = |src: &str, column: usize| {
                assert_eq!(
                    parse(src, &names()).unwrap_err().to_string(),
                    format!(
                        "column {column}: the expression nests more than {MAX_NESTING} levels \
                         deep (each parenthesis, function call, unary minus and binary \
                         operator is a level)"
                    )
                );
            };
            let n = MAX_NESTING + 1;
            refused_at(&nested("(", "1", ")", n), n);
            refused_at(&nested("ln(", "1", ")", n), 3 * (n - 1) + 1);
            refused_at(&format!("{}1", "-".repeat(n)), n);
            // The operator that makes the chain too deep: "1 + " is 4 characters.
            refused_at(&vec!["1"; n + 1].join(" + "), 4 * n - 1);
            refused_at(&nested("1 + (", "1", ")", n / 2 + 1), 5);
            // As hostile files have them: far past the limit.
            refused_at(&nested("(", "1", ")", 3_000), n);
            refused_at(&nested("ln(", "1", ")", 3_000), 3 * (n - 1) + 1);
            refused_at(&format!("{}1", "-".repeat(10_000)), n);
            refused_at(&vec!["1"; 100_000].join(" + "), 4 * n - 1);
        });
    }

    #[test]
    fn rejects_unknown_feature_with_column() {
        assert_eq!(
            parse("1 + body.bm25", &names()),
            Err(FreeFormError::UnknownFeature {
                column: 5,
                name: "body.bm25".into()
            })
        );
    }

    #[test]
    fn rejects_unknown_function() {
        assert_eq!(
            parse("2 * sqrt(1)", &names()),
            Err(FreeFormError::UnknownFunction {
                column: 5,
                name: "sqrt".into()
            })
        );
    }

    #[test]
    fn rejects_wrong_arity() {
        assert_eq!(
            parse("min(1)", &names()),
            Err(FreeFormError::WrongArity {
                column: 1,
                name: "min",
                expected: 2,
                got: 1
            })
        );
        assert!(matches!(
            parse("ln(1, 2)", &names()),
            Err(FreeFormError::WrongArity { got: 2, .. })
        ));
    }

    #[test]
    fn rejects_bad_tokens_and_structure() {
        assert_eq!(
            parse("1 + $", &names()),
            Err(FreeFormError::UnexpectedChar {
                column: 5,
                found: '$'
            })
        );
        assert_eq!(
            parse("(1 + 2", &names()),
            Err(FreeFormError::UnexpectedToken {
                column: 7,
                expected: "')'",
                found: "the end of the expression".into()
            })
        );
        assert!(matches!(
            parse("1 2", &names()),
            Err(FreeFormError::UnexpectedToken { column: 3, .. })
        ));
        assert!(matches!(
            parse("", &names()),
            Err(FreeFormError::UnexpectedToken { column: 1, .. })
        ));
        assert!(matches!(
            parse("1 +", &names()),
            Err(FreeFormError::UnexpectedToken { column: 4, .. })
        ));
        assert_eq!(
            parse("\"abc", &names()),
            Err(FreeFormError::UnterminatedQuote { column: 1 })
        );
        assert_eq!(
            parse("1e39", &names()),
            Err(FreeFormError::BadNumber {
                column: 1,
                text: "1e39".into()
            })
        );
        assert!(matches!(
            parse("1.2.3", &names()),
            Err(FreeFormError::BadNumber { .. })
        ));
    }
}
