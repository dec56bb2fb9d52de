//! NodePool controller (DESIGN §2): keeps a pool's NodeClaims alive.
//!
//! - **Static pools** (`spec.replicas`): exactly N live claims from the pool's claim
//!   template. Scale-down removes the least valuable claims first (not yet Available, then
//!   newest) with at most `disruption.budget` Ready nodes draining at once; Failed claims are
//!   deleted and replaced; claims made from an older template (or older than
//!   `disruption.expireAfter`) are rolled by surge: a replacement is created first and the
//!   old claim is deleted once the replacement is Available.
//! - **Dynamic pools** (no `replicas`): the tenant's unschedulable pods that a node of the
//!   pool would accept are packed first-fit-decreasing onto the free room of the tenant's
//!   existing and in-flight nodes, then onto new claims of the cheapest accepting node type,
//!   never beyond `spec.limits`. Nodes without non-DaemonSet pods for
//!   `disruption.consolidateAfter` are removed.
//!
//! The planning is pure ([`plan_claims`], [`pack`], [`accepts`]); the reconcile reads the
//! pool's claims straight from the API server (never a lagging cache, so a claim created a
//! moment ago is always counted) and the tenant's pods and nodes, then creates and deletes
//! claims and writes the pool's status.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc::{self, UnboundedSender};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, Controller};
use kube::{Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::{apply_status, now, Context, Error};
use crate::api::{
    DurationOrNever, NodeClaim, NodeClaimPhase, NodeClaimSpec, NodePool, NodePoolLimits,
    NodePoolResources, NodePoolSpec, NodePoolStatus, ResourceList, LABEL_NODEPOOL,
};
use crate::clients::{remote_error_text, ClusterKey, Remote, REMOTE_TIMEOUT};
use crate::conditions::{self, status_of, TRUE};
use crate::resources::{self, ResourceAmounts, CPU, MEMORY};
use crate::scheduling::{self, Catalogue, ClaimRequest, PreparedType};

/// Label on a pool's claims: hash of the claim template they were made from.
pub const LABEL_TEMPLATE_HASH: &str = "autonodes.io/nodepool-template-hash";
/// Annotation on a replacement claim: the claim it replaces (rolling update, expiry).
pub const ANNOTATION_REPLACES: &str = "autonodes.io/replaces";
/// Annotation on a claim: remove this claim first when the pool scales down. The
/// `capi.autonodes.io` mirror sets it from the Machine's `capi.autonodes.io/delete-machine`.
pub const ANNOTATION_DELETE_FIRST: &str = "autonodes.io/delete-first";
/// Annotation on a dynamic pool's claim: since when its node runs no non-DaemonSet pod.
pub const ANNOTATION_EMPTY_SINCE: &str = "autonodes.io/empty-since";
/// Pool condition: demand is blocked by `spec.limits`.
pub const LIMIT_REACHED: &str = "LimitReached";
/// Pool condition: the pool has what it should (replicas Ready, no demand left unserved).
pub const READY: &str = "Ready";
/// Default of `disruption.consolidateAfter`.
pub const DEFAULT_CONSOLIDATE_AFTER: Duration = Duration::from_secs(30);
/// Default of `disruption.budget`.
pub const DEFAULT_BUDGET: usize = 1;
/// How long after a node became Ready its free room still counts for pods the scheduler
/// marked unschedulable (it may not have retried them yet). Afterwards such pods evidently
/// do not fit for reasons autonodes does not model, and new nodes are made for them.
pub const READY_NODE_GRACE: Duration = Duration::from_secs(30);
/// Pods a node takes at most (the kubelet's default `maxPods`).
pub const MAX_PODS_PER_NODE: i128 = 110;

// ---------------------------------------------------------------------------------------
// Claim template
// ---------------------------------------------------------------------------------------

/// The claim spec every claim of the pool starts from (without `desiredCapacity`/`typeRef`).
pub fn template_spec(pool: &NodePoolSpec) -> NodeClaimSpec {
    NodeClaimSpec {
        provider_ref: pool.provider_ref.clone(),
        type_ref: None,
        requirements: pool.requirements.clone(),
        desired_capacity: ResourceList::new(),
        v_cluster_ref: pool.v_cluster_ref.clone(),
        properties: pool.properties.clone(),
        taints: pool.taints.clone(),
        startup_taints: pool.startup_taints.clone(),
        labels: pool.labels.clone(),
        kubelet_args: pool.kubelet_args.clone(),
        kubernetes_version: None,
    }
}

/// A short stable hash of the pool's claim template: claims whose label differs are rolled.
pub fn template_hash(pool: &NodePoolSpec) -> String {
    let bytes = serde_json::to_vec(&template_spec(pool)).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// `<pool>-<5 random [a-z0-9]>`.
pub fn claim_name(pool: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let random = uuid::Uuid::new_v4();
    let suffix: String = random
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    crate::names::child_name(pool, &format!("-{suffix}"))
}

/// The label selector of a pool's claims (`status.selector`, for the scale subresource).
pub fn selector(pool: &str) -> String {
    format!("{LABEL_NODEPOOL}={}", crate::names::label_value(pool))
}

/// The effective disruption budget (`disruption.budget`, default 1, at least 1).
pub fn budget(pool: &NodePoolSpec) -> usize {
    pool.disruption
        .as_ref()
        .and_then(|d| d.budget)
        .map_or(DEFAULT_BUDGET, |b| usize::try_from(b).unwrap_or(1).max(1))
}

/// The effective `disruption.consolidateAfter` (default 30s; `None` for `Never`).
pub fn consolidate_after(pool: &NodePoolSpec) -> Option<Duration> {
    pool.disruption
        .as_ref()
        .and_then(|d| d.consolidate_after)
        .map_or(Some(DEFAULT_CONSOLIDATE_AFTER), DurationOrNever::after)
}

/// `disruption.expireAfter`, if set.
pub fn expire_after(pool: &NodePoolSpec) -> Option<Duration> {
    pool.disruption
        .as_ref()
        .and_then(|d| d.expire_after)
        .and_then(DurationOrNever::after)
}

// ---------------------------------------------------------------------------------------
// Planning claims (pure)
// ---------------------------------------------------------------------------------------

/// What the planner knows about one claim of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    /// The claim's name.
    pub name: String,
    /// Creation time, milliseconds since the epoch.
    pub created_ms: i64,
    /// Phase Available (its node is Ready).
    pub available: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Phase Failed.
    pub failed: bool,
    /// It has (had) a node in the tenant: deleting it drains a node.
    pub has_node: bool,
    /// Made from an older template, or older than `expireAfter`.
    pub outdated: bool,
    /// The claim this one replaces (annotation [`ANNOTATION_REPLACES`]).
    pub replaces: Option<String>,
    /// Marked to go first on scale-down (annotation [`ANNOTATION_DELETE_FIRST`]).
    pub delete_first: bool,
}

/// Why the planner deletes a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// The claim Failed; the pool replaces it.
    Failed,
    /// The claim is outdated and not serving yet: it goes, an up-to-date one takes its place.
    Outdated,
    /// The claim is outdated and its replacement is Available.
    Replaced,
    /// The pool has more claims than `replicas`.
    ScaleDown,
    /// Its node ran no non-DaemonSet pod for `consolidateAfter`.
    Empty,
}

impl DeleteReason {
    /// The Event reason for this deletion.
    pub fn event_reason(self) -> &'static str {
        match self {
            DeleteReason::Failed => "ReplacingFailedClaim",
            DeleteReason::Outdated => "RemovingOutdatedClaim",
            DeleteReason::Replaced => "ClaimReplaced",
            DeleteReason::ScaleDown => "ScaledDown",
            DeleteReason::Empty => "Consolidated",
        }
    }
}

/// Claims to create and delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One entry per claim to create: `Some(old)` for the replacement of `old`.
    pub create: Vec<Option<String>>,
    /// Claims to delete, with why.
    pub delete: Vec<(String, DeleteReason)>,
}

