//! A dynamic pool's plan (no `replicas`): the tenant's unschedulable pods a node of the
//! pool would take are packed onto the free room of the tenant's nodes and in-flight claims,
//! then onto new claims of the cheapest accepting node type within `spec.limits`
//! ([`super::pack`]); the pool's Available claims whose node runs no non-DaemonSet pod are
//! marked `autonodes.io/empty-since` and removed after `consolidateAfter`, within the
//! disruption budget; and the `Ready` and `LimitReached` conditions say how it went. A pod
//! that a dynamic pool of the same tenant ranked ahead (higher `weight`, then name) would
//! create a node for is left to that pool.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::catalogue::{Catalogue, PreparedType};
use crate::requirements::Offer;
use crate::resources::ResourceAmounts;
use crate::scheduling::{self, ClaimRequest, Mismatch};
use autonodes_api::conditions;
use autonodes_api::reasons::{ClaimCondition, PoolReason};
use autonodes_api::{
    NodeClaim, NodeClaimSpec, NodePool, NodePoolSpec, Operator, Overhead, PreferencePolicy,
    Requirement,
};

use super::consolidate::{self, ConsolidationInput, NodeUse};
use super::daemonsets::{self, DaemonPod};
use super::do_not_disrupt;
use super::limits::holds_a_place;
use super::pack::packer::pack;
use super::pack::{
    accepts, claim_type, is_unschedulable, opens_for, Amount, Bin, Candidate, Limits, NodeShape,
    Packing, PendingPod, ZONE_TOPOLOGY,
};
use super::plan::NewClaim;
use super::plan::Verdict;
use super::plan::{is_live, DeleteReason};
use super::{due_for_removal, owned_by, template_spec, ANNOTATION_REPLACES, READY_NODE_GRACE};

/// The most unschedulable pods one plan of a dynamic pool packs (the oldest first); the
/// others are packed in the plans after.
pub const MAX_PENDING_PER_PLAN: usize = 5_000;

/// The longest a dynamic pool waits before it looks again.
pub(crate) const MAX_RECHECK: Duration = Duration::from_secs(30);

/// How a burst of pending pods is gathered into one batch, packed together: new nodes are
/// made once no pod of the pool was newly marked unschedulable for `idle` (the marks have a
/// resolution of one second), or once a pod that needs a new node has waited `max`, however
/// long the burst. Karpenter's `BATCH_IDLE_DURATION` and `BATCH_MAX_DURATION`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Batch {
    /// No new mark for this long closes the batch.
    pub idle: Duration,
    /// A pod that needs a new node never waits longer than this.
    pub max: Duration,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            idle: Duration::from_secs(2),
            max: Duration::from_secs(10),
        }
    }
}

/// When the kube-scheduler marked `p` unschedulable (its `PodScheduled` condition's last
/// transition).
fn marked_at(p: &Pod) -> Option<Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// How long the new nodes for `new_pods` wait for the `batch` to close, given when each
/// pending pod was marked (`marks`, by key): `None` once no pod was marked for `batch.idle`
/// or one of `new_pods` has waited `batch.max` (pods without a mark count as waiting long).
fn batch_open(
    batch: Batch,
    new_pods: &[&str],
    marks: &HashMap<String, Timestamp>,
    now: Timestamp,
) -> Option<Duration> {
    let age = |t: &Timestamp| {
        Duration::from_millis(
            (now.as_millisecond() - t.as_millisecond())
                .max(0)
                .unsigned_abs(),
        )
    };
    let newest = marks.values().map(age).min()?;
    let oldest = new_pods
        .iter()
        .map(|k| marks.get(*k).map_or(batch.max, age))
        .max()?;
    if newest >= batch.idle || oldest >= batch.max {
        return None;
    }
    Some((batch.idle - newest).min(batch.max - oldest))
}

