#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
//! `autonodes-dev`: the playground and the standalone KubeVirt simulator. Built from the
//! workspace's default member, so `cargo run -- dev` starts the playground. The controller
//! binary (`autonodes`) links none of this.

mod dev;

use clap::{Parser, Subcommand};

/// jemalloc, as the controller binary has: the simulator's watch caches churn small objects
/// as the controller's do, and with glibc's allocator a fifth of its CPU went to `malloc`
/// and `free` (docs/src/benchmarks.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The autonodes playground and KubeVirt simulator (development and tests only).
#[derive(Debug, Parser)]
#[command(name = "autonodes-dev", version, about)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a local playground: management, host and tenant clusters, the controller and
    /// the KubeVirt simulator, until Ctrl-C.
    Dev(dev::DevArgs),
    /// Play KubeVirt, CDI and the guests for autonodes VirtualMachines on a host cluster
    /// (a kwok-like playground; see the simulator module docs).
    Simulate(autonodes_testenv::simulator::SimulateArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Dev(args) => runtime.block_on(dev::run(args)),
        Command::Simulate(args) => runtime.block_on(autonodes_testenv::simulator::run_cli(args)),
    }
}
