//! `capi.autonodes.io/v1alpha1`: Cluster-API-shaped mirrors of NodePools and NodeClaims
//! (see docs/src/cluster-autoscaler.md).
//!
//! The stock cluster-autoscaler's `clusterapi` cloud provider drives objects of this shape
//! in the group named by its `CAPI_GROUP` environment variable. autonodes mirrors every
//! NodePool with `spec.autoscaling` into a [`MachinePool`] of the same name and namespace,
//! and every NodeClaim of such a pool into a [`Machine`] of the claim's name.
//! [`MachineSet`] is served (the provider lists it at start) and stays empty.
//!
//! Nothing here is a Cluster API object: `spec.template.spec.infrastructureRef` is never
//! set (the provider would then wait for an informer on the infrastructure kind).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::Conditions;

/// The API group of the Cluster-API-shaped mirrors (the autoscaler's `CAPI_GROUP`).
pub const CAPI_GROUP: &str = "capi.autonodes.io";
/// The API version of the mirrors (the autoscaler's `CAPI_VERSION`, or found by discovery).
pub const CAPI_VERSION: &str = "v1alpha1";

/// MachinePool annotation: the fewest replicas the cluster-autoscaler may set.
pub const ANNOTATION_MIN_SIZE: &str =
    "capi.autonodes.io/cluster-api-autoscaler-node-group-min-size";
/// MachinePool annotation: the most replicas the cluster-autoscaler may set.
pub const ANNOTATION_MAX_SIZE: &str =
    "capi.autonodes.io/cluster-api-autoscaler-node-group-max-size";
/// Machine annotation the cluster-autoscaler sets on the Machine of the node it removes,
/// before it lowers the MachinePool's replicas.
pub const ANNOTATION_DELETE_MACHINE: &str = "capi.autonodes.io/delete-machine";
/// Annotation on a NodePool and its MachinePool: the replica count the mirror last
/// agreed on for that object (see `autonodes_core::capi` for the two-way sync rule).
pub const ANNOTATION_SYNCED_REPLICAS: &str = "capi.autonodes.io/synced-replicas";

/// Scale-from-zero annotation: CPU of a new node of the pool (allocatable).
pub const CAPACITY_CPU: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
/// Scale-from-zero annotation: memory of a new node of the pool (allocatable).
pub const CAPACITY_MEMORY: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
/// Scale-from-zero annotation: pods a new node of the pool takes.
pub const CAPACITY_MAX_PODS: &str = "capacity.cluster-autoscaler.kubernetes.io/maxPods";
/// Scale-from-zero annotation: GPUs of a new node of the pool.
pub const CAPACITY_GPU_COUNT: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-count";
/// Scale-from-zero annotation: the resource name of the GPUs (e.g. `nvidia.com/gpu`).
pub const CAPACITY_GPU_TYPE: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-type";
/// Scale-from-zero annotation: labels of a new node of the pool, `k=v,…`.
pub const CAPACITY_LABELS: &str = "capacity.cluster-autoscaler.kubernetes.io/labels";
/// Scale-from-zero annotation: taints of a new node of the pool, `k=v:Effect,…`.
pub const CAPACITY_TAINTS: &str = "capacity.cluster-autoscaler.kubernetes.io/taints";

/// Label on Machines: the MachinePool (and NodePool) they belong to.
pub const LABEL_POOL_NAME: &str = "capi.autonodes.io/pool-name";
/// Label on MachinePools and Machines: the tenant cluster (vCluster) of their nodes.
pub const LABEL_CLUSTER_NAME: &str = "capi.autonodes.io/cluster-name";

/// A pool of machines for one tenant cluster, as the cluster-autoscaler's `clusterapi`
/// provider expects it: a mirror of the NodePool of the same name and namespace.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "capi.autonodes.io",
    version = "v1alpha1",
    kind = "MachinePool",
    plural = "machinepools",
    shortname = "anmp",
    category = "autonodes",
    namespaced,
    status = "MachinePoolStatus",
    doc = "A Cluster-API-shaped mirror of an autoscaled NodePool, driven by the cluster-autoscaler's clusterapi provider through its scale subresource.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "CLUSTER", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "DESIRED", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "REPLICAS", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "READY", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "PROVIDERIDS",
        type_ = "string",
        json_path = ".spec.providerIDList",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolSpec {
    /// The tenant cluster (vCluster) the pool's nodes join: the NodePool's
    /// `spec.vClusterRef.name`. Auto-discovery may filter on it (`clusterName=`).
    #[schemars(length(min = 1))]
    pub cluster_name: String,
    /// Desired number of machines. Kept equal to the NodePool's `spec.replicas` in both
    /// directions: a write here (e.g. the autoscaler's PUT on `/scale`) becomes the
    /// NodePool's, and a `kubectl scale npool` shows here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::nodepool::MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// What the pool's Machines look like, shaped like Cluster API's MachineTemplateSpec
    /// (without `spec.infrastructureRef`).
    pub template: MachineTemplateSpec,
    /// Provider IDs (`kubevirt://<vm>`) of the pool's nodes that joined the tenant cluster.
    /// Always written (also empty), so a node leaving the pool leaves the list.
    #[serde(default, rename = "providerIDList")]
    pub provider_id_list: Vec<String>,
}

