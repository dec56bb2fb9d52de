//! Pending pods packed onto nodes: what a pod asks for ([`pod_request`]: cpu, memory, pods
//! and extended resources), whether a node of some labels and taints would take it
//! ([`accepts`], through [`crate::requirements`]), the rules a pod sets on other pods
//! ([`constraints`]: pod affinity, anti-affinity, topology spread), and [`packer::pack`]: largest
//! first onto the room of existing and in-flight nodes, then onto new nodes of the types
//! the pool may use within its [`Limits`] (counting pods per topology domain in
//! [`topology`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorTerm, Pod, PreferredSchedulingTerm, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::catalogue::{Catalogue, PreparedType};
use crate::pod_requests::pod_requests;
use crate::requirements;
use crate::resources::{self, ResourceAmounts, CPU, MEMORY};
use crate::scheduling::{self, ClaimRequest};
use autonodes_api::{NodeClaim, NodeClaimSpec, Requirement, ResourceList};

/// Pods a node takes at most (the kubelet's default `maxPods`).
pub const MAX_PODS_PER_NODE: i128 = 110;

/// CPU (millicores), memory (bytes), a pod count and extended resources (milli-units by
/// name, e.g. `nvidia.com/gpu`: 1000 is one GPU).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount {
    /// Millicores.
    pub cpu: i128,
    /// Bytes.
    pub memory: i128,
    /// Pods.
    pub pods: i128,
    /// Extended resources (see [`resources::is_extended_resource`]) in milli-units; only
    /// non-zero entries.
    pub extended: BTreeMap<String, i128>,
}

impl Amount {
    /// Whether `want` fits into `self`.
    pub fn covers(&self, want: &Amount) -> bool {
        self.cpu >= want.cpu
            && self.memory >= want.memory
            && self.pods >= want.pods
            && want
                .extended
                .iter()
                .all(|(name, w)| self.extended.get(name).copied().unwrap_or(0) >= *w)
    }

    /// `self + other`.
    pub fn plus(&self, other: &Amount) -> Amount {
        let mut extended = self.extended.clone();
        for (name, v) in &other.extended {
            *extended.entry(name.clone()).or_insert(0) += v;
        }
        extended.retain(|_, v| *v != 0);
        Amount {
            cpu: self.cpu + other.cpu,
            memory: self.memory + other.memory,
            pods: self.pods + other.pods,
            extended,
        }
    }

    /// `self - other`, never below zero.
    pub fn minus(&self, other: &Amount) -> Amount {
        let mut extended = self.extended.clone();
        for (name, v) in &other.extended {
            if let Some(have) = extended.get_mut(name) {
                *have = (*have - v).max(0);
            }
        }
        extended.retain(|_, v| *v != 0);
        Amount {
            cpu: (self.cpu - other.cpu).max(0),
            memory: (self.memory - other.memory).max(0),
            pods: (self.pods - other.pods).max(0),
            extended,
        }
    }

    /// Whether it asks for any extended resource.
    pub fn has_extended(&self) -> bool {
        !self.extended.is_empty()
    }

    /// The cpu, memory and extended resources of a node type's resources, with room for
    /// [`MAX_PODS_PER_NODE`].
    pub fn of_node(amounts: &ResourceAmounts) -> Amount {
        Amount {
            cpu: amounts.cpu_millis(),
            memory: amounts.memory_bytes(),
            pods: MAX_PODS_PER_NODE,
            extended: amounts
                .extended()
                .map(|(name, milli)| (name.to_string(), milli))
                .collect(),
        }
    }

