use super::CmdResult;

#[derive(clap::Subcommand)]
pub enum RequestsCommand {}

#[derive(clap::Args)]
pub struct Args {}

pub fn run_requests(c: RequestsCommand) -> CmdResult {
    match c {}
}

pub fn run(_args: Args) -> CmdResult {
    super::not_built("replay")
}
