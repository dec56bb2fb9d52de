//! Dynamic pools at scale on real API servers, printed, never asserted: 2,000 pending pods of
//! the packing benchmark's six kinds over 10 teams of one tenant, each team with a namespace
//! and a dynamic pool of its own, created kind by kind, then (on fresh clusters) in a random
//! order, then in a random order with the controller batching for up to 60 s; management, host and tenant kube-apiservers on one etcd,
//! `autonodes run` as its own process, the KubeVirt simulator and the tenant's real
//! kube-scheduler. It prints the time from the last pod created to the last claim created and
//! to the last pod bound, writes per claim (the controller's, by cluster, and all API
//! servers'), the controller's CPU and peak RSS, and any pod left pending with the
//! scheduler's message (`tests/it/opscommon/at_scale.rs` runs it; `tests/it/packing.rs` runs it
//! small as a test).
//!
//! `cargo bench --bench pools_at_scale`; `AUTONODES_BENCH_PODS` and `AUTONODES_BENCH_POOLS`
//! set the sizes (default 2,000 and 10). Under `cargo test` it only says it was skipped.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "../tests/it/opscommon/mod.rs"]
mod opscommon;

use std::time::Duration;

use opscommon::{at_scale, measure};

/// jemalloc, as in the `autonodes` binary: this process runs the simulator.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let Some(rt) = measure::bench_runtime("pools_at_scale") else {
        return;
    };
    let pods = measure::bench_sizes("AUTONODES_BENCH_PODS", &[2000])[0];
    let pools = measure::bench_sizes("AUTONODES_BENCH_POOLS", &[10])[0].max(1);
    rt.block_on(async {
        println!("dynamic pools at scale on real API servers (one etcd; management, host and tenant kube-apiservers), 2 cores");
        // The kube-scheduler marks pods unschedulable at about 50 a second: a burst of
        // 2,000 takes it some 40 s, which the last run packs as one batch.
        let runs: [(at_scale::Order, &[&str]); 3] = [
            (at_scale::Order::ByKind, &[]),
            (at_scale::Order::Shuffled, &[]),
            (at_scale::Order::Shuffled, &["--batch-max-duration=60s"]),
        ];
        for (order, flags) in runs {
            let mut world = at_scale::world().await;
            let figures = at_scale::run(
                &mut world,
                pods,
                pools,
                order,
                flags,
                Duration::from_secs(600 + pods as u64 / 2),
            )
            .await;
            for line in figures.lines() {
                println!("{line}");
            }
            world.shutdown().await;
        }
    });
}
