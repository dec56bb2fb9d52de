//! Many tenant clusters on one replica, on real API servers, printed, never asserted.
//!
//! N tenant namespaces on the management cluster, each with its own `vc-tenant` Secret and
//! one dynamic NodePool: every Secret reaches the same real tenant kube-apiserver, each with
//! an identity of its own (a client certificate per tenant), which is all autonodes tells
//! tenants apart by. The controller runs as its own process (`autonodes run`), the KubeVirt
//! simulator plays the guests. For each N it prints:
//!
//! - the controller's RSS before any tenant, with N idle tenants (each pool `Ready`, no
//!   pending pod), and the growth per idle tenant;
//! - the watches the controller holds on the tenant API server (its
//!   `apiserver_longrunning_gauge` of WATCH requests, less the simulator's) and its
//!   established connections to it;
//! - then `AUTONODES_BENCH_CLAIMS_PER_TENANT` claims per tenant (default 2), created tenant
//!   by tenant, 32 at a time: claims/s until all are Available, creation → Ready p50/p90 of
//!   the first tenth of the tenants and of the last tenth, the controller's peak RSS;
//! - a restart (SIGKILL, then a new process): the time until it holds all its tenant
//!   watches again (the re-list) and its RSS then.
//!
//! With `AUTONODES_BENCH_REPLICAS=3` (or `1,3`: both, one after the other) the tenants are
//! shared by that many replicas (`--leader-elect --shard-tenants`): RSS is summed over them
//! (and the largest one's given), connections too, and instead of a restart one replica is
//! SIGKILLed and the others take its tenants: the time until every tenant is watched again.
//!
//! `cargo bench --bench many_tenants`; `AUTONODES_BENCH_TENANTS=100,1000` sets the sizes
//! (default `100`). Under `cargo test` it only says it was skipped.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "../tests/it/opscommon/mod.rs"]
mod opscommon;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autonodes_api::{NodeClaim, NodeClaimPhase, NodePool};
use autonodes_testenv::playground::put_kubeconfig_secret;
use autonodes_testenv::simulator::SimMode;
use autonodes_testenv::testenv::{client_cert_kubeconfig, process_memory};
use common::world::{pool_condition, provider_yaml, World, WorldOptions};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use opscommon::measure::{
    bench_runtime, bench_sizes, connections_to, mb, server_gauge, MeteredController as Controller,
};

/// jemalloc, as in the `autonodes` binary: this process runs the simulator.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Writes in flight while the tenants and claims are made.
const IN_FLIGHT: usize = 32;
/// The provider and its one type.
const PROVIDER: &str = "tenants";
const TYPE: &str = "tenants.small";

fn provider() -> String {
    provider_yaml(
        PROVIDER,
        "test-kubevirt-1",
        "1",
        "1Gi",
        "      - name: small\n",
    )
}

/// Tenant `i`'s namespace.
fn tenant_ns(i: usize) -> String {
    format!("t-{i:05}")
}

fn main() {
    let Some(rt) = bench_runtime("many_tenants") else {
        return;
    };
    let tenants = bench_sizes("AUTONODES_BENCH_TENANTS", &[100]);
    let per_tenant = bench_sizes("AUTONODES_BENCH_CLAIMS_PER_TENANT", &[2])[0];
    let replicas = bench_sizes("AUTONODES_BENCH_REPLICAS", &[1]);
    rt.block_on(async {
        println!(
            "many tenant clusters on one replica (one etcd; management and host, and one tenant kube-apiserver behind an identity per tenant), 2 cores, {per_tenant} claims per tenant"
        );
        for n in tenants {
            for &r in &replicas {
                let figures = run(n, per_tenant, r).await;
                for line in figures {
                    println!("{line}");
                }
            }
        }
    });
}

