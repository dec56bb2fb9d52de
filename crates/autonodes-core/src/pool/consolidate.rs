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
//! Both stay within the disruption budgets, and leave alone nodes marked do-not-disrupt
//! ([`super::do_not_disrupt`]). A pod with pod anti-affinity or topology spread
//! constraints keeps its node from counting as underutilized: those rules are not
//! simulated here.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::api::{ConsolidationPolicy, NodeClaim, NodeClaimPhase};

use super::pack::{accepts, non_daemon_running, pod_request, Amount, NodeShape, PendingPod};
use super::plan::{is_draining, is_live, DeleteReason};
use super::{
    allowed_disruptions, consolidate_after, due_for_removal, ANNOTATION_EMPTY_SINCE,
    ANNOTATION_UNDERUTILIZED_SINCE,
};
use crate::api::NodePoolSpec;

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
        let bound = self
            .bound
            .get(node)
            .map(|b| b.0.clone())
            .unwrap_or_default();
        match self.daemons.get(node) {
            Some(d) => bound.plus(d),
            None => bound,
        }
    }

    /// Whether a non-DaemonSet pod runs on the node.
    pub fn busy(&self, node: &str) -> bool {
        self.bound.get(node).is_some_and(|b| !b.1.is_empty())
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
}

/// What consolidation does this time.
#[derive(Debug, Default)]
pub struct Consolidation {
    /// Claims to remove, with why ([`DeleteReason::Empty`], [`DeleteReason::Underutilized`]).
    pub delete: Vec<(String, DeleteReason)>,
    /// [`ANNOTATION_EMPTY_SINCE`] to set (`Some`) or remove (`None`), by claim name.
    pub empty_since: Vec<(String, Option<Timestamp>)>,
    /// [`ANNOTATION_UNDERUTILIZED_SINCE`] to set or remove, by claim name.
    pub underutilized_since: Vec<(String, Option<Timestamp>)>,
    /// When the next marked node falls due.
    pub next_check: Option<Duration>,
}

/// The inputs of [`consolidate`].
pub struct ConsolidationInput<'a, 'p> {
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
    pub protected: &'a BTreeSet<String>,
    /// What the tenant's pods use.
    pub usage: &'a NodeUse<'p>,
    /// Where moved pods could go.
    pub targets: &'a [Target],
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

/// Whether every pod on `node` (claim `claim`) fits the room of the other targets, first
/// fit, largest first; pods with pod anti-affinity or topology spread constraints do not
/// count as movable.
pub fn fits_elsewhere(pods: &[&Pod], claim: &str, targets: &[Target]) -> bool {
    let simulated = |p: &&Pod| {
        let spec = p.spec.as_ref();
        let anti = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .is_some();
        let spread = spec
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        !anti && !spread
    };
    if !pods.iter().all(simulated) {
        return false;
    }
    let mut moving: Vec<PendingPod> = pods.iter().map(|p| PendingPod::from_pod(p)).collect();
    moving.sort_by(|a, b| {
        (b.request.cpu, b.request.memory)
            .cmp(&(a.request.cpu, a.request.memory))
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut room: Vec<Target> = targets
        .iter()
        .filter(|t| t.claim != claim)
        .cloned()
        .collect();
    'pods: for pod in &moving {
        for t in room.iter_mut() {
            if accepts(&t.shape, pod) && t.free.covers(&pod.request) {
                t.free = t.free.minus(&pod.request);
                continue 'pods;
            }
        }
        return false;
    }
    true
}

/// Empty and underutilized nodes: marks to set and clear, claims due for removal within
/// the budget, and when the next one falls due.
pub fn consolidate(input: &ConsolidationInput) -> Consolidation {
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
    let mut disrupt = allowed_disruptions(input.spec, nodes, now).saturating_sub(draining);
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
        let receiving = input.receiving.contains(name);
        let busy = input.usage.busy(node_name) || receiving;
        let empty = !busy && !protected;
        let underutilized = underutilized_too
            && busy
            && !protected
            && !receiving
            && fits_elsewhere(input.usage.movable(node_name), name, input.targets);
        if underutilized {
            let cpu = input
                .usage
                .movable(node_name)
                .iter()
                .map(|p| pod_request(p).cpu)
                .sum();
            moving_cpu.insert(name.to_string(), cpu);
        }
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
        if disrupt == 0 {
            soonest(&mut next, Duration::from_secs(2));
            break;
        }
        disrupt -= 1;
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
        if quiet && disrupt > 0 {
            out.delete.push((name, DeleteReason::Underutilized));
        } else {
            soonest(&mut next, Duration::from_secs(2));
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
            })
        })
        .collect()
}
