use super::CmdResult;

#[derive(clap::Subcommand)]
pub enum Command {}

#[derive(clap::Subcommand)]
pub enum QueriesCommand {}

pub fn run(c: Command) -> CmdResult {
    match c {}
}

pub fn run_queries(c: QueriesCommand) -> CmdResult {
    match c {}
}
