//! `NodeType`: one kind of node a provider offers, with its resources, cost and capacity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::*;

/// One kind of node (size, template, capacity, cost) that a NodeProvider offers. Generated
/// from each provider entry as `<provider>.<type>` (owned by the provider, labelled
/// `autonodes.io/provider`), or created directly with `spec.providerRef`.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "autonodes.io",
    version = "v1alpha1",
    kind = "NodeType",
    plural = "nodetypes",
    shortname = "ntype",
    category = "autonodes",
    status = "NodeTypeStatus",
    doc = "One kind of node a NodeProvider offers: resources, template changes, capacity and cost.",
    printcolumn(
        name = "AVAILABLE",
        type_ = "integer",
        json_path = ".status.capacity.available"
    ),
    printcolumn(
        name = "TOTAL",
        type_ = "integer",
        json_path = ".status.capacity.total"
    ),
    printcolumn(name = "PROVIDER", type_ = "string", json_path = ".spec.providerRef"),
    printcolumn(name = "COST", type_ = "integer", json_path = ".status.cost"),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "HOST-ROOM",
        type_ = "integer",
        json_path = ".status.host.headroom",
        priority = 1
    ),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeTypeSpec {
    /// Name of the NodeProvider that offers this type.
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub provider_ref: String,
    /// Human-friendly name shown in UIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// CPU, memory and extended resources of a node of this type. When absent they are
    /// discovered from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub resources: ResourceList,
    /// Resources reserved on the node for Kubernetes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// Cost of one node; when absent it is computed from the resources
    /// (10 per CPU + 2 per GiB of memory + 10000 per unit of any other resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cost: Option<i64>,
    /// How many nodes of this type may exist at once. Absent means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_capacity: Option<i64>,
    /// Properties of this type, over the provider's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::properties")]
    pub properties: Properties,
    /// Taints every node of this type gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub taints: Taints,
    /// A partial VirtualMachine merged over the provider's base template.
    /// Mutually exclusive with `virtualMachineTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::vm_template")]
    pub merge_virtual_machine_template: Option<Value>,
    /// A full VirtualMachine template replacing the provider's base template.
    /// Mutually exclusive with `mergeVirtualMachineTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::vm_template")]
    pub virtual_machine_template: Option<Value>,
    /// Warm VMs of this type: booted and prepared, joined to no tenant, each taken by the
    /// next claim of the type a warm VM can serve (which then joins in seconds) and
    /// replaced. Absent or `replicas: 0`: none. A type with an `addressPool` keeps none
    /// (condition `WarmReady` says so): a warm VM's address is set before any claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<Warm>,
    /// Static addresses for this type's nodes: each claim scheduled to the type holds one
    /// address of the pool for its life (`status.address`), written into its VM's
    /// cloud-init network data. Absent: the VM's network hands out the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_pool: Option<crate::common::AddressPool>,
}

/// Largest `warm.replicas` of a node type.
pub const MAX_WARM_REPLICAS: i32 = 100;

/// How many warm VMs a node type keeps.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Warm {
    /// Warm VMs to keep (0 to 100); a claim that takes one is served at once and a new one
    /// is started. They count against the type's `maxCapacity` and cost, not against any
    /// tenant's quota.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The warm VMs of a NodeType.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTypeWarm {
    /// `spec.warm.replicas`, as far as `maxCapacity` leaves room for it.
    #[serde(default)]
    pub replicas: i64,
    /// Warm VMs that exist and are taken by no claim.
    #[serde(default)]
    pub current: i64,
    /// Of those, the ones whose guest reports in (a claim can take them).
    #[serde(default)]
    pub ready: i64,
    /// Warm VMs of this type kept for NodePools (their `spec.warm`), taken by no claim.
    /// They count against `maxCapacity` after the type's own. Left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pools: i64,
    /// What the unbound warm VMs cost together (`current` and `pools` × the type's cost),
    /// shown apart from the tenants' nodes.
    #[serde(default)]
    pub cost: i64,
    /// Claims served by a warm VM since the controller started.
    #[serde(default)]
    pub bound: i64,
}

/// Lifecycle phase of a NodeType.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NodeTypePhase {
    /// Not yet evaluated.
    Pending,
    /// Claims can be scheduled to this type.
    Available,
    /// Every unit of `maxCapacity` is claimed.
    Exhausted,
    /// The type cannot be used (invalid template, undiscoverable resources, missing provider).
    Failed,
}

/// Capacity of a NodeType.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTypeCapacity {
    /// `maxCapacity`; absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
    /// Claims scheduled to this type that are not yet gone.
    #[serde(default)]
    pub claimed: i64,
    /// `total - claimed`; absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
}

/// Observed state of a NodeType.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTypeStatus {
    /// Pending, Available, Exhausted or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeTypePhase>,
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Effective cost of one node: `spec.cost`, else computed from the resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<i64>,
    /// Capacity: total, claimed and available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<NodeTypeCapacity>,
    /// Effective resources: from the spec, else discovered from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub resources: ResourceList,
    /// The type's merged properties, as node selector requirements (`key In [value]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
    /// A hash of what the type's VMs are made from (the composed template with the
    /// provider's base, resources, taints, properties, overhead). Claims record it; a
    /// claim whose type's hash changed has drifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_hash: Option<String>,
    /// Room for more of the type's VMs on its host cluster's nodes, as autonodes' watch of
    /// the host sees it (absent until autonodes has seen the host's Nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<NodeTypeHost>,
    /// Warm VMs kept for the type (`spec.warm`); absent when it keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<NodeTypeWarm>,
    /// Conditions, among them `Ready` with the reason when the type cannot be used, and
    /// `WarmReady` for a type that keeps warm VMs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}

/// A node type's room on its host cluster: its VM's launcher pod request against the
/// host's schedulable nodes, after what is bound to them and the type's and its host's
/// other claims still on the way.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTypeHost {
    /// How many more of the type's VMs the host's nodes have room for (over all zones the
    /// type offers); absent when it is not known (see `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom: Option<i64>,
    /// Host nodes the type's VM may go to (ready, not cordoned, matching its zones,
    /// host node selector, node affinity and tolerations), room or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eligible_nodes: Option<i64>,
    /// Headroom per zone, for a type that lists zones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub zones: BTreeMap<String, i64>,
    /// Why the headroom is not known (the host's Nodes or pods cannot be watched), or
    /// why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