/// Watches open on the tenant API server.
async fn tenant_watches(world: &World) -> f64 {
    server_gauge(&world.tenant, "apiserver_longrunning_gauge", |l| {
        l.get("verb").map(String::as_str) == Some("WATCH")
    })
    .await
}

fn rss(pid: u32) -> u64 {
    process_memory(pid).map_or(0, |(rss, _)| rss)
}

/// When each object of a watch first satisfied a predicate, by namespace and name (the
/// bench's own reads of the management cluster: one watch, not a list of every tenant's
/// objects per poll).
struct FirstSeen {
    seen: Arc<Mutex<BTreeMap<(String, String), Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FirstSeen {
    /// How many objects satisfied it so far.
    fn count(&self) -> usize {
        self.seen.lock().map_or(0, |s| s.len())
    }

    /// When each did.
    fn times(&self) -> BTreeMap<(String, String), Instant> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for FirstSeen {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches `api`, recording when each object first satisfies `pred`.
fn first_seen<K>(api: Api<K>, pred: fn(&K) -> bool) -> FirstSeen
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                let now = Instant::now();
                if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
                    if pred(&o) {
                        if let Ok(mut seen) = seen.lock() {
                            seen.entry((o.namespace().unwrap_or_default(), o.name_any()))
                                .or_insert(now);
                        }
                    }
                }
            }
        }
    });
    FirstSeen { seen, task }
}

/// The `p`th percentile of `values` (sorted here), in seconds.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i.min(values.len() - 1)]
}

/// Runs `f` on every item, `IN_FLIGHT` at a time.
async fn in_flight<T, F, Fut>(items: Vec<T>, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(items.into_iter().map(f))
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// One run with `n` tenants on fresh clusters.
/// The replicas serving the tenants: one, or several sharing them.
struct Replicas(Vec<Controller>);

impl Replicas {
    async fn start(world: &World, replicas: usize, first: u32) -> Replicas {
        let mut all = Vec::new();
        for k in 0..replicas {
            let n = first + u32::try_from(k).unwrap_or(0);
            all.push(match replicas {
                1 => Controller::start(world, n).await,
                _ => Controller::start_with(world, n, &["--leader-elect", "--shard-tenants"]).await,
            });
        }
        Replicas(all)
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Controller::pid).collect()
    }

    /// RSS summed over the replicas, and the largest one's.
    fn rss(&self) -> (u64, u64) {
        let each: Vec<u64> = self.pids().into_iter().map(rss).collect();
        (each.iter().sum(), each.iter().copied().max().unwrap_or(0))
    }

    fn connections(&self, port: u16) -> usize {
        self.pids()
            .into_iter()
            .map(|p| connections_to(p, port))
            .sum()
    }
}