/// What the controller observed of the tenant and the namespace for a dynamic pool.
#[derive(Clone, Copy, Debug)]
pub struct Tenant<'a> {
    /// Every pod of the tenant.
    pub pods: &'a [Pod],
    /// Every node of the tenant.
    pub nodes: &'a [Node],
    /// The namespace's claims that are not the pool's (other pools', single claims); those
    /// of the pool's tenant add room.
    pub others: &'a [Arc<NodeClaim>],
    /// Live claims per node type (what is left of `maxCapacity`).
    pub claimed: &'a BTreeMap<String, i64>,
    /// `spec.overhead` by NodeType name (its `kubeReserved` is not allocatable).
    pub overheads: &'a BTreeMap<String, Overhead>,
    /// The tenant's DaemonSets: their pods take room on every node they would run on
    /// ([`super::daemonsets`]).
    pub daemonsets: &'a [DaemonSet],
    /// The namespace's NodePools (the pool itself may be among them): dynamic pools of
    /// the same tenant ranked ahead of this one get first go at pending pods.
    pub pools: &'a [Arc<NodePool>],
}

/// The inputs of [`plan`].
#[derive(Clone, Copy, Debug)]
pub struct DynamicInput<'a> {
    /// The pool's name.
    pub name: &'a str,
    /// The pool's spec.
    pub spec: &'a NodePoolSpec,
    /// Its claim template ([`super::template_spec`]).
    pub template: &'a NodeClaimSpec,
    /// The pool's claims, with the ones planned a moment ago (no status yet).
    pub mine: &'a [Arc<NodeClaim>],
    /// Claims of the pool planned for deletion a moment ago (by name).
    pub deleted_now: &'a BTreeSet<String>,
    /// The tenant.
    pub tenant: Tenant<'a>,
    /// The node types.
    pub catalogue: &'a Catalogue,
    /// How bursts of pending pods are batched.
    pub batch: Batch,
    /// The time of the observation.
    pub now: Timestamp,
}

/// What a dynamic pool does.
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicPlan {
    /// New claims for pending pods, each pinned to its type with the pods' requests.
    pub create: Vec<NewClaim>,
    /// Claims consolidation removes ([`super::consolidate`]), with why.
    pub delete: Vec<(String, DeleteReason)>,
    /// `autonodes.io/empty-since` to set (`Some`) or remove (`None`), by claim name.
    pub empty_since: Vec<(String, Option<Timestamp>)>,
    /// `autonodes.io/underutilized-since` to set or remove, by claim name.
    pub underutilized_since: Vec<(String, Option<Timestamp>)>,
    /// `Ready`.
    pub ready: Verdict,
    /// `LimitReached`.
    pub limit: Verdict,
    /// Unschedulable pods a node of the pool would take.
    pub pending_pods: i32,
    /// When to look again.
    pub requeue: Duration,
}

/// What pods may use on a node of type `t`: its resources less `overhead.kubeReserved`.
pub fn allocatable(t: &PreparedType, overhead: Option<&Overhead>) -> Amount {
    let reserved = overhead
        .and_then(|o| ResourceAmounts::from_list(&o.kube_reserved).ok())
        .map(|r| Amount {
            cpu: r.cpu_millis(),
            memory: r.memory_bytes(),
            ..Amount::default()
        })
        .unwrap_or_default();
    Amount::of_node(&t.amounts).minus(&reserved)
}

/// A live claim of the tenant: its node's labels and taints (from its type, as scheduled,
/// else as it would be) and its room.
struct ClaimNode<'a> {
    claim: &'a NodeClaim,
    /// Whether it is a claim of the pool being planned.
    own: bool,
    shape: NodeShape,
    allocatable: Amount,
}

fn name_of(c: &NodeClaim) -> &str {
    c.metadata.name.as_deref().unwrap_or_default()
}

/// The tenant's live claims (the pool's and the others of its vCluster), less the ones
/// deleted a moment ago.
fn claim_nodes<'a>(input: &DynamicInput<'a>) -> Vec<ClaimNode<'a>> {
    let vcluster = &input.spec.v_cluster_ref.name;
    let mine = input.mine.iter().map(|c| (&**c, true));
    let others = input
        .tenant
        .others
        .iter()
        .filter(|c| &c.spec.v_cluster_ref.name == vcluster)
        .map(|c| (&**c, false));
    mine.chain(others)
        .filter(|(c, _)| is_live(c) && !input.deleted_now.contains(name_of(c)))
        .map(|(c, own)| {
            let t = claim_type(c, input.catalogue, input.tenant.claimed);
            let (shape, allocatable) = match t {
                Some(t) => (
                    NodeShape::of_type(t, &c.spec).unwrap_or_default(),
                    allocatable(t, input.tenant.overheads.get(&t.name)),
                ),
                None => (NodeShape::default(), Amount::default()),
            };
            ClaimNode {
                claim: c,
                own,
                shape,
                allocatable,
            }
        })
        .collect()
}

