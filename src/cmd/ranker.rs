//! `rankserve ranker ...`: make and import rankers.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rankserve::rank::format::to_native_json;
use rankserve::rank::import::{import_lightgbm, import_xgboost};

use super::{BadInputExt, CmdResult};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Import a LightGBM `dump_model()` or XGBoost `save_model()` JSON as a ranker file whose
    /// ensemble holds the trees, reproducing the library's raw scores.
    #[command(after_help = "Example:\n  rankserve ranker import --format lightgbm \
                            --in fixtures/trees/lgb_lambdarank.model.json --out rankers/lgb.json")]
    Import(ImportArgs),
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// Which library wrote the model.
    #[arg(long, value_enum)]
    format: ImportFormat,
    /// The model JSON (LightGBM: `json.dump(booster.dump_model())`; XGBoost:
    /// `booster.save_model("model.json")`).
    #[arg(long = "in", value_name = "MODEL.json")]
    input: PathBuf,
    /// The ranker file to write (written whole or not at all).
    #[arg(long, value_name = "RANKER.json")]
    out: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum ImportFormat {
    Lightgbm,
    Xgboost,
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Import(args) => import(&args),
    }
}

fn import(args: &ImportArgs) -> CmdResult {
    let bytes = std::fs::read(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))
        .bad_input()?;
    let ranker = match args.format {
        ImportFormat::Lightgbm => import_lightgbm(&bytes),
        ImportFormat::Xgboost => import_xgboost(&bytes),
    }
    .with_context(|| format!("importing {}", args.input.display()))
    .bad_input()?;
    write_whole(&args.out, to_native_json(&ranker).as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`, so a reader
/// never sees a partial file.
fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path)?;
    Ok(())
}
