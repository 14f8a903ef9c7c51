use super::CmdResult;

#[derive(clap::Subcommand)]
pub enum Command {}

pub fn run(c: Command) -> CmdResult {
    match c {}
}
