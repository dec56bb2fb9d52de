//! Host capacity: whether a node type's VM fits a node of its host cluster, and how many
//! more would. Pure code, no I/O: the controller hands in the host's Nodes and bound pods
//! from its watch caches, and the claims that are scheduled but whose VM's launcher pod is
//! not bound to a host node yet.
//!
//! The model follows the host's scheduler where it decides whether a pod fits at all:
//! - a host node takes new pods when it is `Ready` and not cordoned;
//! - its room is its `status.allocatable` (cpu, memory, pods) less the requests of the
//!   pods bound to it that have not ended (a pod's request: the larger of its containers'
//!   sum and its largest init container, plus `spec.overhead`);
//! - a VM may go to a node its template's `nodeSelector` and required node affinity accept,
//!   whose `NoSchedule`/`NoExecute` taints its tolerations tolerate, that carries the labels
//!   of `autonodes.io/host-node-selector`, and that is in the claim's zone;
//! - a VM asks for its type's cpu and memory plus the launcher's overhead
//!   ([`PROP_HOST_OVERHEAD`], by default [`crate::properties::DEFAULT_HOST_OVERHEAD`]) and one pod.
//!
//! Claims in flight (scheduled, launcher pod not bound yet, not powered off) are placed first, largest VMs
//! first, each kind onto the eligible nodes with the most free memory; what is left is the
//! headroom. A claim whose type has hard VM anti-affinity also needs an eligible node with
//! room that runs no VM of its group, one more than the group has on its way
//! ([`HostModel::fits_apart`]). Not modelled: VM affinity (soft or hard) and the soft
//! presets, which the host's scheduler still weighs.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorTerm, Pod, PodSpec, PodStatus, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::catalogue::PreparedType;
use crate::ledger::ClaimedLedger;
use crate::pod_requests::pod_requests;
use crate::properties::PROP_ZONE;
use crate::properties::{host_overhead, PROP_HOST_OVERHEAD};
use crate::requirements::{selector_matches, term_matches, tolerates_taints};
use crate::resources::parse_quantity;
use crate::resources::Room;
use crate::template::placement::{self, HostRequirement};
use autonodes_api::{NodeClaim, LABEL_NODECLAIM_NAMESPACE, LABEL_NODECLAIM_UID, LABEL_NODEPOOL};

/// The labels of a launcher pod autonodes reads: its claim (from the VMI template, which
/// KubeVirt copies to the pod), and the group labels VM (anti-)affinity selects on.
pub const LAUNCHER_LABELS: [&str; 4] = [
    LABEL_NODECLAIM_UID,
    LABEL_NODECLAIM_NAMESPACE,
    placement::LABEL_VCLUSTER,
    LABEL_NODEPOOL,
];

const TEMPLATE_SPEC: &str = "/spec/template/spec";

/// A node of a host cluster, as far as placing a VM on it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostNode {
    /// Node name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Whether new pods may go there: `Ready` and not cordoned.
    pub schedulable: bool,
    /// Its room left (allocatable less the requests of its pods).
    pub room: Room,
    /// The labels of the autonodes VMs' launcher pods bound to it (the pods that carry a
    /// group label), for hard VM anti-affinity.
    pub groups: Vec<BTreeMap<String, String>>,
}

impl HostNode {
    /// The node as its object shows it, with nothing on it yet.
    pub fn from_node(node: &Node) -> HostNode {
        let spec = node.spec.clone().unwrap_or_default();
        let status = node.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let allocatable = status.allocatable.unwrap_or_default();
        let amount = |name: &str, scale: fn(&Quantity) -> i128| {
            allocatable.get(name).map(scale).unwrap_or(0)
        };
        HostNode {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            schedulable: ready && !spec.unschedulable.unwrap_or(false),
            room: Room {
                cpu_millis: amount("cpu", milli),
                memory: amount("memory", bytes),
                pods: amount("pods", units),
            },
            groups: Vec::new(),
        }
    }
}

fn milli(q: &Quantity) -> i128 {
    parse_quantity(&q.0).unwrap_or(0)
}

fn bytes(q: &Quantity) -> i128 {
    (parse_quantity(&q.0).unwrap_or(0) + 999) / 1000
}

fn units(q: &Quantity) -> i128 {
    parse_quantity(&q.0).unwrap_or(0) / 1000
}