/// The template of a pool's Machines (Cluster API's MachineTemplateSpec shape).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    /// Labels and annotations of the pool's Machines.
    #[serde(default)]
    pub metadata: MachineTemplateMetadata,
    /// The spec of the pool's Machines.
    pub spec: MachineTemplateMachineSpec,
}

/// Labels and annotations in a Machine template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateMetadata {
    /// Labels every Machine of the pool carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations every Machine of the pool carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The spec part of a Machine template (Cluster API's MachineSpec without
/// `infrastructureRef` and `providerID`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateMachineSpec {
    /// The tenant cluster (vCluster) the Machines' nodes join.
    #[schemars(length(min = 1))]
    pub cluster_name: String,
    /// How the Machines' nodes are bootstrapped.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// Kubernetes version of the nodes, when the pool pins one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Bootstrap data of a Machine (Cluster API's Bootstrap shape).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    /// Name of the Secret holding the node's bootstrap data. autonodes writes each VM's
    /// cloud-init Secret (`<vm>-userdata`) on the host cluster itself; this names it once
    /// known and is informational only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// Observed state of a MachinePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolStatus {
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Live machines (claims of the NodePool that are neither Failed nor being deleted);
    /// the scale subresource's status replicas.
    #[serde(default)]
    pub replicas: i32,
    /// Machines whose node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Machines whose node is Ready (Cluster API's available replicas).
    #[serde(default)]
    pub available_replicas: i32,
    /// Live machines whose node is not Ready yet.
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// Label selector of the pool's Machines, as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// ScalingUp, ScalingDown or Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The tenant Nodes of the pool's joined machines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_refs: Vec<ObjectReference>,
    /// Condition `Ready`: every desired machine's node is Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}

/// One node of an autoscaled NodePool, as the cluster-autoscaler's `clusterapi` provider
/// expects it: a mirror of the NodeClaim of the same name.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "capi.autonodes.io",
    version = "v1alpha1",
    kind = "Machine",
    plural = "machines",
    shortname = "anma",
    category = "autonodes",
    namespaced,
    status = "MachineStatus",
    doc = "A Cluster-API-shaped mirror of one NodeClaim of an autoscaled NodePool. Annotating it with capi.autonodes.io/delete-machine makes its claim the one removed when the pool's replicas drop.",
    printcolumn(name = "CLUSTER", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(
        name = "NODENAME",
        type_ = "string",
        json_path = ".status.nodeRef.name"
    ),
    printcolumn(name = "PROVIDERID", type_ = "string", json_path = ".spec.providerID"),
    printcolumn(name = "PHASE", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "FAILURE",
        type_ = "string",
        json_path = ".status.failureMessage",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The tenant cluster (vCluster) the node joins.
    #[schemars(length(min = 1))]
    pub cluster_name: String,
    /// How the node is bootstrapped.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// The node's provider ID, `kubevirt://<vm>`, once the claim's VM is named.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Kubernetes version of the node, when the claim pins one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Observed state of a Machine (from its NodeClaim).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Pending, Provisioning, Provisioned, Running, Deleting or Failed (the claim's phase
    /// in Cluster API's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The tenant Node, once it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<ObjectReference>,
    /// The VM's cloud-init Secret exists (the claim was scheduled and its VM named).
    #[serde(default)]
    pub bootstrap_ready: bool,
    /// The VM runs (the claim's `Provisioned` condition is True).
    #[serde(default)]
    pub infrastructure_ready: bool,
    /// Why the claim Failed (its failed condition's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// What went wrong with a Failed claim (its failed condition's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

/// A set of machines (Cluster API's MachineSet shape). Served because the
/// cluster-autoscaler's `clusterapi` provider lists it at start; autonodes creates none.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "capi.autonodes.io",
    version = "v1alpha1",
    kind = "MachineSet",
    plural = "machinesets",
    shortname = "anms",
    category = "autonodes",
    namespaced,
    status = "MachineSetStatus",
    doc = "Served for the cluster-autoscaler's clusterapi provider, which lists MachineSets at start; autonodes mirrors NodePools as MachinePools and creates no MachineSet.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// The tenant cluster the set's nodes join.
    #[schemars(length(min = 1))]
    pub cluster_name: String,
    /// Desired number of machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::nodepool::MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// Label selector of the set's Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// What the set's Machines look like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<MachineTemplateSpec>,
}

/// Observed state of a MachineSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Machines of the set.
    #[serde(default)]
    pub replicas: i32,
    /// Machines of the set whose node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the set's Machines, as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}