/// Plans the claims of a pool: Failed claims go; `desired` (static pools) is met by
/// creating claims or by deleting the least valuable ones (those marked
/// [`ANNOTATION_DELETE_FIRST`] first, then not Available, then outdated, then newest), never more Available ones draining than `budget`; outdated
/// claims are rolled by surge, at most `budget` replacements in flight, each old claim
/// deleted only once its replacement is Available.
pub fn plan_claims(claims: &[ClaimView], desired: Option<usize>, budget: usize) -> Plan {
    let mut plan = Plan::default();
    for c in claims.iter().filter(|c| c.failed && !c.terminating) {
        plan.delete.push((c.name.clone(), DeleteReason::Failed));
    }
    let live: Vec<&ClaimView> = claims
        .iter()
        .filter(|c| !c.terminating && !c.failed)
        .collect();
    let draining = claims
        .iter()
        .filter(|c| c.terminating && c.has_node)
        .count();
    let mut disrupt = budget.max(1).saturating_sub(draining);
    let replacement_of = |o: &ClaimView| -> Option<&ClaimView> {
        live.iter()
            .find(|r| r.replaces.as_deref() == Some(o.name.as_str()) && !r.outdated)
            .copied()
    };
    // A surge claim replaces a live outdated claim and does not take a slot of its own.
    let is_surge = |r: &ClaimView| {
        r.replaces
            .as_deref()
            .is_some_and(|o| live.iter().any(|x| x.name == o && x.outdated))
    };
    let counted: Vec<&ClaimView> = live.iter().filter(|c| !is_surge(c)).copied().collect();
    let mut slots = counted.len();

    if let Some(desired) = desired {
        if slots > desired {
            let mut order = counted.clone();
            order.sort_by_key(|c| {
                (
                    !c.delete_first,
                    c.available,
                    !c.outdated,
                    Reverse(c.created_ms),
                )
            });
            for c in order {
                if slots <= desired {
                    break;
                }
                if c.available {
                    if disrupt == 0 {
                        break;
                    }
                    disrupt -= 1;
                }
                plan.delete.push((c.name.clone(), DeleteReason::ScaleDown));
                if let Some(r) = replacement_of(c) {
                    plan.delete.push((r.name.clone(), DeleteReason::ScaleDown));
                }
                slots -= 1;
            }
            return plan;
        }
    }

    let mut surging = live.iter().filter(|r| is_surge(r) && !r.available).count();
    let mut outdated: Vec<&ClaimView> = counted.iter().filter(|c| c.outdated).copied().collect();
    outdated.sort_by_key(|c| (c.available, c.created_ms));
    for o in outdated {
        let replacement = replacement_of(o);
        if !o.available {
            plan.delete.push((o.name.clone(), DeleteReason::Outdated));
            if replacement.is_none() {
                slots -= 1;
            }
            continue;
        }
        match replacement {
            Some(r) if r.available => {
                if disrupt > 0 {
                    disrupt -= 1;
                    plan.delete.push((o.name.clone(), DeleteReason::Replaced));
                }
            }
            Some(_) => {}
            None => {
                if surging < budget.max(1) {
                    surging += 1;
                    plan.create.push(Some(o.name.clone()));
                }
            }
        }
    }
    if let Some(desired) = desired {
        for _ in slots..desired {
            plan.create.push(None);
        }
    }
    plan
}

// ---------------------------------------------------------------------------------------
// Packing pending pods (pure)
// ---------------------------------------------------------------------------------------

/// CPU (millicores), memory (bytes) and a pod count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount {
    /// Millicores.
    pub cpu: i128,
    /// Bytes.
    pub memory: i128,
    /// Pods.
    pub pods: i128,
}

impl Amount {
    /// Whether `want` fits into `self`.
    pub fn covers(&self, want: &Amount) -> bool {
        self.cpu >= want.cpu && self.memory >= want.memory && self.pods >= want.pods
    }

    /// `self + other`.
    pub fn plus(&self, other: &Amount) -> Amount {
        Amount {
            cpu: self.cpu + other.cpu,
            memory: self.memory + other.memory,
            pods: self.pods + other.pods,
        }
    }

    /// `self - other`, never below zero.
    pub fn minus(&self, other: &Amount) -> Amount {
        Amount {
            cpu: (self.cpu - other.cpu).max(0),
            memory: (self.memory - other.memory).max(0),
            pods: (self.pods - other.pods).max(0),
        }
    }

    /// The cpu and memory of a node type's resources, with room for [`MAX_PODS_PER_NODE`].
    pub fn of_node(amounts: &ResourceAmounts) -> Amount {
        Amount {
            cpu: amounts.cpu_millis(),
            memory: amounts.memory_bytes(),
            pods: MAX_PODS_PER_NODE,
        }
    }

    /// As a resource list (cpu, memory).
    pub fn to_resource_list(self) -> ResourceList {
        ResourceList::from([
            (CPU.to_string(), Quantity(resources::format_cpu(self.cpu))),
            (
                MEMORY.to_string(),
                Quantity(resources::format_memory(self.memory)),
            ),
        ])
    }
}

/// The labels and taints a node has: what a pod's selectors and tolerations are checked
/// against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeShape {
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints (startup taints excluded: they go once the node is ready).
    pub taints: Vec<Taint>,
}

/// One unschedulable pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingPod {
    /// `namespace/name`.
    pub key: String,
    /// Its requests (pods: 1).
    pub request: Amount,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The required node affinity's terms (any must match), if it has any.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
}

impl PendingPod {
    /// The pending-pod view of a pod.
    pub fn from_pod(pod: &Pod) -> PendingPod {
        let spec = pod.spec.clone().unwrap_or_default();
        PendingPod {
            key: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
            request: pod_request(pod),
            node_selector: spec.node_selector.unwrap_or_default(),
            required_terms: spec
                .affinity
                .and_then(|a| a.node_affinity)
                .and_then(|a| a.required_during_scheduling_ignored_during_execution)
                .map(|s| s.node_selector_terms),
            tolerations: spec.tolerations.unwrap_or_default(),
        }
    }
}

/// What a pod asks for: the sum of its containers' requests, at least the largest init
/// container's, plus the pod overhead; one pod.
pub fn pod_request(pod: &Pod) -> Amount {
    let Some(spec) = pod.spec.as_ref() else {
        return Amount {
            pods: 1,
            ..Amount::default()
        };
    };
    let requests = |c: &k8s_openapi::api::core::v1::Container| -> Amount {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        Amount {
            cpu: r
                .and_then(|r| r.get(CPU))
                .and_then(|q| resources::cpu_millis(q).ok())
                .unwrap_or(0),
            memory: r
                .and_then(|r| r.get(MEMORY))
                .and_then(|q| resources::memory_bytes(q).ok())
                .unwrap_or(0),
            pods: 0,
        }
    };
    let mut sum = spec
        .containers
        .iter()
        .map(requests)
        .fold(Amount::default(), |a, b| a.plus(&b));
    for init in spec.init_containers.iter().flatten() {
        let r = requests(init);
        sum.cpu = sum.cpu.max(r.cpu);
        sum.memory = sum.memory.max(r.memory);
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        sum.cpu += overhead
            .get(CPU)
            .and_then(|q| resources::cpu_millis(q).ok())
            .unwrap_or(0);
        sum.memory += overhead
            .get(MEMORY)
            .and_then(|q| resources::memory_bytes(q).ok())
            .unwrap_or(0);
    }
    sum.pods = 1;
    sum
}

fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| int(v)),
                values.first().and_then(|v| int(v)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // Fields name a node (metadata.name) that does not exist yet: such a term cannot be
    // satisfied by a new node. An empty term matches nothing (as in the scheduler).
    fields.is_empty() && !exprs.is_empty() && exprs.iter().all(|r| requirement_matches(r, labels))
}

/// Whether `toleration` tolerates `taint` (the scheduler's rules).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    if !effect_ok {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Whether a node of `shape` would accept the pod: its nodeSelector and required node
/// affinity match the labels, and it tolerates every NoSchedule/NoExecute taint.
pub fn accepts(shape: &NodeShape, pod: &PendingPod) -> bool {
    let selected = pod
        .node_selector
        .iter()
        .all(|(k, v)| shape.labels.get(k) == Some(v));
    let affine = pod
        .required_terms
        .as_ref()
        .filter(|terms| !terms.is_empty())
        .is_none_or(|terms| terms.iter().any(|t| term_matches(t, &shape.labels)));
    let tolerated = shape
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| pod.tolerations.iter().any(|tol| tolerates(tol, t)));
    selected && affine && tolerated
}

