//! Consolidation of a dynamic pool's nodes (`disruption.consolidationPolicy`):
//!
//! - **empty**: an Available node of the pool that runs no non-DaemonSet pod is marked
//!   [`ANNOTATION_EMPTY_SINCE`] and removed after `consolidateAfter`, longest-empty first;
//! - **underutilized** (`WhenEmptyOrUnderutilized`, the default): an Available node whose
//!   pods would all fit the free room of the tenant's other Ready nodes (requests, node
//!   selectors, required node affinity, tolerations) is marked
//!   [`ANNOTATION_UNDERUTILIZED_SINCE`] and removed after `consolidateAfter` — one node at a
//!   time, only while no node of the pool is draining and no pending pod waits for the
//!   pool; the drain evicts its pods (PodDisruptionBudgets apply) and the scheduler places
//!   them on the room that was counted.
//!
//! - **replaced by a cheaper type** (same policy): an Available node whose pods do not fit
//!   elsewhere but would all fit one new node of a cheaper node type the pool may use
//!   (within its limits) is marked the same way; when due, a replacement claim of that
//!   type is made first (`autonodes.io/replaces`), and once it is Available the node's pods
//!   fit its room, so the node goes as underutilized.
//!
//! - **several merged into one** (same policy): Available nodes none of which fits
//!   elsewhere or has a cheaper node of its own, but whose pods together fit one new node of
//!   a type cheaper than they cost together ([`merged_node`], at most [`MAX_MERGE`], the
//!   least to move first), are marked; when due the new node replaces the first of them,
//!   and once it is Available their pods fit its room, so they go one at a time as
//!   underutilized.
//!
//! All of them stay within the disruption budgets, and leave alone nodes marked do-not-disrupt
//! ([`super::do_not_disrupt`]). Where the pods would go is decided by the same packing as
//! for pending pods ([`super::pack`]), so pod affinity, anti-affinity and topology spread
//! among the pods of the other nodes hold after the move.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use autonodes_api::{ConsolidationPolicy, DisruptionReason, NodeClaim, NodeClaimPhase};

use super::pack::packer::place;
use super::pack::{
    non_daemon_running, pod_request, Amount, Bin, Candidate, Limits, NodeShape, PendingPod,
};
use super::plan::{is_draining, is_live, DeleteReason};
use super::{
    allowed_disruptions, consolidate_after, due_for_removal, ANNOTATION_EMPTY_SINCE,
    ANNOTATION_REPLACES, ANNOTATION_UNDERUTILIZED_SINCE,
};
use autonodes_api::NodePoolSpec;

/// What pods use on each node: non-DaemonSet pods (their requests, and the pods
/// themselves: what would have to move) and DaemonSet pods (room taken, but they keep no
/// node alive and do not move).
#[derive(Default)]
pub struct NodeUse<'a> {
    bound: HashMap<String, (Amount, Vec<&'a Pod>)>,
    daemons: HashMap<String, Amount>,
}

