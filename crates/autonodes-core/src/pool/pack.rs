//! Pending pods packed onto nodes: what a pod asks for ([`pod_request`]: cpu, memory, pods
//! and extended resources), whether a node of some labels and taints would take it
//! ([`accepts`], through [`crate::requirements`]), which pods may not share a node
//! ([`conflicts`]: required pod anti-affinity on the hostname), and [`pack`],
//! first-fit-decreasing onto the room of existing and in-flight nodes, then onto new nodes
//! of the cheapest accepting type within the pool's [`Limits`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, NodeSelectorTerm, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::{NodeClaim, NodeClaimSpec, Requirement, ResourceList};
use crate::catalogue::{Catalogue, PreparedType};
use crate::requirements;
use crate::resources::{self, ResourceAmounts, CPU, MEMORY};
use crate::scheduling::{self, ClaimRequest};

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

/// The topology key of one node: the only one pod anti-affinity is packed for.
pub(crate) const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";
/// The topology key of a zone: the only one topology spread is packed for (a node type
/// gets it from its `topology.kubernetes.io/zone` property).
pub(crate) const ZONE_TOPOLOGY: &str = "topology.kubernetes.io/zone";

/// A `topologySpreadConstraints` entry on [`ZONE_TOPOLOGY`] with `whenUnsatisfiable:
/// DoNotSchedule`: the pods it selects (in the pod's namespace) differ by at most
/// `max_skew` between the zones a node for the pod could be in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ZoneSpread {
    /// `maxSkew` (at least 1).
    pub max_skew: i64,
    /// Which pods are counted.
    pub selector: LabelSelector,
}

/// A required pod anti-affinity term on [`HOSTNAME_TOPOLOGY`]: the pod shares no node with
/// a pod its selector selects in these namespaces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AntiAffinity {
    /// Which pods it keeps away.
    pub selector: LabelSelector,
    /// Their namespaces (the pod's own when the term names none).
    pub namespaces: Vec<String>,
}