/// Room on a node that exists or is on its way (a live claim of the tenant).
#[derive(Clone, Debug, PartialEq)]
pub struct Bin {
    /// The claim.
    pub claim: String,
    /// Its labels and taints.
    pub shape: NodeShape,
    /// Room left.
    pub free: Amount,
}

/// A node type a dynamic pool may create claims of.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// NodeType name.
    pub node_type: String,
    /// Labels and taints its nodes get.
    pub shape: NodeShape,
    /// What pods may use on it (resources less `kubeReserved`).
    pub allocatable: Amount,
    /// Its resources (what counts against `limits`).
    pub resources: Amount,
    /// How many more claims it takes (`None`: unlimited).
    pub room: Option<i64>,
}

/// `spec.limits`, parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most nodes.
    pub nodes: Option<i64>,
    /// Most millicores.
    pub cpu: Option<i128>,
    /// Most bytes of memory.
    pub memory: Option<i128>,
}

impl Limits {
    /// Parses `spec.limits` (invalid quantities count as absent).
    pub fn from_spec(limits: Option<&NodePoolLimits>) -> Limits {
        let Some(l) = limits else {
            return Limits::default();
        };
        Limits {
            nodes: l.nodes,
            cpu: l.cpu.as_ref().and_then(|q| resources::cpu_millis(q).ok()),
            memory: l
                .memory
                .as_ref()
                .and_then(|q| resources::memory_bytes(q).ok()),
        }
    }

    /// Whether a pool using `used` (cpu, memory) on `nodes` nodes stays within the limits.
    pub fn allow(&self, nodes: i64, used: &Amount) -> bool {
        self.nodes.is_none_or(|n| nodes <= n)
            && self.cpu.is_none_or(|c| used.cpu <= c)
            && self.memory.is_none_or(|m| used.memory <= m)
    }
}

/// A claim to create for pending pods.
#[derive(Clone, Debug, PartialEq)]
pub struct NewNode {
    /// Its node type (pinned with `typeRef`).
    pub node_type: String,
    /// The sum of the requests packed onto it (`desiredCapacity`).
    pub request: Amount,
    /// The pods packed onto it.
    pub pods: Vec<String>,
}

/// The outcome of packing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Packing {
    /// Pods the pool's nodes would accept.
    pub wanted: usize,
    /// Pods that fit on existing or in-flight nodes, by claim.
    pub placed: BTreeMap<String, Vec<String>>,
    /// New claims.
    pub new_nodes: Vec<NewNode>,
    /// Pods that would need a node beyond `limits`.
    pub blocked_by_limits: Vec<String>,
    /// Pods whose fitting node types are all at `maxCapacity`.
    pub blocked_by_capacity: Vec<String>,
}