    /// As a resource list (cpu, memory and the extended resources).
    pub fn to_resource_list(&self) -> ResourceList {
        let mut list = ResourceList::from([
            (CPU.to_string(), Quantity(resources::format_cpu(self.cpu))),
            (
                MEMORY.to_string(),
                Quantity(resources::format_memory(self.memory)),
            ),
        ]);
        for (name, milli) in &self.extended {
            list.insert(name.clone(), Quantity(resources::format_cpu(*milli)));
        }
        list
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

impl NodeShape {
    /// The labels and taints a node of type `t` made from the claim `spec` gets; `None` if
    /// the spec's labels or taints cannot be used.
    pub fn of_type(t: &PreparedType, spec: &NodeClaimSpec) -> Option<NodeShape> {
        let labels = crate::node_config::node_labels(
            &crate::node_config::node_properties(t, None, spec),
            None,
            &spec.labels,
            &BTreeMap::new(),
        )
        .ok()?
        .all();
        let taints = crate::node_config::node_taints(t, None, spec).ok()?.taints;
        Some(NodeShape { labels, taints })
    }
}

/// The type of a claim: the one it was scheduled to, else the one it would get now given
/// the claims per type (`claimed`).
pub fn claim_type<'c>(
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

/// The annotation the kubelet puts on the mirror pod of a static pod.
pub(crate) const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether the pod keeps its node busy: neither a DaemonSet's nor a mirror pod, and not
/// finished.
pub(crate) fn non_daemon_running(p: &Pod) -> bool {
    let daemon = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
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

/// The topology key of one node.
pub(crate) const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";
/// The topology key of a zone (a node type gets it from its `topology.kubernetes.io/zone`
/// property).
pub(crate) const ZONE_TOPOLOGY: &str = "topology.kubernetes.io/zone";

/// One unschedulable pod (or one that would have to move, or one already on a node).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingPod {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// Its labels (what other pods' terms select).
    pub labels: BTreeMap<String, String>,
    /// Its pod affinity, anti-affinity and topology spread rules.
    pub rules: PodRules,
    /// Its requests (pods: 1).
    pub request: Amount,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The required node affinity's terms (any must match), if it has any.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    /// The preferred node affinity's terms with their weights (packing honours them
    /// first, and drops them one at a time when the pod fits nowhere with them:
    /// [`preferences`]).
    pub preferred_terms: Vec<PreferredSchedulingTerm>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
}

impl PendingPod {
    /// The pending-pod view of a pod.
    pub fn from_pod(pod: &Pod) -> PendingPod {
        let spec = pod.spec.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let node_affinity = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref());
        PendingPod {
            rules: PodRules::of(&namespace, &labels, &spec),
            key: format!(
                "{namespace}/{}",
                pod.metadata
                    .name
                    .as_deref()
                    .or(pod.metadata.generate_name.as_deref())
                    .unwrap_or_default()
            ),
            namespace,
            labels,
            request: pod_request(pod),
            required_terms: node_affinity
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|s| s.node_selector_terms.clone()),
            preferred_terms: node_affinity
                .and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
            node_selector: spec.node_selector.unwrap_or_default(),
            tolerations: spec.tolerations.unwrap_or_default(),
        }
    }

    /// The pod as if it had no preferences: no preferred node affinity, no preferred pod
    /// affinity or anti-affinity, no `ScheduleAnyway` spread (a pool's
    /// `preferencePolicy: Ignore`).
    pub fn without_preferences(mut self) -> PendingPod {
        self.preferred_terms.clear();
        self.rules.preferred_affinity.clear();
        self.rules.preferred_anti_affinity.clear();
        self.rules.spread.retain(|s| s.hard);
        self
    }
}

/// What a pod asks for, as packing counts it: cpu, memory and extended resources by
/// [`pod_requests`] (the kube-scheduler's rule: sidecars, pod-level resources, resizes,
/// overhead), and one pod. Extended resources (`nvidia.com/gpu`) count by their requests,
/// else by their limits (the API server makes them equal).
pub fn pod_request(pod: &Pod) -> Amount {
    let Some(spec) = pod.spec.as_ref() else {
        return Amount {
            pods: 1,
            ..Amount::default()
        };
    };
    let r = pod_requests(spec, pod.status.as_ref());
    Amount {
        cpu: r.cpu_millis(),
        memory: r.memory_bytes(),
        pods: 1,
        extended: r
            .extended()
            .map(|(name, milli)| (name.to_string(), milli))
            .collect(),
    }
}

/// Whether a node with `labels` matches the pod's nodeSelector and required node affinity.
pub(crate) fn selects_node(labels: &BTreeMap<String, String>, pod: &PendingPod) -> bool {
    requirements::selector_matches(&pod.node_selector, labels)
        && pod
            .required_terms
            .as_ref()
            .filter(|terms| !terms.is_empty())
            .is_none_or(|terms| terms.iter().any(|t| requirements::term_matches(t, labels)))
}

/// Whether a node of `shape` would accept the pod: its nodeSelector and required node
/// affinity match the labels ([`selects_node`]), and it tolerates every NoSchedule/NoExecute
/// taint.
pub fn accepts(shape: &NodeShape, pod: &PendingPod) -> bool {
    selects_node(&shape.labels, pod)
        && requirements::tolerates_taints(&pod.tolerations, &shape.taints)
}

/// Room on a node that exists or is on its way (a live claim of the tenant).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bin {
    /// The claim.
    pub claim: String,
    /// Its labels and taints.
    pub shape: NodeShape,
    /// Room left.
    pub free: Amount,
    /// The pods on it (what pod affinity, anti-affinity and spread count).
    pub residents: Vec<PendingPod>,
    /// Whether a claim of a larger type may still take its place: a claim of the pool
    /// being planned whose node runs no pod yet (it has not joined, or nothing was bound
    /// there). Pods that must share a node with pods that arrived after it then get a
    /// node that holds them all instead of this one ([`Packing::outgrown`]).
    pub replaceable: bool,
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
    /// How many more claims it takes (`None`: unlimited); shared by the candidates of one
    /// type.
    pub room: Option<i64>,
    /// The type's cost.
    pub cost: i64,
    /// Requirements its claims carry beside the pool's (the zone chosen of a type that
    /// offers several).
    pub requirements: Vec<Requirement>,
}

