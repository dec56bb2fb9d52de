//! `NodePool`: keeps a number of NodeClaims alive, statically or by demand.

use std::collections::BTreeMap;

use super::common::DurationOrNever;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// A pool of nodes for one tenant cluster: a claim template plus either a static
/// `replicas` count (driven by `kubectl scale`, HPA or KEDA through the scale subresource)
/// or `limits` for demand-driven growth from the tenant's unschedulable pods.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "autonodes.io",
    version = "v1alpha1",
    kind = "NodePool",
    plural = "nodepools",
    shortname = "npool",
    category = "autonodes",
    namespaced,
    status = "NodePoolStatus",
    doc = "A pool of KubeVirt nodes for one tenant cluster, scaled statically or by demand.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "DESIRED", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "READY", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "NODETYPE", type_ = "string", json_path = ".status.nodeType"),
    printcolumn(
        name = "VCLUSTER",
        type_ = "string",
        json_path = ".spec.vClusterRef.name"
    ),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// The tenant cluster the pool's nodes join.
    #[serde(rename = "vClusterRef")]
    pub v_cluster_ref: VClusterRef,
    /// Only use node types of this NodeProvider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = crate::schema::DNS_SUBDOMAIN_PATTERN))]
    pub provider_ref: Option<String>,
    /// Requirements every node type of the pool must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<Requirement>,
    /// Properties of the pool's claims (over provider and type, under the claim's own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: Properties,
    /// Taints every node of the pool keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub taints: Taints,
    /// Taints the pool's nodes register with, removed by something else once ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::taints")]
    pub startup_taints: Taints,
    /// Labels put on every node of the pool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::label_map")]
    pub labels: BTreeMap<String, String>,
    /// Extra kubelet arguments for the pool's nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::string_map")]
    pub kubelet_args: BTreeMap<String, String>,
    /// Static pool: how many nodes to keep. Absent for a dynamic pool driven by `limits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Dynamic pool: the most the pool may grow to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<NodePoolLimits>,
    /// How and when nodes may be removed or replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Disruption>,
    /// Bounds for the cluster-autoscaler; a pool with them is mirrored as a Cluster-API
    /// `MachinePool` in `capi.autonodes.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
}

/// The most a dynamic pool may use.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolLimits {
    /// Most nodes at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub nodes: Option<i64>,
    /// Most CPU over all nodes of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub cpu: Option<Quantity>,
    /// Most memory over all nodes of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub memory: Option<Quantity>,
}

/// When and how fast the pool removes or replaces nodes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Remove a node that has run no non-DaemonSet pod for this long (dynamic pools;
    /// default `30s`). A Go duration such as `30s`, `5m` or `1h`, or `Never` (empty nodes
    /// stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidate_after: Option<DurationOrNever>,
    /// Replace nodes older than this. A Go duration such as `720h`, or `Never`. Absent:
    /// never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after: Option<DurationOrNever>,
    /// How many nodes may be drained at once (scale-down, roll-out, expiry). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub budget: Option<i32>,
}

/// Replica bounds for the cluster-autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Fewest replicas the autoscaler may set.
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Most replicas the autoscaler may set.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
}

/// Resources in use by a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolResources {
    /// Nodes (live claims) of the pool.
    #[serde(default)]
    pub nodes: i64,
    /// CPU over all nodes of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory over all nodes of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// Observed state of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Live claims of the pool (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// Claims of the pool whose node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the pool's claims, as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The node type(s) the pool's claims are scheduled to, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// Resources in use by the pool's claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<NodePoolResources>,
    /// Sum of the cost of the pool's claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<i64>,
    /// Dynamic pools: unschedulable pods in the tenant that the pool's nodes would accept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<i32>,
    /// Conditions `Ready` and `LimitReached` (True when demand is blocked by `limits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}
