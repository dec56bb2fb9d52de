//! Workloads in the shape of Karpenter's scheduling benchmark, for the packing benchmark and
//! tests: a catalogue of node types of many sizes over three zones, and pending pods of six
//! kinds in equal parts — no rules, topology spread on the zone, topology spread on the
//! hostname, pod affinity on the hostname, pod affinity on the zone, pod anti-affinity on
//! the hostname — with cpu from {100m, 250m, 500m, 1, 1.5} and memory from {100Mi, 256Mi,
//! 512Mi, 1Gi, 2Gi, 4Gi}, and labels from a small set; all from a seed, so every run packs
//! the same pods. Then what the real kube-scheduler makes of the packer's nodes
//! ([`provision`]): the nodes created as the packer proposed them, the pods created, every
//! pod's fate, and more rounds for the pods the scheduler placed otherwise, as a dynamic
//! pool does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use autonodes_core::pool::pack::packer::pack;
use autonodes_core::pool::pack::{
    pod_request, Amount, Bin, Candidate, Limits, NodeShape, PendingPod, MAX_PODS_PER_NODE,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

/// The label every benchmark node type sets to its name.
pub const TYPE_LABEL: &str = "autonodes.io/node-type";
/// The zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The zones of the catalogue.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// A small deterministic generator (xorshift64*): the same seed gives the same pods.
#[derive(Clone, Debug)]
pub struct Seeded(u64);

impl Seeded {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Seeded {
        Seeded(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 33) as usize % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// One node type of the benchmark catalogue.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchType {
    /// Its name (and [`TYPE_LABEL`]).
    pub name: String,
    /// Cores.
    pub cpu: i128,
    /// GiB of memory.
    pub memory_gib: i128,
    /// Its zone.
    pub zone: &'static str,
    /// Its cost: by cores and memory, with a few percent between families.
    pub cost: i64,
}

/// `n` node types: sizes from 1 to 128 cores, 1 to 8 GiB per core, ten families, spread
/// over [`ZONES`].
pub fn bench_types(n: usize) -> Vec<BenchType> {
    const CORES: [i128; 10] = [1, 2, 4, 8, 12, 16, 32, 48, 64, 96];
    const GIB_PER_CORE: [i128; 4] = [1, 2, 4, 8];
    (0..n)
        .map(|i| {
            let cpu = CORES[i % CORES.len()];
            let memory_gib = cpu * GIB_PER_CORE[(i / CORES.len()) % GIB_PER_CORE.len()];
            let family = (i / (CORES.len() * GIB_PER_CORE.len())) as i128;
            // Per core 1,000 and per GiB 125, a family 0–9 % dearer.
            let base = cpu * 1000 + memory_gib * 125;
            BenchType {
                name: format!("f{family}-{cpu}c-{memory_gib}g-{i}"),
                cpu,
                memory_gib,
                zone: ZONES[i % ZONES.len()],
                cost: i64::try_from(base * (100 + family) / 100).unwrap_or(i64::MAX),
            }
        })
        .collect()
}

impl BenchType {
    /// Its resources, as packing counts them.
    pub fn amount(&self) -> Amount {
        Amount {
            cpu: self.cpu * 1000,
            memory: self.memory_gib << 30,
            pods: MAX_PODS_PER_NODE,
            ..Amount::default()
        }
    }

    /// Its node labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (TYPE_LABEL.to_string(), self.name.clone()),
            (ZONE_LABEL.to_string(), self.zone.to_string()),
        ])
    }

    /// It as a candidate of a dynamic pool.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            node_type: self.name.clone(),
            shape: NodeShape {
                labels: self.labels(),
                taints: Vec::new(),
            },
            allocatable: self.amount(),
            resources: self.amount(),
            room: None,
            cost: self.cost,
            requirements: Vec::new(),
        }
    }
}

fn resources(r: &mut Seeded) -> serde_json::Value {
    let cpu = r.pick(&["100m", "250m", "500m", "1", "1500m"]);
    let memory = r.pick(&["100Mi", "256Mi", "512Mi", "1Gi", "2Gi", "4Gi"]);
    json!({"requests": {"cpu": cpu, "memory": memory}})
}

fn label_value(r: &mut Seeded) -> &'static str {
    r.pick(&["a", "b", "c", "d", "e", "f", "g"])
}

fn pod(name: String, labels: serde_json::Value, r: &mut Seeded, extra: serde_json::Value) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9", "resources": resources(r)}],
        "terminationGracePeriodSeconds": 0,
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    }))
    .unwrap_or_default()
}

/// The kinds of pod, in the order [`diverse_pods`] makes them.
pub const KINDS: [&str; 6] = [
    "generic",
    "spread-zone",
    "spread-host",
    "affinity-host",
    "affinity-zone",
    "anti-host",
];