/// What a pod asks of its host node: cpu and memory by [`pod_requests`] (the
/// kube-scheduler's rule, `status` for a pod being resized), and one pod.
pub fn pod_request(spec: &PodSpec, status: Option<&PodStatus>) -> Room {
    let r = pod_requests(spec, status);
    Room {
        cpu_millis: r.cpu_millis(),
        memory: r.memory_bytes(),
        pods: 1,
    }
}

/// What one VM of a node type asks of a host node, and which host nodes it may go to.
#[derive(Debug, Clone, PartialEq)]
pub struct VmShape {
    /// The VM's launcher pod's request: the type's cpu and memory plus the overhead.
    pub request: Room,
    node_selector: BTreeMap<String, String>,
    required_terms: Vec<NodeSelectorTerm>,
    tolerations: Vec<Toleration>,
    host_required: Vec<HostRequirement>,
}

impl VmShape {
    /// The shape of `t`'s VMs: its resources, the overhead of its properties, and where its
    /// template and placement presets let it go. The error names what could not be read.
    pub fn of(t: &PreparedType) -> Result<VmShape, String> {
        let overhead =
            host_overhead(&t.properties).map_err(|m| format!("{PROP_HOST_OVERHEAD}: {m}"))?;
        let read = |field: &str| {
            t.template
                .pointer(&format!("{TEMPLATE_SPEC}/{field}"))
                .cloned()
        };
        let node_selector = match read("nodeSelector") {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| format!("spec.template.spec.nodeSelector: {e}"))?,
            None => BTreeMap::new(),
        };
        let required_terms = match read(
            "affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
        ) {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| format!("the template's required node affinity: {e}"))?,
            None => Vec::new(),
        };
        let tolerations = match read("tolerations") {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| format!("spec.template.spec.tolerations: {e}"))?,
            None => Vec::new(),
        };
        let host_required = placement::parse_placement(&t.properties)
            .map_err(|(property, message)| format!("{property}: {message}"))?
            .host_required;
        Ok(VmShape {
            request: Room {
                cpu_millis: t.amounts.cpu_millis() + overhead.cpu_millis,
                memory: t.amounts.memory_bytes() + overhead.memory,
                pods: 1,
            },
            node_selector,
            required_terms,
            tolerations,
            host_required,
        })
    }

    /// Whether the VM may go to `node` (in `zone`, when the claim has one), room aside.
    pub fn may_use(&self, node: &HostNode, zone: Option<&str>) -> bool {
        node.schedulable
            && zone.is_none_or(|z| node.labels.get(PROP_ZONE).map(String::as_str) == Some(z))
            && selector_matches(&self.node_selector, &node.labels)
            && (self.required_terms.is_empty()
                || self
                    .required_terms
                    .iter()
                    .any(|term| term_matches(term, &node.labels)))
            && self
                .host_required
                .iter()
                .all(|r| match node.labels.get(&r.key) {
                    Some(v) => r.values.is_empty() || r.values.contains(v),
                    None => false,
                })
            && tolerates_taints(&self.tolerations, &node.taints)
    }
}

/// How many more VMs of a shape the host takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headroom {
    /// VMs that would still fit.
    pub vms: i64,
    /// Host nodes the VM may go to (room or not).
    pub nodes: i64,
}

/// The nodes of a host cluster and the room left on each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostModel {
    nodes: Vec<HostNode>,
}

impl HostModel {
    /// The host's `nodes` with the requests of the `pods` bound to them taken off (pods of
    /// unknown nodes, and pods not bound yet, take nothing).
    pub fn new<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> HostModel {
        let mut nodes: Vec<HostNode> = nodes.into_iter().map(HostNode::from_node).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut model = HostModel { nodes };
        for pod in pods {
            let Some(spec) = pod.spec.as_ref() else {
                continue;
            };
            let Some(on) = spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            if let Ok(i) = model.nodes.binary_search_by(|n| n.name.as_str().cmp(on)) {
                let node = &mut model.nodes[i];
                node.room.take(&pod_request(spec, pod.status.as_ref()), 1);
                let labels = pod.metadata.labels.as_ref();
                if let Some(l) = labels.filter(|l| l.contains_key(placement::LABEL_VCLUSTER)) {
                    node.groups.push(l.clone());
                }
            }
        }
        model
    }