/// `spec.limits`, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most nodes.
    pub nodes: Option<i64>,
    /// Most millicores.
    pub cpu: Option<i128>,
    /// Most bytes of memory.
    pub memory: Option<i128>,
    /// Most pods.
    pub pods: Option<i128>,
    /// Limits on extended resources (`nvidia.com/gpu`), in milli-units, by name; the node
    /// types' extended resources count against them.
    pub extended: BTreeMap<String, i128>,
    /// The pool's requirements with `minValues`: the types a new node could be (those that
    /// hold its pods) must offer that many values of their key.
    pub min_values: Vec<crate::scheduling::CheckedRequirement>,
}

/// The key of `spec.limits` that limits the number of nodes.
pub(crate) const LIMIT_NODES: &str = "nodes";

impl Limits {
    /// Parses `spec.limits`: `nodes`, `cpu`, `memory`, `pods` and extended resources
    /// (invalid quantities, which the CRD schema refuses, count as absent; `nodes` is
    /// rounded down to whole nodes).
    pub fn from_spec(limits: Option<&ResourceList>) -> Limits {
        let mut out = Limits::default();
        for (name, q) in limits.into_iter().flatten() {
            let Ok(milli) = resources::parse_quantity(&q.0) else {
                continue;
            };
            match name.as_str() {
                LIMIT_NODES => out.nodes = Some(i64::try_from(milli / 1000).unwrap_or(i64::MAX)),
                "cpu" => out.cpu = Some(milli),
                "memory" => out.memory = resources::memory_bytes(q).ok(),
                "pods" => out.pods = Some(milli / 1000),
                _ => {
                    out.extended.insert(name.clone(), milli);
                }
            }
        }
        out
    }