/// Packs pending pods first-fit-decreasing (by cpu, then memory): onto the room of
/// existing bins first, then onto new nodes, each of the cheapest candidate (candidates
/// come cheapest first) that accepts the pod, has capacity and stays within `limits`
/// given the pool's `usage` (nodes, resources). Pods no candidate accepts are not the
/// pool's business and are skipped.
pub fn pack(
    pods: &[PendingPod],
    bins: &[Bin],
    candidates: &[Candidate],
    limits: &Limits,
    usage: (i64, Amount),
) -> Packing {
    let mut out = Packing::default();
    let mut order: Vec<&PendingPod> = pods
        .iter()
        .filter(|p| {
            candidates
                .iter()
                .any(|c| accepts(&c.shape, p) && c.allocatable.covers(&p.request))
        })
        .collect();
    out.wanted = order.len();
    order.sort_by(|a, b| {
        (b.request.cpu, b.request.memory)
            .cmp(&(a.request.cpu, a.request.memory))
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut bins: Vec<Bin> = bins.to_vec();
    // New nodes: (candidate index, free room, request, pods).
    let mut fresh: Vec<(usize, Amount, NewNode)> = Vec::new();
    let mut room: Vec<Option<i64>> = candidates.iter().map(|c| c.room).collect();
    let (mut nodes, mut used) = usage;
    'pods: for pod in order {
        for bin in bins.iter_mut() {
            if accepts(&bin.shape, pod) && bin.free.covers(&pod.request) {
                bin.free = bin.free.minus(&pod.request);
                out.placed
                    .entry(bin.claim.clone())
                    .or_default()
                    .push(pod.key.clone());
                continue 'pods;
            }
        }
        for (i, free, node) in fresh.iter_mut() {
            if accepts(&candidates[*i].shape, pod) && free.covers(&pod.request) {
                *free = free.minus(&pod.request);
                node.request = node.request.plus(&pod.request);
                node.pods.push(pod.key.clone());
                continue 'pods;
            }
        }
        let mut limited = false;
        for (i, c) in candidates.iter().enumerate() {
            if !accepts(&c.shape, pod) || !c.allocatable.covers(&pod.request) {
                continue;
            }
            if room[i].is_some_and(|r| r <= 0) {
                continue;
            }
            let after = used.plus(&c.resources);
            if !limits.allow(nodes + 1, &after) {
                limited = true;
                continue;
            }
            nodes += 1;
            used = after;
            if let Some(r) = room[i].as_mut() {
                *r -= 1;
            }
            fresh.push((
                i,
                c.allocatable.minus(&pod.request),
                NewNode {
                    node_type: c.node_type.clone(),
                    request: pod.request,
                    pods: vec![pod.key.clone()],
                },
            ));
            continue 'pods;
        }
        if limited {
            out.blocked_by_limits.push(pod.key.clone());
        } else {
            out.blocked_by_capacity.push(pod.key.clone());
        }
    }
    out.new_nodes = fresh.into_iter().map(|(_, _, n)| n).collect();
    out
}

/// Whether a node empty since `since` is due for removal at `now`.
pub fn due_for_removal(since: Timestamp, now: Timestamp, after: Duration) -> bool {
    let waited = now.as_millisecond() - since.as_millisecond();
    waited >= i64::try_from(after.as_millis()).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------
// The controller
// ---------------------------------------------------------------------------------------

/// Shared state of the NodePool controller.
pub struct PoolContext {
    /// The controllers' shared context.
    pub ctx: Arc<Context>,
    /// Every NodePool (the controller's reflector).
    pub pools: Store<NodePool>,
    /// Wakes pools (tenant pod and node changes).
    pub wake: UnboundedSender<ObjectRef<NodePool>>,
    /// Watches on tenant clusters, by tenant: the client they use and their tasks.
    watches: Mutex<HashMap<ClusterKey, TenantWatch>>,
    /// Pools whose gauges are set (to remove those of deleted pools).
    gauges: std::sync::Mutex<BTreeSet<String>>,
}

struct TenantWatch {
    remote: Arc<Remote>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs the NodePool controller until `shutdown` resolves: it owns NodeClaims (a claim's
/// change wakes its pool) and is woken by the tenant pod and node watches of dynamic pools.
pub async fn run(
    ctx: Arc<Context>,
    reflectors: &super::Reflectors,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let (wake, wakeups) = mpsc::unbounded();
    let pctx = Arc::new(PoolContext {
        ctx,
        pools: reflectors.pools.store(),
        wake,
        watches: Mutex::new(HashMap::new()),
        gauges: std::sync::Mutex::new(BTreeSet::new()),
    });
    Controller::for_shared_stream(reflectors.pools.applied(), reflectors.pools.store())
        .owns_shared_stream(reflectors.claims.touched_objects())
        .reconcile_on(wakeups)
        .with_config(RunConfig::default().debounce(Duration::from_millis(300)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, pctx)
        .for_each(super::log_run_error)
        .await;
}

/// Reconciles one NodePool.
pub async fn reconcile(pool: Arc<NodePool>, pctx: Arc<PoolContext>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_pool(&pool, &pctx).await;
    pctx.ctx
        .metrics
        .observe_reconcile("nodepool", started, &result);
    result
}

/// Logs the error; the pool is retried with backoff.
pub fn error_policy(pool: Arc<NodePool>, error: &Error, _pctx: Arc<PoolContext>) -> Action {
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; reconciling the pool again");
    } else {
        tracing::warn!(
            nodepool = %pool.name_any(),
            namespace = %pool.namespace().unwrap_or_default(),
            %error,
            "reconciling NodePool failed"
        );
    }
    super::error_requeue(error)
}

/// Everything one reconcile decided, for the status.
#[derive(Default)]
struct Outcome {
    /// `Ready` condition: (ok, reason, message).
    ready: Option<(bool, String, String)>,
    /// `LimitReached` condition: (reached, reason, message).
    limit: Option<(bool, String, String)>,
    /// Unschedulable pods the pool would take (dynamic pools).
    pending_pods: Option<i32>,
}

fn conflict_or(e: Error) -> Error {
    match e {
        Error::Kube {
            source: kube::Error::Api(s),
            context,
        } if s.code == 409 => Error::Conflict(context),
        e => e,
    }
}

async fn reconcile_pool(pool: &NodePool, pctx: &PoolContext) -> Result<Action, Error> {
    let ctx = &pctx.ctx;
    if pool.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the owned claims; their finalizers drain the nodes.
        return Ok(Action::await_change());
    }
    ctx.wait_synced().await;
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodePool {name}"), "metadata.uid"))?;
    // A claim that cannot be decoded is reported by its watch and left out here.
    let all_claims: Vec<NodeClaim> = super::lenient::list(&ctx.client, &ns, &ListParams::default())
        .await
        .map_err(Error::kube(format!("listing NodeClaims in {ns}")))?;
    let (mine, others): (Vec<NodeClaim>, Vec<NodeClaim>) =
        all_claims.into_iter().partition(|c| owned_by(c, &uid));

    let mut outcome = Outcome::default();
    let template = template_spec(&pool.spec);
    let hash = template_hash(&pool.spec);
    let mut requeue = Duration::from_secs(60);
    let mut created: Vec<NodeClaim> = Vec::new();
    let mut deleted: HashSet<String> = HashSet::new();

    let mut problem = template_problem(pool, ctx);
    if problem.is_none() && pool.spec.replicas.is_some() {
        // A static pool needs no tenant watch, but claims for a tenant that cannot be
        // reached would only wait: say so on the pool and leave the claims as they are.
        if let Err(e) = ctx.clients.tenant(&ns, &pool.spec.v_cluster_ref.name).await {
            problem = Some((e.reason().to_string(), e.to_string()));
        }
    }
    if let Some((reason, message)) = problem {
        outcome.ready = Some((false, reason, message));
        requeue = Duration::from_secs(30);
    } else {
        let views = claim_views(&mine, &hash, expire_after(&pool.spec));
        let budget = budget(&pool.spec);
        let desired = pool.spec.replicas.map(|r| usize::try_from(r).unwrap_or(0));
        let plan = plan_claims(&views, desired, budget);
        for (claim_name, reason) in &plan.delete {
            if let Some(c) = mine.iter().find(|c| &c.name_any() == claim_name) {
                delete_claim(pctx, pool, c, *reason).await?;
                deleted.insert(claim_name.clone());
            }
        }
        for replaces in &plan.create {
            let old = replaces
                .as_ref()
                .and_then(|o| mine.iter().find(|c| &c.name_any() == o));
            let (capacity, type_ref) = match old {
                Some(o) => (
                    o.spec.desired_capacity.clone(),
                    // An expired claim keeps its type; a changed template chooses anew.
                    (o.labels().get(LABEL_TEMPLATE_HASH) == Some(&hash))
                        .then(|| o.spec.type_ref.clone())
                        .flatten(),
                ),
                None => (ResourceList::new(), None),
            };
            let c = create_claim(
                pctx,
                pool,
                &template,
                &hash,
                capacity,
                type_ref,
                replaces.as_deref(),
            )
            .await?;
            created.push(c);
        }
        if pool.spec.replicas.is_none() {
            let with_created: Vec<NodeClaim> = mine.iter().chain(created.iter()).cloned().collect();
            match dynamic(
                pctx,
                pool,
                &template,
                &hash,
                &with_created,
                &others,
                &deleted,
            )
            .await?
            {
                DynamicResult::Done {
                    outcome: o,
                    created: c,
                    deleted: d,
                    requeue: r,
                } => {
                    outcome = o;
                    created.extend(c);
                    deleted.extend(d);
                    requeue = r;
                }
                DynamicResult::Unreachable(reason, message) => {
                    outcome.ready = Some((false, reason, message));
                    requeue = Duration::from_secs(15);
                }
            }
        } else if !plan.create.is_empty() || !plan.delete.is_empty() {
            requeue = Duration::from_secs(5);
        }
    }
    write_status(pctx, pool, &mine, &created, &deleted, outcome).await?;
    Ok(Action::requeue(requeue))
}

fn owned_by(claim: &NodeClaim, pool_uid: &str) -> bool {
    claim
        .owner_references()
        .iter()
        .any(|o| o.kind == "NodePool" && o.uid == pool_uid && o.controller == Some(true))
}

fn claim_views(claims: &[NodeClaim], hash: &str, expire: Option<Duration>) -> Vec<ClaimView> {
    let now_ms = now().as_millisecond();
    claims
        .iter()
        .map(|c| {
            let s = c.status.clone().unwrap_or_default();
            let created_ms = c
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(now_ms, |t| t.0.as_millisecond());
            let expired = expire.is_some_and(|e| {
                now_ms - created_ms >= i64::try_from(e.as_millis()).unwrap_or(i64::MAX)
            });
            ClaimView {
                name: c.name_any(),
                created_ms,
                available: s.phase == Some(NodeClaimPhase::Available),
                terminating: c.metadata.deletion_timestamp.is_some(),
                failed: s.phase == Some(NodeClaimPhase::Failed),
                has_node: s.node_name.is_some(),
                outdated: c.labels().get(LABEL_TEMPLATE_HASH).map(String::as_str) != Some(hash)
                    || expired,
                replaces: c.annotations().get(ANNOTATION_REPLACES).cloned(),
                delete_first: c.annotations().contains_key(ANNOTATION_DELETE_FIRST),
            }
        })
        .collect()
}

/// Why the pool's template cannot be used: (reason, message).
fn template_problem(pool: &NodePool, ctx: &Context) -> Option<(String, String)> {
    if let Some(p) = &pool.spec.provider_ref {
        if ctx.providers.get(&ObjectRef::new(p)).is_none() {
            return Some((
                "ProviderNotFound".into(),
                format!("NodeProvider {p} does not exist"),
            ));
        }
    }
    let template = template_spec(&pool.spec);
    if let Err(e) = ClaimRequest::new(&template, None) {
        return Some(("InvalidTemplate".into(), e.to_string()));
    }
    if let Err(e) = scheduling::node_labels(
        &Default::default(),
        None,
        &template.labels,
        &BTreeMap::new(),
    ) {
        return Some(("InvalidTemplate".into(), e.to_string()));
    }
    None
}

async fn create_claim(
    pctx: &PoolContext,
    pool: &NodePool,
    template: &NodeClaimSpec,
    hash: &str,
    desired_capacity: ResourceList,
    type_ref: Option<String>,
    replaces: Option<&str>,
) -> Result<NodeClaim, Error> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = OwnerReference {
        api_version: NodePool::api_version(&()).into_owned(),
        kind: NodePool::kind(&()).into_owned(),
        name: pool_name.clone(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut spec = template.clone();
    spec.desired_capacity = desired_capacity;
    spec.type_ref = type_ref;
    let annotations =
        replaces.map(|o| BTreeMap::from([(ANNOTATION_REPLACES.to_string(), o.to_string())]));
    // A name collision (1 in 36^5) gets another name.
    for attempt in 0..3 {
        let claim = NodeClaim {
            metadata: ObjectMeta {
                name: Some(claim_name(&pool_name)),
                namespace: Some(ns.clone()),
                labels: Some(BTreeMap::from([
                    (
                        LABEL_NODEPOOL.to_string(),
                        crate::names::label_value(&pool_name),
                    ),
                    (LABEL_TEMPLATE_HASH.to_string(), hash.to_string()),
                ])),
                annotations: annotations.clone(),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            spec: spec.clone(),
            status: None,
        };
        match api.create(&PostParams::default(), &claim).await {
            Ok(c) => {
                let what = match replaces {
                    Some(o) => format!("created NodeClaim {} to replace {o}", c.name_any()),
                    None => format!("created NodeClaim {}", c.name_any()),
                };
                tracing::info!(nodepool = %pool_name, namespace = %ns, claim = %c.name_any(), replaces = ?replaces, "claim created");
                ctx.event(pool, EventType::Normal, "ClaimCreated", "Scale", what)
                    .await;
                return Ok(c);
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 2 => continue,
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("creating a NodeClaim for NodePool {ns}/{pool_name}"),
                    source: e,
                })
            }
        }
    }
    Err(Error::Internal(format!(
        "no free claim name for NodePool {ns}/{pool_name}"
    )))
}

async fn delete_claim(
    pctx: &PoolContext,
    pool: &NodePool,
    claim: &NodeClaim,
    reason: DeleteReason,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        Err(e) => {
            return Err(Error::Kube {
                context: format!("deleting NodeClaim {ns}/{name}"),
                source: e,
            })
        }
    }
    tracing::info!(nodepool = %pool.name_any(), namespace = %ns, claim = %name, ?reason, "claim deleted");
    let note = match reason {
        DeleteReason::Failed => format!("deleted Failed NodeClaim {name}; a new one replaces it"),
        DeleteReason::Outdated => {
            format!("deleted NodeClaim {name}: made from an older template and not Available")
        }
        DeleteReason::Replaced => format!("deleted NodeClaim {name}: its replacement is Available"),
        DeleteReason::ScaleDown => format!("deleted NodeClaim {name}: more claims than replicas"),
        DeleteReason::Empty => {
            format!("deleted NodeClaim {name}: its node ran no pods for the consolidation delay")
        }
    };
    ctx.event(
        pool,
        EventType::Normal,
        reason.event_reason(),
        "Scale",
        note,
    )
    .await;
    Ok(())
}

enum DynamicResult {
    Done {
        outcome: Outcome,
        created: Vec<NodeClaim>,
        deleted: Vec<String>,
        requeue: Duration,
    },
    Unreachable(String, String),
}

async fn tenant_call<T>(
    remote: &Remote,
    context: &str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, (String, String)> {
    match tokio::time::timeout(REMOTE_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err((
            "TenantUnreachable".into(),
            format!("{}: {context}: {}", remote.key, remote_error_text(&e)),
        )),
        Err(_) => Err((
            "TenantUnreachable".into(),
            format!(
                "{}: {context}: no answer within {}s",
                remote.key,
                REMOTE_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// Starts (or keeps) the pod and node watches on the pool's tenant.
async fn ensure_tenant_watch(pctx: &PoolContext, remote: &Arc<Remote>) {
    let mut watches = pctx.watches.lock().await;
    if watches
        .get(&remote.key)
        .is_some_and(|w| Arc::ptr_eq(&w.remote, remote))
    {
        return;
    }
    let ClusterKey::Tenant {
        namespace,
        vcluster,
    } = remote.key.clone()
    else {
        return;
    };
    let wake_pools = {
        let pools = pctx.pools.clone();
        let wake = pctx.wake.clone();
        move || {
            for p in pools.state() {
                if p.namespace().as_deref() == Some(namespace.as_str())
                    && p.spec.v_cluster_ref.name == vcluster
                    && p.spec.replicas.is_none()
                {
                    let _ = wake.unbounded_send(ObjectRef::from_obj(&*p));
                }
            }
        }
    };
    let pods: Api<Pod> = Api::all(remote.client.clone());
    let nodes: Api<Node> = Api::all(remote.client.clone());
    let tasks = vec![
        spawn_wake_watch(remote.key.to_string(), pods, wake_pools.clone()),
        spawn_wake_watch(remote.key.to_string(), nodes, wake_pools),
    ];
    tracing::info!(cluster = %remote.key, "watching tenant pods and nodes for node pools");
    watches.insert(
        remote.key.clone(),
        TenantWatch {
            remote: remote.clone(),
            tasks,
        },
    );
}

fn spawn_wake_watch<K>(
    cluster: String,
    api: Api<K>,
    wake: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        use kube::runtime::WatchStreamExt;
        let mut stream = watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                Ok(_) => wake(),
                Err(e) => tracing::debug!(%cluster, error = %e, "tenant watch error (retrying)"),
            }
        }
    })
}

/// The node type, labels, taints and allocatable room of a live claim.
struct ClaimNode<'a> {
    claim: &'a NodeClaim,
    node_type: Option<&'a PreparedType>,
    shape: NodeShape,
    allocatable: Amount,
}

fn shape_of(t: &PreparedType, spec: &NodeClaimSpec) -> Option<NodeShape> {
    let labels = scheduling::node_labels(
        &scheduling::node_properties(t, None, spec),
        None,
        &spec.labels,
        &BTreeMap::new(),
    )
    .ok()?
    .all();
    let taints = scheduling::node_taints(t, None, spec).ok()?.taints;
    Some(NodeShape { labels, taints })
}

fn allocatable_of(ctx: &Context, t: &PreparedType) -> Amount {
    let reserved = ctx
        .types
        .get(&ObjectRef::new(&t.name))
        .and_then(|nt| nt.spec.overhead.clone())
        .and_then(|o| ResourceAmounts::from_list(&o.kube_reserved).ok())
        .map(|r| Amount {
            cpu: r.cpu_millis(),
            memory: r.memory_bytes(),
            pods: 0,
        })
        .unwrap_or_default();
    Amount::of_node(&t.amounts).minus(&reserved)
}

/// The type of a claim: the one it was scheduled to, else the one it would get now.
fn type_of<'c>(
    claim: &NodeClaim,
    catalogue: &'c Catalogue,
    claimed: &BTreeMap<String, i64>,
) -> Option<&'c PreparedType> {
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        return catalogue.get(t).filter(|x| &x.name == t);
    }
    let req = ClaimRequest::new(&claim.spec, None).ok()?;
    scheduling::choose(catalogue, &req, claimed).ok()
}