    /// The nodes as they stand.
    pub fn nodes(&self) -> &[HostNode] {
        &self.nodes
    }

    /// Places `count` VMs of `shape` (in `zone`), onto the eligible nodes with the most
    /// free memory first; returns how many found no room.
    pub fn place(&mut self, shape: &VmShape, zone: Option<&str>, count: i64) -> i64 {
        let mut left = i128::from(count.max(0));
        let mut order: Vec<usize> = (0..self.nodes.len())
            .filter(|i| shape.may_use(&self.nodes[*i], zone))
            .collect();
        order.sort_by_key(|i| std::cmp::Reverse(self.nodes[*i].room.memory));
        for i in order {
            if left == 0 {
                break;
            }
            let n = self.nodes[i].room.holds(&shape.request).min(left);
            self.nodes[i].room.take(&shape.request, n);
            left -= n;
        }
        i64::try_from(left).unwrap_or(i64::MAX)
    }

    /// How many more VMs of `shape` fit (in `zone`, or anywhere when `None`).
    pub fn headroom(&self, shape: &VmShape, zone: Option<&str>) -> Headroom {
        let eligible = self.nodes.iter().filter(|n| shape.may_use(n, zone));
        let mut h = Headroom::default();
        for n in eligible {
            h.nodes += 1;
            let fits = n.room.holds(&shape.request);
            h.vms = h
                .vms
                .saturating_add(i64::try_from(fits).unwrap_or(i64::MAX));
        }
        h
    }

    /// Whether one more VM of `shape` fits (in `zone`).
    pub fn fits(&self, shape: &VmShape, zone: Option<&str>) -> bool {
        self.nodes
            .iter()
            .any(|n| shape.may_use(n, zone) && n.room.holds(&shape.request) > 0)
    }

    /// Whether one more VM of `shape` (in `zone`) that must keep apart from `apart`'s group
    /// fits: an eligible node with room running no VM of the group, for it and for each of
    /// the group's VMs on their way.
    pub fn fits_apart(&self, shape: &VmShape, zone: Option<&str>, apart: &Apart) -> bool {
        self.apart_nodes(shape, zone, apart) > apart.on_the_way
    }

    /// Eligible nodes with room for `shape` that run no VM of `apart`'s group.
    fn apart_nodes(&self, shape: &VmShape, zone: Option<&str>, apart: &Apart) -> i64 {
        let free = self.nodes.iter().filter(|n| {
            shape.may_use(n, zone)
                && n.room.holds(&shape.request) > 0
                && !n.groups.iter().any(|g| apart.selects(g))
        });
        i64::try_from(free.count()).unwrap_or(i64::MAX)
    }

    /// Why one more VM of `shape` fits nowhere (in `zone`, apart from `apart`'s group when
    /// given): a bounded message naming the request and what the eligible nodes have left.
    pub fn refusal(&self, shape: &VmShape, zone: Option<&str>, apart: Option<&Apart>) -> String {
        if let Some(a) = apart.filter(|_| self.fits(shape, zone)) {
            let in_zone = zone.map(|z| format!(" in zone {z}")).unwrap_or_default();
            return format!(
                "hard VM anti-affinity: {} eligible host node(s){in_zone} with room run no VM of the claim's group, and {} of the group are on their way",
                self.apart_nodes(shape, zone, a),
                a.on_the_way
            );
        }
        let want = format!(
            "{} cpu, {} memory",
            crate::resources::format_cpu(shape.request.cpu_millis),
            crate::resources::format_memory(shape.request.memory)
        );
        let in_zone = zone.map(|z| format!(" in zone {z}")).unwrap_or_default();
        let eligible: Vec<&HostNode> = self
            .nodes
            .iter()
            .filter(|n| shape.may_use(n, zone))
            .collect();
        if eligible.is_empty() {
            return format!(
                "no schedulable host node{in_zone} matches the VM's placement (of {} host nodes)",
                self.nodes.len()
            );
        }
        let most = eligible
            .iter()
            .max_by_key(|n| (n.room.memory, n.room.cpu_millis))
            .map(|n| {
                format!(
                    "; the roomiest, {}, has {} cpu, {} memory, {} pods left",
                    n.name,
                    crate::resources::format_cpu(n.room.cpu_millis.max(0)),
                    crate::resources::format_memory(n.room.memory.max(0)),
                    n.room.pods.max(0)
                )
            })
            .unwrap_or_default();
        format!(
            "the VM's launcher pod ({want}) fits none of {} eligible host node(s){in_zone}{most}",
            eligible.len()
        )
    }
}