/// One pod of `kind` (one of [`KINDS`]), named `name`.
pub fn pod_of_kind(kind: &str, name: String, r: &mut Seeded) -> Pod {
    match kind {
        "spread-zone" | "spread-host" => {
            let key = if kind == "spread-zone" {
                ZONE_LABEL
            } else {
                "kubernetes.io/hostname"
            };
            let labels = json!({"my-label": label_value(r)});
            let selects = label_value(r);
            pod(
                name,
                labels,
                r,
                json!({"topologySpreadConstraints": [{
                    "maxSkew": 1,
                    "topologyKey": key,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"my-label": selects}},
                }]}),
            )
        }
        "affinity-host" | "affinity-zone" => {
            let key = if kind == "affinity-zone" {
                ZONE_LABEL
            } else {
                "kubernetes.io/hostname"
            };
            let labels = json!({"my-affinity": label_value(r)});
            let selects = label_value(r);
            pod(
                name,
                labels,
                r,
                json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "topologyKey": key,
                    "labelSelector": {"matchLabels": {"my-affinity": selects}},
                }]}}}),
            )
        }
        "anti-host" => pod(
            name,
            json!({"app": "nginx"}),
            r,
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": "nginx"}},
            }]}}}),
        ),
        _ => {
            let labels = json!({"my-label": label_value(r)});
            pod(name, labels, r, json!({}))
        }
    }
}

/// `count` pods of the six [`KINDS`] in equal parts (the remainder generic), from `seed`.
pub fn diverse_pods(count: usize, seed: u64) -> Vec<Pod> {
    let mut r = Seeded::new(seed);
    let each = count / KINDS.len();
    let mut out = Vec::with_capacity(count);
    for kind in KINDS {
        for i in 0..each {
            out.push(pod_of_kind(kind, format!("{kind}-{i}"), &mut r));
        }
    }
    for i in 0..count - each * KINDS.len() {
        out.push(pod_of_kind("generic", format!("generic-extra-{i}"), &mut r));
    }
    out
}

/// `count` pods without rules, from `seed`.
pub fn generic_pods(count: usize, seed: u64) -> Vec<Pod> {
    let mut r = Seeded::new(seed);
    (0..count)
        .map(|i| pod_of_kind("generic", format!("generic-{i}"), &mut r))
        .collect()
}

/// The pods as the kube-scheduler should meet them: those with pod anti-affinity first
/// (each needs a node of its own, and takes whichever it meets first), then largest cpu,
/// then memory first, as the packer takes them.
pub fn scheduler_order(pods: &[Pod]) -> Vec<Pod> {
    let mut out = pods.to_vec();
    out.sort_by_key(|p| {
        let r = pod_request(p);
        let anti = p
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .is_some_and(|a| a.pod_anti_affinity.is_some());
        (
            !anti,
            std::cmp::Reverse((r.cpu, r.memory)),
            p.metadata.name.clone(),
        )
    });
    out
}

/// The fewest nodes the pods could need: for each resource (cpu, memory, pods), the sum of
/// the requests over the largest type's amount, rounded up; the largest of those.
pub fn lower_bound(requests: &[Amount], types: &[BenchType]) -> usize {
    let sum = requests.iter().fold(Amount::default(), |s, r| s.plus(r));
    let most = |f: fn(&Amount) -> i128| {
        types
            .iter()
            .map(|t| f(&t.amount()))
            .max()
            .unwrap_or(1)
            .max(1)
    };
    let need = |total: i128, per: i128| ((total + per - 1) / per).max(0) as usize;
    need(sum.cpu, most(|a| a.cpu))
        .max(need(sum.memory, most(|a| a.memory)))
        .max(need(sum.pods, most(|a| a.pods)))
}

/// A little more than the kube-scheduler's longest wait before it tries an unschedulable
/// pod again without a cluster event (`podMaxInUnschedulablePodsDuration`, one minute).
const UNSCHEDULABLE_RETRY: Duration = Duration::from_secs(70);

/// One round of [`provision`]: the packer's new nodes for the pods still pending, then
/// what the kube-scheduler bound.
#[derive(Debug, Default)]
pub struct Round {
    /// The pods packed this round.
    pub pending_before: usize,
    /// Nodes the packer added.
    pub nodes_added: usize,
    /// Pods the packer found no node for (their rules allow none).
    pub blocked: BTreeSet<String>,
    /// Bound pods after the round, by name, to their node.
    pub bound: BTreeMap<String, String>,
    /// Pods left unbound after the round, by name, with the scheduler's last message.
    pub pending: BTreeMap<String, String>,
    /// From the round's nodes created to its last pod bound.
    pub took: Duration,
}

/// Names of pods without `namespace/`.
fn names(keys: &[String]) -> BTreeSet<String> {
    keys.iter()
        .map(|k| k.rsplit('/').next().unwrap_or(k).to_string())
        .collect()
}