fn is_live(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed)
}

fn non_daemon_running(p: &Pod) -> bool {
    let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
    let done = matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    );
    !daemon && !mirror && !done
}

/// Whether the scheduler gave up on the pod for now: PodScheduled=False, Unschedulable.
pub fn is_unschedulable(p: &Pod) -> bool {
    let unbound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none();
    let pending = p.metadata.deletion_timestamp.is_none()
        && !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
    let marked = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        });
    unbound && pending && marked
}

#[allow(clippy::too_many_arguments)]
async fn dynamic(
    pctx: &PoolContext,
    pool: &NodePool,
    template: &NodeClaimSpec,
    hash: &str,
    mine: &[NodeClaim],
    others: &[NodeClaim],
    deleted_now: &HashSet<String>,
) -> Result<DynamicResult, Error> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let vcluster = &pool.spec.v_cluster_ref.name;
    let tenant = match ctx.clients.tenant(&ns, vcluster).await {
        Ok(t) => t,
        Err(e) => return Ok(DynamicResult::Unreachable(e.reason().into(), e.to_string())),
    };
    ensure_tenant_watch(pctx, &tenant).await;
    let pods_api: Api<Pod> = Api::all(tenant.client.clone());
    let nodes_api: Api<Node> = Api::all(tenant.client.clone());
    let pods = match tenant_call(
        &tenant,
        "listing pods",
        pods_api.list(&ListParams::default()),
    )
    .await
    {
        Ok(l) => l.items,
        Err((r, m)) => return Ok(DynamicResult::Unreachable(r, m)),
    };
    let nodes = match tenant_call(
        &tenant,
        "listing nodes",
        nodes_api.list(&ListParams::default()),
    )
    .await
    {
        Ok(l) => l.items,
        Err((r, m)) => return Ok(DynamicResult::Unreachable(r, m)),
    };
    let nodes: HashMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let mut bound: HashMap<String, (Amount, usize)> = HashMap::new();
    for p in pods.iter().filter(|p| non_daemon_running(p)) {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            let e = bound.entry(n).or_default();
            e.0 = e.0.plus(&pod_request(p));
            e.1 += 1;
        }
    }
    // DaemonSet pods take room too, but do not keep a node alive.
    let mut daemon_use: HashMap<String, Amount> = HashMap::new();
    for p in pods.iter().filter(|p| !non_daemon_running(p)) {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            let e = daemon_use.entry(n).or_default();
            *e = e.plus(&pod_request(p));
        }
    }
    let pending: Vec<PendingPod> = pods
        .iter()
        .filter(|p| is_unschedulable(p))
        .map(PendingPod::from_pod)
        .collect();

    let catalogue = super::nodeclaim::catalogue(ctx);
    let claimed = {
        let r = ctx.scheduling.lock().await;
        super::nodeclaim::claimed_counts(ctx, &r)
    };
    let now_ts = now();

    // Existing room: every live claim of the tenant (this pool's and others').
    let tenant_claims = mine.iter().chain(
        others
            .iter()
            .filter(|c| &c.spec.v_cluster_ref.name == vcluster),
    );
    let mut claim_nodes: Vec<ClaimNode> = Vec::new();
    for c in tenant_claims.filter(|c| is_live(c) && !deleted_now.contains(&c.name_any())) {
        let t = type_of(c, &catalogue, &claimed);
        let (shape, allocatable) = match t {
            Some(t) => (
                shape_of(t, &c.spec).unwrap_or_default(),
                allocatable_of(ctx, t),
            ),
            None => (NodeShape::default(), Amount::default()),
        };
        claim_nodes.push(ClaimNode {
            claim: c,
            node_type: t,
            shape,
            allocatable,
        });
    }
    let mut bins = Vec::new();
    for cn in &claim_nodes {
        let s = cn.claim.status.clone().unwrap_or_default();
        let node = s.node_name.as_ref().and_then(|n| nodes.get(n));
        if node
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            continue;
        }
        let ready_since = conditions::true_since(&s.conditions, super::nodeclaim::READY);
        if let Some(since) = ready_since {
            if due_for_removal(since, now_ts, READY_NODE_GRACE) {
                // The scheduler has seen this node: pods it still calls unschedulable
                // do not fit there.
                continue;
            }
        }
        let used = s
            .node_name
            .as_ref()
            .map(|n| {
                let b = bound.get(n).map(|b| b.0).unwrap_or_default();
                b.plus(&daemon_use.get(n).copied().unwrap_or_default())
            })
            .unwrap_or_default();
        bins.push(Bin {
            claim: cn.claim.name_any(),
            shape: cn.shape.clone(),
            free: cn.allocatable.minus(&used),
        });
    }

    // Candidates: the types the pool's template fits, cheapest first.
    let request = ClaimRequest::new(template, None).map_err(|e| Error::Internal(e.to_string()))?;
    let candidates: Vec<Candidate> = catalogue
        .types()
        .iter()
        .filter(|t| {
            template
                .provider_ref
                .as_deref()
                .is_none_or(|p| p == t.provider)
                && scheduling::fits(t, &request)
        })
        .filter_map(|t| {
            Some(Candidate {
                node_type: t.name.clone(),
                shape: shape_of(t, template)?,
                allocatable: allocatable_of(ctx, t),
                resources: Amount::of_node(&t.amounts),
                room: t
                    .max_capacity
                    .map(|m| m - claimed.get(&t.name).copied().unwrap_or(0)),
            })
        })
        .collect();

    // The pool's usage against its limits.
    let mut usage = (0i64, Amount::default());
    for cn in claim_nodes.iter().filter(|cn| owned_mine(mine, cn.claim)) {
        usage.0 += 1;
        if let Some(t) = cn.node_type {
            usage.1 = usage.1.plus(&Amount::of_node(&t.amounts));
        }
    }
    let limits = Limits::from_spec(pool.spec.limits.as_ref());
    let packing = pack(&pending, &bins, &candidates, &limits, usage);

    let mut created = Vec::new();
    for n in &packing.new_nodes {
        let c = create_claim(
            pctx,
            pool,
            template,
            hash,
            n.request.to_resource_list(),
            Some(n.node_type.clone()),
            None,
        )
        .await?;
        tracing::info!(nodepool = %pool.name_any(), claim = %c.name_any(), node_type = %n.node_type, pods = n.pods.len(), "new node for pending pods");
        created.push(c);
    }

    // Consolidation: this pool's Available claims whose node runs no non-DaemonSet pod.
    // `consolidateAfter: Never`: empty nodes stay.
    let consolidate = consolidate_after(&pool.spec);
    let after = consolidate.unwrap_or(Duration::MAX);
    let draining = mine
        .iter()
        .filter(|c| {
            c.metadata.deletion_timestamp.is_some()
                && c.status
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
        })
        .count()
        + deleted_now.len();
    let mut disrupt = budget(&pool.spec).saturating_sub(draining);
    let mut deleted = Vec::new();
    let mut next_check: Option<Duration> = None;
    let mut empties: Vec<(&NodeClaim, Timestamp)> = Vec::new();
    for c in mine
        .iter()
        .filter(|c| is_live(c) && !deleted_now.contains(&c.name_any()))
        .filter(|_| consolidate.is_some())
    {
        let s = c.status.clone().unwrap_or_default();
        if s.phase != Some(NodeClaimPhase::Available) {
            continue;
        }
        let Some(node_name) = s.node_name.as_ref() else {
            continue;
        };
        let busy = bound.get(node_name).is_some_and(|b| b.1 > 0)
            || packing.placed.contains_key(&c.name_any());
        let since = c
            .annotations()
            .get(ANNOTATION_EMPTY_SINCE)
            .and_then(|v| v.parse::<Timestamp>().ok());
        match (busy, since) {
            (true, Some(_)) => annotate_empty(ctx, c, None).await?,
            (true, None) => {}
            (false, None) => {
                annotate_empty(ctx, c, Some(now_ts)).await?;
                next_check = Some(next_check.map_or(after, |n| n.min(after)));
            }
            (false, Some(since)) => {
                if due_for_removal(since, now_ts, after) {
                    empties.push((c, since));
                } else {
                    let waited = (now_ts.as_millisecond() - since.as_millisecond()).max(0);
                    let left = after.saturating_sub(Duration::from_millis(waited as u64));
                    next_check = Some(next_check.map_or(left, |n| n.min(left)));
                }
            }
        }
    }
    empties.sort_by_key(|(_, since)| since.as_millisecond());
    for (c, _) in empties {
        if disrupt == 0 {
            next_check = Some(Duration::from_secs(2));
            break;
        }
        disrupt -= 1;
        delete_claim(pctx, pool, c, DeleteReason::Empty).await?;
        deleted.push(c.name_any());
    }

    let mut outcome = Outcome {
        pending_pods: Some(i32::try_from(packing.wanted).unwrap_or(i32::MAX)),
        ..Outcome::default()
    };
    outcome.limit = Some(if packing.blocked_by_limits.is_empty() {
        (
            false,
            "WithinLimits".into(),
            "demand fits within the pool's limits".into(),
        )
    } else {
        (
            true,
            LIMIT_REACHED.into(),
            format!(
                "{} pending pod(s) need nodes beyond the pool's limits ({})",
                packing.blocked_by_limits.len(),
                describe_limits(&limits)
            ),
        )
    });
    outcome.ready = Some(if !packing.blocked_by_capacity.is_empty() {
        (
            false,
            scheduling::REASON_INSUFFICIENT_CAPACITY.into(),
            format!(
                "{} pending pod(s) fit node types that are all at maxCapacity",
                packing.blocked_by_capacity.len()
            ),
        )
    } else if candidates.is_empty() {
        (
            false,
            scheduling::REASON_NO_MATCHING_NODE_TYPE.into(),
            "no node type fits the pool's template".into(),
        )
    } else if !packing.new_nodes.is_empty() {
        (
            false,
            "ScalingUp".into(),
            format!(
                "{} new node(s) for {} pending pod(s)",
                packing.new_nodes.len(),
                packing
                    .new_nodes
                    .iter()
                    .map(|n| n.pods.len())
                    .sum::<usize>()
            ),
        )
    } else {
        (
            true,
            "Ready".into(),
            "no pending pod waits for a new node".into(),
        )
    });
    let requeue = next_check
        .map(|d| d.max(Duration::from_millis(500)) + Duration::from_millis(200))
        .unwrap_or(Duration::from_secs(30))
        .min(Duration::from_secs(30));
    Ok(DynamicResult::Done {
        outcome,
        created,
        deleted,
        requeue,
    })
}

