//! High availability with the real binary on real API servers (issue 6): two `autonodes run
//! --leader-elect` processes share a Lease, only the leader provisions, a follower takes over
//! after the leader is killed (SIGKILL) or stops (SIGTERM), and the claims in flight finish
//! with exactly one VirtualMachine each.

use crate::common;
use crate::opscommon;

use std::time::{Duration, Instant};

use autonodes_testenv::simulator::SimMode;
use common::world::*;
use common::{eventually, path_str};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use kube::api::Api;
use opscommon::{http_get, sample, spawn_controller, Proc};

const AVAILABLE: Duration = Duration::from_secs(120);
const LEASE: &str = "autonodes";

async fn lease(world: &World) -> Option<LeaseSpec> {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        world.mgmt.clone(),
        "autonodes-system",
    )
    .get_opt(LEASE)
    .await
    .ok()
    .flatten()
    .and_then(|l| l.spec)
}

/// The replica name (POD_NAME) inside a holder identity `<name>_<random>`.
fn replica_of(identity: &str) -> &str {
    identity.split('_').next().unwrap_or(identity)
}

async fn holder(world: &World) -> Option<String> {
    lease(world).await.and_then(|s| s.holder_identity)
}

fn args<'a>(kubeconfig: &'a str, lease_duration: &'a str) -> Vec<&'a str> {
    vec![
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        "autonodes-system",
        "--leader-elect",
        "--leader-election-lease-duration",
        lease_duration,
        "--metrics-addr",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--launch-timeout",
        "120s",
        "--registration-timeout",
        "120s",
    ]
}

async fn scrape(p: &Proc) -> String {
    let addr = p.metrics_addr().await;
    http_get(addr, "/metrics")
        .await
        .map(|(_, s)| s)
        .unwrap_or_default()
}

async fn wait_ready(p: &Proc) {
    let addr = p.metrics_addr().await;
    eventually(
        &format!("{} to be ready", p.name),
        Duration::from_secs(60),
        || async move { matches!(http_get(addr, "/readyz").await, Ok((200, _))).then_some(()) },
    )
    .await
}

