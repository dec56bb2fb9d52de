//! `NodeClaim`: one node for one tenant cluster.

use std::collections::BTreeMap;

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// A request for one node, for one tenant cluster. autonodes picks the cheapest NodeType
/// that fits, creates the KubeVirt VirtualMachine and reports when its Node is Ready.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "autonodes.io",
    version = "v1alpha1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    shortname = "nclaim",
    category = "autonodes",
    namespaced,
    status = "NodeClaimStatus",
    doc = "A request for one KubeVirt node for one tenant cluster.",
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "REASON",
        type_ = "string",
        description = "Why the claim is not Available: the reason of its first condition that is not True",
        json_path = ".status.reason"
    ),
    printcolumn(
        name = "VCLUSTER",
        type_ = "string",
        json_path = ".spec.vClusterRef.name"
    ),
    printcolumn(name = "NODETYPE", type_ = "string", json_path = ".status.typeRef"),
    printcolumn(name = "NODE", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "PROVIDER",
        type_ = "string",
        priority = 1,
        json_path = ".status.providerRef"
    ),
    printcolumn(
        name = "HOSTCLUSTER",
        type_ = "string",
        priority = 1,
        json_path = ".status.hostCluster"
    ),
    printcolumn(
        name = "ZONE",
        type_ = "string",
        priority = 1,
        json_path = ".status.zone"
    ),
    printcolumn(
        name = "ADDRESS",
        type_ = "string",
        priority = 1,
        json_path = ".status.address"
    ),
    printcolumn(
        name = "POWER",
        type_ = "string",
        priority = 1,
        json_path = ".status.power"
    ),
    printcolumn(
        name = "HOSTNODE",
        type_ = "string",
        priority = 1,
        json_path = ".status.hostNode"
    ),
    printcolumn(
        name = "PROVIDERID",
        type_ = "string",
        priority = 1,
        json_path = ".status.providerID"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// Only consider node types of this NodeProvider. Optional when `typeRef` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub provider_ref: Option<String>,
    /// Pin the claim to this NodeType (by its full name, `<provider>.<type>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub type_ref: Option<String>,
    /// Requirements every candidate node type's properties must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::schema::MAX_REQUIREMENTS))]
    pub requirements: Vec<Requirement>,
    /// Resources the node must have at least (cpu, memory, extended resources).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub desired_capacity: ResourceList,
    /// The tenant cluster the node joins.
    #[serde(rename = "vClusterRef")]
    pub v_cluster_ref: VClusterRef,
    /// Properties with the highest precedence (over provider, type and pool).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::properties")]
    pub properties: Properties,
    /// Taints the node keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub taints: Taints,
    /// Taints the node registers with and that something else (e.g. a CNI or a device
    /// plugin) removes when the node is ready; the claim is Ready only once they are gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub startup_taints: Taints,
    /// Labels put on the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::label_map")]
    pub labels: BTreeMap<String, String>,
    /// Extra kubelet arguments (`name: value`, without the leading dashes; `_` in a name
    /// reads as `-`, as the kubelet reads it). Flags autonodes or kubeadm set and those
    /// that change the node's identity or credentials (`provider-id`, `node-labels`,
    /// `register-with-taints`, `hostname-override`, `kubeconfig`, `cert-dir`, …) are
    /// refused, and a value may hold letters, digits and `.,:=/+@<>*~%_-` only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::string_map")]
    pub kubelet_args: BTreeMap<String, String>,
    /// Kubernetes version of the node, e.g. `v1.33.4`; defaults to the tenant's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// Whether the node's VM runs: `On` (the default) or `Off`. Powered off, the node's
    /// Node is cordoned, drained and kept, its VM stopped with its disks kept, and the host
    /// room it took given back; it still counts against NodeQuota `nodes` and its type's
    /// `maxCapacity`, and nothing consolidates, rolls or repairs it. Back `On`, the VM
    /// starts again and the Node is uncordoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<Power>,
}

/// Whether a claim's VM should run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Power {
    /// The VM runs.
    On,
    /// The VM is stopped; the claim keeps its Node (cordoned), its disks and its address.
    Off,
}

/// Whether a claim's VM runs, as the controller last saw it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    /// The VM runs.
    On,
    /// The VM is stopped.
    Off,
    /// Powered on again: the VM starts, its Node is not Ready yet.
    Starting,
    /// Powered off: the Node is being drained, or the VM is stopping.
    Stopping,
    /// The VM is being live-migrated to another host node.
    Migrating,
}