fn owned_mine(mine: &[NodeClaim], c: &NodeClaim) -> bool {
    mine.iter().any(|m| m.uid() == c.uid())
}

fn describe_limits(l: &Limits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.nodes {
        parts.push(format!("nodes {n}"));
    }
    if let Some(c) = l.cpu {
        parts.push(format!("cpu {}", resources::format_cpu(c)));
    }
    if let Some(m) = l.memory {
        parts.push(format!("memory {}", resources::format_memory(m)));
    }
    parts.join(", ")
}

async fn annotate_empty(
    ctx: &Context,
    c: &NodeClaim,
    since: Option<Timestamp>,
) -> Result<(), Error> {
    let api: Api<NodeClaim> =
        Api::namespaced(ctx.client.clone(), &c.namespace().unwrap_or_default());
    let value = since.map(|t| json!(t.to_string())).unwrap_or(json!(null));
    let patch = json!({"metadata": {"annotations": {ANNOTATION_EMPTY_SINCE: value}}});
    match api
        .patch(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube {
            context: format!("annotating NodeClaim {}", c.name_any()),
            source: e,
        }),
    }
}

/// Writes the pool's status (if it changed) and its gauges.
async fn write_status(
    pctx: &PoolContext,
    pool: &NodePool,
    mine: &[NodeClaim],
    created: &[NodeClaim],
    deleted: &HashSet<String>,
    outcome: Outcome,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let old = pool.status.clone().unwrap_or_default();
    let mut new = old.clone();
    let live: Vec<&NodeClaim> = mine
        .iter()
        .chain(created.iter())
        .filter(|c| is_live(c) && !deleted.contains(&c.name_any()))
        .collect();
    let catalogue = super::nodeclaim::catalogue(ctx);
    new.replicas = i32::try_from(live.len()).unwrap_or(i32::MAX);
    new.ready_replicas = i32::try_from(
        live.iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available))
            .count(),
    )
    .unwrap_or(i32::MAX);
    new.selector = Some(selector(&pool.name_any()));
    let types: BTreeSet<String> = live
        .iter()
        .filter_map(|c| c.status.as_ref().and_then(|s| s.type_ref.clone()))
        .collect();
    new.node_type = (!types.is_empty()).then(|| types.into_iter().collect::<Vec<_>>().join(","));
    let mut used = Amount::default();
    let mut cost = 0i64;
    for c in &live {
        let s = c.status.clone().unwrap_or_default();
        cost += s.cost.unwrap_or(0);
        if let Some(t) = s.type_ref.as_ref().and_then(|t| catalogue.get(t)) {
            used = used.plus(&Amount::of_node(&t.amounts));
        }
    }
    new.resources = Some(NodePoolResources {
        nodes: live.len() as i64,
        cpu: Some(Quantity(resources::format_cpu(used.cpu))),
        memory: Some(Quantity(resources::format_memory(used.memory))),
    });
    new.cost = Some(cost);
    new.pending_pods = outcome.pending_pods;
    let generation = pool.metadata.generation;
    let ready = outcome.ready.unwrap_or_else(|| {
        let desired = pool.spec.replicas.unwrap_or(0);
        let outdated = live
            .iter()
            .filter(|c| c.labels().get(LABEL_TEMPLATE_HASH) != Some(&template_hash(&pool.spec)))
            .count();
        if outdated > 0 {
            (
                false,
                "RollingUpdate".to_string(),
                format!("{outdated} claim(s) from an older template are being replaced"),
            )
        } else if new.ready_replicas == desired && new.replicas == desired {
            (
                true,
                "AllReplicasReady".to_string(),
                format!("{desired} of {desired} nodes Ready"),
            )
        } else if new.replicas > desired {
            (
                false,
                "ScalingDown".to_string(),
                format!("{} claims, {desired} wanted", new.replicas),
            )
        } else {
            (
                false,
                "ScalingUp".to_string(),
                format!("{} of {desired} nodes Ready", new.ready_replicas),
            )
        }
    });
    let limit = outcome.limit.unwrap_or_else(|| {
        (
            false,
            "WithinLimits".to_string(),
            "the pool is within its limits".to_string(),
        )
    });
    conditions::set(
        &mut new.conditions,
        READY,
        status_of(ready.0),
        &ready.1,
        ready.2.clone(),
        generation,
        now(),
    );
    conditions::set(
        &mut new.conditions,
        LIMIT_REACHED,
        status_of(limit.0),
        &limit.1,
        limit.2.clone(),
        generation,
        now(),
    );
    new.observed_generation = generation;
    set_gauges(pctx, pool, &new);
    if new == old {
        return Ok(());
    }
    // Events for problems, once per reason.
    for c in &new.conditions {
        let before = conditions::get(&old.conditions, &c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let problem = (c.type_ == READY
            && c.status != TRUE
            && !matches!(
                c.reason.as_str(),
                "ScalingUp" | "ScalingDown" | "RollingUpdate"
            ))
            || (c.type_ == LIMIT_REACHED && c.status == TRUE);
        if problem {
            tracing::info!(nodepool = %pool.name_any(), condition = %c.type_, reason = %c.reason, message = %c.message, "pool condition");
            ctx.event(
                pool,
                EventType::Warning,
                &c.reason,
                &c.type_,
                c.message.clone(),
            )
            .await;
        }
    }
    let api: Api<NodePool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    apply_status(&api, pool, &new)
        .await
        .map(|_| ())
        .map_err(conflict_or)
}

