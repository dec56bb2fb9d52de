//! Dynamic pools at scale on real API servers: one tenant whose teams each have a namespace
//! and a dynamic pool of their own (their pods select the pool's nodes by a label), pending
//! pods of the packing benchmark's six kinds ([`autonodes_testenv::workloads`]) created all
//! at once in a seeded random order, the controller as a process of its own, the KubeVirt
//! simulator playing the guests, and the real kube-scheduler binding the pods to the nodes
//! that join. What a run shows: the time from the last pod created to the last claim
//! created and to the last pod bound, writes per claim, the controller's CPU and peak
//! memory, and every pod left pending with the scheduler's reason.
//!
//! The integration test (`tests/it/packing.rs`) runs it small; the benchmark
//! (`benches/pools_at_scale.rs`) at 2,000 pods over 10 pools, in both [`Order`]s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autonodes_api::{NodeClaim, LABEL_NODEPOOL};
use autonodes_core::pool::pack::is_unschedulable;
use autonodes_testenv::testenv::{process_cpu_seconds, process_memory};
use autonodes_testenv::workloads::{self, Seeded};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodAffinityTerm};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;

use super::measure::{self, mb, MeteredController, Requests, Totals};
use crate::common::world::{pool_condition, provider_yaml, World, WorldOptions, NS};

/// The node label that tells the teams' pools apart (each pool sets it on its nodes; each
/// team's pods select it).
pub const POOL_LABEL: &str = "workload-pool";

/// How long a run waits on when no pod was bound and no claim created: past the
/// kube-scheduler's one-minute retry of unschedulable pods and a pool's next plan.
const QUIET: Duration = Duration::from_secs(120);

/// The NodeProvider the pools use.
pub const PROVIDER: &str = "at-scale";

/// The provider [`PROVIDER`]: four node types from 4 to 16 CPU, each in the host's two zones.
pub fn provider() -> String {
    let zones = "\n        properties:\n          topology.kubernetes.io/zone: zone-a,zone-b";
    let types = [("c4", "4", "8Gi"), ("c8", "8", "16Gi"), ("m8", "8", "32Gi"), ("c16", "16", "32Gi")]
        .iter()
        .map(|(name, cpu, memory)| {
            format!("      - name: {name}\n        resources:\n          cpu: {cpu}\n          memory: {memory}{zones}")
        })
        .collect::<Vec<_>>()
        .join("\n");
    provider_yaml(PROVIDER, "test-kubevirt-1", "4", "8Gi", &types)
}

/// The test clusters (no controller, no simulator: [`run`] starts them) with [`provider`].
pub async fn world() -> World {
    World::start_clusters(&WorldOptions {
        provider: provider(),
        ..Default::default()
    })
    .await
}

/// Pod `i`'s team: its namespace and its pool.
fn team(i: usize, pools: usize) -> (String, String) {
    (format!("team-{}", i % pools), format!("pool-{}", i % pools))
}

/// The order in which a run creates its pods.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Order {
    /// Kind by kind, as a tenant's deployments would create them: the pods of one kind
    /// are marked unschedulable close together and mostly packed in one batch.
    ByKind,
    /// All kinds mixed at random: pods with required affinity on the hostname come in
    /// every batch, and some find their partners' nodes, packed in an earlier batch,
    /// already full.
    Shuffled,
}

/// `pods` pods of the six kinds, team by team (pod `i` to team `i % pools`, in the team's
/// namespace and selecting the team's pool), in `order` (at random from `seed`).
pub fn team_pods(pods: usize, pools: usize, seed: u64, order: Order) -> Vec<Pod> {
    let mut out: Vec<Pod> = workloads::diverse_pods(pods, seed)
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            let (namespace, pool) = team(i, pools);
            p.metadata.namespace = Some(namespace);
            if let Some(spec) = p.spec.as_mut() {
                spec.node_selector = Some(BTreeMap::from([(POOL_LABEL.to_string(), pool)]));
            }
            p
        })
        .collect();
    if order == Order::Shuffled {
        let mut r = Seeded::new(seed ^ 0x5eed);
        for i in (1..out.len()).rev() {
            out.swap(i, r.below(i + 1));
        }
    }
    out
}

