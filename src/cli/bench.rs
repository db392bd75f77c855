//! `uraid bench`: measurements, each a subcommand.

use crate::bench;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// P+Q generation and two-data recovery speed of each parity
    /// implementation, next to Intel ISA-L's and memcpy's.
    Parity(bench::parity::ParityArgs),
}

pub fn run(command: &BenchCommand) -> super::CliResult {
    match command {
        BenchCommand::Parity(args) => bench::parity::run(args),
    }
}
