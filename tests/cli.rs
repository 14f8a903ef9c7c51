//! The `score` and `ranker synth` commands, run as the built binary: outputs, exit codes and
//! the exact error messages. Also keeps `fixtures/medium-features.csv` (and its expected scores)
//! in step with `rankers/medium.json`: `RANKSERVE_REGENERATE_FIXTURES=1` rewrites them
//! (`scripts/make_score_fixture.sh`).

use std::path::{Path, PathBuf};
use std::process::Output;

use rankserve::rank::cpu::score_doc_reference;
use rankserve::rank::format::parse_native;
use rankserve::rank::synth::synth_features;

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn rankserve(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rankserve"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the rankserve binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// A two-feature ranker: score = 0.5·a + 1 (linear, f32) + (b ≤ 2 ? 0.25 : -0.25), NaN b left.
const TINY: &str = r#"{"format": "rankserve-ranker", "version": 1, "features": ["a", "b"],
  "inputs": [{"type": "linear", "feature": "a", "slope": 0.5, "intercept": 1.0}],
  "ensemble": {"base_score": 0.0, "trees": [{"nodes": [
    {"feature": 1, "threshold": 2.0, "missing": "nan", "default_left": true, "left": 1, "right": 2},
    {"leaf": 0.25}, {"leaf": -0.25}]}]}}"#;

#[test]
fn score_prints_one_round_trip_score_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(dir.path(), "tiny.json", TINY);
    let csv = write(dir.path(), "f.csv", "a,b\n2,2\n0.1,3\n,nan\n4,\n");
    let out = rankserve(&["score", "--ranker", &ranker, "--features", &csv]);
    assert!(out.status.success(), "{}", stderr(&out));
    let want = [
        2.0 + 0.25,
        f64::from(0.1f32 * 0.5 + 1.0) - 0.25,
        1.0 + 0.25,
        3.0 + 0.25,
    ];
    let got: Vec<f64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn score_without_header_and_with_threads() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(dir.path(), "tiny.json", TINY);
    let csv = write(dir.path(), "f.csv", "2,2\n0,5\n");
    let one = rankserve(&[
        "score",
        "--ranker",
        &ranker,
        "--features",
        &csv,
        "--threads",
        "1",
    ]);
    let two = rankserve(&[
        "score",
        "--ranker",
        &ranker,
        "--features",
        &csv,
        "--threads",
        "2",
    ]);
    assert_eq!(String::from_utf8_lossy(&one.stdout), "2.25\n0.75\n");
    assert_eq!(one.stdout, two.stdout);
}

#[test]
fn score_rejects_a_stray_field_naming_the_line_with_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(dir.path(), "tiny.json", TINY);
    let csv = write(dir.path(), "f.csv", "1,2\n3,4\n5,6,7\n");
    let out = rankserve(&["score", "--ranker", &ranker, "--features", &csv]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no partial output");
    assert_eq!(
        stderr(&out),
        format!("rankserve: in {csv}: line 3: expected 2 fields (one per ranker feature), got 3\n")
    );
}