/// One unschedulable pod (or one that would have to move).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingPod {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// Its labels (what other pods' anti-affinity selects).
    pub labels: BTreeMap<String, String>,
    /// Its required anti-affinity terms on [`HOSTNAME_TOPOLOGY`].
    pub anti_affinity: Vec<AntiAffinity>,
    /// Its hard topology spread constraints over zones.
    pub zone_spread: Vec<ZoneSpread>,
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
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let anti_affinity = spec
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten()
            .filter(|t| t.topology_key == HOSTNAME_TOPOLOGY)
            .filter_map(|t| {
                Some(AntiAffinity {
                    // A term without a selector selects no pod.
                    selector: t.label_selector.clone()?,
                    namespaces: match t.namespaces.as_ref() {
                        Some(ns) if !ns.is_empty() => ns.clone(),
                        _ => vec![namespace.clone()],
                    },
                })
            })
            .collect();
        let zone_spread = spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .filter(|c| c.topology_key == ZONE_TOPOLOGY && c.when_unsatisfiable == "DoNotSchedule")
            .filter_map(|c| {
                Some(ZoneSpread {
                    max_skew: i64::from(c.max_skew.max(1)),
                    // A constraint without a selector counts no pod: nothing to spread.
                    selector: c.label_selector.clone()?,
                })
            })
            .collect();
        PendingPod {
            namespace,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            anti_affinity,
            zone_spread,
            key: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata
                    .name
                    .as_deref()
                    .or(pod.metadata.generate_name.as_deref())
                    .unwrap_or_default()
            ),
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
/// container's, plus the pod overhead; one pod. Extended resources (`nvidia.com/gpu`) count
/// by their requests, else by their limits (the API server makes them equal).
pub fn pod_request(pod: &Pod) -> Amount {
    let Some(spec) = pod.spec.as_ref() else {
        return Amount {
            pods: 1,
            ..Amount::default()
        };
    };
    let requests = |c: &Container| -> Amount {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let l = c.resources.as_ref().and_then(|r| r.limits.as_ref());
        let mut extended = BTreeMap::new();
        for list in [l, r].into_iter().flatten() {
            for (name, q) in list {
                if resources::is_extended_resource(name) {
                    if let Ok(milli) = resources::parse_quantity(&q.0) {
                        extended.insert(name.clone(), milli.max(0));
                    }
                }
            }
        }
        extended.retain(|_, v| *v != 0);
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
            extended,
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
        for (name, v) in r.extended {
            let have = sum.extended.entry(name).or_insert(0);
            *have = (*have).max(v);
        }
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

/// Whether a node of `shape` would accept the pod: its nodeSelector and required node
/// affinity match the labels, and it tolerates every NoSchedule/NoExecute taint.
pub fn accepts(shape: &NodeShape, pod: &PendingPod) -> bool {
    let selected = requirements::selector_matches(&pod.node_selector, &shape.labels);
    let affine = pod
        .required_terms
        .as_ref()
        .filter(|terms| !terms.is_empty())
        .is_none_or(|terms| {
            terms
                .iter()
                .any(|t| requirements::term_matches(t, &shape.labels))
        });
    let tolerated = requirements::tolerates_taints(&pod.tolerations, &shape.taints);
    selected && affine && tolerated
}

/// Whether `a`'s anti-affinity keeps `b` off its node.
pub(crate) fn repels(a: &PendingPod, b: &PendingPod) -> bool {
    a.anti_affinity.iter().any(|t| {
        t.namespaces.contains(&b.namespace)
            && requirements::label_selector_matches(&t.selector, &b.labels)
    })
}

/// Whether `pod` may not share a node with `residents` (its anti-affinity, or theirs).
pub fn conflicts(pod: &PendingPod, residents: &[PendingPod]) -> bool {
    residents.iter().any(|r| repels(pod, r) || repels(r, pod))
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
    /// The pods on it (for pod anti-affinity).
    pub residents: Vec<PendingPod>,
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
            candidates.iter().any(|c| {
                accepts(&c.shape, p) && opens_for(c, p) && c.allocatable.covers(&p.request)
            })
        })
        .collect();
    out.wanted = order.len();
    order.sort_by(|a, b| {
        (b.request.cpu, b.request.memory)
            .cmp(&(a.request.cpu, a.request.memory))
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut bins: Vec<Bin> = bins.to_vec();
    // New nodes: (candidate index, free room, request and pods, the pods as packed).
    let mut fresh: Vec<(usize, Amount, NewNode, Vec<PendingPod>)> = Vec::new();
    let mut room: BTreeMap<&str, Option<i64>> = candidates
        .iter()
        .map(|c| (c.node_type.as_str(), c.room))
        .collect();
    let (mut nodes, mut used) = usage;
    'pods: for pod in order {
        let zones = allowed_zones(pod, &bins, &fresh, candidates);
        let in_zone = |shape: &NodeShape| {
            zones.as_ref().is_none_or(|z| {
                shape
                    .labels
                    .get(ZONE_TOPOLOGY)
                    .is_some_and(|v| z.contains(v))
            })
        };
        for bin in bins.iter_mut() {
            if accepts(&bin.shape, pod)
                && bin.free.covers(&pod.request)
                && !conflicts(pod, &bin.residents)
                && in_zone(&bin.shape)
            {
                bin.free = bin.free.minus(&pod.request);
                bin.residents.push(pod.clone());
                out.placed
                    .entry(bin.claim.clone())
                    .or_default()
                    .push(pod.key.clone());
                continue 'pods;
            }
        }
        for (i, free, node, residents) in fresh.iter_mut() {
            if accepts(&candidates[*i].shape, pod)
                && free.covers(&pod.request)
                && !conflicts(pod, residents)
                && in_zone(&candidates[*i].shape)
            {
                *free = free.minus(&pod.request);
                residents.push((*pod).clone());
                node.request = node.request.plus(&pod.request);
                node.pods.push(pod.key.clone());
                continue 'pods;
            }
        }
        let mut limited = false;
        for (i, c) in candidates.iter().enumerate() {
            if !accepts(&c.shape, pod)
                || !opens_for(c, pod)
                || !c.allocatable.covers(&pod.request)
                || !in_zone(&c.shape)
            {
                continue;
            }
            if room
                .get(c.node_type.as_str())
                .copied()
                .flatten()
                .is_some_and(|r| r <= 0)
            {
                continue;
            }
            let after = used.plus(&c.resources);
            if !limits.allow(nodes + 1, &after) {
                limited = true;
                continue;
            }
            nodes += 1;
            used = after;
            if let Some(Some(r)) = room.get_mut(c.node_type.as_str()) {
                *r -= 1;
            }
            fresh.push((
                i,
                c.allocatable.minus(&pod.request),
                NewNode {
                    node_type: c.node_type.clone(),
                    request: pod.request.clone(),
                    pods: vec![pod.key.clone()],
                    requirements: c.requirements.clone(),
                },
                vec![(*pod).clone()],
            ));
            continue 'pods;
        }
        if limited {
            out.blocked_by_limits.push(pod.key.clone());
        } else {
            out.blocked_by_capacity.push(pod.key.clone());
        }
    }
    out.new_nodes = fresh.into_iter().map(|(_, _, n, _)| n).collect();
    out
}

/// The zones a pod with zone spread constraints may go to now (`None`: it has none): for
/// each constraint, the zones where one more selected pod keeps the skew — its count there
/// minus the smallest count over the zones the pod could be in (of existing, in-flight and
/// possible new nodes that accept it) — within `maxSkew`.
fn allowed_zones(
    pod: &PendingPod,
    bins: &[Bin],
    fresh: &[(usize, Amount, NewNode, Vec<PendingPod>)],
    candidates: &[Candidate],
) -> Option<BTreeSet<String>> {
    if pod.zone_spread.is_empty() {
        return None;
    }
    let zone = |shape: &NodeShape| shape.labels.get(ZONE_TOPOLOGY).cloned();
    let nodes: Vec<(Option<String>, &NodeShape, &[PendingPod])> = bins
        .iter()
        .map(|b| (zone(&b.shape), &b.shape, b.residents.as_slice()))
        .chain(fresh.iter().map(|(i, _, _, residents)| {
            let shape = &candidates[*i].shape;
            (zone(shape), shape, residents.as_slice())
        }))
        .collect();
    let eligible: BTreeSet<String> = nodes
        .iter()
        .filter(|(_, shape, _)| accepts(shape, pod))
        .filter_map(|(z, _, _)| z.clone())
        .chain(
            candidates
                .iter()
                .filter(|c| accepts(&c.shape, pod) && opens_for(c, pod))
                .filter_map(|c| zone(&c.shape)),
        )
        .collect();
    let mut allowed = eligible.clone();
    for spread in &pod.zone_spread {
        let mut count: BTreeMap<&str, i64> = eligible.iter().map(|z| (z.as_str(), 0)).collect();
        for (z, _, residents) in &nodes {
            let Some(n) = z.as_deref().and_then(|z| count.get_mut(z)) else {
                continue;
            };
            *n += residents
                .iter()
                .filter(|r| {
                    r.namespace == pod.namespace
                        && requirements::label_selector_matches(&spread.selector, &r.labels)
                })
                .count() as i64;
        }
        let least = count.values().copied().min().unwrap_or(0);
        allowed.retain(|z| {
            count
                .get(z.as_str())
                .is_some_and(|n| n + 1 - least <= spread.max_skew)
        });
    }
    Some(allowed)
}

#[cfg(test)]
mod tests;
