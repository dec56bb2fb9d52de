#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! The `autonodes` binary; everything lives in the library.

use clap::Parser;

/// jemalloc instead of the system allocator: under the watch caches' steady churn of small
/// objects it costs the controller about a fifth less CPU and a little less memory (see
/// docs/src/benchmarks.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    autonodes::cli::run(autonodes::cli::Cli::parse())
}