impl<'a> NodeUse<'a> {
    /// What the tenant's `pods` use, by node.
    pub fn of(pods: &'a [Pod]) -> NodeUse<'a> {
        let mut u = NodeUse::default();
        for p in pods {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            if non_daemon_running(p) {
                let e = u.bound.entry(node).or_default();
                e.0 = e.0.plus(&pod_request(p));
                e.1.push(p);
            } else {
                let e = u.daemons.entry(node).or_default();
                *e = e.plus(&pod_request(p));
            }
        }
        u
    }

    /// Requests of every pod on the node.
    pub fn used(&self, node: &str) -> Amount {
        let bound = self.moving(node);
        match self.daemons.get(node) {
            Some(d) => bound.plus(d),
            None => bound,
        }
    }

    /// What the DaemonSet and mirror pods on the node ask for together.
    pub fn daemons_on(&self, node: &str) -> Amount {
        self.daemons.get(node).cloned().unwrap_or_default()
    }

    /// Whether a non-DaemonSet pod runs on the node.
    pub fn busy(&self, node: &str) -> bool {
        self.bound.get(node).is_some_and(|b| !b.1.is_empty())
    }

    /// What the non-DaemonSet pods on the node ask for together.
    pub fn moving(&self, node: &str) -> Amount {
        self.bound
            .get(node)
            .map(|b| b.0.clone())
            .unwrap_or_default()
    }

    /// The non-DaemonSet pods on the node.
    pub fn movable(&self, node: &str) -> &[&'a Pod] {
        self.bound.get(node).map(|b| b.1.as_slice()).unwrap_or(&[])
    }
}

/// A node that could take moved pods: a Ready, schedulable node of a live claim of the
/// tenant, with its labels and taints and the room its pods leave.
#[derive(Clone, Debug)]
pub struct Target {
    /// The claim's name.
    pub claim: String,
    /// The node's name.
    pub node: String,
    /// Its labels and taints.
    pub shape: NodeShape,
    /// Room left.
    pub free: Amount,
    /// The pods on it (what pod affinity, anti-affinity and spread count).
    pub residents: Vec<PendingPod>,
}

/// What consolidation does this time.
#[derive(Debug, Default)]
pub(crate) struct Consolidation {
    /// Claims to remove, with why ([`DeleteReason::Empty`], [`DeleteReason::Underutilized`]).
    pub delete: Vec<(String, DeleteReason)>,
    /// [`ANNOTATION_EMPTY_SINCE`] to set (`Some`) or remove (`None`), by claim name.
    pub empty_since: Vec<(String, Option<Timestamp>)>,
    /// [`ANNOTATION_UNDERUTILIZED_SINCE`] to set or remove, by claim name.
    pub underutilized_since: Vec<(String, Option<Timestamp>)>,
    /// Replacement claims to create first (a cheaper type).
    pub replace: Vec<Replacement>,
    /// When the next marked node falls due.
    pub next_check: Option<Duration>,
}

/// A cheaper node to move a node's pods to: a new claim of `node_type` asking for
/// `request`, with `requirements` beside the pool's, replacing the claim `replaces`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Replacement {
    /// The claim replaced.
    pub replaces: String,
    /// The cheaper node type.
    pub node_type: String,
    /// What the moved pods ask for (`desiredCapacity`).
    pub request: Amount,
    /// The candidate's requirements (a zone pin).
    pub requirements: Vec<autonodes_api::Requirement>,
}

/// The inputs of [`consolidate`].
pub(crate) struct ConsolidationInput<'a, 'p> {
    /// The pool's spec.
    pub spec: &'a NodePoolSpec,
    /// The pool's claims.
    pub mine: &'a [std::sync::Arc<NodeClaim>],
    /// Claims of the pool planned for deletion a moment ago (by name).
    pub deleted_now: &'a BTreeSet<String>,
    /// Claims that receive pending pods in this plan (not empty, not underutilized).
    pub receiving: &'a BTreeSet<String>,
    /// Whether pending pods wait for the pool (no underutilized node goes meanwhile).
    pub pods_waiting: bool,
    /// Claims marked do-not-disrupt.
    pub protected: &'a super::do_not_disrupt::Protected,
    /// What the tenant's pods use.
    pub usage: &'a NodeUse<'p>,
    /// Where moved pods could go.
    pub targets: &'a [Target],
    /// The node types the pool may create, cheapest first.
    pub candidates: &'a [Candidate],
    /// The pool's limits and what it uses (nodes, resources).
    pub limits: &'a Limits,
    /// What the pool uses now (nodes, resources).
    pub pool_usage: &'a (i64, Amount),
    /// The time of the observation.
    pub now: Timestamp,
}

fn name_of(c: &NodeClaim) -> &str {
    c.metadata.name.as_deref().unwrap_or_default()
}

fn mark(c: &NodeClaim, key: &str) -> Option<Timestamp> {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<Timestamp>().ok())
}

/// The targets but those of `claims`, as nodes packing may use: the room of each (none
/// when `room` is false: they only count for pod affinity, anti-affinity and spread) and
/// the pods on it.
fn other_bins(targets: &[Target], claims: &[&str], room: bool) -> Vec<Bin> {
    targets
        .iter()
        .filter(|t| !claims.contains(&t.claim.as_str()))
        .map(|t| Bin {
            claim: t.claim.clone(),
            shape: t.shape.clone(),
            free: if room {
                t.free.clone()
            } else {
                Amount::default()
            },
            residents: t.residents.clone(),
            replaceable: false,
        })
        .collect()
}