    /// Whether a pool using `used` (cpu, memory, pods, extended resources) on `nodes` nodes
    /// stays within the limits.
    pub fn allow(&self, nodes: i64, used: &Amount) -> bool {
        self.nodes.is_none_or(|n| nodes <= n)
            && self.cpu.is_none_or(|c| used.cpu <= c)
            && self.memory.is_none_or(|m| used.memory <= m)
            && self.pods.is_none_or(|p| used.pods <= p)
            && self
                .extended
                .iter()
                .all(|(name, limit)| used.extended.get(name).copied().unwrap_or(0) <= *limit)
    }

    /// The limits set, for messages: e.g. `nodes 2, cpu 8, memory 16Gi`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.nodes {
            parts.push(format!("nodes {n}"));
        }
        if let Some(c) = self.cpu {
            parts.push(format!("cpu {}", resources::format_cpu(c)));
        }
        if let Some(m) = self.memory {
            parts.push(format!("memory {}", resources::format_memory(m)));
        }
        if let Some(p) = self.pods {
            parts.push(format!("pods {p}"));
        }
        for (name, milli) in &self.extended {
            parts.push(format!("{name} {}", resources::format_cpu(*milli)));
        }
        parts.join(", ")
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
    /// Requirements beside the pool's ([`Candidate::requirements`]).
    pub requirements: Vec<Requirement>,
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
    /// Pods that fit the pool's node types but whose pod affinity, anti-affinity or
    /// topology spread no node allows (a pod of their affinity missing, say).
    pub blocked_by_constraints: Vec<String>,
    /// Pods whose new node's possible types would offer fewer values than a requirement's
    /// `minValues`.
    pub blocked_by_min_values: Vec<String>,
    /// Groups of pods that must share one node (required pod affinity on the hostname)
    /// that no node type of the pool holds: none of their pods is placed.
    pub blocked_groups: Vec<BlockedGroup>,
    /// Claims that a new node takes the place of before they join: replaceable bins
    /// ([`Bin::replaceable`]) that receive no pod, while a group of pods that must share a
    /// node, the first of which fitted the bin alone, goes to a new node (by claim, with
    /// the index of that node in `new_nodes`).
    pub outgrown: Vec<(String, usize)>,
}

/// A group of pods that must share one node, and no node type holds them all.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockedGroup {
    /// The group's pods (`namespace/name`).
    pub pods: Vec<String>,
    /// What they ask for together.
    pub request: Amount,
    /// The largest node type that would take every pod of the group (by cpu, then
    /// memory), with its allocatable room; `None` when no type takes them all.
    pub largest: Option<(String, Amount)>,
}

impl BlockedGroup {
    /// Says so, for a condition: the pods (the first three), their sum and the largest type.
    pub fn describe(&self) -> String {
        let shown: Vec<&str> = self.pods.iter().take(3).map(String::as_str).collect();
        let more = self.pods.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let amount = |a: &Amount| {
            format!(
                "cpu {}, memory {}",
                resources::format_cpu(a.cpu),
                resources::format_memory(a.memory)
            )
        };
        let largest = match &self.largest {
            Some((t, room)) => format!("the largest node type, {t}, holds {}", amount(room)),
            None => "no node type takes them all".to_string(),
        };
        format!(
            "pods {}{more} must share a node (required pod affinity on the hostname) and ask for {} together; {largest}",
            shown.join(", "),
            amount(&self.request)
        )
    }
}

/// Whether a new node of `c` may be opened for `pod`: a type with extended resources
/// (`nvidia.com/gpu`) only for a pod that asks for one of them, as a claim gets such a type
/// only when it asks for it; other pods may still use the room left on it.
pub(crate) fn opens_for(c: &Candidate, pod: &PendingPod) -> bool {
    !c.resources.has_extended()
        || pod
            .request
            .extended
            .keys()
            .any(|name| c.resources.extended.contains_key(name))
}

pub mod constraints;
pub mod groups;
pub mod packer;
pub(crate) mod preferences;
pub mod topology;

pub use constraints::{Namespaces, PodRules, PodTerm, Preferred, Spread};

#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod tests;