#[test]
fn score_rejects_a_non_number() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(dir.path(), "tiny.json", TINY);
    let csv = write(dir.path(), "f.csv", "1,2\n3,four\n");
    let out = rankserve(&["score", "--ranker", &ranker, "--features", &csv]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("line 2, field 2 (b): expected a number, empty or nan, got \"four\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn score_rejects_a_bad_ranker_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(
        dir.path(),
        "bad.json",
        &TINY.replace("\"right\": 2", "\"right\": 0"),
    );
    let csv = write(dir.path(), "f.csv", "1,2\n");
    let out = rankserve(&["score", "--ranker", &ranker, "--features", &csv]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(
        stderr(&out),
        format!(
            "rankserve: loading ranker {ranker}: ensemble.trees[0].nodes[0].right: child index 0 is \
             already reached from the root (a cycle, or a node with two parents)\n"
        )
    );
    let unknown = write(
        dir.path(),
        "unknown.json",
        &TINY.replace("\"feature\": \"a\"", "\"feature\": \"c\""),
    );
    let out = rankserve(&["score", "--ranker", &unknown, "--features", &csv]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("inputs[0].feature: feature \"c\" is not in `features`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn score_missing_file_is_bad_input() {
    let out = rankserve(&["score", "--ranker", "no/such.json", "--features", "no.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("rankserve: reading no/such.json"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn synth_is_deterministic_and_rejects_bad_specs() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    let b = dir.path().join("b.json");
    let spec = [
        "--inputs",
        "bucket=3,loglinear=2,tree=4,ensemble=2",
        "--layers",
        "8,1",
        "--seed",
        "5",
    ];
    for out in [&a, &b] {
        let mut args = vec!["ranker", "synth"];
        args.extend(spec);
        args.extend(["--out", out.to_str().unwrap()]);
        let run = rankserve(&args);
        assert!(run.status.success(), "{}", stderr(&run));
    }
    let text = std::fs::read(&a).unwrap();
    assert_eq!(text, std::fs::read(&b).unwrap());
    let r = parse_native(&text).unwrap();
    assert_eq!(r.inputs.len(), 9);
    let out = rankserve(&[
        "ranker",
        "synth",
        "--inputs",
        "tree=4",
        "--layers",
        "8,2",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "rankserve: --layers: expected comma-separated widths ending in 1 (e.g. 64,1) or \"none\", got \"8,2\"\n"
    );
}

#[test]
fn committed_presets_are_what_synth_makes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("small.json");
    let run = rankserve(&[
        "ranker",
        "synth",
        "--preset",
        "small",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(
        std::fs::read(out).unwrap(),
        std::fs::read(root().join("rankers/small.json")).unwrap()
    );
    for name in ["medium", "large"] {
        let r = parse_native(&std::fs::read(root().join(format!("rankers/{name}.json"))).unwrap())
            .unwrap();
        assert!(!r.inputs.is_empty());
    }
}

/// The fixture CSV's rows: 200 documents from `synth_features` (NaN written as an empty field),
/// after a header line of the ranker's feature names.
fn medium_fixture() -> (String, String) {
    let ranker = parse_native(&std::fs::read(root().join("rankers/medium.json")).unwrap()).unwrap();
    let nf = ranker.features.len();
    let rows = synth_features(&ranker, 200, 2026);
    let mut csv = ranker.features.join(",") + "\n";
    let mut scores = String::new();
    for row in rows.chunks(nf) {
        let fields: Vec<String> = row
            .iter()
            .map(|v| {
                if v.is_nan() {
                    String::new()
                } else {
                    v.to_string()
                }
            })
            .collect();
        csv.push_str(&fields.join(","));
        csv.push('\n');
        scores.push_str(&format!("{}\n", score_doc_reference(&ranker, row)));
    }
    (csv, scores)
}

#[test]
fn medium_fixture_scores_match_the_reference() {
    let (csv, scores) = medium_fixture();
    let csv_path = root().join("fixtures/medium-features.csv");
    let scores_path = root().join("fixtures/medium-scores.txt");
    if std::env::var_os("RANKSERVE_REGENERATE_FIXTURES").is_some() {
        std::fs::write(&csv_path, &csv).unwrap();
        std::fs::write(&scores_path, &scores).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&csv_path).unwrap(),
        csv,
        "fixture out of date: run scripts/make_score_fixture.sh"
    );
    assert_eq!(std::fs::read_to_string(&scores_path).unwrap(), scores);
    let out = rankserve(&[
        "score",
        "--ranker",
        "rankers/medium.json",
        "--features",
        "fixtures/medium-features.csv",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        scores,
        "the fast path equals the reference"
    );
}

#[test]
fn bench_ranking_without_gpu_prints_cpu_columns_and_writes_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("bench");
    let out = rankserve(&[
        "bench",
        "ranking",
        "--cpu-only",
        "--rankers",
        "small",
        "--docs",
        "1,3",
        "--reps",
        "2",
        "--budget-ms",
        "1",
        "--threads",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("GPU: none (--cpu-only); GPU column absent"),
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("small ")).count(),
        2,
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("ranking.json")).unwrap())
            .unwrap();
    assert_eq!(report["gpu"]["Err"], "--cpu-only");
    assert_eq!(report["rankers"][0]["cells"].as_array().unwrap().len(), 2);
    assert!(report["rankers"][0]["cells"][0]["gpu"].is_null());
    let svg = std::fs::read_to_string(out_dir.join("ranking.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
}

#[test]
fn bench_ranking_rejects_an_empty_batch() {
    let out = rankserve(&["bench", "ranking", "--docs", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "rankserve: --docs needs batch sizes of at least 1 and --reps at least 1\n"
    );
}

#[test]
fn bench_ranking_checks_scores_against_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let ranker = write(dir.path(), "tiny.json", TINY);
    let csv = write(dir.path(), "f.csv", "2,2\n4,\n");
    let args = |expect: &str| {
        let expect = write(dir.path(), "expect.txt", expect);
        rankserve(&[
            "bench",
            "ranking",
            "--cpu-only",
            "--ranker",
            &ranker,
            "--features",
            &csv,
            "--expect",
            &expect,
            "--docs",
            "1,2",
            "--reps",
            "1",
            "--threads",
            "1",
        ])
    };
    let out = args("2.25\n3.25\n");
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("reference check tiny: 2 rows, max relative error CPU 0.000e0"),
        "{stdout}"
    );
    assert!(stdout.contains("PASS"), "{stdout}");
    let out = args("2.25\n3.26\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).lines().last(),
        Some("rankserve: scores differ from the reference by more than 1e-6 relative")
    );
    assert!(String::from_utf8(out.stdout).unwrap().contains("FAIL"));
    let out = args("2.25\n");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "rankserve: --expect has 1 scores for the 2 rows of --features\n"
    );
}

/// `bench selection --out` records every query's hit count (all the documents it matches, not
/// just its top-k), checked against a count over the corpus's tokenized bodies; both timings run.
#[test]
fn bench_selection_out_counts_every_hit() {
    use rankserve::index::corpus::read_all;
    use rankserve::index::tokenize::Tokenizer;

    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("idx");
    let corpus = root().join("fixtures/corpus.jsonl");
    let built = rankserve(&[
        "index",
        "build",
        "--corpus",
        corpus.to_str().unwrap(),
        "--out",
        idx.to_str().unwrap(),
    ]);
    assert!(built.status.success(), "{}", stderr(&built));
    let texts = [
        "the of",
        "Kernel ranking",
        "lists",
        "the zzznotaword",
        "and for the",
    ];
    let queries = write(dir.path(), "queries.txt", &texts.join("\n"));
    let mut tokenizer = Tokenizer::new();
    let bodies: Vec<Vec<String>> = read_all(&corpus)
        .unwrap()
        .iter()
        .map(|d| tokenizer.tokens(d.streams.get("body").map_or("", String::as_str)))
        .collect();
    for (mode, timing, label) in [
        ("and", "passes", "passes over the query set"),
        ("or", "back-to-back", "back to back"),
    ] {
        let runs = dir.path().join(format!("runs-{mode}.jsonl"));
        let out = rankserve(&[
            "bench",
            "selection",
            "--index",
            idx.to_str().unwrap(),
            "--queries",
            &queries,
            "--mode",
            mode,
            "--k",
            "3",
            "--reps",
            "2",
            "--timing",
            timing,
            "--out",
            runs.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains(label));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&runs)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), texts.len());
        for (line, text) in lines.iter().zip(texts) {
            let terms = tokenizer.tokens(text);
            let matches = |body: &Vec<String>| match mode {
                "and" => terms.iter().all(|t| body.contains(t)),
                _ => terms.iter().any(|t| body.contains(t)),
            };
            let want = bodies.iter().filter(|b| matches(b)).count() as u64;
            assert_eq!(line["hits"].as_u64(), Some(want), "{mode} {text:?}");
            let shown = line["ids"].as_array().unwrap().len() as u64;
            assert_eq!(shown, want.min(3), "{mode} {text:?}");
        }
    }
}
