//! `NodeProvider`: a KubeVirt host cluster, a base VirtualMachine template and the node
//! types offered on it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::*;

/// A source of KubeVirt virtual machines for tenant nodes: the host cluster, the base
/// VirtualMachine template and the node types (sizes, template changes, capacity, cost)
/// it offers. autonodes keeps one NodeType named `<provider>.<type>` per entry.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "autonodes.io",
    version = "v1alpha1",
    kind = "NodeProvider",
    plural = "nodeproviders",
    shortname = "nprov",
    category = "autonodes",
    status = "NodeProviderStatus",
    doc = "A KubeVirt host cluster, a base VirtualMachine template and the node types offered on it.",
    printcolumn(
        name = "DISPLAY-NAME",
        type_ = "string",
        json_path = ".spec.displayName"
    ),
    printcolumn(
        name = "CLUSTER",
        type_ = "string",
        json_path = ".spec.kubeVirt.clusterRef.cluster"
    ),
    printcolumn(name = "TYPES", type_ = "integer", json_path = ".status.nodeTypes"),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeProviderSpec {
    /// Human-friendly name shown in UIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Properties every node type of this provider has, with the lowest precedence
    /// (NodeProvider < NodeType < NodePool < NodeClaim).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::properties")]
    pub properties: Properties,
    /// The KubeVirt host cluster, base template and node types.
    pub kube_virt: KubeVirtProvider,
    /// The tenant namespaces that may use this provider's node types, selected by the
    /// namespaces' labels: NodeClaims, NodePools and vCluster imports in any other
    /// namespace cannot be scheduled to them (`Scheduled=False`, reason
    /// `ProviderNotAllowed`). Absent: every namespace. An empty selector (`{}`) also
    /// selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_namespace_selector: Option<LabelSelector>,
    /// How pools of this provider's node types repair unhealthy nodes, for each field a
    /// pool's own `repair` leaves out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<crate::nodepool::Repair>,
}

/// KubeVirt settings of a NodeProvider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtProvider {
    /// The host cluster where VirtualMachines are created, and the namespace they go to.
    pub cluster_ref: ClusterRef,
    /// The base VirtualMachine (`metadata` + `spec`) every node type starts from, unless the
    /// type replaces it with its own `virtualMachineTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::vm_template")]
    pub virtual_machine_template: Option<Value>,
    /// The node types offered by this provider.
    #[serde(default)]
    pub node_types: Vec<ProviderNodeType>,
    /// The host cluster's API server as this provider's VMs reach it
    /// (`https://host[:port][/path]`): warm VMs renew their heartbeat and read their
    /// binding there. Absent: the server of the host kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::schema::GUEST_SERVER_PATTERN), length(max = 512))]
    pub guest_api_server: Option<String>,
    /// Static addresses for the nodes of every type of this provider (a type's own
    /// `addressPool` replaces it). Absent: a node gets whatever the VM's network hands out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_pool: Option<crate::common::AddressPool>,
    /// Place each tenant's VMs, user-data Secrets and DataVolumes in a host namespace of its
    /// own, `<prefix><tenant namespace>`, instead of `clusterRef.namespace`, so that host
    /// ResourceQuotas and NetworkPolicies apply per tenant. Absent: every VM goes to
    /// `clusterRef.namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_namespace_per_tenant: Option<VmNamespacePerTenant>,
}

/// A host namespace per tenant namespace for a provider's VMs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmNamespacePerTenant {
    /// The namespace is `<prefix><tenant namespace>`, cut to 63 characters with a hash of
    /// the whole when longer. Absent: `clusterRef.namespace` and a dash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 40), regex(pattern = r"^[a-z0-9]([-a-z0-9]*)?$"))]
    pub prefix: Option<String>,
    /// `Create` (the default): autonodes creates the namespace, labelled as its own, when a
    /// tenant's first claim needs it, and deletes it once the tenant has no claim of the
    /// provider left and it holds none of autonodes' objects. `Existing`: the namespace must
    /// exist (a claim waits with `VMNamespaceNotFound`); autonodes never creates or deletes
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<NamespacePolicy>,
}

/// Whether autonodes creates and deletes a per-tenant VM namespace.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NamespacePolicy {
    /// autonodes creates the namespace and deletes it once unused.
    Create,
    /// The namespace must exist; autonodes leaves it alone.
    Existing,
}

/// One node type offered by a NodeProvider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderNodeType {
    /// Short name of the type, unique within the provider; the NodeType is named
    /// `<provider>.<name>`. A DNS-1123 label.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = crate::schema::DNS_LABEL_PATTERN)
    )]
    pub name: String,
    /// Human-friendly name shown in UIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// How many nodes of this type may exist at once. Absent means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_capacity: Option<i64>,
    /// CPU, memory and extended resources of a node of this type. Overrides the template's
    /// resources; when absent they are discovered from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub resources: ResourceList,
    /// Resources reserved on the node for Kubernetes itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// Cost of one node per hour, in any unit used consistently. When absent:
    /// 10 per CPU + 2 per GiB of memory + 10000 per unit of any other resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cost: Option<i64>,
    /// Properties of this type, over the provider's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::properties")]
    pub properties: Properties,
    /// Taints every node of this type gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub taints: Taints,
    /// Labels and annotations copied onto the generated NodeType object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TypeMetadata>,
    /// A partial VirtualMachine merged over the base template (strategic merge: maps merge,
    /// lists replace except KubeVirt lists with a `name` key, `null` deletes a key).
    /// Mutually exclusive with `virtualMachineTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::vm_template")]
    pub merge_virtual_machine_template: Option<Value>,
    /// A full VirtualMachine template that replaces the provider's base template for this
    /// type. Mutually exclusive with `mergeVirtualMachineTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::vm_template")]
    pub virtual_machine_template: Option<Value>,
    /// Warm VMs of this type (copied to the NodeType's `spec.warm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::nodetype::Warm>,
    /// Static addresses for this type's nodes, over the provider's `addressPool` (copied to
    /// the NodeType's `spec.addressPool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_pool: Option<crate::common::AddressPool>,
}

/// Lifecycle phase of a NodeProvider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProviderPhase {
    /// Not yet checked.
    Pending,
    /// The host cluster is reachable and every template is valid.
    Available,
    /// The host cluster cannot be reached or a template is invalid; see conditions.
    Failed,
}

/// Observed state of a NodeProvider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProviderStatus {
    /// Summary of the conditions: Pending, Available or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ProviderPhase>,
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many NodeTypes this provider currently has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_types: Option<i64>,
    /// Conditions `HostReachable`, `TemplatesValid` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}