async fn run(n: usize, per_tenant: usize, replicas: usize) -> Vec<String> {
    let mut out = vec![match replicas {
        1 => format!("  {n} tenant clusters:"),
        r => format!("  {n} tenant clusters shared by {r} replicas (--shard-tenants; RSS and connections summed over them):"),
    }];
    let mut world = World::start_clusters(&WorldOptions {
        provider: provider(),
        ..Default::default()
    })
    .await;
    world.start_simulator(SimMode::Normal).await;
    let tenant_port = world.playground.tenant().expect("tenant").port;
    let mut controller = Replicas::start(&world, replicas, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_empty = controller.rss().0;
    let watches_empty = tenant_watches(&world).await;

    // N tenants: a namespace, a Secret with an identity of its own, one dynamic pool.
    let started = Instant::now();
    let tenant = world.playground.tenant().expect("tenant");
    let identities: Vec<(usize, String)> = (0..n)
        .map(|i| {
            let (cert, key) = tenant
                .client_certificate(&format!("tenant-{i}"), &["system:masters"])
                .expect("a client certificate");
            (
                i,
                client_cert_kubeconfig("tenant", &tenant.url, &tenant.ca_pem, &cert, &key),
            )
        })
        .collect();
    let mgmt = world.mgmt.clone();
    in_flight(identities, |(i, kubeconfig)| {
        let mgmt = mgmt.clone();
        async move {
            let ns = tenant_ns(i);
            put_kubeconfig_secret(&mgmt, &ns, "vc-tenant", "config", &kubeconfig)
                .await
                .expect("the tenant's Secret");
            let pool: NodePool = serde_json::from_value(serde_json::json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "pool", "namespace": ns},
                "spec": {"vClusterRef": {"name": "tenant"}, "providerRef": PROVIDER,
                         "disruption": {"consolidateAfter": "Never"}},
            }))
            .expect("a pool");
            Api::<NodePool>::namespaced(mgmt, &ns)
                .create(&PostParams::default(), &pool)
                .await
                .expect("the tenant's pool");
        }
    })
    .await;
    let pools_ready = first_seen(Api::<NodePool>::all(world.mgmt.clone()), |p| {
        pool_condition(p, "Ready").is_some_and(|(s, _, _)| s == "True")
    });
    let made = started.elapsed();
    common::eventually(
        "every tenant's pool Ready",
        Duration::from_secs(600 + n as u64),
        || async { (pools_ready.count() == n).then_some(()) },
    )
    .await;
    let idle_after = started.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss_idle, rss_idle_largest) = controller.rss();
    let watches_idle = tenant_watches(&world).await - watches_empty;
    let connections_idle = controller.connections(tenant_port);
    out.push(format!(
        "    tenants made in {:.1}s, every pool Ready after {:.1}s",
        made.as_secs_f64(),
        idle_after.as_secs_f64()
    ));
    out.push(format!(
        "    controller RSS:                {:.1} MB with no tenant, {:.1} MB with {n} idle tenants (largest replica {:.1} MB): {:.0} KB per idle tenant",
        mb(rss_empty),
        mb(rss_idle),
        mb(rss_idle_largest),
        (rss_idle.saturating_sub(rss_empty)) as f64 / 1024.0 / n as f64
    ));
    out.push(format!(
        "    on the tenant API server:      {watches_idle:.0} watches ({:.2} per tenant), {connections_idle} connections ({:.2} per tenant)",
        watches_idle / n as f64,
        connections_idle as f64 / n as f64
    ));

    // Claims, tenant by tenant.
    let created_at = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let work: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (0..per_tenant).map(move |j| (i, j)))
        .collect();
    let total = work.len();
    let pids = controller.pids();
    let summed = move || pids.iter().map(|p| rss(*p)).sum::<u64>();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(summed()));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(summed(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let claims_available = first_seen(Api::<NodeClaim>::all(world.mgmt.clone()), |c| {
        c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
    });
    let started = Instant::now();
    {
        let created_at = created_at.clone();
        let mgmt = world.mgmt.clone();
        in_flight(work, move |(i, j)| {
            let mgmt = mgmt.clone();
            let created_at = created_at.clone();
            async move {
                let ns = tenant_ns(i);
                let claim: NodeClaim = serde_json::from_value(serde_json::json!({
                    "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                    "metadata": {"name": format!("c-{j}"), "namespace": ns},
                    "spec": {"vClusterRef": {"name": "tenant"}, "typeRef": TYPE},
                }))
                .expect("a claim");
                Api::<NodeClaim>::namespaced(mgmt, &ns)
                    .create(&PostParams::default(), &claim)
                    .await
                    .expect("claim created");
                if let Ok(mut c) = created_at.lock() {
                    c.insert((i, j), Instant::now());
                }
            }
        })
        .await;
    }
    let deadline = Duration::from_secs(900 + 2 * total as u64);
    while claims_available.count() < total {
        assert!(
            started.elapsed() < deadline,
            "{} of {total} claims Available after {deadline:?}",
            claims_available.count()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let created_at = created_at.lock().map(|m| m.clone()).unwrap_or_default();
    let ready_after: BTreeMap<(usize, usize), f64> = claims_available
        .times()
        .into_iter()
        .filter_map(|((ns, name), at)| {
            let i = ns.strip_prefix("t-")?.parse::<usize>().ok()?;
            let j = name.strip_prefix("c-")?.parse::<usize>().ok()?;
            let since = created_at.get(&(i, j))?;
            Some(((i, j), at.saturating_duration_since(*since).as_secs_f64()))
        })
        .collect();
    let all_in = started.elapsed().as_secs_f64();
    sampler.abort();
    let tenth = (n / 10).max(1);
    let mut first: Vec<f64> = ready_after
        .iter()
        .filter(|((i, _), _)| *i < tenth)
        .map(|(_, s)| *s)
        .collect();
    let mut last: Vec<f64> = ready_after
        .iter()
        .filter(|((i, _), _)| *i >= n - tenth)
        .map(|(_, s)| *s)
        .collect();
    let (first50, first90) = (percentile(&mut first, 0.5), percentile(&mut first, 0.9));
    let (last50, last90) = (percentile(&mut last, 0.5), percentile(&mut last, 0.9));
    let rss_busy = controller.rss().0;
    let watches_busy = tenant_watches(&world).await - watches_empty;
    out.push(format!(
        "    {total} claims Available in {all_in:.1}s: {:.1} claims/s",
        total as f64 / all_in
    ));
    out.push(format!(
        "    creation → Ready:              first {tenth} tenants p50 {first50:.1}s p90 {first90:.1}s; last {tenth} tenants p50 {last50:.1}s p90 {last90:.1}s (last ÷ first p90: {:.2})",
        last90 / first90
    ));
    out.push(format!(
        "    controller RSS:                peak {:.1} MB, {:.1} MB with every claim Available; {watches_busy:.0} tenant watches, {} connections",
        mb(peak.load(std::sync::atomic::Ordering::Relaxed)),
        mb(rss_busy),
        controller.connections(tenant_port)
    ));

    if replicas > 1 {
        // One replica SIGKILLed: the others take its tenants once its Lease expired.
        let mut gone = controller.0.remove(0);
        gone.process.kill();
        let killed = Instant::now();
        common::eventually(
            "the killed replica's watches gone",
            Duration::from_secs(60),
            || async {
                (tenant_watches(&world).await - watches_empty < watches_busy).then_some(())
            },
        )
        .await;
        common::eventually(
            "every tenant watched again",
            Duration::from_secs(600 + n as u64),
            || async {
                (tenant_watches(&world).await - watches_empty >= watches_busy).then_some(())
            },
        )
        .await;
        let relisted = killed.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (sum, largest) = controller.rss();
        out.push(format!(
            "    after one replica's SIGKILL:    every tenant watched again by the others after {relisted:.1}s (Lease 15s), RSS {:.1} MB (largest {:.1} MB)",
            mb(sum),
            mb(largest)
        ));
        drop(controller);
        world.shutdown().await;
        return out;
    }

    // A restart: the new process lists every tenant again.
    controller.0[0].process.kill();
    common::eventually(
        "the killed controller's watches gone",
        Duration::from_secs(120),
        || async { (tenant_watches(&world).await - watches_empty < 1.0).then_some(()) },
    )
    .await;
    let restarted = Instant::now();
    controller = Replicas::start(&world, 1, 2).await;
    let ready_in = restarted.elapsed().as_secs_f64();
    common::eventually(
        "every tenant watched again",
        Duration::from_secs(600 + n as u64),
        || async { (tenant_watches(&world).await - watches_empty >= watches_busy).then_some(()) },
    )
    .await;
    let relisted = restarted.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    out.push(format!(
        "    after a restart:               ready in {ready_in:.1}s, every tenant watched again after {relisted:.1}s, RSS {:.1} MB",
        mb(controller.rss().0)
    ));
    drop(controller);
    world.shutdown().await;
    out
}