/// The tenant's claims' nodes with their pods, and their free room for pods the scheduler
/// could not place: none on cordoned nodes and on nodes Ready for longer than
/// [`READY_NODE_GRACE`] (the scheduler has seen those: pods it still calls unschedulable do
/// not fit there). Their pods count all the same: for pod anti-affinity, affinity and
/// spread, the kube-scheduler counts the pods of every node.
fn bins(
    claim_nodes: &[ClaimNode],
    nodes: &[Node],
    usage: &NodeUse,
    daemons: &[DaemonPod],
    now: Timestamp,
) -> Vec<Bin> {
    let nodes: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    let mut bins = Vec::new();
    for cn in claim_nodes {
        let status = cn.claim.status.clone().unwrap_or_default();
        let node_name = status.node_name.as_deref();
        let cordoned = node_name
            .and_then(|n| nodes.get(n))
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
            || crate::claim::powered_off(cn.claim);
        let ready_since = conditions::true_since(&status.conditions, ClaimCondition::Ready);
        let seen = ready_since.is_some_and(|since| due_for_removal(since, now, READY_NODE_GRACE));
        // What runs there, and the daemon pods still to come (all of them on a node that
        // has not joined yet).
        let used = match node_name {
            Some(n) => usage
                .used(n)
                .plus(&daemonsets::still_to_come(&cn.shape, daemons, n, usage)),
            None => daemonsets::overhead(&cn.shape, daemons),
        };
        bins.push(Bin {
            claim: name_of(cn.claim).to_string(),
            shape: cn.shape.clone(),
            free: if cordoned || seen {
                Amount::default()
            } else {
                cn.allocatable.minus(&used)
            },
            residents: node_name
                .map(|n| {
                    usage
                        .movable(n)
                        .iter()
                        .map(|p| PendingPod::from_pod(p))
                        .collect()
                })
                .unwrap_or_default(),
            // The pool's own claim whose node runs no pod yet may still be replaced by
            // one of a larger type; not one made to replace another (it waits for that
            // one's pods).
            replaceable: cn.own
                && node_name.is_none_or(|n| !usage.busy(n))
                && !cn
                    .claim
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(ANNOTATION_REPLACES)),
        });
    }
    bins
}

