//! The tokenizer shared by the index builder, the query parser and the forward index.
//!
//! Rules (DESIGN §5 "Tokens, phrases, hits"):
//! - Text is split on Unicode word boundaries (UAX #29, through `unicode-segmentation`'s
//!   `split_word_bounds`). A segment is a *token* when its first character is alphabetic or
//!   numeric; everything else (spaces, punctuation, symbols, emoji) is a separator.
//!   UAX #29 keeps some punctuation inside words: `don't`, `3.14`, `1,000`, `e.g`, `foo_bar`
//!   and `a:b` are each one token.
//! - Tokens are lower-cased with Unicode's full lower-case mapping (`str::to_lowercase` per
//!   character; ASCII takes a fast path).
//! - A *phrase* is a run of tokens between phrase breaks: a separator segment that contains
//!   `.` `!` `?` `;` `:` or a line break (`\n`, `\r`) ends the current phrase. Empty phrases are
//!   never produced (several breaks in a row count as one).
//! - A token's *position* is its offset within its stream: the first token is 0, and positions
//!   run on across phrases (phrase breaks do not consume a position). The stream's length is
//!   the number of tokens.
//! - Tokens are not truncated or dropped, whatever their length.

use unicode_segmentation::UnicodeSegmentation;

/// Where a token sits in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPos {
    /// Offset of the token within its stream (0-based, counting tokens).
    pub position: u32,
    /// Index of the phrase holding the token (0-based).
    pub phrase: u32,
}

/// A reusable tokenizer: holds the lower-casing buffer so that tokenizing allocates nothing
/// per token.
#[derive(Debug, Default)]
pub struct Tokenizer {
    lower: String,
}

impl Tokenizer {
    /// A tokenizer with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `emit(token, pos)` for every token of `text` in order, with the lower-cased token.
    /// Returns the number of tokens (the stream's length).
    pub fn for_each_token(&mut self, text: &str, mut emit: impl FnMut(&str, TokenPos)) -> u32 {
        let mut position = 0u32;
        let mut phrase = 0u32;
        let mut phrase_open = false;
        for segment in text.split_word_bounds() {
            let first = segment.chars().next().unwrap_or(' ');
            if first.is_alphanumeric() {
                lowercase_into(segment, &mut self.lower);
                emit(&self.lower, TokenPos { position, phrase });
                position += 1;
                phrase_open = true;
            } else if phrase_open && segment.chars().any(is_phrase_break) {
                phrase += 1;
                phrase_open = false;
            }
        }
        position
    }

    /// The lower-cased tokens of `text`, in order (convenience for queries and tests).
    pub fn tokens(&mut self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.for_each_token(text, |t, _| out.push(t.to_string()));
        out
    }
}

/// Whether `c` ends a phrase.
pub fn is_phrase_break(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | ';' | ':' | '\n' | '\r')
}

fn lowercase_into(word: &str, out: &mut String) {
    out.clear();
    if word.is_ascii() {
        out.push_str(word);
        out.make_ascii_lowercase();
    } else {
        for c in word.chars() {
            out.extend(c.to_lowercase());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(text: &str) -> Vec<(String, u32, u32)> {
        let mut out = Vec::new();
        Tokenizer::new()
            .for_each_token(text, |t, p| out.push((t.to_string(), p.position, p.phrase)));
        out
    }

    #[test]
    fn lowercases_and_numbers_positions_across_phrases() {
        let got = tok("Hello World. Foo bar!\nBaz");
        let want = vec![
            ("hello".to_string(), 0, 0),
            ("world".to_string(), 1, 0),
            ("foo".to_string(), 2, 1),
            ("bar".to_string(), 3, 1),
            ("baz".to_string(), 4, 2),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn repeated_and_leading_breaks_make_no_empty_phrase() {
        let got = tok("...; a ?! \n\n b");
        assert_eq!(got, vec![("a".into(), 0, 0), ("b".into(), 1, 1)]);
    }

    #[test]
    fn uax29_keeps_inner_punctuation_and_unicode_lowercases() {
        let got: Vec<String> = Tokenizer::new().tokens("Don't pay 3.14 or 1,000 ÉCOLE Straße");
        assert_eq!(
            got,
            vec!["don't", "pay", "3.14", "or", "1,000", "école", "straße"]
        );
    }

    #[test]
    fn separators_and_emoji_are_not_tokens() {
        assert_eq!(Tokenizer::new().tokens("  -- 🙂 , "), Vec::<String>::new());
        assert_eq!(Tokenizer::new().for_each_token("", |_, _| {}), 0);
    }

    #[test]
    fn long_tokens_are_kept_whole() {
        let long = "x".repeat(10_000);
        assert_eq!(Tokenizer::new().tokens(&long), vec![long]);
    }
}