/// Asserts exactly one VM and one user-data Secret per claim, and at most one token.
async fn assert_one_vm_per_claim(world: &World, claims: &[&str]) {
    let ObjectsPerClaim {
        vms,
        secrets,
        tokens,
        ..
    } = world.objects_per_claim("autonodes.io/nodeclaim").await;
    println!("VMs per claim: {vms:?}; user-data Secrets per claim: {secrets:?}; live tokens per claim: {tokens:?}");
    assert_eq!(vms.len(), claims.len(), "{vms:?}");
    for c in claims {
        assert_eq!(vms.get(*c), Some(&1), "claim {c}: VMs {vms:?}");
        assert_eq!(secrets.get(*c), Some(&1), "claim {c}: Secrets {secrets:?}");
        assert!(
            tokens.get(*c).copied().unwrap_or(0) <= 1,
            "claim {c}: tokens {tokens:?}"
        );
        let claim = world.claims().get(c).await.expect("claim");
        let vm_name = claim.status.and_then(|s| s.vm_name).expect("vm name");
        assert!(
            world
                .vms()
                .await
                .iter()
                .any(|v| v.metadata.name.as_deref() == Some(vm_name.as_str())),
            "claim {c}: its status names VM {vm_name}, which must be the one on the host"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_over_a_killed_leader_within_the_lease_duration_and_finishes_its_claims_without_duplicate_vms(
) {
    let opts = WorldOptions {
        mode: SimMode::SlowBoot(Duration::from_secs(4)),
        ..Default::default()
    };
    let mut world = World::start_clusters(&opts).await;
    world.start_simulator(opts.mode).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = world
        .playground
        .mgmt()
        .expect("mgmt")
        .kubeconfig_path
        .clone();
    let lease_duration = "6s";
    let a = spawn_controller(
        dir.path(),
        "replica-a",
        &args(path_str(&kubeconfig), lease_duration),
    );
    let b = spawn_controller(
        dir.path(),
        "replica-b",
        &args(path_str(&kubeconfig), lease_duration),
    );

    let first = eventually("a leader", Duration::from_secs(60), || async {
        holder(&world).await
    })
    .await;
    let (mut leader, follower) = if replica_of(&first) == "replica-a" {
        (a, b)
    } else {
        (b, a)
    };
    println!("leader: {first}; follower: {}", follower.name);
    wait_ready(&leader).await;
    wait_ready(&follower).await;
    let l = scrape(&leader).await;
    let f = scrape(&follower).await;
    assert_eq!(sample(&l, "autonodes_leader"), Some(1.0), "{l}");
    assert_eq!(sample(&f, "autonodes_leader"), Some(0.0), "{f}");

    let claims = ["ha-1", "ha-2", "ha-3"];
    for c in claims {
        world.claim_type(c, "standard-node").await;
    }
    // Mid-flight: every claim has its VM name and at least one VM exists, none has joined.
    let start = Instant::now();
    loop {
        let mut named = 0;
        for c in claims {
            let status = world.claims().get(c).await.ok().and_then(|c| c.status);
            named += usize::from(status.and_then(|s| s.vm_name).is_some());
        }
        if named == claims.len() && !world.vms().await.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the claims never got in flight; leader log:\n{}\nfollower log:\n{}",
            leader.log_text(),
            follower.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut phases = Vec::new();
    for c in claims {
        let claim = world.claims().get(c).await.expect("claim");
        phases.push(format!("{c}={:?}", claim.status.and_then(|s| s.phase)));
    }
    // Only the leader provisions.
    let f = scrape(&follower).await;
    assert!(
        // Its counters exist from the start, at 0: none may have counted a reconcile.
        !f.lines()
            .any(|l| l.starts_with("autonodes_reconcile_total") && !l.ends_with(" 0")),
        "the follower reconciled:\n{f}"
    );
    let leader_scrape = scrape(&leader).await;
    assert!(
        leader_scrape
            .lines()
            .filter(|l| l.starts_with("autonodes_nodeclaims_created_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
            >= 1.0,
        "{leader_scrape}"
    );

    println!(
        "kill -9 {} ({}) with claims {}",
        leader.name,
        leader.pid(),
        phases.join(", ")
    );
    leader.signal("KILL");
    let killed = Instant::now();
    assert_eq!(
        leader.wait_exit(Duration::from_secs(10)).await,
        Some(None),
        "killed by a signal"
    );

    let new = eventually(
        "the follower to take the Lease",
        Duration::from_secs(60),
        || async {
            holder(&world)
                .await
                .filter(|h| replica_of(h) == follower.name)
        },
    )
    .await;
    let takeover = killed.elapsed();
    let spec = lease(&world).await.expect("lease");
    println!(
        "takeover: {} took the Lease {:.1}s after the leader was killed (lease duration {lease_duration}, transitions {:?})",
        new,
        takeover.as_secs_f64(),
        spec.lease_transitions
    );

    for c in claims {
        world.wait_phase(c, "Available", AVAILABLE).await;
    }
    println!(
        "all claims Available {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    );
    assert_one_vm_per_claim(&world, &claims).await;
    let s = scrape(&follower).await;
    assert_eq!(sample(&s, "autonodes_leader"), Some(1.0));
    assert!(follower.log_text().contains("became the leader"));

    // JSON logs carry the object in fields.
    let structured = follower.log_text().lines().any(|line| {
        serde_json::from_str::<serde_json::Value>(line)
            .map(|v| v["fields"]["nodeclaim"].is_string() && v["fields"]["namespace"].is_string())
            .unwrap_or(false)
    }) || leader.log_text().lines().any(|line| {
        serde_json::from_str::<serde_json::Value>(line)
            .map(|v| v["fields"]["nodeclaim"].is_string())
            .unwrap_or(false)
    });
    assert!(structured, "no JSON log line names its claim in fields");

    follower.signal("TERM");
    let mut follower = follower;
    assert_eq!(
        follower.wait_exit(Duration::from_secs(40)).await,
        Some(Some(0))
    );
    drop(leader);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_work_in_flight_releases_the_lease_and_the_other_replica_takes_over_at_once(
) {
    let opts = WorldOptions {
        mode: SimMode::SlowBoot(Duration::from_secs(3)),
        ..Default::default()
    };
    let mut world = World::start_clusters(&opts).await;
    world.start_simulator(opts.mode).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = world
        .playground
        .mgmt()
        .expect("mgmt")
        .kubeconfig_path
        .clone();
    // The default lease duration: a takeover faster than it comes from the release.
    let lease_duration = "15s";
    let mut a = spawn_controller(
        dir.path(),
        "replica-a",
        &args(path_str(&kubeconfig), lease_duration),
    );
    eventually("replica-a to lead", Duration::from_secs(60), || async {
        holder(&world)
            .await
            .filter(|h| replica_of(h) == "replica-a")
    })
    .await;
    let mut b = spawn_controller(
        dir.path(),
        "replica-b",
        &args(path_str(&kubeconfig), lease_duration),
    );
    wait_ready(&b).await;

    world.claim_type("term-1", "standard-node").await;
    let start = Instant::now();
    while world.vms().await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no VM for the claim; leader log:\n{}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    println!("SIGTERM {} ({})", a.name, a.pid());
    a.signal("TERM");
    let termed = Instant::now();
    let code = a.wait_exit(Duration::from_secs(40)).await;
    println!(
        "{} exited with {code:?} after {:.1}s",
        a.name,
        termed.elapsed().as_secs_f64()
    );
    assert_eq!(code, Some(Some(0)), "graceful exit; log:\n{}", a.log_text());
    assert!(
        a.log_text().contains("released the leader Lease"),
        "{}",
        a.log_text()
    );

    let new = eventually(
        "replica-b to take the Lease",
        Duration::from_secs(60),
        || async {
            holder(&world)
                .await
                .filter(|h| replica_of(h) == "replica-b")
        },
    )
    .await;
    println!(
        "takeover: {new} took the released Lease {:.1}s after SIGTERM (lease duration {lease_duration})",
        termed.elapsed().as_secs_f64()
    );

    world.wait_phase("term-1", "Available", AVAILABLE).await;
    assert_one_vm_per_claim(&world, &["term-1"]).await;

    b.signal("TERM");
    assert_eq!(b.wait_exit(Duration::from_secs(40)).await, Some(Some(0)));
    let spec = lease(&world).await.expect("lease");
    assert_eq!(
        spec.holder_identity, None,
        "the last replica released the Lease too"
    );
    world.shutdown().await;
}
