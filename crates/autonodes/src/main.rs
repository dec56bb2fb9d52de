#![forbid(unsafe_code)]
//! The `autonodes` binary; everything lives in the library.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    autonodes::cli::run(autonodes::cli::Cli::parse())
}
