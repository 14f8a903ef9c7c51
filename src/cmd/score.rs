//! `rankserve score`: scores a CSV of feature vectors with a ranker, one score per line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use rankserve::rank::cpu::CpuPlan;
use rankserve::rank::import::load_any;

use super::{BadInputExt, CmdResult, Failure};

#[derive(clap::Args)]
#[command(after_help = "\
The CSV has one document per line, one field per ranker feature in the ranker's `features`
order, no header (a first line equal to the feature names is accepted as one). Values are f64;
an empty field or `nan` is a missing value. Each score is printed with the digits that read
back to the same f64. The whole file is scored before anything is printed.

Example:
  rankserve score --ranker rankers/medium.json --features fixtures/medium-features.csv")]
pub struct Args {
    /// The ranker: a native ranker file, or a LightGBM / XGBoost model JSON.
    #[arg(long, value_name = "FILE")]
    ranker: PathBuf,
    /// The feature vectors (CSV).
    #[arg(long, value_name = "FILE.csv")]
    features: PathBuf,
    /// Scoring threads (0: one per core). Scores do not depend on it.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Where to score.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq)]
enum Backend {
    Cpu,
    Gpu,
}

pub fn run(args: Args) -> CmdResult {
    let bytes = std::fs::read(&args.ranker)
        .with_context(|| format!("reading {}", args.ranker.display()))
        .bad_input()?;
    let ranker = load_any(&bytes)
        .with_context(|| format!("loading ranker {}", args.ranker.display()))
        .bad_input()?;
    let text = std::fs::read_to_string(&args.features)
        .with_context(|| format!("reading {}", args.features.display()))
        .bad_input()?;
    let rows = parse_csv(&text, &ranker.features)
        .with_context(|| format!("in {}", args.features.display()))
        .bad_input()?;
    let scores = match args.backend {
        Backend::Cpu => CpuPlan::new(&ranker).score_batch(&rows, args.threads),
        Backend::Gpu => score_gpu(&ranker, &rows)?,
    };
    let mut out = String::with_capacity(scores.len() * 20);
    for s in scores {
        out.push_str(&s.to_string()); // Rust prints the shortest digits that round-trip
        out.push('\n');
    }
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

fn score_gpu(ranker: &rankserve::rank::model::Ranker, rows: &[f64]) -> Result<Vec<f64>, Failure> {
    use rankserve::gpu::GpuDevice;
    use rankserve::rank::gpu::ranker::GpuRanker;
    let device = GpuDevice::probe().context("--backend gpu")?;
    let gpu = GpuRanker::upload(&device, ranker, Default::default())
        .context("uploading the ranker to the GPU")?;
    Ok(gpu
        .score(&device, rows, false)
        .context("scoring on the GPU")?
        .scores)
}

/// Parses the feature CSV into row-major values; errors name the line (1-based) and field.
pub(crate) fn parse_csv(text: &str, features: &[String]) -> anyhow::Result<Vec<f64>> {
    let nf = features.len();
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if i == 0
            && fields.len() == nf
            && fields
                .iter()
                .zip(features)
                .all(|(f, name)| f.trim_matches('"') == name)
        {
            continue; // the header line
        }
        if fields.len() != nf {
            anyhow::bail!(
                "line {line_no}: expected {nf} fields (one per ranker feature), got {}",
                fields.len()
            );
        }
        for (k, field) in fields.iter().enumerate() {
            let value = if field.is_empty() || field.eq_ignore_ascii_case("nan") {
                f64::NAN
            } else {
                field.parse::<f64>().map_err(|_| {
                    anyhow::anyhow!(
                        "line {line_no}, field {} ({}): expected a number, empty or nan, got {field:?}",
                        k + 1,
                        features[k]
                    )
                })?
            };
            rows.push(value);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    #[test]
    fn parses_values_missing_and_header() {
        let rows = parse_csv("a,b\n1.5, \n nan,-2e3\r\n", &names()).unwrap();
        assert_eq!(rows[0], 1.5);
        assert!(rows[1].is_nan() && rows[2].is_nan());
        assert_eq!(rows[3], -2000.0);
        assert_eq!(rows.len(), 4);
    }

    #[test]
    fn rejects_wrong_field_count_naming_the_line() {
        let err = parse_csv("1,2\n3,4,5\n", &names()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: expected 2 fields (one per ranker feature), got 3"
        );
    }

    #[test]
    fn rejects_non_numbers_naming_line_and_field() {
        let err = parse_csv("1,2\n3,x\n", &names()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2, field 2 (b): expected a number, empty or nan, got \"x\""
        );
    }
}
