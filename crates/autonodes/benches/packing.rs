//! Packing at Karpenter's benchmark scale, printed, never asserted: 400 node types and
//! {100, 500, 1,000, 2,000, 5,000} pending pods of six kinds in equal parts
//! ([`autonodes_testenv::workloads`]), packed by the dynamic pools' packer. For each size:
//! pods/s (the best of several packings of the same pods), the pods placed and blocked, the
//! nodes created, and nodes against the resource lower bound (the sum of the requests over
//! the largest type, per resource); then the same for pods without rules, where the goal is
//! nodes ≤ 1.15 × the lower bound.
//!
//! Then the real kube-scheduler on a real API server: the packer's nodes created as Nodes,
//! the pods created (those with anti-affinity first, then largest first), and the rounds a dynamic pool would make for the pods the
//! scheduler placed otherwise than the packer (each round packs the pods still pending onto
//! the room left and new nodes); every pod the packer placed must bind (any that does not
//! is printed with the scheduler's message), and the pods it found no node for stay
//! pending.
//!
//! `cargo bench --bench packing`; `AUTONODES_BENCH_PODS=100,500` sets the sizes,
//! `AUTONODES_BENCH_SCHEDULER=0` skips the kube-scheduler part. Under `cargo test` it only
//! says it was skipped.

use std::time::{Duration, Instant};

use autonodes_core::pool::pack::packer::pack;
use autonodes_core::pool::pack::{Limits, Packing, PendingPod};
use autonodes_testenv::testenv::TestEnv;
use autonodes_testenv::workloads::{self, BenchType};

/// Packs `pods` a few times; the best time and the packing.
fn timed(pods: &[PendingPod], types: &[BenchType]) -> (Duration, Packing) {
    let candidates: Vec<_> = types.iter().map(BenchType::candidate).collect();
    let mut best = Duration::MAX;
    let mut out = Packing::default();
    let rounds = if pods.len() >= 2000 { 3 } else { 5 };
    for _ in 0..rounds {
        let start = Instant::now();
        out = pack(
            pods,
            &[],
            &candidates,
            &Limits::default(),
            (0, Default::default()),
        );
        best = best.min(start.elapsed());
    }
    (best, out)
}

fn row(label: &str, n: usize, took: Duration, packing: &Packing, bound: usize) {
    let placed: usize = packing.new_nodes.iter().map(|n| n.pods.len()).sum();
    let blocked = packing.blocked_by_constraints.len()
        + packing.blocked_by_capacity.len()
        + packing
            .blocked_groups
            .iter()
            .map(|g| g.pods.len())
            .sum::<usize>();
    let nodes = packing.new_nodes.len();
    println!(
        "{label:<8} {n:>6} pods  {:>9.0} pods/s  {:>8.1} ms  placed {placed:>5}  blocked {blocked:>4}  nodes {nodes:>5}  lower bound {bound:>4}  nodes/bound {:>5.2}",
        n as f64 / took.as_secs_f64(),
        took.as_secs_f64() * 1000.0,
        nodes as f64 / bound.max(1) as f64,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--bench") {
        run().await;
    } else {
        println!("packing: skipped (run with cargo bench --bench packing)");
    }
}

async fn run() {
    let sizes: Vec<usize> = std::env::var("AUTONODES_BENCH_PODS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 500, 1000, 2000, 5000]);
    let scheduler = std::env::var("AUTONODES_BENCH_SCHEDULER").as_deref() != Ok("0");
    let types = workloads::bench_types(400);
    println!(
        "packing: {} node types, pods of six kinds (Karpenter's benchmark shape)",
        types.len()
    );
    let mut runs = Vec::new();
    for &n in &sizes {
        let pods = workloads::diverse_pods(n, 42);
        let pending: Vec<PendingPod> = pods.iter().map(PendingPod::from_pod).collect();
        let requests: Vec<_> = pending.iter().map(|p| p.request.clone()).collect();
        let (took, packing) = timed(&pending, &types);
        row(
            "diverse",
            n,
            took,
            &packing,
            workloads::lower_bound(&requests, &types),
        );
        let mut by_kind: std::collections::BTreeMap<&str, usize> = Default::default();
        for key in packing
            .blocked_by_constraints
            .iter()
            .chain(&packing.blocked_by_capacity)
        {
            let name = key.trim_start_matches("default/");
            let kind = workloads::KINDS
                .iter()
                .find(|k| name.starts_with(*k))
                .copied()
                .unwrap_or("other");
            *by_kind.entry(kind).or_default() += 1;
        }
        if !by_kind.is_empty() {
            println!("         blocked by kind: {by_kind:?}");
        }
        runs.push((pods, packing));
    }
    for &n in &sizes {
        let pods = workloads::generic_pods(n, 7);
        let pending: Vec<PendingPod> = pods.iter().map(PendingPod::from_pod).collect();
        let requests: Vec<_> = pending.iter().map(|p| p.request.clone()).collect();
        let (took, packing) = timed(&pending, &types);
        row(
            "generic",
            n,
            took,
            &packing,
            workloads::lower_bound(&requests, &types),
        );
        if std::env::var("AUTONODES_BENCH_NODES").is_ok() {
            for node in &packing.new_nodes {
                println!(
                    "  {} {} pods {:?}",
                    node.node_type,
                    node.pods.len(),
                    node.request
                );
            }
        }
    }
    if !scheduler {
        return;
    }
    println!("kube-scheduler on the packer's nodes (pods with anti-affinity first, then largest first; more rounds for pods it placed otherwise):");
    for &n in &sizes {
        let pods = workloads::diverse_pods(n, 42);
        let env = match TestEnv::start(&["tenant"]).await {
            Ok(env) => env,
            Err(e) => {
                println!("  no API server: {e}");
                return;
            }
        };
        let _scheduler = match env.start_scheduler("tenant") {
            Ok(s) => s,
            Err(e) => {
                println!("  no kube-scheduler: {e}");
                return;
            }
        };
        let Some(client) = async { env.apiserver("tenant")?.client().await.ok() }.await else {
            println!("  no client");
            return;
        };
        let rounds = workloads::provision(
            &client,
            &types,
            &workloads::scheduler_order(&pods),
            4,
            Duration::from_secs(70),
        )
        .await;
        let rounds = match rounds {
            Ok(r) => r,
            Err(e) => {
                println!("  kube-scheduler run failed: {e}");
                continue;
            }
        };
        let blocked = rounds
            .first()
            .map(|r| r.blocked.clone())
            .unwrap_or_default();
        for (i, r) in rounds.iter().enumerate() {
            println!(
                "  {n:>5} pods, round {}: {:>4} pending, {:>4} nodes added, {:>5} bound after {:.1} s, {:>4} left pending",
                i + 1,
                r.pending_before,
                r.nodes_added,
                r.bound.len(),
                r.took.as_secs_f64(),
                r.pending.len(),
            );
        }
        if let Some(last) = rounds.last() {
            let unforeseen: Vec<_> = last
                .pending
                .iter()
                .filter(|(name, _)| !blocked.contains(*name))
                .collect();
            let bound_blocked = last.bound.keys().filter(|n| blocked.contains(*n)).count();
            println!(
                "  {n:>5} pods: {} the packer placed left pending, {} the packer blocked ({}) bound anyway",
                unforeseen.len(),
                bound_blocked,
                blocked.len(),
            );
            for (name, message) in unforeseen.iter().take(10) {
                println!("    pending {name}: {message}");
            }
        }
    }
}