fn set_gauges(pctx: &PoolContext, pool: &NodePool, status: &NodePoolStatus) {
    let g = &pctx.ctx.metrics.nodepool_replicas;
    let key = format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    );
    let desired = pool.spec.replicas.unwrap_or(status.replicas);
    g.with_label_values(&[&key, "desired"])
        .set(i64::from(desired));
    g.with_label_values(&[&key, "ready"])
        .set(i64::from(status.ready_replicas));
    let live: BTreeSet<String> = pctx
        .pools
        .state()
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    if let Ok(mut known) = pctx.gauges.lock() {
        known.insert(key);
        let gone: Vec<String> = known
            .iter()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            let _ = g.remove_label_values(&[&k, "desired"]);
            let _ = g.remove_label_values(&[&k, "ready"]);
            known.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;

    fn view(name: &str, created: i64, available: bool) -> ClaimView {
        ClaimView {
            name: name.into(),
            created_ms: created,
            available,
            terminating: false,
            failed: false,
            has_node: available,
            outdated: false,
            replaces: None,
            delete_first: false,
        }
    }

    fn deleted(plan: &Plan) -> Vec<&str> {
        plan.delete.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn a_static_pool_creates_the_missing_claims() {
        let plan = plan_claims(&[view("a", 1, true)], Some(3), 1);
        assert_eq!(plan.create, vec![None, None]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn scale_down_removes_claims_that_are_not_available_first_then_the_newest() {
        let claims = vec![
            view("old", 1, true),
            view("new", 3, true),
            view("booting", 2, false),
            view("mid", 2, true),
        ];
        let plan = plan_claims(&claims, Some(2), 1);
        assert_eq!(deleted(&plan), vec!["booting", "new"]);
        let plan = plan_claims(&claims, Some(0), 2);
        assert_eq!(deleted(&plan), vec!["booting", "new", "mid"]);
    }

    #[test]
    fn scale_down_removes_the_claim_marked_delete_first_even_when_it_is_the_oldest_available_one() {
        let mut marked = view("old", 1, true);
        marked.delete_first = true;
        let claims = vec![
            marked,
            view("new", 3, true),
            view("booting", 2, false),
            view("mid", 2, true),
        ];
        let plan = plan_claims(&claims, Some(3), 1);
        assert_eq!(
            plan.delete,
            vec![("old".to_string(), DeleteReason::ScaleDown)]
        );
        assert!(plan.create.is_empty());
        // Unmarked, the same scale-down takes the claim that is not Available.
        let unmarked: Vec<ClaimView> = claims
            .into_iter()
            .map(|mut c| {
                c.delete_first = false;
                c
            })
            .collect();
        assert_eq!(
            deleted(&plan_claims(&unmarked, Some(3), 1)),
            vec!["booting"]
        );
    }

    #[test]
    fn scale_down_waits_while_the_budget_is_used_by_draining_nodes() {
        let mut draining = view("going", 0, true);
        draining.terminating = true;
        let claims = vec![draining, view("a", 1, true), view("b", 2, true)];
        assert!(plan_claims(&claims, Some(0), 1).delete.is_empty());
        assert_eq!(deleted(&plan_claims(&claims, Some(0), 2)), vec!["b"]);
    }

    #[test]
    fn a_failed_claim_is_deleted_and_replaced() {
        let mut failed = view("f", 1, false);
        failed.failed = true;
        let plan = plan_claims(&[failed, view("a", 2, true)], Some(2), 1);
        assert_eq!(plan.delete, vec![("f".to_string(), DeleteReason::Failed)]);
        assert_eq!(plan.create, vec![None]);
    }

    #[test]
    fn an_outdated_available_claim_gets_a_replacement_before_it_goes() {
        let mut a = view("a", 1, true);
        a.outdated = true;
        let mut b = view("b", 2, true);
        b.outdated = true;
        let plan = plan_claims(&[a.clone(), b.clone()], Some(2), 1);
        assert_eq!(
            plan.create,
            vec![Some("a".to_string())],
            "one surge at a time"
        );
        assert!(plan.delete.is_empty());

        // The replacement is on its way: nothing else happens.
        let mut r = view("r", 3, false);
        r.replaces = Some("a".into());
        let plan = plan_claims(&[a.clone(), b.clone(), r.clone()], Some(2), 1);
        assert_eq!(plan, Plan::default());

        // The replacement is Available: the old claim goes, the next surge starts.
        r.available = true;
        let plan = plan_claims(&[a, b, r], Some(2), 1);
        assert_eq!(plan.delete, vec![("a".to_string(), DeleteReason::Replaced)]);
        assert_eq!(plan.create, vec![Some("b".to_string())]);
    }

    #[test]
    fn an_outdated_claim_that_is_not_available_is_replaced_at_once() {
        let mut a = view("a", 1, false);
        a.outdated = true;
        let plan = plan_claims(&[a, view("b", 2, true)], Some(2), 1);
        assert_eq!(plan.delete, vec![("a".to_string(), DeleteReason::Outdated)]);
        assert_eq!(plan.create, vec![None]);
    }

    fn pod(key: &str, cpu: i128) -> PendingPod {
        PendingPod {
            key: key.into(),
            request: Amount {
                cpu,
                memory: 256 << 20,
                pods: 1,
            },
            node_selector: BTreeMap::new(),
            required_terms: None,
            tolerations: Vec::new(),
        }
    }

    fn candidate(name: &str, cpu: i128, labels: &[(&str, &str)]) -> Candidate {
        let amount = Amount {
            cpu,
            memory: 16 << 30,
            pods: MAX_PODS_PER_NODE,
        };
        Candidate {
            node_type: name.into(),
            shape: NodeShape {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                taints: Vec::new(),
            },
            allocatable: amount,
            resources: amount,
            room: None,
        }
    }

    #[test]
    fn twelve_one_cpu_pods_pack_onto_three_four_cpu_nodes() {
        let pods: Vec<PendingPod> = (0..12).map(|i| pod(&format!("p{i:02}"), 1000)).collect();
        let out = pack(
            &pods,
            &[],
            &[candidate("small", 4000, &[]), candidate("big", 16000, &[])],
            &Limits::default(),
            (0, Amount::default()),
        );
        assert_eq!(out.new_nodes.len(), 3);
        assert!(out
            .new_nodes
            .iter()
            .all(|n| n.node_type == "small" && n.pods.len() == 4 && n.request.cpu == 4000));
        assert_eq!(out.wanted, 12);
    }

    #[test]
    fn pods_fitting_in_flight_nodes_need_no_new_node() {
        let pods: Vec<PendingPod> = (0..4).map(|i| pod(&format!("p{i}"), 1000)).collect();
        let bins = vec![Bin {
            claim: "c".into(),
            shape: NodeShape::default(),
            free: Amount {
                cpu: 4000,
                memory: 16 << 30,
                pods: 110,
            },
        }];
        let out = pack(
            &pods,
            &bins,
            &[candidate("small", 4000, &[])],
            &Limits::default(),
            (1, Amount::default()),
        );
        assert!(out.new_nodes.is_empty());
        assert_eq!(out.placed["c"].len(), 4);
    }

    #[test]
    fn node_selectors_choose_the_type_and_foreign_pods_are_ignored() {
        let mut gpu = pod("gpu", 1000);
        gpu.node_selector = BTreeMap::from([("kind".to_string(), "big".to_string())]);
        let mut elsewhere = pod("elsewhere", 1000);
        elsewhere.node_selector = BTreeMap::from([("kind".to_string(), "none".to_string())]);
        let out = pack(
            &[gpu, elsewhere, pod("plain", 1000)],
            &[],
            &[
                candidate("small", 4000, &[("kind", "small")]),
                candidate("big", 16000, &[("kind", "big")]),
            ],
            &Limits::default(),
            (0, Amount::default()),
        );
        assert_eq!(out.wanted, 2);
        let types: Vec<&str> = out.new_nodes.iter().map(|n| n.node_type.as_str()).collect();
        // The plain pod fits the room left on the large node: one node for both.
        assert_eq!(types, vec!["big"]);
        assert_eq!(out.new_nodes[0].pods, vec!["gpu", "plain"]);
    }

    #[test]
    fn limits_stop_growth_and_name_the_blocked_pods() {
        let pods: Vec<PendingPod> = (0..12).map(|i| pod(&format!("p{i:02}"), 1000)).collect();
        let limits = Limits {
            nodes: Some(2),
            ..Limits::default()
        };
        let out = pack(
            &pods,
            &[],
            &[candidate("small", 4000, &[])],
            &limits,
            (0, Amount::default()),
        );
        assert_eq!(out.new_nodes.len(), 2);
        assert_eq!(out.blocked_by_limits.len(), 4);
        let cpu_limited = pack(
            &pods,
            &[],
            &[candidate("small", 4000, &[])],
            &Limits {
                cpu: Some(4000),
                ..Limits::default()
            },
            (0, Amount::default()),
        );
        assert_eq!(cpu_limited.new_nodes.len(), 1);
    }

    #[test]
    fn taints_need_tolerations_and_affinity_terms_are_matched() {
        let shape = NodeShape {
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            taints: vec![Taint {
                key: "dedicated".into(),
                value: Some("x".into()),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }],
        };
        let mut p = pod("p", 100);
        assert!(!accepts(&shape, &p));
        p.tolerations = vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("x".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }];
        assert!(accepts(&shape, &p));
        p.required_terms = Some(vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(vec!["b".into()]),
            }]),
            match_fields: None,
        }]);
        assert!(!accepts(&shape, &p));
        p.tolerations = vec![Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        }];
        p.required_terms = Some(vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "zone".into(),
                operator: "NotIn".into(),
                values: Some(vec!["b".into()]),
            }]),
            match_fields: None,
        }]);
        assert!(accepts(&shape, &p));
    }

    #[test]
    fn the_template_hash_changes_with_the_template_only() {
        let spec: NodePoolSpec = serde_json::from_value(json!({
            "vClusterRef": {"name": "t"}, "replicas": 2
        }))
        .expect("spec");
        let mut scaled = spec.clone();
        scaled.replicas = Some(5);
        assert_eq!(template_hash(&spec), template_hash(&scaled));
        let mut labelled = spec.clone();
        labelled.labels.insert("a".into(), "b".into());
        assert_ne!(template_hash(&spec), template_hash(&labelled));
        assert_eq!(template_hash(&spec).len(), 10);
    }

    #[test]
    fn claim_names_are_the_pool_name_and_five_random_characters() {
        let n = claim_name("workers");
        let suffix = n.strip_prefix("workers-").expect("prefix");
        assert_eq!(suffix.len(), 5);
        assert!(suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(claim_name("workers"), claim_name("workers"));
    }
}