/// A claim's group its VM must keep apart from (hard VM anti-affinity, see
/// [`placement::group_labels`]), and how many VMs of the group are on their way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Apart {
    /// The labels that select the group's launcher pods.
    pub group: BTreeMap<String, String>,
    /// The group's claims scheduled to this host whose launcher pod is not bound yet.
    pub on_the_way: i64,
}

impl Apart {
    /// Whether a launcher pod with `labels` is of the group.
    fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.group.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The claims whose VMs' launcher pods are bound to a host node already (and counted by
/// their pods): by UID, and per type and zone (`None` for a type without zones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bound {
    /// Their UIDs.
    pub uids: HashSet<String>,
    /// How many per type and zone.
    pub per_type: BTreeMap<(String, Option<String>), i64>,
}

impl Bound {
    /// The claims of `pods` (by their [`LABEL_NODECLAIM_UID`]) bound to a node that hold a
    /// unit in `ledger`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>, ledger: &ClaimedLedger) -> Bound {
        let mut bound = Bound::default();
        for pod in pods {
            let on_node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            let uid = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_NODECLAIM_UID));
            let (true, Some(uid)) = (on_node, uid) else {
                continue;
            };
            let Some((node_type, zone)) = ledger.holding(uid) else {
                continue;
            };
            if bound.uids.insert(uid.clone()) {
                *bound
                    .per_type
                    .entry((node_type.to_string(), zone.map(str::to_string)))
                    .or_default() += 1;
            }
        }
        bound
    }

    fn count(&self, node_type: &str, zone: Option<&str>) -> i64 {
        self.per_type
            .get(&(node_type.to_string(), zone.map(str::to_string)))
            .copied()
            .unwrap_or(0)
    }
}

/// How many of `group`'s claims (`claims`, grouped by `scope` as
/// [`placement::group_labels`] does) hold a unit of one of `types` in `ledger` (in `zone`,
/// when given) and have no bound launcher pod yet.
pub fn group_on_the_way<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    types: &HashSet<&str>,
    ledger: &ClaimedLedger,
    bound: &Bound,
    group: &BTreeMap<String, String>,
    scope: placement::Scope,
    zone: Option<&str>,
) -> i64 {
    let mut n = 0;
    for c in claims {
        let Some(uid) = c.metadata.uid.as_deref() else {
            continue;
        };
        let Some((t, z)) = ledger.holding(uid) else {
            continue;
        };
        if !types.contains(t) || bound.uids.contains(uid) || zone.is_some_and(|w| z != Some(w)) {
            continue;
        }
        if &placement::claim_group(scope, c) == group {
            n += 1;
        }
    }
    n
}