/// The dynamic pool's loop with the real kube-scheduler against `client`: pack the pending
/// pods onto the room of the nodes made so far and new nodes of `types`, create those
/// nodes (and, the first time, the pods in the order given), wait until the scheduler
/// bound them all or none more for `patience`, and go again for the pods it left pending
/// (it may place pods elsewhere than the packer did), at most `rounds` times.
pub async fn provision(
    client: &Client,
    types: &[BenchType],
    pods: &[Pod],
    rounds: usize,
    patience: Duration,
) -> Result<Vec<Round>, kube::Error> {
    let by_name: BTreeMap<&str, &BenchType> = types.iter().map(|t| (t.name.as_str(), t)).collect();
    let candidates: Vec<Candidate> = types.iter().map(BenchType::candidate).collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let wanted: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // Nodes made so far: name and type.
    let mut made: Vec<(String, &BenchType)> = Vec::new();
    let mut out: Vec<Round> = Vec::new();
    let mut current: Vec<Pod> = pods.to_vec();
    for r in 0..rounds {
        let pending: Vec<PendingPod> = current
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .map(PendingPod::from_pod)
            .collect();
        let bins: Vec<Bin> = made
            .iter()
            .map(|(name, t)| {
                let on: Vec<&Pod> = current
                    .iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
                    .collect();
                let used = on
                    .iter()
                    .fold(Amount::default(), |sum, p| sum.plus(&pod_request(p)));
                Bin {
                    claim: name.clone(),
                    shape: NodeShape {
                        labels: t.labels(),
                        taints: Vec::new(),
                    },
                    free: t.amount().minus(&used),
                    residents: on.iter().map(|p| PendingPod::from_pod(p)).collect(),
                    replaceable: false,
                }
            })
            .collect();
        let packing = pack(
            &pending,
            &bins,
            &candidates,
            &Limits::default(),
            (0, Amount::default()),
        );
        let mut round = Round {
            pending_before: pending.len(),
            nodes_added: packing.new_nodes.len(),
            blocked: names(&packing.blocked_by_constraints),
            ..Round::default()
        };
        round.blocked.extend(names(&packing.blocked_by_capacity));
        for g in &packing.blocked_groups {
            round.blocked.extend(names(&g.pods));
        }
        for (i, n) in packing.new_nodes.iter().enumerate() {
            if let Some(t) = by_name.get(n.node_type.as_str()) {
                let name = format!("packed-{r}-{i}");
                create_node(client, &name, t).await?;
                made.push((name, t));
            }
        }
        let start = Instant::now();
        if r == 0 {
            for p in pods {
                api.create(&PostParams::default(), p).await?;
            }
        }
        // A round that adds no node gives the scheduler no event to look again at the pods
        // it found no room for; it retries them on its own within a minute.
        // A round that found no node at all for its pods has nothing to wait for.
        let patience = if r == 0 || round.nodes_added > 0 {
            patience
        } else if packing.placed.is_empty() {
            Duration::ZERO
        } else {
            patience.max(UNSCHEDULABLE_RETRY)
        };
        let mut last_progress = Instant::now();
        let mut bound_before = None;
        loop {
            current = list_paged(&api)
                .await?
                .into_iter()
                .filter(|p| p.metadata.name.as_ref().is_some_and(|n| wanted.contains(n)))
                .collect();
            round.bound.clear();
            round.pending.clear();
            for p in &current {
                let name = p.metadata.name.clone().unwrap_or_default();
                match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    Some(node) => {
                        round.bound.insert(name, node);
                    }
                    None => {
                        let message = p
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                            .and_then(|c| c.message.clone())
                            .unwrap_or_else(|| "not looked at yet".into());
                        round.pending.insert(name, message);
                    }
                }
            }
            if round.pending.is_empty() {
                round.took = start.elapsed();
                break;
            }
            if bound_before != Some(round.bound.len()) {
                bound_before = Some(round.bound.len());
                last_progress = Instant::now();
                round.took = start.elapsed();
            } else if last_progress.elapsed() > patience {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let done = round.pending.is_empty() || round.nodes_added == 0;
        out.push(round);
        if done {
            break;
        }
    }
    Ok(out)
}

/// Every object of `api`, 500 a page.
pub async fn list_paged<K>(api: &Api<K>) -> Result<Vec<K>, kube::Error>
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// A ready Node of type `t` named `name` (created, then its status written: the API server
/// ignores a new Node's status; then its not-ready taint lifted).
async fn create_node(client: &Client, name: &str, t: &BenchType) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels = t.labels();
    labels.insert("kubernetes.io/hostname".into(), name.to_string());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
    }))
    .unwrap_or_default();
    nodes.create(&PostParams::default(), &node).await?;
    let amount = json!({
        "cpu": t.cpu.to_string(),
        "memory": format!("{}Gi", t.memory_gib),
        "pods": MAX_PODS_PER_NODE.to_string(),
    });
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": amount,
        "allocatable": amount,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "benchmark node", "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    // The API server taints a new Node not-ready; the node lifecycle controller, which
    // does not run here, lifts that once the Node is Ready.
    let untainted = json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untainted))
        .await?;
    Ok(())
}
