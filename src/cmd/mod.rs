//! One module per command family; each owns its clap arguments and its `run`.

pub mod bench;
pub mod corpus;
pub mod index;
pub mod ranker;
pub mod replay;
pub mod score;
pub mod serve;

use std::io::Write;

/// Why a command failed, which decides the exit code.
#[derive(Debug)]
pub enum Failure {
    /// The caller's input or usage was wrong (exit 2).
    BadInput(anyhow::Error),
    /// Anything else (exit 1).
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Other(err)
    }
}

impl From<std::io::Error> for Failure {
    fn from(err: std::io::Error) -> Self {
        Failure::Other(err.into())
    }
}

/// The result every command returns.
pub type CmdResult = Result<(), Failure>;

/// Marks an error as the caller's fault (exit 2).
pub trait BadInputExt<T> {
    fn bad_input(self) -> Result<T, Failure>;
}

impl<T, E: Into<anyhow::Error>> BadInputExt<T> for Result<T, E> {
    fn bad_input(self) -> Result<T, Failure> {
        self.map_err(|e| Failure::BadInput(e.into()))
    }
}

/// Prints a failure on stderr as one line (with its causes) and returns the exit code.
pub fn exit_code(result: CmdResult) -> i32 {
    let (code, err) = match result {
        Ok(()) => return 0,
        Err(Failure::BadInput(err)) => (2, err),
        Err(Failure::Other(err)) => (1, err),
    };
    // A closed stdout (`rankserve score ... | head`) is a normal end, not a failure.
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            return 0;
        }
    }
    let _ = writeln!(std::io::stderr(), "rankserve: {err:#}");
    code
}