/// Places on `model` what the claims of `types` (the types of the model's host) hold in
/// `ledger` but whose VMs' launcher pods are not bound yet (`bound` are): the VMs on their
/// way, largest first, so the headroom left is what new claims may take.
pub fn place_in_flight(
    model: &mut HostModel,
    types: &[&PreparedType],
    ledger: &ClaimedLedger,
    bound: &Bound,
) {
    let mut waiting: Vec<(VmShape, Option<String>, i64)> = Vec::new();
    for t in types {
        let Ok(shape) = VmShape::of(t) else { continue };
        let bound_in = |zone: Option<&str>| bound.count(&t.name, zone);
        // Powered-off claims hold their unit of the type but no host room.
        let parked = ledger.parked(&t.name);
        let parked_in = |zone: &str| parked.get(zone).copied().unwrap_or(0);
        let zones = ledger.zone_counts(&t.name);
        let zoned: i64 = zones.values().sum();
        for (zone, n) in zones {
            let waits = n - parked_in(zone) - bound_in(Some(zone));
            waiting.push((shape.clone(), Some(zone.clone()), waits));
        }
        let unzoned = ledger.count(&t.name) - zoned;
        waiting.push((shape, None, unzoned - parked_in("") - bound_in(None)));
    }
    waiting.retain(|(_, _, n)| *n > 0);
    waiting.sort_by_key(|(s, _, _)| std::cmp::Reverse((s.request.memory, s.request.cpu_millis)));
    for (shape, zone, n) in waiting {
        model.place(&shape, zone.as_deref(), n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{prepare_type, ProviderContext};
    use autonodes_api::Properties;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn node(name: &str, zone: Option<&str>, cpu: &str, memory: &str) -> Node {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some(z) = zone {
            labels[PROP_ZONE] = json!(z);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .expect("node")
    }

    fn pod(on: &str, cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": on, "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        }))
        .expect("pod")
    }

    /// The type `name` of provider `p` (host `h`) with the NodeType spec `spec`, usable or
    /// Failed.
    fn prepared_any(name: &str, spec: Value) -> PreparedType {
        let spec = serde_json::from_value(spec).expect("spec");
        prepare_type(name, &spec, Some(&ProviderContext::for_tests("p")))
    }

    /// [`prepared_any`], usable.
    fn prepared(name: &str, spec: Value) -> PreparedType {
        let t = prepared_any(name, spec);
        assert!(t.problem.is_none(), "{:?}", t.problem);
        t
    }

    fn shape(cpu: &str, memory: &str, properties: Value, template: Value) -> VmShape {
        let t = prepared(
            "p.t",
            json!({
                "providerRef": "p",
                "resources": {"cpu": cpu, "memory": memory},
                "properties": properties,
                "mergeVirtualMachineTemplate": template,
            }),
        );
        VmShape::of(&t).expect("shape")
    }

    fn plain(cpu: &str, memory: &str) -> VmShape {
        shape(
            cpu,
            memory,
            json!({PROP_HOST_OVERHEAD: "cpu=0,memory=0"}),
            json!({}),
        )
    }

    #[test]
    fn a_vm_fits_where_allocatable_less_the_bound_pods_covers_its_request_and_overhead() {
        let nodes = [node("h1", None, "4", "8Gi")];
        let pods = [pod("h1", "1", "3Gi"), pod("elsewhere", "8", "64Gi")];
        let model = HostModel::new(&nodes, &pods);
        // 2 cpu / 4Gi + 256Mi overhead: 3 cpu / 5Gi left, so one fits.
        let s = shape("2", "4Gi", json!({}), json!({}));
        assert_eq!(s.request.memory, (4 << 30) + (256 << 20));
        assert_eq!(model.headroom(&s, None), Headroom { vms: 1, nodes: 1 });
        let big = shape("2", "5Gi", json!({}), json!({}));
        assert!(!model.fits(&big, None), "5Gi + 256Mi is more than 5Gi left");
        assert!(model
            .refusal(&big, None, None)
            .contains("fits none of 1 eligible host node(s)"));
    }

    #[test]
    fn a_pod_without_sidecars_asks_for_its_containers_or_its_largest_init_container_and_its_overhead(
    ) {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}}}],
                "initContainers": [
                    {"name": "i", "resources": {"requests": {"cpu": "1", "memory": "10Mi"}}}],
                "overhead": {"memory": "100Mi"},
            },
        }))
        .expect("pod");
        let r = pod_request(p.spec.as_ref().expect("spec"), None);
        assert_eq!(r.cpu_millis, 1000);
        assert_eq!(r.memory, (1 << 30) + (100 << 20));
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn a_host_pod_with_a_native_sidecar_takes_the_sidecars_room_as_well() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "initContainers": [
                    {"name": "proxy", "restartPolicy": "Always",
                        "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}}}],
                "nodeName": "n1",
            },
        }))
        .expect("pod");
        let r = pod_request(p.spec.as_ref().expect("spec"), None);
        assert_eq!(r.cpu_millis, 1500);
        assert_eq!(r.memory, (1 << 30) + (128 << 20));
        let nodes = [node("n1", Some("a"), "4", "8Gi")];
        let model = HostModel::new(&nodes, [&p]);
        assert_eq!(model.nodes()[0].room.cpu_millis, 2500);
    }

    #[test]
    fn zone_selector_node_selector_affinity_taints_readiness_and_cordons_decide_where_a_vm_may_go()
    {
        let mut tainted = node("tainted", Some("a"), "8", "8Gi");
        tainted.spec = Some(
            serde_json::from_value(json!({
            "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}))
            .expect("spec"),
        );
        let mut cordoned = node("cordoned", Some("a"), "8", "8Gi");
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).expect("spec"));
        let mut not_ready = node("not-ready", Some("a"), "8", "8Gi");
        if let Some(s) = not_ready.status.as_mut() {
            s.conditions = Some(vec![serde_json::from_value(
                json!({"type": "Ready", "status": "Unknown"}),
            )
            .expect("condition")]);
        }
        let mut labelled = node("labelled", Some("b"), "8", "8Gi");
        labelled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .extend([
                (
                    "node-role.kubernetes.io/kubevirt".to_string(),
                    String::new(),
                ),
                ("disk".to_string(), "ssd".to_string()),
            ]);
        let nodes = [
            tainted,
            cordoned,
            not_ready,
            labelled,
            node("plain", Some("a"), "8", "8Gi"),
        ];
        let model = HostModel::new(&nodes, &[]);
        let eligible = |s: &VmShape, zone: Option<&str>| -> Vec<String> {
            model
                .nodes()
                .iter()
                .filter(|n| s.may_use(n, zone))
                .map(|n| n.name.clone())
                .collect()
        };
        let any = plain("1", "1Gi");
        assert_eq!(eligible(&any, None), ["labelled", "plain"]);
        assert_eq!(eligible(&any, Some("a")), ["plain"]);
        let selected = shape(
            "1",
            "1Gi",
            json!({crate::properties::PROP_HOST_NODE_SELECTOR: "node-role.kubernetes.io/kubevirt"}),
            json!({}),
        );
        assert_eq!(eligible(&selected, None), ["labelled"]);
        let by_template = shape(
            "1",
            "1Gi",
            json!({}),
            json!({"spec": {"template": {"spec": {
            "nodeSelector": {"disk": "ssd"}}}}}),
        );
        assert_eq!(eligible(&by_template, None), ["labelled"]);
        let by_affinity = shape(
            "1",
            "1Gi",
            json!({}),
            json!({"spec": {"template": {"spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}}}}}}),
        );
        assert_eq!(eligible(&by_affinity, None), ["plain"]);
        let tolerant = shape(
            "1",
            "1Gi",
            json!({}),
            json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}}}),
        );
        assert_eq!(eligible(&tolerant, Some("a")), ["plain", "tainted"]);
        assert!(model
            .refusal(&selected, Some("a"), None)
            .starts_with("no schedulable host node in zone a matches"));
    }

    #[test]
    fn claims_in_flight_are_placed_before_the_headroom_is_counted() {
        let nodes = [node("h1", None, "4", "8Gi"), node("h2", None, "4", "4Gi")];
        let mut model = HostModel::new(&nodes, &[]);
        let s = plain("1", "2Gi");
        assert_eq!(model.headroom(&s, None).vms, 6);
        assert_eq!(model.place(&s, None, 4), 0);
        assert_eq!(model.headroom(&s, None).vms, 2);
        assert_eq!(model.place(&s, None, 5), 3, "only two more fit");
        assert!(!model.fits(&s, None));
    }

    #[test]
    fn claims_on_their_way_take_room_until_their_launcher_pod_is_bound_and_counted_instead() {
        let nodes = [
            node("h1", Some("a"), "8", "8Gi"),
            node("h2", Some("b"), "8", "8Gi"),
        ];
        let small = prepared(
            "p.small",
            json!({
                "providerRef": "p", "resources": {"cpu": "1", "memory": "2Gi"},
                "properties": {PROP_HOST_OVERHEAD: "memory=0,cpu=0", PROP_ZONE: "a,b"},
            }),
        );
        let shape = VmShape::of(&small).expect("shape");
        let mut ledger = ClaimedLedger::new();
        for (uid, zone) in [("u1", "a"), ("u2", "a"), ("u3", "b")] {
            ledger.reserve(uid, "t", "p.small", Some(zone));
        }
        let room = |pods: &[Pod]| {
            let mut model = HostModel::new(&nodes, pods);
            let bound = Bound::of(pods, &ledger);
            place_in_flight(&mut model, &[&small], &ledger, &bound);
            (
                model.headroom(&shape, Some("a")).vms,
                model.headroom(&shape, Some("b")).vms,
            )
        };
        assert_eq!(room(&[]), (2, 3), "4 per zone less the claims");
        // u1's launcher pod is bound on h1: counted once, by its pod.
        let mut launcher = pod("h1", "1", "2Gi");
        launcher.metadata.labels =
            Some([(LABEL_NODECLAIM_UID.to_string(), "u1".to_string())].into());
        assert_eq!(room(std::slice::from_ref(&launcher)), (2, 3));
        assert_eq!(
            Bound::of([&launcher], &ledger).uids,
            HashSet::from(["u1".to_string()])
        );
    }

    #[test]
    fn a_powered_off_claim_keeps_its_unit_of_the_type_but_takes_no_host_room() {
        let nodes = [node("h1", Some("a"), "8", "8Gi")];
        let small = prepared(
            "p.small",
            json!({
                "providerRef": "p", "resources": {"cpu": "1", "memory": "2Gi"},
                "properties": {PROP_HOST_OVERHEAD: "memory=0,cpu=0", PROP_ZONE: "a"},
            }),
        );
        let shape = VmShape::of(&small).expect("shape");
        let claim = |uid: &str, power: &str| -> NodeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": uid, "namespace": "t", "uid": uid},
                "spec": {"vClusterRef": {"name": "t"}},
                "status": {"typeRef": "p.small", "zone": "a", "power": power},
            }))
            .expect("claim")
        };
        let mut ledger = ClaimedLedger::new();
        // Scheduled by this process (a reservation), then seen powered off in the store.
        ledger.reserve("u1", "t", "p.small", Some("a"));
        ledger.observe(&claim("u1", "On"));
        ledger.observe(&claim("u2", "On"));
        let headroom = |ledger: &ClaimedLedger| {
            let mut model = HostModel::new(&nodes, &[]);
            place_in_flight(&mut model, &[&small], ledger, &Bound::of([], ledger));
            model.headroom(&shape, Some("a")).vms
        };
        assert_eq!(headroom(&ledger), 2, "4 fit, 2 on their way");
        ledger.observe(&claim("u1", "Off"));
        ledger.observe(&claim("u2", "Stopping"));
        assert_eq!(ledger.count("p.small"), 2, "both still hold their unit");
        assert_eq!(headroom(&ledger), 3, "the stopped VM gives its room back");
        ledger.observe(&claim("u1", "Starting"));
        assert_eq!(headroom(&ledger), 2, "a VM starting again takes it back");
    }

    #[test]
    fn hard_anti_affinity_needs_a_node_with_room_free_of_the_group_for_each_vm_on_its_way() {
        let nodes = [node("h1", None, "8", "8Gi"), node("h2", None, "8", "8Gi")];
        let group =
            placement::group_labels(placement::Scope::Pool, "tenant", "vc", Some("workers"));
        let mut theirs = pod("h1", "1", "1Gi");
        let mut labels = group.clone();
        labels.insert(LABEL_NODECLAIM_UID.to_string(), "u1".to_string());
        theirs.metadata.labels = Some(labels);
        let mut other_pool = pod("h2", "1", "1Gi");
        other_pool.metadata.labels = Some(placement::group_labels(
            placement::Scope::Pool,
            "tenant",
            "vc",
            Some("other"),
        ));
        let model = HostModel::new(&nodes, &[theirs, other_pool]);
        let s = plain("1", "1Gi");
        let apart = |on_the_way| Apart {
            group: group.clone(),
            on_the_way,
        };
        assert!(
            model.fits_apart(&s, None, &apart(0)),
            "h2 runs another pool's VM only"
        );
        assert!(
            !model.fits_apart(&s, None, &apart(1)),
            "h2 is taken by the one on its way"
        );
        assert!(model.fits(&s, None), "room alone is there");
        let why = model.refusal(&s, None, Some(&apart(1)));
        assert!(
            why.starts_with("hard VM anti-affinity: 1 eligible host node(s) with room"),
            "{why}"
        );
    }

    #[test]
    fn a_groups_claims_on_their_way_are_those_held_on_the_hosts_types_without_a_bound_pod() {
        let claim = |uid: &str, ns: &str, pool: Option<&str>| -> NodeClaim {
            let mut c: NodeClaim = serde_json::from_value(json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": uid, "namespace": ns, "uid": uid},
                "spec": {"vClusterRef": {"name": "vc"}},
            }))
            .expect("claim");
            if let Some(p) = pool {
                c.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), p.to_string())].into());
            }
            c
        };
        let claims = [
            claim("u1", "tenant", Some("workers")),
            claim("u2", "tenant", Some("workers")),
            claim("u3", "tenant", Some("other")),
            claim("u4", "elsewhere", Some("workers")),
            claim("u5", "tenant", Some("workers")),
            claim("u6", "tenant", Some("workers")),
        ];
        let mut ledger = ClaimedLedger::new();
        for uid in ["u1", "u2", "u3", "u4"] {
            ledger.reserve(uid, "tenant", "p.t", Some("a"));
        }
        ledger.reserve("u5", "tenant", "q.t", Some("a")); // a type of another host
        ledger.reserve("u6", "tenant", "p.t", Some("b"));
        let mut bound = Bound::default();
        bound.uids.insert("u2".to_string());
        let types = HashSet::from(["p.t"]);
        let count = |scope, group: &BTreeMap<String, String>, zone| {
            group_on_the_way(&claims, &types, &ledger, &bound, group, scope, zone)
        };
        let pool = placement::group_labels(placement::Scope::Pool, "tenant", "vc", Some("workers"));
        assert_eq!(
            count(placement::Scope::Pool, &pool, Some("a")),
            1,
            "u1 only"
        );
        assert_eq!(count(placement::Scope::Pool, &pool, None), 2, "u1 and u6");
        let tenant = placement::group_labels(placement::Scope::Tenant, "tenant", "vc", None);
        assert_eq!(
            count(placement::Scope::Tenant, &tenant, Some("a")),
            2,
            "u1 and u3"
        );
    }

    #[test]
    fn the_host_overhead_property_is_read_and_a_wrong_one_is_named() {
        let p = |v: &str| Properties::from([(PROP_HOST_OVERHEAD.to_string(), v.to_string())]);
        assert_eq!(
            host_overhead(&p("memory=1Gi, cpu=250m")),
            Ok(Room {
                cpu_millis: 250,
                memory: 1 << 30,
                pods: 0
            })
        );
        assert_eq!(
            host_overhead(&Properties::new()),
            Ok(Room {
                cpu_millis: 100,
                memory: 256 << 20,
                pods: 0
            })
        );
        // A type with a wrong one is Failed, naming the property.
        let failed = prepared_any(
            "p.t",
            json!({
                "providerRef": "p", "resources": {"cpu": "1", "memory": "1Gi"},
                "properties": {PROP_HOST_OVERHEAD: "memory=lots"},
            }),
        );
        let problem = failed.problem.expect("Failed").to_string();
        assert!(problem.contains(PROP_HOST_OVERHEAD), "{problem}");
        for wrong in ["memory", "gpu=1", "memory=lots", "cpu=-1"] {
            let e = host_overhead(&p(wrong)).expect_err(wrong);
            assert!(!e.is_empty() && e.len() < 200, "{e}");
        }
    }

    proptest! {
        /// Placing VMs one by one never overfills a node, and the headroom is exactly how
        /// many more of them a placement then takes.
        #[test]
        fn headroom_is_what_placement_can_still_take_and_no_node_is_overfilled(
            sizes in proptest::collection::vec((1u32..8, 1u32..16), 1..5),
            vm in (1u32..4, 1u32..8),
            placed in 0i64..20,
        ) {
            let nodes: Vec<Node> = sizes.iter().enumerate()
                .map(|(i, (c, m))| node(&format!("h{i}"), None, &c.to_string(), &format!("{m}Gi")))
                .collect();
            let mut model = HostModel::new(&nodes, &[]);
            let s = plain(&vm.0.to_string(), &format!("{}Gi", vm.1));
            let before = model.headroom(&s, None).vms;
            let unplaced = model.place(&s, None, placed);
            prop_assert_eq!(unplaced, (placed - before).max(0));
            let after = model.headroom(&s, None).vms;
            prop_assert_eq!(after, (before - placed).max(0));
            prop_assert_eq!(model.fits(&s, None), after > 0);
            for n in model.nodes() {
                prop_assert!(n.room.cpu_millis >= 0 && n.room.memory >= 0 && n.room.pods >= 0);
            }
        }
    }
}
