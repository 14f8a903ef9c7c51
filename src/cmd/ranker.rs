//! `rankserve ranker ...`: make and import rankers.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rankserve::rank::format::to_native_json;
use rankserve::rank::import::{load_any, load_as, ModelKind};
use rankserve::rank::synth::{synth, SynthSpec};

use super::{BadInputExt, CmdResult};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Import a LightGBM (dump_model JSON or text model), XGBoost (JSON or UBJSON), CatBoost
    /// (JSON), ONNX (tree ensemble or small MLP) or RankLib (LambdaMART/MART XML) model as a
    /// ranker file, reproducing the library's raw scores.
    #[command(after_help = "Examples:\n  rankserve ranker import --format lightgbm \
                            --in fixtures/trees/lgb_lambdarank.model.json --out rankers/lgb.json\n  \
                            rankserve ranker import --in fixtures/trees/xgbu_ndcg.model.ubj \
                            --out rankers/xgb.json")]
    Import(ImportArgs),
    /// Synthesize a deterministic ranker: a preset of DESIGN §6 or explicit sizes.
    #[command(after_help = SYNTH_HELP)]
    Synth(SynthArgs),
}

const SYNTH_HELP: &str = "\
SPEC syntax:
  --inputs  comma-separated KIND=COUNT, KIND one of
              bucket     1 if lower <= x < upper (runs of adjacent intervals over one feature)
              linear     x*slope + intercept
              loglinear  ln(x+1)*slope + intercept
              freeform   ln(a + 1) * max(b, 0.5) over two features
              tree       a decision tree as a model input (30-64 leaves, depth <= 12)
              ensemble   trees of the tree ensemble added to the score (not model inputs)
  --layers  comma-separated output widths of the NN layers, first to last, ending in 1
            (64,1 = inputs -> 64 (tanh) -> 1 (identity)); \"none\" for no layers (the score is
            then the sum of the inputs)
Presets: small = --inputs bucket=54,linear=2,loglinear=69 --layers 1
         medium = --inputs bucket=10,loglinear=5,tree=500 --layers 1
         large = --inputs tree=1250 --layers 64,1
Features are the FE catalogue (docs/features.md) plus static.static_rank, static.page_quality.

Examples:
  rankserve ranker synth --preset medium --out rankers/medium.json
  rankserve ranker synth --inputs bucket=54,linear=2,loglinear=69,tree=500 --layers 64,1 --seed 7 --out r.json
  rankserve ranker synth --inputs ensemble=500 --layers none --out trees500.json";

#[derive(clap::Args)]
pub struct SynthArgs {
    /// A preset of DESIGN §6.
    #[arg(long, value_parser = ["small", "medium", "large"], conflicts_with_all = ["inputs", "layers"], required_unless_present = "inputs")]
    preset: Option<String>,
    /// Input counts, e.g. `bucket=54,linear=2,loglinear=69,tree=500` (syntax below).
    #[arg(long, value_name = "SPEC")]
    inputs: Option<String>,
    /// NN layer widths ending in 1, e.g. `64,1`, or `none` (syntax below).
    #[arg(long, value_name = "SPEC", default_value = "none", requires = "inputs")]
    layers: String,
    /// Seed of the ChaCha8 stream: the same spec and seed give the same file.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The ranker file to write (written whole or not at all).
    #[arg(long, value_name = "RANKER.json")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// Which library and format wrote the model; `auto` tells it from the file's bytes.
    #[arg(long, value_enum, default_value = "auto")]
    format: ImportFormat,
    /// The model file. lightgbm: `json.dump(booster.dump_model())`; lightgbm-text:
    /// `booster.save_model("model.txt")`; xgboost: `booster.save_model("model.json")`;
    /// xgboost-ubj: `booster.save_model("model.ubj")`; ranklib: RankLib's `-save` file;
    /// catboost: `model.save_model(path, format="json")`; onnx: the `.onnx` protobuf.
    #[arg(long = "in", value_name = "MODEL")]
    input: PathBuf,
    /// The ranker file to write (written whole or not at all).
    #[arg(long, value_name = "RANKER.json")]
    out: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum ImportFormat {
    Auto,
    Lightgbm,
    LightgbmText,
    Xgboost,
    XgboostUbj,
    Ranklib,
    Catboost,
    Onnx,
}

impl ImportFormat {
    /// The kind it names; `None` for `auto`.
    fn kind(self) -> Option<ModelKind> {
        match self {
            ImportFormat::Auto => None,
            ImportFormat::Lightgbm => Some(ModelKind::LightGbm),
            ImportFormat::LightgbmText => Some(ModelKind::LightGbmText),
            ImportFormat::Xgboost => Some(ModelKind::XgBoost),
            ImportFormat::XgboostUbj => Some(ModelKind::XgBoostUbj),
            ImportFormat::Ranklib => Some(ModelKind::RankLib),
            ImportFormat::Catboost => Some(ModelKind::CatBoost),
            ImportFormat::Onnx => Some(ModelKind::Onnx),
        }
    }
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Import(args) => import(&args),
        Command::Synth(args) => synth_ranker(&args),
    }
}

fn import(args: &ImportArgs) -> CmdResult {
    let bytes = std::fs::read(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))
        .bad_input()?;
    let ranker = match args.format.kind() {
        Some(kind) => load_as(kind, &bytes),
        None => load_any(&bytes),
    }
    .with_context(|| format!("importing {}", args.input.display()))
    .bad_input()?;
    write_whole(&args.out, to_native_json(&ranker).as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

fn synth_ranker(args: &SynthArgs) -> CmdResult {
    let spec = match (&args.preset, &args.inputs) {
        (Some(name), _) => SynthSpec::preset(name)
            .ok_or_else(|| anyhow::anyhow!("unknown preset {name:?}"))
            .bad_input()?,
        (None, Some(inputs)) => SynthSpec::parse(inputs, &args.layers).bad_input()?,
        (None, None) => {
            return Err(anyhow::anyhow!("give --preset or --inputs")).bad_input();
        }
    };
    let ranker = synth(&spec, args.seed);
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
