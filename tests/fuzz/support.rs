//! What every fuzz target shares: the counting allocator that measures a decode's peak heap,
//! the case count and seed (plain `cargo test`, or a long run from the environment), and the
//! structure-aware mutations (edits of a parsed JSON tree, then of the serialized bytes).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::Value;

/// The system allocator, counting the bytes live and their peak.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// An allocation that would take the live heap past this is refused (the process aborts with
/// "memory allocation of N bytes failed"): a decoder sizing something by a forged count fails
/// the run at once instead of swapping the machine.
const REFUSED_ABOVE: usize = 2 << 30;

fn grow(bytes: usize) -> bool {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
    if live > REFUSED_ABOVE {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
        return false;
    }
    true
}

fn shrink(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !grow(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc(layout);
        if p.is_null() {
            shrink(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !grow(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            shrink(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !grow(new_size - old) {
            return std::ptr::null_mut();
        }
        let p = System.realloc(ptr, layout, new_size);
        match (p.is_null(), new_size > old) {
            (true, true) => shrink(new_size - old),
            (false, false) => shrink(old - new_size),
            _ => {}
        }
        p
    }
}

/// Held by every target for its whole run, so that one decode at a time is measured (the
/// counters are process-wide: a decode's rayon helpers count too).
static MEASURING: Mutex<()> = Mutex::new(());

/// Holds [`MEASURING`] for a test that measures outside [`run`].
pub fn measuring() -> std::sync::MutexGuard<'static, ()> {
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` and returns its result and the most heap it had live at once beyond what was live
/// when it started. The caller holds [`MEASURING`] (through [`run`]).
pub fn peak_of<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let result = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    (result, peak)
}

/// The heap a decode of `input` bytes may take at its peak: `per_byte` bytes per input byte
/// plus `constant`.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub per_byte: usize,
    pub constant: usize,
}

impl Bound {
    pub fn check(self, what: &str, input: usize, peak: usize) -> Result<(), TestCaseError> {
        let limit = self.per_byte * input + self.constant;
        if peak > limit {
            return Err(TestCaseError::fail(format!(
                "{what}: {peak} bytes of heap at the peak for {input} input bytes, over the bound \
                 {} × {input} + {} = {limit}",
                self.per_byte, self.constant
            )));
        }
        Ok(())
    }
}

/// What a target saw, printed at its end (`cargo test -- --nocapture` shows it).
#[derive(Debug, Default)]
pub struct Tally {
    pub accepted: usize,
    pub refused: usize,
    /// The largest peak heap seen and its input's size.
    pub largest: (usize, usize),
    /// The largest peak per input byte among inputs of 4 KiB or more (where the bound's
    /// constant no longer dominates), with that case's peak and input size.
    pub worst_per_byte: (f64, usize, usize),
}

impl Tally {
    pub fn count(&mut self, ok: bool, input: usize, peak: usize) {
        match ok {
            true => self.accepted += 1,
            false => self.refused += 1,
        }
        if peak > self.largest.0 {
            self.largest = (peak, input);
        }
        let ratio = peak as f64 / input as f64;
        if input >= 4096 && ratio > self.worst_per_byte.0 {
            self.worst_per_byte = (ratio, peak, input);
        }
    }
}

/// Cases per target: `default` in plain `cargo test`, `RANKSERVE_FUZZ_CASES` when set (the
/// long mode: e.g. 200000, one process per seed).
pub fn cases(default: u32) -> u32 {
    std::env::var("RANKSERVE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run's seed: `RANKSERVE_FUZZ_SEED` (a u64), else 0, so that plain `cargo test` runs the
/// same cases every time.
pub fn seed() -> u64 {
    std::env::var("RANKSERVE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs `test` on `cases` values of `strategy` (seeded by [`seed`] and the target's name),
/// one at a time under [`MEASURING`], and panics with the smallest failing value found.
pub fn run<S: Strategy>(
    target: &str,
    default_cases: u32,
    strategy: S,
    mut test: impl FnMut(S::Value, &mut Tally) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let _one_at_a_time = measuring();
    let cases = cases(default_cases);
    let seed = seed();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    for (k, b) in key[8..].iter_mut().zip(target.bytes()) {
        *k = b;
    }
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    // `run` takes an `Fn`; a case that panics releases the borrow as it unwinds.
    let tally = std::cell::RefCell::new(Tally::default());
    let test = std::cell::RefCell::new(&mut test);
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |value| {
        (test.borrow_mut())(value, &mut tally.borrow_mut())
    });
    let tally = tally.into_inner();
    let (ratio, peak, input) = tally.worst_per_byte;
    eprintln!(
        "fuzz {target}: seed {seed}, {cases} cases in {:.1} s ({} accepted, {} refused, counting \
         shrinking); the largest peak heap {} bytes (input {} bytes); per input byte at most \
         {ratio:.1} ({peak} bytes for {input}) over inputs of 4 KiB or more",
        started.elapsed().as_secs_f64(),
        tally.accepted,
        tally.refused,
        tally.largest.0,
        tally.largest.1,
    );
    if let Err(err) = result {
        let text = format!("{err}");
        let cut: String = text.chars().take(4000).collect();
        panic!("fuzz {target} (RANKSERVE_FUZZ_SEED={seed}) failed: {cut}");
    }
}

/// A value that replaces a node of a JSON tree: the wrong type, an extreme number, a long
/// string, an empty or long container.
#[derive(Debug, Clone)]
pub enum Replacement {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    /// A string of this many characters.
    LongStr(usize),
    /// An array of this many zeros.
    Zeros(usize),
    /// An array of this many empty objects (each a document or list entry of one or two bytes).
    EmptyObjects(usize),
    EmptyArray,
    EmptyObject,
}

impl Replacement {
    fn value(&self) -> Value {
        match self {
            Replacement::Null => Value::Null,
            Replacement::Bool(b) => Value::Bool(*b),
            Replacement::Int(i) => Value::from(*i),
            Replacement::Uint(u) => Value::from(*u),
            Replacement::Float(f) => Value::from(*f),
            Replacement::Str(s) => Value::from(s.clone()),
            Replacement::LongStr(n) => Value::from("é".repeat(*n)),
            Replacement::Zeros(n) => Value::Array(vec![Value::from(0); *n]),
            Replacement::EmptyObjects(n) => {
                Value::Array(vec![Value::Object(Default::default()); *n])
            }
            Replacement::EmptyArray => Value::Array(Vec::new()),
            Replacement::EmptyObject => Value::Object(Default::default()),
        }
    }
}

fn replacement() -> impl Strategy<Value = Replacement> {
    prop_oneof![
        Just(Replacement::Null),
        any::<bool>().prop_map(Replacement::Bool),
        prop::sample::select(vec![
            0i64,
            -1,
            1,
            i64::MIN,
            i64::MAX,
            i32::MAX as i64 + 1,
            -(1 << 40)
        ])
        .prop_map(Replacement::Int),
        prop::sample::select(vec![u64::MAX, 1 << 32, 1 << 40, u32::MAX as u64])
            .prop_map(Replacement::Uint),
        prop::sample::select(vec![
            1e308,
            -1e308,
            5e-324,
            -0.0,
            0.5,
            3.4e38,
            1e39,
            4294967296.5
        ])
        .prop_map(Replacement::Float),
        "[a-z_.\"()+*/ -]{0,12}".prop_map(Replacement::Str),
        (100usize..20_000).prop_map(Replacement::LongStr),
        (1usize..5_000).prop_map(Replacement::Zeros),
        (1usize..20_000).prop_map(Replacement::EmptyObjects),
        Just(Replacement::EmptyArray),
        Just(Replacement::EmptyObject),
    ]
}

/// One edit of a parsed JSON tree; the `Index` picks a node in pre-order.
#[derive(Debug, Clone)]
pub enum TreeEdit {
    Replace(Index, Replacement),
    Remove(Index),
    /// Copies the node beside itself (an array grows by one; an object gets the copy under a
    /// fresh key, an unknown field).
    Duplicate(Index),
    /// Wraps the node in this many arrays (`true`) or single-key objects.
    Nest(Index, usize, bool),
    /// Moves a copy of the second node over the first.
    Graft(Index, Index),
}

pub fn tree_edit() -> impl Strategy<Value = TreeEdit> {
    prop_oneof![
        4 => (any::<Index>(), replacement()).prop_map(|(i, r)| TreeEdit::Replace(i, r)),
        2 => any::<Index>().prop_map(TreeEdit::Remove),
        2 => any::<Index>().prop_map(TreeEdit::Duplicate),
        1 => (any::<Index>(), prop_oneof![1usize..8, 100usize..3000], any::<bool>())
            .prop_map(|(i, d, a)| TreeEdit::Nest(i, d, a)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| TreeEdit::Graft(a, b)),
    ]
}

/// The paths (array positions and object keys) of every node, in pre-order.
fn paths(value: &Value) -> Vec<Vec<PathStep>> {
    fn walk(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
        out.push(at.clone());
        match v {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    at.push(PathStep::At(i));
                    walk(item, at, out);
                    at.pop();
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    at.push(PathStep::Key(k.clone()));
                    walk(item, at, out);
                    at.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

#[derive(Debug, Clone)]
enum PathStep {
    At(usize),
    Key(String),
}

fn node_mut<'a>(root: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    path.iter().fold(root, |v, step| match (v, step) {
        (Value::Array(items), PathStep::At(i)) => &mut items[*i],
        (Value::Object(map), PathStep::Key(k)) => map.get_mut(k).expect("path from paths()"),
        _ => unreachable!("path from paths()"),
    })
}

/// `value` with `edits` applied in order.
pub fn edit_tree(mut value: Value, edits: &[TreeEdit]) -> Value {
    for edit in edits {
        let all = paths(&value);
        let pick = |i: &Index| all[i.index(all.len())].clone();
        match edit {
            TreeEdit::Replace(i, r) => *node_mut(&mut value, &pick(i)) = r.value(),
            TreeEdit::Remove(i) | TreeEdit::Duplicate(i) => {
                let path = pick(i);
                let Some((last, parent)) = path.split_last() else {
                    continue;
                };
                let copy = node_mut(&mut value, &path).clone();
                let remove = matches!(edit, TreeEdit::Remove(_));
                match (node_mut(&mut value, parent), last) {
                    (Value::Array(items), PathStep::At(j)) if remove => {
                        items.remove(*j);
                    }
                    (Value::Array(items), PathStep::At(j)) => items.insert(*j, copy),
                    (Value::Object(map), PathStep::Key(k)) if remove => {
                        map.remove(k);
                    }
                    (Value::Object(map), PathStep::Key(k)) => {
                        map.insert(format!("{k}_"), copy);
                    }
                    _ => unreachable!("path from paths()"),
                }
            }
            TreeEdit::Nest(i, depth, array) => {
                let node = node_mut(&mut value, &pick(i));
                let mut wrapped = node.take();
                for _ in 0..*depth {
                    wrapped = match array {
                        true => Value::Array(vec![wrapped]),
                        false => Value::Object([("a".to_string(), wrapped)].into_iter().collect()),
                    };
                }
                *node = wrapped;
            }
            TreeEdit::Graft(to, from) => {
                let copy = node_mut(&mut value, &pick(from)).clone();
                *node_mut(&mut value, &pick(to)) = copy;
            }
        }
    }
    value
}

/// One edit of serialized bytes.
#[derive(Debug, Clone)]
pub enum ByteEdit {
    Truncate(Index),
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    /// Overwrites bytes from the position on.
    Overwrite(Index, Vec<u8>),
    Remove(Index, usize),
}

/// Byte edits; `splices` are byte strings worth inserting or writing over (forged lengths,
/// markers, extreme numbers, deep nesting) in the format at hand.
pub fn byte_edit(splices: Vec<Vec<u8>>) -> impl Strategy<Value = ByteEdit> {
    let splice = prop::sample::select(splices);
    prop_oneof![
        1 => any::<Index>().prop_map(ByteEdit::Truncate),
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, m)| ByteEdit::Flip(i, m)),
        2 => (any::<Index>(), splice.clone()).prop_map(|(i, s)| ByteEdit::Insert(i, s)),
        2 => (any::<Index>(), splice).prop_map(|(i, s)| ByteEdit::Overwrite(i, s)),
        1 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| ByteEdit::Remove(i, n)),
    ]
}

/// `bytes` with `edits` applied in order.
pub fn edit_bytes(mut bytes: Vec<u8>, edits: &[ByteEdit]) -> Vec<u8> {
    for edit in edits {
        let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len) };
        match edit {
            ByteEdit::Truncate(i) => {
                let n = at(i, bytes.len());
                bytes.truncate(n);
            }
            ByteEdit::Flip(i, mask) => {
                if !bytes.is_empty() {
                    let n = at(i, bytes.len());
                    bytes[n] ^= mask;
                }
            }
            ByteEdit::Insert(i, s) => {
                let n = at(i, bytes.len() + 1);
                bytes.splice(n..n, s.iter().copied());
            }
            ByteEdit::Overwrite(i, s) => {
                let n = at(i, bytes.len() + 1);
                let end = (n + s.len()).min(bytes.len());
                bytes.splice(n..end, s.iter().copied());
            }
            ByteEdit::Remove(i, len) => {
                let n = at(i, bytes.len() + 1);
                let end = (n + len).min(bytes.len());
                bytes.drain(n..end);
            }
        }
    }
    bytes
}

/// Byte strings worth splicing into JSON text.
pub fn json_splices() -> Vec<Vec<u8>> {
    let mut s: Vec<Vec<u8>> = [
        "1e400",
        "-1e400",
        "18446744073709551616",
        "-9223372036854775809",
        "0.0000001e-400",
        "\"",
        "\\",
        "\\u0000",
        "\\ud800",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "null",
        "true",
        "\"\":",
        "NaN",
        "-",
        "1.",
        "\u{feff}",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect();
    s.push(b"[".repeat(5000));
    s.push(b"{\"a\":".repeat(5000));
    s.push(vec![0xff, 0xfe]);
    s
}

/// Byte strings worth splicing into MessagePack: forged lengths of every container and string
/// form, reserved and ext markers, NaN and extreme numbers, deep nesting.
pub fn msgpack_splices() -> Vec<Vec<u8>> {
    let mut s = vec![
        vec![0xdd, 0xff, 0xff, 0xff, 0xff],
        vec![0xdf, 0xff, 0xff, 0xff, 0xff],
        vec![0xdc, 0xff, 0xff],
        vec![0xde, 0xff, 0xff],
        vec![0xdb, 0xff, 0xff, 0xff, 0xff],
        vec![0xc6, 0xff, 0xff, 0xff, 0xff],
        vec![0xc4, 0xff],
        vec![0xd9, 0xff],
        vec![0xc1],
        vec![0xd4, 0x01, 0x00],
        vec![0xc7, 0xff, 0x01],
        vec![0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],
        vec![0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0],
        vec![0xca, 0x7f, 0x80, 0, 0],
        vec![0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0xa1, 0xff],
        vec![0xc0],
        vec![0x80],
        vec![0x90],
    ];
    s.push([0x91].repeat(5000));
    s.push([0x81, 0xa1, b'a'].repeat(3000));
    s
}

/// The decode's input, made from a seed value: tree edits, then serialization, then byte edits.
#[derive(Debug, Clone)]
pub struct Mutated {
    pub seed: usize,
    pub tree: Vec<TreeEdit>,
    pub bytes: Vec<ByteEdit>,
}

/// Mostly-valid inputs: a third untouched at the byte level, most with one or two edits.
pub fn mutated(seeds: usize, splices: Vec<Vec<u8>>) -> impl Strategy<Value = Mutated> {
    (
        0..seeds,
        prop::collection::vec(tree_edit(), 0..4),
        prop_oneof![
            1 => Just(Vec::new()),
            2 => prop::collection::vec(byte_edit(splices), 1..4),
        ],
    )
        .prop_map(|(seed, tree, bytes)| Mutated { seed, tree, bytes })
}

/// Serializes a (mutated) JSON tree as JSON or MessagePack (maps with named keys, as clients
/// write them).
pub fn serialize(value: &Value, msgpack: bool) -> Vec<u8> {
    match msgpack {
        true => rmp_serde::to_vec_named(value).expect("a JSON tree serializes"),
        false => serde_json::to_vec(value).expect("a JSON tree serializes"),
    }
}

impl Mutated {
    /// The input bytes: `seeds[self.seed]` edited.
    pub fn apply(&self, seeds: &[Value], msgpack: bool) -> Vec<u8> {
        let value = edit_tree(seeds[self.seed].clone(), &self.tree);
        edit_bytes(serialize(&value, msgpack), &self.bytes)
    }
}