/// The cheapest candidate cheaper than `cost` one new node of which takes all `pods` of the
/// nodes of `claims` (selectors, tolerations, extended resources, their summed requests,
/// and their pod affinity, anti-affinity and spread among the pods of the other targets,
/// whose room is not counted), within the pool's limits, with what the pods ask for;
/// `None` for no pods.
pub(crate) fn cheaper_node(
    pods: &[&Pod],
    claims: &[&str],
    cost: i64,
    targets: &[Target],
    candidates: &[Candidate],
    limits: &Limits,
    pool_usage: &(i64, Amount),
) -> Option<(Candidate, Amount)> {
    if pods.is_empty() {
        return None;
    }
    let moving: Vec<PendingPod> = pods.iter().map(|p| PendingPod::from_pod(p)).collect();
    let moving: Vec<&PendingPod> = moving.iter().collect();
    let cheaper: Vec<Candidate> = candidates
        .iter()
        .filter(|c| c.cost < cost)
        .cloned()
        .collect();
    if cheaper.is_empty() {
        return None;
    }
    // The replacement stands beside the nodes it replaces until they go: one more node
    // against the limits.
    let packing = place(
        &moving,
        &other_bins(targets, claims, false),
        &cheaper,
        limits,
        pool_usage.clone(),
    );
    match packing.new_nodes.as_slice() {
        [node] if node.pods.len() == moving.len() => {
            let c = cheaper
                .iter()
                .find(|c| c.node_type == node.node_type && c.requirements == node.requirements)?;
            Some((c.clone(), node.request.clone()))
        }
        _ => None,
    }
}

/// Whether every pod on the node of `claim` fits the room of the other targets, as
/// packing would place them (largest first, with their pod affinity, anti-affinity and
/// spread among the pods already there).
pub(crate) fn fits_elsewhere(pods: &[&Pod], claim: &str, targets: &[Target]) -> bool {
    let moving: Vec<PendingPod> = pods.iter().map(|p| PendingPod::from_pod(p)).collect();
    let moving: Vec<&PendingPod> = moving.iter().collect();
    let packing = place(
        &moving,
        &other_bins(targets, &[claim], true),
        &[],
        &Limits::default(),
        (0, Amount::default()),
    );
    packing.placed.values().map(Vec::len).sum::<usize>() == moving.len()
}

/// The most nodes one new node may replace at once.
pub(crate) const MAX_MERGE: usize = 8;

/// What consolidation found of one Available node of the pool.
struct Seen<'a> {
    claim: &'a NodeClaim,
    node: &'a str,
    /// No non-DaemonSet pod runs on it.
    empty: bool,
    /// Its pods fit elsewhere, or one cheaper node of its own.
    underutilized: bool,
    /// Its cost, when it may join several nodes replaced by one.
    mergeable: Option<i64>,
}

/// The largest number `k` (2 to [`MAX_MERGE`]) of the first `nodes` (claim, cost, pods;
/// the least to move first) whose pods all fit one new node of a type cheaper than the
/// `k` cost together — the pods' selectors, tolerations, resources, and their pod affinity,
/// anti-affinity and spread among the pods of the other targets, within the pool's limits
/// — with that type and what the pods ask for.
pub(crate) fn merged_node(
    nodes: &[(&str, i64, &[&Pod])],
    targets: &[Target],
    candidates: &[Candidate],
    limits: &Limits,
    pool_usage: &(i64, Amount),
) -> Option<(usize, Candidate, Amount)> {
    (2..=nodes.len().min(MAX_MERGE)).rev().find_map(|k| {
        let group = &nodes[..k];
        let cost: i64 = group.iter().map(|(_, c, _)| *c).sum();
        let pods: Vec<&Pod> = group
            .iter()
            .flat_map(|(_, _, pods)| pods.iter().copied())
            .collect();
        let claims: Vec<&str> = group.iter().map(|(n, _, _)| *n).collect();
        cheaper_node(
            &pods, &claims, cost, targets, candidates, limits, pool_usage,
        )
        .map(|(c, request)| (k, c, request))
    })
}

