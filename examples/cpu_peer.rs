//! rankserve's side of `scripts/cpu_peers.py`: builds a `CpuPlan` (timed) and times
//! `score_batch` on batches of the given rows, for each tree evaluator and thread count asked
//! for; checks every evaluator's scores bit for bit against the block walk's (today's CPU
//! output) and, with `--expect`, against a peer's scores. One JSON object per line on stdout.
//!
//! `cargo run --release --example cpu_peer -- --ranker rankers/large.json --docs 1,100`
//! (without `--rows`, synthetic rows from `rank::synth`). `--random TREES,LEAVES` scores a
//! random ensemble instead (136 features; trees grown leaf-wise, as LightGBM does, by splitting a
//! random leaf at a value of a random row until they have LEAVES leaves; rows uniform in
//! [-3, 3] with 5 % missing): the evaluators' crossover by tree size and their scaling with trees.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankserve::rank::cpu::{CpuPlan, Isa, TreeEvaluator};
use rankserve::rank::format::validate;
use rankserve::rank::import::load_any;
use rankserve::rank::model::{Decision, Ensemble, Missing, Node, Ranker, Split, Tree};
use rankserve::rank::synth::synth_features;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// A ranker file (native or any imported format).
    #[arg(long, required_unless_present = "random")]
    ranker: Option<PathBuf>,
    /// A random ensemble of TREES trees of LEAVES leaves instead.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["ranker", "rows"])]
    random: Option<Vec<usize>>,
    /// Feature rows as little-endian f64, row-major (NaN: missing); repeated to fill a batch.
    #[arg(long)]
    rows: Option<PathBuf>,
    /// Scores of those rows by the peer (one per line), compared with ours.
    #[arg(long)]
    expect: Option<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000,10000")]
    docs: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// Evaluators: auto (what CpuPlan::new picks), walk, portable, avx2, avx512.
    #[arg(long, value_delimiter = ',', default_value = "auto,walk")]
    trees: Vec<String>,
    /// Timed repetitions per cell, after one warm-up.
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

fn evaluator(name: &str) -> anyhow::Result<TreeEvaluator> {
    let isa = match name {
        "auto" => return Ok(TreeEvaluator::detect()),
        "walk" => return Ok(TreeEvaluator::Walk),
        "portable" => Isa::Portable,
        "avx2" => Isa::Avx2,
        "avx512" => Isa::Avx512,
        _ => bail!("--trees {name}: expected auto, walk, portable, avx2 or avx512"),
    };
    if !Isa::available().contains(&isa) {
        bail!("--trees {name}: this CPU does not run it");
    }
    Ok(TreeEvaluator::Quick(isa))
}

/// A random ensemble and rows for it (see the module's doc).
fn random_ensemble(trees: usize, leaves: usize, n_docs: usize) -> (Ranker, Vec<f64>) {
    const FEATURES: usize = 136;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let rows: Vec<f64> = (0..n_docs.max(1000) * FEATURES)
        .map(|_| match rng.random_bool(0.05) {
            true => f64::NAN,
            false => rng.random_range(-3.0..3.0),
        })
        .collect();
    let trees = (0..trees)
        .map(|_| {
            let mut nodes = vec![Node::Leaf(0.0)];
            let mut open = vec![0u32];
            while open.len() < leaves.max(1) {
                let at = open.swap_remove(rng.random_range(0..open.len()));
                let feature = rng.random_range(0..FEATURES);
                let x = rows[rng.random_range(0..rows.len() / FEATURES) * FEATURES + feature];
                let left = nodes.len() as u32;
                nodes[at as usize] = Node::Split(Split {
                    feature: feature as u32,
                    decision: Decision::LeF64(if x.is_nan() { 0.0 } else { x }),
                    missing: Missing::Nan,
                    default_left: rng.random_bool(0.5),
                    left,
                    right: left + 1,
                });
                nodes.push(Node::Leaf(rng.random_range(-0.1..0.1)));
                nodes.push(Node::Leaf(rng.random_range(-0.1..0.1)));
                open.extend([left, left + 1]);
            }
            Tree { nodes }
        })
        .collect();
    let ranker = Ranker {
        features: (0..FEATURES).map(|f| format!("f{f}")).collect(),
        inputs: vec![],
        layers: vec![],
        ensemble: Some(Ensemble {
            trees,
            base_score: 0.0,
        }),
    };
    (ranker, rows)
}