/// Lifecycle phase of a NodeClaim: the first readiness condition that is not True.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NodeClaimPhase {
    /// Not yet scheduled to a node type.
    Pending,
    /// Scheduled; the VirtualMachine is being created or booting.
    Provisioning,
    /// The VM runs; waiting for its Node to join and become Ready.
    Joining,
    /// The Node is Ready.
    Available,
    /// Gave up (timeout or permanent error); see conditions.
    Failed,
    /// Being deleted: draining the Node, deleting the VM and its Secrets.
    Terminating,
    /// Powered off (`spec.power: Off`): the Node is cordoned and kept, the VM stopped.
    PoweredOff,
}

/// Observed state of a NodeClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// Pending, Provisioning, Joining, Available, Failed, Terminating or PoweredOff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeClaimPhase>,
    /// Why the claim is not Available: the reason of its first condition that is not True,
    /// in the order `Scheduled`, `Provisioned`, `Joined`, `Initialized`, `Ready` (e.g.
    /// `InsufficientCapacity`, `Booting`, `LaunchTimeout`); absent once all are True. The
    /// `REASON` column of `kubectl get nodeclaims`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The NodeType the claim was scheduled to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_ref: Option<String>,
    /// The NodeProvider of that NodeType.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<String>,
    /// Cost of the chosen NodeType.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<i64>,
    /// The host cluster the VirtualMachine runs on (`clusterRef.cluster` of the provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cluster: Option<String>,
    /// The zone (`topology.kubernetes.io/zone`) of the host nodes the VirtualMachine may
    /// run on, fixed when the claim is scheduled: the zone its requirements pin among those
    /// its node type offers, else the one the type's claims use least. It is the node's
    /// `topology.kubernetes.io/zone` label. Absent when the type lists no zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Namespace of the VirtualMachine on the host cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_namespace: Option<String>,
    /// Name of the VirtualMachine; fixed before anything is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_name: Option<String>,
    /// The node's provider ID, `kubevirt://<vm>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    /// Name of the Node in the tenant cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The host cluster's node the VM runs on, as its VirtualMachineInstance last said
    /// (it changes when the VM is live-migrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_node: Option<String>,
    /// Whether the VM runs: `On`, `Off`, `Starting`, `Stopping` or `Migrating` (absent
    /// before the VM first ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    /// The static address the claim holds for its life, from its node type's
    /// `addressPool` (with the pool's prefix length, e.g. `10.20.0.5/24`); fixed when the
    /// claim is scheduled and given back when it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The node type's `definitionHash` when the claim was scheduled: when the type's hash
    /// changes (its template, resources, taints, properties, overhead, or the provider's
    /// base template), the claim has drifted (condition `Drifted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type_hash: Option<String>,
    /// Conditions `Scheduled`, `Provisioned`, `Joined`, `Initialized` and `Ready`;
    /// `Drifted` while the node type differs from what the claim's VM was made from, and
    /// `HostMaintenance` while (and after) the VM has to leave a host node being drained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
    /// The Node's conditions as the controller last saw them once the node was initialized
    /// (at most 16, `Ready` first), each with the time the controller first saw its
    /// current status: what node repair reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NODE_CONDITIONS))]
    pub node_conditions: Vec<ObservedNodeCondition>,
    /// The last restart of the VM (asked for with the `autonodes.io/restart` annotation,
    /// by node repair or by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart: Option<Restart>,
    /// Set when a warm VM of the claim's type serves the claim (`vmName` is then the warm
    /// VM's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmBinding>,
}

/// How a warm VM serves a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmBinding {
    /// When the claim took the warm VM.
    pub bound_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// True once the claim wrote the VM's binding (the join its agent reads).
    #[serde(default)]
    pub written: bool,
    /// True once the binding (the join the VM read) and the VM's own credential are
    /// deleted, after the Node joined or when the claim went.
    #[serde(default)]
    pub released: bool,
}

/// Most entries of [`NodeClaimStatus::node_conditions`].
pub const MAX_NODE_CONDITIONS: usize = 16;

/// A condition of the claim's Node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedNodeCondition {
    /// The condition's type (`Ready`, `KernelDeadlock`, …).
    #[serde(rename = "type")]
    #[schemars(length(max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(length(max = 16))]
    pub status: String,
    /// The condition's reason, cut to 128 characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 128))]
    pub reason: String,
    /// When the controller first saw the condition with this status.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// A restart of the claim's VM.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    /// The `autonodes.io/restart` annotation's value that asked for it (cut to 64
    /// characters).
    #[schemars(length(max = 64))]
    pub requested: String,
    /// When the VM's instance was deleted for KubeVirt to start it again.
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}