/// Empty and underutilized nodes: marks to set and clear, claims due for removal within
/// the budget, and when the next one falls due.
pub(crate) fn consolidate(input: &ConsolidationInput) -> Consolidation {
    let mut out = Consolidation::default();
    // `consolidateAfter: Never`: nodes stay.
    let Some(after) = consolidate_after(input.spec) else {
        return out;
    };
    let underutilized_too = input
        .spec
        .disruption
        .as_ref()
        .and_then(|d| d.consolidation_policy)
        != Some(ConsolidationPolicy::WhenEmpty);
    let now = input.now;
    let draining = input.mine.iter().filter(|c| is_draining(c)).count() + input.deleted_now.len();
    let nodes = input.mine.iter().filter(|c| is_live(c)).count();
    // Empty and underutilized nodes each go within the budgets for their reason.
    let allowed = |r| allowed_disruptions(input.spec, nodes, now, Some(r)).saturating_sub(draining);
    let mut disrupt_empty = allowed(DisruptionReason::Empty);
    let disrupt_underutilized = allowed(DisruptionReason::Underutilized);
    let mut next: Option<Duration> = None;
    let soonest = |next: &mut Option<Duration>, d: Duration| {
        *next = Some(next.map_or(d, |n| n.min(d)));
    };
    // `None` when the mark is due, else how long it has left.
    let left = |since: Timestamp| -> Option<Duration> {
        if due_for_removal(since, now, after) {
            return None;
        }
        let waited = (now.as_millisecond() - since.as_millisecond()).max(0);
        Some(after.saturating_sub(Duration::from_millis(waited.unsigned_abs())))
    };
    let mut empties: Vec<(String, Timestamp)> = Vec::new();
    let mut underused: Vec<(String, Timestamp)> = Vec::new();
    let mut moving_cpu: HashMap<String, i128> = HashMap::new();
    // Claims being replaced, by the name of their replacement (live claims of the pool
    // with `autonodes.io/replaces` naming a live claim of the pool).
    let live_names: BTreeSet<&str> = input
        .mine
        .iter()
        .filter(|c| is_live(c))
        .map(|c| name_of(c))
        .collect();
    let replacements: HashMap<&str, &NodeClaim> = input
        .mine
        .iter()
        .filter(|c| is_live(c))
        .filter_map(|c| {
            let old = c.metadata.annotations.as_ref()?.get(ANNOTATION_REPLACES)?;
            live_names
                .contains(old.as_str())
                .then_some((old.as_str(), &**c))
        })
        .collect();
    let replacing: BTreeSet<&str> = replacements.values().map(|c| name_of(c)).collect();
    let mut cheaper: HashMap<String, Replacement> = HashMap::new();
    let mut seen: Vec<Seen> = Vec::new();
    for c in input
        .mine
        .iter()
        .filter(|c| is_live(c) && !input.deleted_now.contains(name_of(c)))
    {
        let Some(s) = c.status.as_ref() else {
            continue;
        };
        if s.phase != Some(NodeClaimPhase::Available) {
            continue;
        }
        let Some(node_name) = s.node_name.as_deref() else {
            continue;
        };
        let name = name_of(c);
        let protected = input.protected.contains(name);
        // A replacement waiting for the pods of the claim it replaces is not idle.
        let receiving = input.receiving.contains(name) || replacing.contains(name);
        let busy = input.usage.busy(node_name) || receiving;
        let empty = !busy && !protected;
        // While pods wait for a node of the pool, no node counts as underutilized: its room
        // may be what they need, and none would go meanwhile (nor is the simulation of
        // every node's pods, the dearest part of a plan, spent on every plan of a burst).
        let candidate =
            underutilized_too && busy && !protected && !receiving && !input.pods_waiting;
        let fits = candidate && fits_elsewhere(input.usage.movable(node_name), name, input.targets);
        let replaceable = candidate && !fits && {
            let found = s.cost.and_then(|cost| {
                cheaper_node(
                    input.usage.movable(node_name),
                    &[name],
                    cost,
                    input.targets,
                    input.candidates,
                    input.limits,
                    input.pool_usage,
                )
            });
            match found {
                Some((c, request)) => {
                    cheaper.insert(
                        name.to_string(),
                        Replacement {
                            replaces: name.to_string(),
                            node_type: c.node_type,
                            request,
                            requirements: c.requirements,
                        },
                    );
                    true
                }
                None => false,
            }
        };
        let cost = s.cost.filter(|_| candidate && !fits && !replaceable);
        seen.push(Seen {
            claim: c,
            node: node_name,
            empty,
            underutilized: fits || replaceable,
            mergeable: cost,
        });
    }
    // Several nodes whose pods, together, fit one new node cheaper than they cost: each is
    // underutilized, and the node with the least to move is replaced first by that node
    // (the others' pods then fit its room and they go one by one).
    let mut candidates: Vec<&Seen> = seen.iter().filter(|v| v.mergeable.is_some()).collect();
    candidates.sort_by_key(|v| (input.usage.moving(v.node).cpu, name_of(v.claim)));
    let mergeable: Vec<(&str, i64, &[&Pod])> = candidates
        .iter()
        .filter_map(|v| Some((name_of(v.claim), v.mergeable?, input.usage.movable(v.node))))
        .collect();
    let merged = merged_node(
        &mergeable,
        input.targets,
        input.candidates,
        input.limits,
        input.pool_usage,
    );
    let mut merging: BTreeSet<String> = BTreeSet::new();
    if let Some((k, c, request)) = merged {
        merging.extend(mergeable.iter().take(k).map(|(n, _, _)| n.to_string()));
        let head = mergeable[0].0.to_string();
        cheaper.insert(
            head.clone(),
            Replacement {
                replaces: head,
                node_type: c.node_type,
                request,
                requirements: c.requirements,
            },
        );
    }
    for v in &seen {
        let (c, name) = (v.claim, name_of(v.claim));
        let underutilized = v.underutilized || merging.contains(name);
        if underutilized {
            moving_cpu.insert(name.to_string(), input.usage.moving(v.node).cpu);
        }
        let empty = v.empty;
        for (key, now_true, list) in [
            (ANNOTATION_EMPTY_SINCE, empty, &mut out.empty_since),
            (
                ANNOTATION_UNDERUTILIZED_SINCE,
                underutilized,
                &mut out.underutilized_since,
            ),
        ] {
            match (now_true, mark(c, key)) {
                (false, Some(_)) => list.push((name.to_string(), None)),
                (true, None) => list.push((name.to_string(), Some(now))),
                _ => {}
            }
        }
        let (key, due) = match (empty, underutilized) {
            (true, _) => (ANNOTATION_EMPTY_SINCE, &mut empties),
            (_, true) => (ANNOTATION_UNDERUTILIZED_SINCE, &mut underused),
            _ => continue,
        };
        match mark(c, key) {
            Some(since) => match left(since) {
                None => due.push((name.to_string(), since)),
                Some(d) => soonest(&mut next, d),
            },
            None => soonest(&mut next, after),
        }
    }
    empties.sort_by_key(|(_, since)| since.as_millisecond());
    for (name, _) in empties {
        if disrupt_empty == 0 {
            soonest(&mut next, Duration::from_secs(2));
            break;
        }
        disrupt_empty -= 1;
        out.delete.push((name, DeleteReason::Empty));
    }
    // One underutilized node at a time, and only while nothing else of the pool drains
    // and no pod waits for a node: the moved pods land on the room counted above.
    let quiet = draining == 0 && out.delete.is_empty() && !input.pods_waiting;
    // The node with the least to move first, then the longest marked.
    underused.sort_by_key(|(name, since)| {
        (
            moving_cpu.get(name).copied().unwrap_or(0),
            since.as_millisecond(),
        )
    });
    if let Some((name, _)) = underused.into_iter().next() {
        let available = |c: &NodeClaim| {
            c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
        };
        let may = quiet && disrupt_underutilized > 0;
        match (cheaper.remove(&name), replacements.get(name.as_str())) {
            // No replacement needed (the pods fit the room of other nodes, a replacement's
            // among them once it is Available): the node goes.
            (None, None) if may => out.delete.push((name, DeleteReason::Underutilized)),
            (None, Some(r)) if may && available(r) => {
                out.delete.push((name, DeleteReason::Underutilized));
            }
            // A cheaper node first.
            (Some(r), None) if may => out.replace.push(r),
            // The replacement is on its way (or not enough yet): look again soon.
            _ => soonest(&mut next, Duration::from_secs(2)),
        }
    }
    out.next_check = next;
    out
}

/// Where pods moved off a node could go: the Ready, schedulable nodes of the tenant's live
/// claims (`claims`: name, node shape, allocatable), with the room their pods leave.
pub fn targets<'a>(
    claims: impl IntoIterator<Item = (&'a NodeClaim, &'a NodeShape, &'a Amount)>,
    nodes: &[Node],
    usage: &NodeUse,
) -> Vec<Target> {
    let nodes: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    claims
        .into_iter()
        .filter_map(|(c, shape, allocatable)| {
            let s = c.status.as_ref()?;
            if s.phase != Some(NodeClaimPhase::Available) {
                return None;
            }
            let node_name = s.node_name.as_deref()?;
            let node = nodes.get(node_name)?;
            let cordoned = node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            if cordoned {
                return None;
            }
            Some(Target {
                claim: name_of(c).to_string(),
                node: node_name.to_string(),
                shape: shape.clone(),
                free: allocatable.minus(&usage.used(node_name)),
                residents: usage
                    .movable(node_name)
                    .iter()
                    .map(|p| PendingPod::from_pod(p))
                    .collect(),
            })
        })
        .collect()
}