/// CPU time of the whole process, in milliseconds: on a machine shared with other work, what a
/// one-thread call costs, whatever share of a core it got.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    (samples[(n - 1) / 2] + samples[n / 2]) / 2.0
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let most = args.docs.iter().copied().max().unwrap_or(1);
    let (ranker, random_rows) = match (&args.ranker, &args.random) {
        (_, Some(shape)) => {
            if shape.len() != 2 {
                bail!("--random TREES,LEAVES");
            }
            let (ranker, rows) = random_ensemble(shape[0], shape[1], most);
            validate(&ranker)?;
            (ranker, Some(rows))
        }
        (Some(path), None) => {
            let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
            let ranker = load_any(&bytes).with_context(|| format!("{}", path.display()))?;
            (ranker, None)
        }
        (None, None) => bail!("--ranker or --random"),
    };
    let nf = ranker.features.len();
    let base = match &args.rows {
        _ if random_rows.is_some() => random_rows.expect("checked"),
        Some(path) => {
            let raw = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
            if raw.is_empty() || raw.len() % (8 * nf) != 0 {
                bail!("{}: not rows of {nf} f64 values", path.display());
            }
            raw.chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect::<Vec<_>>()
        }
        None => synth_features(&ranker, most, 7),
    };
    let rows: Vec<f64> = base.iter().copied().cycle().take(most * nf).collect();
    let expect: Option<Vec<f64>> = match &args.expect {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("{}", path.display()))?
                .lines()
                .map(|l| l.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}", path.display()))?,
        ),
        None => None,
    };
    let walk = CpuPlan::with_trees(&ranker, TreeEvaluator::Walk).score_batch(&rows, 1);
    for name in &args.trees {
        let evaluator = evaluator(name)?;
        let mut build_ms = Vec::new();
        let mut plan = None;
        for _ in 0..3 {
            let start = Instant::now();
            plan = Some(CpuPlan::with_trees(&ranker, evaluator));
            build_ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let plan = plan.expect("built");
        let scores = plan.score_batch(&rows, 1);
        let identical = scores
            .iter()
            .zip(&walk)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let peer_diff = expect.as_ref().map(|e| {
            scores
                .iter()
                .zip(e)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f64, f64::max)
        });
        println!(
            "{}",
            json!({"trees": name, "evaluator": format!("{evaluator:?}"), "build_ms": median(&mut build_ms),
                   "identical_to_walk": identical, "max_abs_diff_to_peer": peer_diff})
        );
        for &threads in &args.threads {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?;
            for &docs in &args.docs {
                let batch = &rows[..docs * nf];
                // One thread: the calling thread, as `score_batch(_, 1)` runs it.
                let score = || match threads {
                    1 => plan.score_batch(batch, 1),
                    _ => pool.install(|| plan.score_batch(batch, 0)),
                };
                std::hint::black_box(score());
                let (mut ms, mut cpu) = (Vec::new(), Vec::new());
                for _ in 0..args.reps.max(1) {
                    let (start, cpu_start) = (Instant::now(), cpu_ms());
                    std::hint::black_box(score());
                    cpu.push(cpu_ms() - cpu_start);
                    ms.push(start.elapsed().as_secs_f64() * 1e3);
                }
                let (min, max) = (
                    ms.iter().copied().fold(f64::INFINITY, f64::min),
                    ms.iter().copied().fold(0.0, f64::max),
                );
                println!(
                    "{}",
                    json!({"trees": name, "threads": threads, "docs": docs,
                           "median_ms": median(&mut ms), "min_ms": min, "max_ms": max,
                           "cpu_median_ms": median(&mut cpu)})
                );
            }
        }
    }
    Ok(())
}