/// The node types the pool's template fits, cheapest first, with the room left of each.
/// Types with extended resources are candidates too (the template need not ask for a
/// GPU): packing opens one only for a pod that asks for its extended resource. A type
/// whose zone property offers several zones (`a,b`) the template does not pin is one
/// candidate per zone, each pinned by a requirement, so zone spread can choose.
pub(crate) fn candidates(
    template: &NodeClaimSpec,
    request: &ClaimRequest,
    tenant: &Tenant,
    daemons: &[DaemonPod],
    catalogue: &Catalogue,
) -> Vec<Candidate> {
    catalogue
        .types()
        .iter()
        .filter(|t| {
            template
                .provider_ref
                .as_deref()
                .is_none_or(|p| p == t.provider)
                && scheduling::mismatches(t, request)
                    .iter()
                    .all(|m| matches!(m, Mismatch::UnrequestedExtended(_)))
        })
        .flat_map(|t| {
            zone_pins(t, template)
                .into_iter()
                .filter_map(|pin| {
                    let mut spec = template.clone();
                    spec.requirements.extend(pin.iter().cloned());
                    let shape = NodeShape::of_type(t, &spec)?;
                    // What pods may use once the DaemonSets' pods run there too.
                    let allocatable = allocatable(t, tenant.overheads.get(&t.name))
                        .minus(&daemonsets::overhead(&shape, daemons));
                    Some(Candidate {
                        node_type: t.name.clone(),
                        shape,
                        allocatable,
                        resources: Amount::of_node(&t.amounts),
                        room: t
                            .max_capacity
                            .map(|m| m - tenant.claimed.get(&t.name).copied().unwrap_or(0)),
                        cost: t.cost,
                        requirements: pin,
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The zone requirements to make one candidate each of `t`: none (one candidate as it is)
/// unless its zone property offers several zones and the template has no requirement on
/// the zone; then `zone In [z]` for each offered zone `z`.
fn zone_pins(t: &PreparedType, template: &NodeClaimSpec) -> Vec<Vec<Requirement>> {
    let pinned = template.requirements.iter().any(|r| r.key == ZONE_TOPOLOGY);
    let offered = t.properties.get(ZONE_TOPOLOGY).map(|v| Offer::parse(v));
    match offered {
        Some(Offer::Several(zones)) if !pinned => zones
            .into_iter()
            .map(|z| {
                vec![Requirement {
                    key: ZONE_TOPOLOGY.to_string(),
                    operator: Operator::In,
                    values: vec![z.to_string()],
                    min_values: None,
                }]
            })
            .collect(),
        _ => vec![Vec::new()],
    }
}

/// The pool's claim template pinned to `node_type` (`typeRef`), asking for `request`
/// (`desiredCapacity`), with `requirements` added (a zone).
fn pinned(
    template: &NodeClaimSpec,
    node_type: &str,
    request: &Amount,
    requirements: &[Requirement],
) -> NodeClaimSpec {
    let mut spec = NodeClaimSpec {
        desired_capacity: request.to_resource_list(),
        type_ref: Some(node_type.to_string()),
        ..template.clone()
    };
    spec.requirements.extend(requirements.iter().cloned());
    spec
}

/// What a pool's live claims use against its `limits`: how many, and the full resources of
/// their types (a claim whose type is unknown counts as a node without resources).
fn pool_usage<'t>(types: impl Iterator<Item = Option<&'t PreparedType>>) -> (i64, Amount) {
    types.fold((0, Amount::default()), |(nodes, used), t| match t {
        Some(t) => (nodes + 1, used.plus(&Amount::of_node(&t.amounts))),
        None => (nodes + 1, used),
    })
}

/// A pool's place among a tenant's dynamic pools: higher `weight` first, then by name.
fn rank(name: &str, spec: &NodePoolSpec) -> (std::cmp::Reverse<i32>, String) {
    (
        std::cmp::Reverse(spec.weight.unwrap_or(0)),
        name.to_string(),
    )
}

/// A dynamic pool of the same tenant ranked ahead of the one being planned: the node
/// types it may create, its limits and what it uses.
struct Ahead {
    candidates: Vec<Candidate>,
    limits: Limits,
    usage: (i64, Amount),
}

impl Ahead {
    /// Whether this pool would create a node for `pod`: one of its types takes the pod,
    /// has room left, and one more node of it stays within the pool's limits.
    fn would_take(&self, pod: &PendingPod) -> bool {
        self.candidates.iter().any(|c| {
            accepts(&c.shape, pod)
                && opens_for(c, pod)
                && c.allocatable.covers(&pod.request)
                && c.room.is_none_or(|r| r > 0)
                && self
                    .limits
                    .allow(self.usage.0 + 1, &self.usage.1.plus(&c.resources))
        })
    }
}

/// The tenant's other dynamic pools ranked ahead of this one (weight, then name), that
/// are not being deleted and whose template can be read.
fn pools_ahead(input: &DynamicInput) -> Vec<Ahead> {
    let me = rank(input.name, input.spec);
    input
        .tenant
        .pools
        .iter()
        .filter(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            name != input.name
                && p.metadata.deletion_timestamp.is_none()
                && p.spec.replicas.is_none()
                && p.spec.v_cluster_ref.name == input.spec.v_cluster_ref.name
                && rank(name, &p.spec) < me
        })
        .filter_map(|p| {
            let template = template_spec(&p.spec);
            let request = ClaimRequest::new(&template, None).ok()?;
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let usage = pool_usage(
                input
                    .tenant
                    .others
                    .iter()
                    .filter(|c| holds_a_place(c) && owned_by(c, uid))
                    .map(|c| claim_type(c, input.catalogue, input.tenant.claimed)),
            );
            Some(Ahead {
                candidates: candidates(
                    &template,
                    &request,
                    &input.tenant,
                    &daemonsets::daemon_pods(input.tenant.daemonsets),
                    input.catalogue,
                ),
                limits: Limits::from_spec(p.spec.limits.as_ref()),
                usage,
            })
        })
        .collect()
}

/// `LimitReached`, then `Ready`, from the packing.
fn verdicts(packing: &Packing, limits: &Limits, no_candidates: bool) -> (Verdict, Verdict) {
    let limit = if packing.blocked_by_limits.is_empty() {
        Verdict::new(
            false,
            PoolReason::WithinLimits,
            "demand fits within the pool's limits",
        )
    } else {
        Verdict::new(
            true,
            PoolReason::LimitReached,
            format!(
                "{} pending pod(s) need nodes beyond the pool's limits ({})",
                packing.blocked_by_limits.len(),
                limits.describe()
            ),
        )
    };
    let ready = if !packing.blocked_by_capacity.is_empty() {
        Verdict::problem(
            PoolReason::InsufficientCapacity,
            format!(
                "{} pending pod(s) fit node types that are all at maxCapacity",
                packing.blocked_by_capacity.len()
            ),
        )
    } else if !packing.blocked_by_min_values.is_empty() && packing.new_nodes.is_empty() {
        Verdict::problem(
            PoolReason::NoMatchingNodeType,
            format!(
                "{} pending pod(s) fit too few node types for the pool's minValues ({})",
                packing.blocked_by_min_values.len(),
                limits
                    .min_values
                    .iter()
                    .map(|r| format!("{r}: at least {} values", r.min_values.unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        )
    } else if !packing.blocked_groups.is_empty() && packing.new_nodes.is_empty() {
        Verdict::problem(
            PoolReason::PodRulesUnsatisfiable,
            format!(
                "{} group(s) of pending pods fit no node type of the pool together: {}",
                packing.blocked_groups.len(),
                packing.blocked_groups[0].describe()
            ),
        )
    } else if !packing.blocked_by_constraints.is_empty() && packing.new_nodes.is_empty() {
        Verdict::problem(
            PoolReason::PodRulesUnsatisfiable,
            format!(
                "{} pending pod(s) fit the pool's node types, but their pod affinity, anti-affinity or topology spread allows no node (first: {})",
                packing.blocked_by_constraints.len(),
                packing.blocked_by_constraints.first().map(String::as_str).unwrap_or_default()
            ),
        )
    } else if no_candidates {
        Verdict::problem(
            PoolReason::NoMatchingNodeType,
            "no node type fits the pool's template",
        )
    } else if !packing.new_nodes.is_empty() {
        Verdict::new(
            false,
            PoolReason::ScalingUp,
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
        Verdict::new(
            true,
            PoolReason::Ready,
            "no pending pod waits for a new node",
        )
    };
    (limit, ready)
}

/// Plans a dynamic pool: new claims for the pending pods that fit no existing room, empty
/// nodes marked and removed, the conditions, and when to look again (when the next empty
/// node falls due, at most [`MAX_RECHECK`]).
pub fn plan(input: &DynamicInput) -> DynamicPlan {
    let tenant = &input.tenant;
    let usage = NodeUse::of(tenant.pods);
    // Pods a pool ranked ahead would create a node for are left to it.
    let ahead = pools_ahead(input);
    // The oldest unschedulable pods first, at most MAX_PENDING_PER_PLAN of them: the rest
    // wait for the next plan, so a tenant's flood costs each plan a bounded amount.
    let mut unschedulable: Vec<&Pod> = tenant.pods.iter().filter(|p| is_unschedulable(p)).collect();
    unschedulable.sort_by(|a, b| {
        (
            &a.metadata.creation_timestamp,
            &a.metadata.namespace,
            &a.metadata.name,
        )
            .cmp(&(
                &b.metadata.creation_timestamp,
                &b.metadata.namespace,
                &b.metadata.name,
            ))
    });
    let mut marks: HashMap<String, Timestamp> = HashMap::new();
    // `preferencePolicy: Ignore`: the pods are packed as if they had no preferences.
    let ignore = input.spec.preference_policy == Some(PreferencePolicy::Ignore);
    let pending: Vec<PendingPod> = unschedulable
        .into_iter()
        .map(|p| {
            let pod = PendingPod::from_pod(p);
            let pod = if ignore {
                pod.without_preferences()
            } else {
                pod
            };
            (pod, marked_at(p))
        })
        .filter(|(p, _)| !ahead.iter().any(|a| a.would_take(p)))
        .take(MAX_PENDING_PER_PLAN)
        .map(|(p, mark)| {
            // A mark ahead of this clock (a tenant's skewed clock, or a status written by
            // hand) would hold the batch open: such a pod counts as waiting long.
            if let Some(mark) = mark.filter(|m| m.as_second() <= input.now.as_second() + 1) {
                marks.insert(p.key.clone(), mark);
            }
            p
        })
        .collect();
    let daemons = daemonsets::daemon_pods(tenant.daemonsets);
    let claim_nodes = claim_nodes(input);
    let bins = bins(&claim_nodes, tenant.nodes, &usage, &daemons, input.now);
    let candidates = match ClaimRequest::new(input.template, None) {
        Ok(request) => candidates(input.template, &request, tenant, &daemons, input.catalogue),
        Err(_) => Vec::new(),
    };
    // The pool's usage against its limits: every claim of it that holds a place, those
    // being deleted included (their VMs run until their drains end).
    let usage_of_pool = pool_usage(
        input
            .mine
            .iter()
            .filter(|c| holds_a_place(c))
            .map(|c| claim_type(c, input.catalogue, input.tenant.claimed)),
    );
    let mut limits = Limits::from_spec(input.spec.limits.as_ref());
    limits.min_values = ClaimRequest::new(input.template, None)
        .map(|r| {
            r.requirements()
                .iter()
                .filter(|r| r.min_values.is_some())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let packing = pack(&pending, &bins, &candidates, &limits, usage_of_pool.clone());
    let new_pods: Vec<&str> = packing
        .new_nodes
        .iter()
        .flat_map(|n| n.pods.iter().map(String::as_str))
        .collect();
    let batching = batch_open(input.batch, &new_pods, &marks, input.now);
    let mut create: Vec<NewClaim> = packing
        .new_nodes
        .iter()
        .filter(|_| batching.is_none())
        .map(|n| NewClaim {
            spec: pinned(input.template, &n.node_type, &n.request, &n.requirements),
            replaces: None,
            pods: n.pods.clone(),
        })
        .collect();
    // A claim that has not joined and whose pod must now share a node with pods that came
    // after it goes together with the creation of the node that holds them all.
    let outgrown: Vec<(String, DeleteReason)> = packing
        .outgrown
        .iter()
        .filter(|_| batching.is_none())
        .map(|(claim, _)| (claim.clone(), DeleteReason::Outgrown))
        .collect();
    let mut deleted_now = input.deleted_now.clone();
    deleted_now.extend(outgrown.iter().map(|(c, _)| c.clone()));
    let protected = do_not_disrupt::protected(
        input.mine.iter().map(|c| &**c),
        tenant.nodes,
        tenant.pods,
        input.now,
    );
    let receiving: BTreeSet<String> = packing.placed.keys().cloned().collect();
    let targets = consolidate::targets(
        claim_nodes
            .iter()
            .map(|cn| (cn.claim, &cn.shape, &cn.allocatable)),
        tenant.nodes,
        &usage,
    );
    let consolidation = consolidate::consolidate(&ConsolidationInput {
        spec: input.spec,
        mine: input.mine,
        deleted_now: &deleted_now,
        receiving: &receiving,
        pods_waiting: packing.wanted > 0,
        protected: &protected,
        usage: &usage,
        targets: &targets,
        candidates: &candidates,
        limits: &limits,
        pool_usage: &usage_of_pool,
        now: input.now,
    });
    // A cheaper node first; the replaced one goes once it is Available.
    create.extend(consolidation.replace.iter().map(|r| NewClaim {
        spec: pinned(input.template, &r.node_type, &r.request, &r.requirements),
        replaces: Some(r.replaces.clone()),
        pods: Vec::new(),
    }));
    let (limit, ready) = verdicts(&packing, &limits, candidates.is_empty());
    let requeue = consolidation
        .next_check
        .map(|d| d.max(Duration::from_millis(500)) + Duration::from_millis(200))
        .unwrap_or(MAX_RECHECK)
        .min(MAX_RECHECK)
        .min(batching.map_or(MAX_RECHECK, |d| d + Duration::from_millis(100)));
    let mut delete = outgrown;
    delete.extend(consolidation.delete);
    DynamicPlan {
        create,
        delete,
        empty_since: consolidation.empty_since,
        underutilized_since: consolidation.underutilized_since,
        ready,
        limit,
        pending_pods: i32::try_from(packing.wanted).unwrap_or(i32::MAX),
        requeue,
    }
}