/// The pods (`namespace/name`) that can never run: a required pod-affinity term of theirs
/// selects no pod of their namespace that can run, and not themselves (the kube-scheduler
/// lets a pod start a group when no running pod matches its term but it matches the term
/// itself). With few pods per team some of the benchmark's random labels find no partner.
pub fn can_never_run(pods: &[Pod]) -> BTreeSet<String> {
    let selects = |term: &PodAffinityTerm, p: &Pod| {
        let wanted = term
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref());
        wanted.is_some_and(|wanted| {
            wanted
                .iter()
                .all(|(k, v)| p.labels().get(k).is_some_and(|have| have == v))
        })
    };
    let terms = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .clone()
            })
            .unwrap_or_default()
    };
    // The pods that can run, grown until no more join.
    let mut run = vec![false; pods.len()];
    loop {
        let mut grew = false;
        for (i, p) in pods.iter().enumerate() {
            if run[i] {
                continue;
            }
            let can = terms(p).iter().all(|term| {
                selects(term, p)
                    || pods
                        .iter()
                        .enumerate()
                        .any(|(j, q)| run[j] && q.namespace() == p.namespace() && selects(term, q))
            });
            if can {
                run[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    pods.iter()
        .zip(run)
        .filter(|(_, run)| !run)
        .map(|(p, _)| key(p))
        .collect()
}

/// When each claim and each pod was first seen, by name, as watches report them.
#[derive(Default)]
struct Seen {
    claims: BTreeMap<String, Instant>,
    marked: BTreeMap<String, Instant>,
    bound: BTreeMap<String, Instant>,
}

/// Watches the claims and the tenant's pods, recording in `seen` when each claim appeared
/// and each pod was first seen marked unschedulable by the kube-scheduler, and bound.
fn watch(world: &World, seen: &Arc<Mutex<Seen>>) -> Vec<tokio::task::JoinHandle<()>> {
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.clone(), NS);
    let pods: Api<Pod> = Api::all(world.tenant.clone());
    let s = seen.clone();
    let claim_task = tokio::spawn(async move {
        let mut stream = watcher(claims, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let mut seen = s.lock().expect("lock");
            for c in touched(event) {
                seen.claims.entry(c.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    let s = seen.clone();
    let pod_task = tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let mut seen = s.lock().expect("lock");
            for p in touched(event) {
                if is_unschedulable(&p) {
                    seen.marked.entry(key(&p)).or_insert_with(Instant::now);
                }
                if p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                    seen.bound.entry(key(&p)).or_insert_with(Instant::now);
                }
            }
        }
    });
    vec![claim_task, pod_task]
}

/// The objects a watch event shows.
fn touched<K>(event: watcher::Event<K>) -> Vec<K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => vec![o],
        _ => Vec::new(),
    }
}

/// `namespace/name` of a pod.
fn key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// What one run showed.
pub struct Figures {
    /// Pods created.
    pub pods: usize,
    /// Pools (and teams).
    pub pools: usize,
    /// The order the pods were created in.
    pub order: Order,
    /// The controller's flags beyond the defaults.
    pub flags: String,
    /// Seconds from the first pod created to the last.
    pub created_in: f64,
    /// Claims the pools created, by pool.
    pub claims_by_pool: BTreeMap<String, usize>,
    /// The tenant's Nodes at the end.
    pub nodes: usize,
    /// Seconds from the last pod created to the last pod the kube-scheduler marked
    /// unschedulable (dynamic pools plan for such pods only).
    pub to_last_marked: f64,
    /// Seconds from the last pod created to the first and the last claim created.
    pub to_first_claim: f64,
    /// See [`Figures::to_first_claim`].
    pub to_last_claim: f64,
    /// Seconds from the last pod created to the last pod bound.
    pub to_last_bound: f64,
    /// Pods bound.
    pub bound: usize,
    /// The controller's requests over the run.
    pub controller: Requests,
    /// All API servers' requests over the run.
    pub servers: Requests,
    /// The controller's CPU seconds over the run.
    pub controller_cpu: f64,
    /// The controller's peak resident memory, bytes.
    pub controller_peak_rss: u64,
    /// Pods left pending at the end.
    pub pending: Vec<Pending>,
}

/// A pod left pending at the end of a run.
pub struct Pending {
    /// `namespace/name`.
    pub pod: String,
    /// Whether it is one of [`can_never_run`].
    pub can_never_run: bool,
    /// The kube-scheduler's message.
    pub scheduler: String,
    /// The status and reason of its pool's `Ready` condition (`False PodRulesUnsatisfiable`
    /// when the pool's packer found no node for it either).
    pub pool_ready: String,
}

impl Figures {
    /// Claims created in all.
    pub fn claims(&self) -> usize {
        self.claims_by_pool.values().sum()
    }

    /// The run as a few lines of text, each starting with `pools at scale:`.
    pub fn lines(&self) -> Vec<String> {
        let claims = self.claims().max(1) as f64;
        let controller = Totals::per_claim(&self.controller, claims);
        let servers = Totals::per_claim(&self.servers, claims);
        let mut by_cluster: BTreeMap<&str, f64> = BTreeMap::new();
        for ((cluster, verb, _, _), n) in &self.controller {
            if measure::is_write(verb) {
                *by_cluster.entry(cluster.as_str()).or_default() += n / claims;
            }
        }
        let (fewest, most) = (
            self.claims_by_pool.values().min().copied().unwrap_or(0),
            self.claims_by_pool.values().max().copied().unwrap_or(0),
        );
        let by_pool = self
            .claims_by_pool
            .iter()
            .map(|(pool, n)| format!("{pool} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out = vec![
            format!(
                "{} pods over {} pools, created {}{}: {} claims ({fewest} to {most} per pool), {} nodes, {} of {} pods bound",
                self.pods,
                self.pools,
                match self.order {
                    Order::ByKind => "kind by kind",
                    Order::Shuffled => "in a random order",
                },
                if self.flags.is_empty() {
                    String::new()
                } else {
                    format!(", controller {}", self.flags)
                },
                self.claims(),
                self.nodes,
                self.bound,
                self.pods
            ),
            format!("claims by pool: {by_pool}"),
            format!(
                "pods created in {:.1} s; last pod created → last marked unschedulable {:.1} s, → first claim created {:.1} s, → last claim created {:.1} s, → last pod bound {:.1} s",
                self.created_in, self.to_last_marked, self.to_first_claim, self.to_last_claim, self.to_last_bound
            ),
            format!(
                "writes per claim: the controller's {:.1} ({}), all API servers' {:.1} (with the scheduler's bindings and the simulator's VMs and Nodes)",
                controller.writes,
                by_cluster
                    .iter()
                    .map(|(cluster, n)| format!("{cluster} {n:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                servers.writes
            ),
            format!(
                "controller: CPU {:.1} s ({:.1} ms per pod), peak RSS {:.0} MB; its reads per claim {:.1} ({:.2} LISTs)",
                self.controller_cpu,
                self.controller_cpu * 1000.0 / self.pods.max(1) as f64,
                mb(self.controller_peak_rss),
                controller.reads,
                controller.lists
            ),
        ];
        let never = self.pending.iter().filter(|p| p.can_never_run).count();
        if never > 0 {
            out.push(format!(
                "{never} pods can never run (a required pod affinity of theirs selects no pod of their team) and are pending"
            ));
        }
        for p in self.pending.iter().filter(|p| !p.can_never_run) {
            out.push(format!(
                "pending {}: pool Ready {}; scheduler: {}",
                p.pod, p.pool_ready, p.scheduler
            ));
        }
        out.into_iter()
            .map(|l| format!("pools at scale: {l}"))
            .collect()
    }
}

/// The scheduler's message on a pending pod.
fn scheduler_message(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}

/// Runs `pods` pending pods over `pools` teams on `world` (clusters only: this starts the
/// simulator, the kube-scheduler and the controller with `flags`), created in `order`,
/// waiting at most `limit` for every pod to be bound.
pub async fn run(
    world: &mut World,
    pods: usize,
    pools: usize,
    order: Order,
    flags: &[&str],
    limit: Duration,
) -> Figures {
    world
        .start_simulator(autonodes_testenv::simulator::SimMode::Normal)
        .await;
    let _scheduler = world
        .playground
        .env
        .start_scheduler("tenant")
        .expect("kube-scheduler started");
    let controller = MeteredController::start_with(world, 1, flags).await;
    let namespaces: Api<Namespace> = Api::all(world.tenant.clone());
    for i in 0..pools {
        let (namespace, pool) = team(i, pools);
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))
                .expect("namespace");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("team namespace created");
        world
            .create_pool(
                &pool,
                // No consolidation: the tenant runs no controllers that would make the
                // pods of a drained node again, and the run measures scaling up.
                serde_json::json!({
                    "providerRef": PROVIDER,
                    "labels": {POOL_LABEL: pool},
                    "disruption": {"consolidateAfter": "Never"},
                }),
            )
            .await;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watches = watch(world, &seen);
    let servers_before = measure::server_requests(world).await;
    let controller_before = controller.requests().await;
    let cpu_before = process_cpu_seconds(controller.pid()).unwrap_or(0.0);

    let created = team_pods(pods, pools, 42, order);
    let never = can_never_run(&created);
    let creates = created.into_iter().map(|p| {
        let api: Api<Pod> =
            Api::namespaced(world.tenant.clone(), &p.namespace().unwrap_or_default());
        async move {
            api.create(&PostParams::default(), &p)
                .await
                .unwrap_or_else(|e| panic!("creating pod {}: {e}", p.name_any()))
        }
    });
    let first_created = Instant::now();
    futures::stream::iter(creates)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let last_created = Instant::now();

    // Until every pod that can run is bound, or nothing moved (no pod bound, no claim
    // created) for [`QUIET`], or `limit`.
    let deadline = last_created + limit;
    let mut last = (0, 0);
    let mut moved = Instant::now();
    loop {
        let now = {
            let seen = seen.lock().expect("lock");
            (seen.bound.len(), seen.claims.len())
        };
        if now.0 >= pods - never.len() || Instant::now() >= deadline || moved.elapsed() > QUIET {
            break;
        }
        if now != last {
            (last, moved) = (now, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let servers = measure::diff(&measure::server_requests(world).await, &servers_before);
    let controller_requests = measure::diff(&controller.requests().await, &controller_before);
    let controller_cpu = process_cpu_seconds(controller.pid()).unwrap_or(0.0) - cpu_before;
    let controller_peak_rss = process_memory(controller.pid()).map_or(0, |(_, peak)| peak);
    for w in watches {
        w.abort();
    }
    let since = |at: Option<&Instant>| {
        at.map_or(0.0, |at| {
            at.saturating_duration_since(last_created).as_secs_f64()
        })
    };
    let (to_last_marked, to_first_claim, to_last_claim, to_last_bound, bound) = {
        let seen = seen.lock().expect("lock");
        (
            since(seen.marked.values().max()),
            since(seen.claims.values().min()),
            since(seen.claims.values().max()),
            since(seen.bound.values().max()),
            seen.bound.len(),
        )
    };
    let claims = workloads::list_paged(&world.claims())
        .await
        .expect("claims listed");
    let mut claims_by_pool: BTreeMap<String, usize> =
        (0..pools).map(|i| (team(i, pools).1, 0)).collect();
    for c in &claims {
        if let Some(pool) = c.labels().get(LABEL_NODEPOOL) {
            *claims_by_pool.entry(pool.clone()).or_default() += 1;
        }
    }
    let mut pending = Vec::new();
    for p in workloads::list_paged(&Api::<Pod>::all(world.tenant.clone()))
        .await
        .expect("pods listed")
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
    {
        let pool = p
            .spec
            .as_ref()
            .and_then(|s| s.node_selector.as_ref())
            .and_then(|s| s.get(POOL_LABEL))
            .cloned()
            .unwrap_or_default();
        let ready = match world.pools().get(&pool).await {
            Ok(np) => {
                pool_condition(&np, "Ready").map(|(status, reason, _)| format!("{status} {reason}"))
            }
            Err(_) => None,
        };
        pending.push(Pending {
            pod: key(p),
            can_never_run: never.contains(&key(p)),
            scheduler: scheduler_message(p),
            pool_ready: ready.unwrap_or_default(),
        });
    }
    Figures {
        pods,
        pools,
        order,
        flags: flags.join(" "),
        created_in: last_created.duration_since(first_created).as_secs_f64(),
        claims_by_pool,
        nodes: world.nodes().await.len(),
        to_last_marked,
        to_first_claim,
        to_last_claim,
        to_last_bound,
        bound,
        controller: controller_requests,
        servers,
        controller_cpu,
        controller_peak_rss,
        pending,
    }
}
