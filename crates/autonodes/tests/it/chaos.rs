//! Chaos: the real `autonodes run` binary SIGKILLed at random moments while claims
//! provision and again while they are cleaned up, the host API server stopped and
//! restarted, then the tenant API server likewise — and at the end every claim deleted at
//! once. After each phase every claim has exactly one VM, one user-data Secret and at most
//! one token, and once the claims are gone nothing they created is left. The node type
//! keeps 5 warm VMs, so claims take warm VMs while the controller is killed: no VM serves
//! two claims or joins twice, and once the type keeps none nothing of them is left.
//!
//! Sizes come from the environment (the test command uses the defaults):
//! `AUTONODES_CHAOS_CLAIMS` (100) claims provisioned under kills, `AUTONODES_CHAOS_OUTAGE`
//! (60) seconds each API server stays down, `AUTONODES_CHAOS_DELETE` (150; the book's figures use
//! 1000) claims deleted at once at the end, `AUTONODES_CHAOS_SEED` the kill timing. The figures are printed and
//! written to `target/chaos-report.txt`, which `scripts/test.sh` shows.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use autonodes_api::{
    NodeClaim, NodeClaimPhase, LABEL_NODECLAIM_UID, LABEL_WARM_NODETYPE, LABEL_WARM_VM,
};
use autonodes_testenv::testenv::ManagedProcess;
use common::world::*;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::ResourceExt;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator for kill moments (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A duration between `lo` and `hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

struct Chaos {
    world: World,
    controller: ManagedProcess,
    starts: u32,
    kills: u32,
    report: String,
    host_peak: u64,
    host_rss_sampled: u64,
}

impl Chaos {
    fn restart_controller(&mut self) {
        self.controller.kill();
        self.kills += 1;
        self.starts += 1;
        self.controller = self
            .world
            .spawn_controller_process(self.starts, env!("CARGO_BIN_EXE_autonodes"));
    }

    fn line(&mut self, text: String) {
        eprintln!("chaos: {text}");
        let _ = writeln!(self.report, "{text}");
    }

    fn sample_host_memory(&mut self) {
        if let Some((rss, peak)) = self
            .world
            .playground
            .env
            .apiserver("host")
            .and_then(|h| h.memory())
        {
            self.host_peak = self.host_peak.max(peak);
            self.host_rss_sampled = self.host_rss_sampled.max(rss);
        }
    }

    async fn create_claims(&self, prefix: &str, n: usize) {
        let api = self.world.claims();
        for i in 0..n {
            let claim: NodeClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": format!("{prefix}-{i}"), "namespace": NS},
                "spec": {"vClusterRef": {"name": "tenant"}},
            }))
            .expect("claim");
            // The management API server stays up; a failed create is a test failure.
            api.create(&PostParams::default(), &claim)
                .await
                .expect("claim created");
        }
    }

    async fn claims(&self) -> Vec<NodeClaim> {
        self.world
            .claims()
            .list(&ListParams::default())
            .await
            .expect("list claims")
            .items
    }

    /// Waits until every claim is Available (and none is left Terminating); returns how
    /// long it took.
    async fn wait_all_available(&mut self, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            self.sample_host_memory();
            let claims = self.claims().await;
            let waiting: Vec<String> = claims
                .iter()
                .filter(|c| {
                    c.metadata.deletion_timestamp.is_some()
                        || c.status.as_ref().and_then(|s| s.phase)
                            != Some(NodeClaimPhase::Available)
                })
                .map(|c| {
                    let ready = c
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.iter().find(|x| x.status != "True"))
                        .map(|x| format!("{}={} {}", x.type_, x.reason, x.message))
                        .unwrap_or_default();
                    format!(
                        "{} {:?} {}",
                        c.name_any(),
                        c.status.as_ref().and_then(|s| s.phase),
                        ready.chars().take(160).collect::<String>()
                    )
                })
                .collect();
            if waiting.is_empty() {
                return start.elapsed();
            }
            if start.elapsed().as_secs().is_multiple_of(10) && start.elapsed().subsec_millis() < 500
            {
                eprintln!(
                    "chaos: {what}: {:.0}s, {} waiting, e.g. {:?}",
                    start.elapsed().as_secs_f64(),
                    waiting.len(),
                    &waiting[..waiting.len().min(3)]
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "{what}: claims not Available after 10 min: {} of them, e.g. {:?}; controller log: {}",
                waiting.len(),
                &waiting[..waiting.len().min(5)],
                self.controller.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until no claim is left; returns how long it took.
    async fn wait_no_claims(&mut self, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            self.sample_host_memory();
            let left = self.claims().await.len();
            if left == 0 {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(900),
                "{what}: {left} claims still there after 15 min; controller log: {}",
                self.controller.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Counts, by claim UID, VMs and user-data Secrets on the host and tokens in the
    /// tenant; returns (leaked, duplicated): objects whose claim is gone, and claims with
    /// more than one VM or Secret or live token.
    /// Waits (at most 90 s) until every Secret made for a warm VM that no claim took has its
    /// VM: a warm VM's user data is made before the VM, and what a killed controller left
    /// of one is removed 30 s after it was made.
    async fn settle_warm(&mut self) {
        let start = Instant::now();
        loop {
            let vms: BTreeSet<String> = self
                .world
                .vms()
                .await
                .iter()
                .map(|v| v.name_any())
                .collect();
            let pending = self
                .world
                .host_secrets()
                .await
                .iter()
                .filter(|s| !s.labels().contains_key(LABEL_NODECLAIM_UID))
                .filter_map(|s| s.labels().get(LABEL_WARM_VM).cloned())
                .filter(|vm| !vms.contains(vm))
                .count();
            if pending == 0 || start.elapsed() > Duration::from_secs(90) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn audit(&mut self, what: &str) -> (usize, usize) {
        self.settle_warm().await;
        let claims = self.claims().await;
        let live: BTreeSet<String> = claims.iter().filter_map(|c| c.uid()).collect();
        let mut per_claim: BTreeMap<(String, &str), usize> = BTreeMap::new();
        let mut leaked = 0;
        let uid_of = |labels: &BTreeMap<String, String>| labels.get(LABEL_NODECLAIM_UID).cloned();
        let vms = self.world.vms().await;
        let secrets = self.world.host_secrets().await;
        let tokens = self.world.tokens().await;
        // Warm VMs no claim took, and their user data: the type's, not leaked.
        let warm: BTreeSet<String> = vms
            .iter()
            .filter(|v| {
                uid_of(v.labels()).is_none() && v.labels().contains_key(LABEL_WARM_NODETYPE)
            })
            .map(|v| v.name_any())
            .collect();
        let is_warm = |labels: &BTreeMap<String, String>| {
            uid_of(labels).is_none() && labels.get(LABEL_WARM_VM).is_some_and(|v| warm.contains(v))
        };
        let labelled = vms
            .iter()
            .filter(|o| !is_warm(o.labels()))
            .map(|o| (uid_of(o.labels()), "vm"))
            .chain(
                secrets
                    .iter()
                    .filter(|o| !is_warm(o.labels()))
                    .map(|o| (uid_of(o.labels()), "secret")),
            )
            .chain(tokens.iter().map(|o| (uid_of(o.labels()), "token")));
        for (uid, kind) in labelled {
            match uid {
                Some(uid) if live.contains(&uid) => *per_claim.entry((uid, kind)).or_default() += 1,
                _ => leaked += 1,
            }
        }
        // No VM serves two claims, and no Node is registered twice for one VM.
        let mut served: BTreeMap<String, usize> = BTreeMap::new();
        for vm in claims
            .iter()
            .filter_map(|c| c.status.as_ref()?.vm_name.clone())
        {
            *served.entry(vm).or_default() += 1;
        }
        let mut joined: BTreeMap<String, usize> = BTreeMap::new();
        for id in self
            .world
            .nodes()
            .await
            .iter()
            .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
        {
            *joined.entry(id).or_default() += 1;
        }
        let twice = served
            .values()
            .chain(joined.values())
            .filter(|n| **n > 1)
            .count();
        let bound = claims
            .iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.warm.is_some()))
            .count();
        let duplicated = per_claim.values().filter(|n| **n > 1).count() + twice;
        // Nodes: one per live claim at most, none for a claim that is gone.
        let claim_nodes: BTreeSet<String> = claims
            .iter()
            .filter_map(|c| c.status.as_ref().and_then(|s| s.node_name.clone()))
            .collect();
        let stray_nodes = self
            .world
            .nodes()
            .await
            .iter()
            .filter(|n| !claim_nodes.contains(&n.name_any()))
            .count();
        self.line(format!(
            "{what}: {} claims ({bound} on a warm VM), {} VMs ({} warm), {} Secrets, {} tokens; leaked {leaked}, duplicated {duplicated}, VMs serving two claims or joined twice {twice}, nodes without a claim {stray_nodes}",
            live.len(),
            vms.len(),
            warm.len(),
            secrets.len(),
            tokens.len()
        ));
        (leaked + stray_nodes, duplicated)
    }

    /// Stops the API server `name` for `outage`, while `n` claims are created and `n`
    /// deleted; restarts it and returns how long until everything is settled again.
    async fn outage(&mut self, name: &str, outage: Duration, n: usize) -> Duration {
        let victims: Vec<String> = self
            .claims()
            .await
            .iter()
            .take(n)
            .map(|c| c.name_any())
            .collect();
        self.sample_host_memory();
        self.world
            .playground
            .env
            .apiserver_mut(name)
            .expect("server")
            .stop();
        self.create_claims(&format!("during-{name}"), n).await;
        for v in &victims {
            self.world.delete_claim(v).await;
        }
        tokio::time::sleep(outage).await;
        self.world
            .playground
            .env
            .apiserver_mut(name)
            .expect("server")
            .restart()
            .await
            .expect("API server restarts");
        let back = Instant::now();
        self.wait_all_available(&format!("after the {name} outage"))
            .await;
        back.elapsed()
    }
}

/// The chaos provider: one type, `small`, keeping `warm` warm VMs.
fn chaos_provider(warm: u32) -> String {
    provider_yaml(
        "chaos",
        "test-kubevirt-1",
        "1",
        "1Gi",
        &format!("      - name: small\n        warm:\n          replicas: {warm}"),
    )
}

/// What is left on the host of warm VMs: their ServiceAccounts, Roles, RoleBindings,
/// Leases and Secrets (by their warm-VM label), and warm VMs.
async fn warm_objects_left(world: &World) -> usize {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::Api;
    let ns = "vcluster-platform";
    let lp = ListParams::default().labels(LABEL_WARM_VM);
    let host = &world.host;
    let count = |n: Result<usize, kube::Error>| n.expect("list warm objects");
    count(
        Api::<ServiceAccount>::namespaced(host.clone(), ns)
            .list_metadata(&lp)
            .await
            .map(|l| l.items.len()),
    ) + count(
        Api::<Role>::namespaced(host.clone(), ns)
            .list_metadata(&lp)
            .await
            .map(|l| l.items.len()),
    ) + count(
        Api::<RoleBinding>::namespaced(host.clone(), ns)
            .list_metadata(&lp)
            .await
            .map(|l| l.items.len()),
    ) + count(
        Api::<Lease>::namespaced(host.clone(), ns)
            .list_metadata(&lp)
            .await
            .map(|l| l.items.len()),
    ) + count(
        Api::<Secret>::namespaced(host.clone(), ns)
            .list_metadata(&lp)
            .await
            .map(|l| l.items.len()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_controllers_and_stopped_api_servers_leak_and_duplicate_nothing() {
    let claims = setting("AUTONODES_CHAOS_CLAIMS", 100) as usize;
    let outage = Duration::from_secs(setting("AUTONODES_CHAOS_OUTAGE", 60));
    let delete = setting("AUTONODES_CHAOS_DELETE", 150) as usize;
    let seed = setting(
        "AUTONODES_CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1,
    );
    let mut rng = Rng(seed);
    let opts = WorldOptions {
        provider: chaos_provider(5),
        launch_timeout: Duration::from_secs(600),
        registration_timeout: Duration::from_secs(600),
        // The host's API server is stopped on its own while the management one stays up.
        separate_host: true,
        ..Default::default()
    };
    let mut world = World::start_clusters(&opts).await;
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    let controller = world.spawn_controller_process(0, env!("CARGO_BIN_EXE_autonodes"));
    let mut chaos = Chaos {
        world,
        controller,
        starts: 0,
        kills: 0,
        report: String::new(),
        host_peak: 0,
        host_rss_sampled: 0,
    };
    chaos.line(format!(
        "seed {seed}; {claims} claims, outages of {}s, {delete} deletions at once",
        outage.as_secs()
    ));
    let mut leaked = 0;
    let mut duplicated = 0;

    // 1. Provisioning, the controller killed three times at random moments. The type's
    // warm VMs are ready first, so the first claims take them while the kills happen.
    let start = Instant::now();
    loop {
        let types: kube::api::Api<autonodes_api::NodeType> =
            kube::api::Api::all(chaos.world.mgmt.clone());
        let t = types.get_opt("chaos.small").await.ok().flatten();
        let ready = t
            .and_then(|t| t.status)
            .and_then(|s| s.warm)
            .map_or(0, |w| w.ready);
        if ready == 5 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "warm VMs not ready: {ready} of 5"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    chaos.create_claims("chaos", claims).await;
    let started = Instant::now();
    for _ in 0..3 {
        tokio::time::sleep(rng.millis(300, 3000)).await;
        chaos.restart_controller();
    }
    let recovered = chaos.wait_all_available("provisioning under kills").await;
    chaos.line(format!(
        "provisioning: {claims} claims Available {:.1}s after creation, {:.1}s after the last of 3 kills",
        started.elapsed().as_secs_f64(),
        recovered.as_secs_f64()
    ));
    let (l, d) = chaos.audit("after provisioning").await;
    leaked += l;
    duplicated += d;

    // 2. Cleanup, killed twice: a third of the claims deleted.
    let third: Vec<String> = chaos
        .claims()
        .await
        .iter()
        .take(claims / 3)
        .map(|c| c.name_any())
        .collect();
    for name in &third {
        chaos.world.delete_claim(name).await;
    }
    for _ in 0..2 {
        tokio::time::sleep(rng.millis(200, 2000)).await;
        chaos.restart_controller();
    }
    let start = Instant::now();
    loop {
        let names: BTreeSet<String> = chaos.claims().await.iter().map(|c| c.name_any()).collect();
        if third.iter().all(|n| !names.contains(n)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "cleanup under kills stalled"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    chaos.line(format!(
        "cleanup: {} claims gone {:.1}s after the last of 2 kills",
        third.len(),
        start.elapsed().as_secs_f64()
    ));
    let (l, d) = chaos.audit("after cleanup under kills").await;
    leaked += l;
    duplicated += d;

    // 3. and 4. Each remote API server down for the outage while claims come and go.
    for name in ["host", "tenant"] {
        let took = chaos.outage(name, outage, 5).await;
        chaos.line(format!(
            "{name} API server down {}s: 5 claims created and 5 deleted meanwhile; settled {:.1}s after it came back",
            outage.as_secs(),
            took.as_secs_f64()
        ));
        let (l, d) = chaos.audit(&format!("after the {name} outage")).await;
        leaked += l;
        duplicated += d;
    }

    // 5. Many claims deleted at once.
    let have = chaos.claims().await.len();
    if delete > have {
        chaos.create_claims("bulk", delete - have).await;
        let took = chaos.wait_all_available("bulk provisioning").await;
        chaos.line(format!(
            "bulk: {} more claims Available in {:.1}s",
            delete - have,
            took.as_secs_f64()
        ));
    }
    let all = chaos.claims().await;
    let api = chaos.world.claims();
    chaos.host_rss_sampled = 0;
    let start = Instant::now();
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("claims deleted");
    let took = chaos.wait_no_claims("deleting every claim").await;
    chaos.line(format!(
        "deleting {} claims at once: all gone in {:.1}s; host API server RSS meanwhile at most {} MB (sampled every 0.5 s)",
        all.len(),
        took.as_secs_f64().max(start.elapsed().as_secs_f64()),
        chaos.host_rss_sampled / 1_000_000
    ));
    // The type keeps no warm VMs any more: they go, with everything made for them.
    chaos.world.apply_provider(&chaos_provider(0)).await;
    let start = Instant::now();
    loop {
        let left = warm_objects_left(&chaos.world).await + chaos.world.vms().await.len();
        if left == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{left} warm VMs or their objects are left"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    chaos.line(format!(
        "warm replicas 0: the warm VMs and their credentials, Leases and Secrets gone in {:.1}s",
        start.elapsed().as_secs_f64()
    ));
    let (l, d) = chaos.audit("after deleting every claim").await;
    leaked += l;
    duplicated += d;
    leaked += warm_objects_left(&chaos.world).await;
    let nodes = chaos.world.nodes().await.len();
    let dvs = chaos.world.data_volumes().await.len();
    leaked += nodes + dvs;
    chaos.sample_host_memory();
    chaos.line(format!(
        "runs 1, controller kills {}, leaked {leaked}, duplicated {duplicated}, nodes left {nodes}, DataVolumes left {dvs}, host API server peak RSS over the run {} MB",
        chaos.kills,
        chaos.host_peak / 1_000_000
    ));
    let report_path = common::repo().join("target/chaos-report.txt");
    let _ = std::fs::write(&report_path, &chaos.report);
    assert_eq!(leaked, 0, "leaked objects:\n{}", chaos.report);
    assert_eq!(duplicated, 0, "duplicated objects:\n{}", chaos.report);
    chaos.controller.kill();
    chaos.world.shutdown().await;
}
