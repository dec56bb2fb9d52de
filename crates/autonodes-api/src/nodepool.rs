//! `NodePool`: keeps a number of NodeClaims alive, statically or by demand.

use std::collections::BTreeMap;

use super::common::DurationOrNever;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// The most replicas a NodePool (and a `capi.autonodes.io` MachinePool or MachineSet) may
/// ask for: the CRDs refuse more. How many claims a namespace holds is bounded apart from
/// it, by the controller's `--max-claims-per-namespace` and the namespace's NodeQuotas.
pub const MAX_REPLICAS: i32 = 1000;

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
    printcolumn(
        name = "AVAILABLE",
        type_ = "integer",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "READY",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "REASON",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
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
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.autoscaling) || has(self.replicas)",
    "message": "autoscaling needs replicas (set them, e.g. to minReplicas): the cluster-autoscaler drives a pool through its replicas"
}]))]
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
    #[schemars(length(max = crate::schema::MAX_REQUIREMENTS))]
    pub requirements: Vec<Requirement>,
    /// Properties of the pool's claims (over provider and type, under the claim's own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::properties")]
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
    /// Extra kubelet arguments for the pool's nodes (`name: value`, without the leading dashes; `_` in a name
    /// reads as `-`, as the kubelet reads it). Flags autonodes or kubeadm set and those
    /// that change the node's identity or credentials (`provider-id`, `node-labels`,
    /// `register-with-taints`, `hostname-override`, `kubeconfig`, `cert-dir`, …) are
    /// refused, and a value may hold letters, digits and `.,:=/+@<>*~%_-` only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::string_map")]
    pub kubelet_args: BTreeMap<String, String>,
    /// Static pool: how many nodes to keep, at most 1000. Absent for a dynamic pool driven
    /// by `limits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// Dynamic pool: the most the pool may grow to, by resource: `nodes`, `cpu`, `memory`,
    /// `pods` or an extended resource such as `nvidia.com/gpu`; values are quantities,
    /// written as integers or strings (`{nodes: 10, cpu: "64"}`). The pool's claims being
    /// deleted count until their VMs are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub limits: Option<ResourceList>,
    /// How and when nodes may be removed or replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Disruption>,
    /// Longest a node of the pool may take to drain once its removal began: until then
    /// eviction respects PodDisruptionBudgets, afterwards the node goes. A Go duration such
    /// as `30s` or `1h`, or `Never` (wait for the drain however long it takes, up to the
    /// controller's `--max-drain-duration`). Absent: the controller's `--drain-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<DurationOrNever>,
    /// Replace nodes older than this (a Go duration such as `720h`, or `Never`). Takes
    /// precedence over `disruption.expireAfter`, which is its older spelling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after: Option<DurationOrNever>,
    /// Preference among a tenant's pools, 0 to 100 (higher first), as Karpenter's and
    /// vCluster's `weight`. Absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub weight: Option<i32>,
    /// Bounds for the cluster-autoscaler; a pool with them is mirrored as a Cluster-API
    /// `MachinePool` in `capi.autonodes.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// How the pool repairs nodes that turn unhealthy. Each field left out is taken from
    /// the NodeProvider's `repair`, then from the controller's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,
    /// Warm VMs kept for this pool alone: booted with the pool's properties (its image
    /// settings, disks, networks, placement; but the type's SSH keys and user data, as the
    /// pool's come with the binding) on the cheapest type the pool's template accepts,
    /// joined to no tenant until a claim of the pool takes one. Unlike a NodeType's warm
    /// VMs they are the namespace's: they count against its NodeQuotas and claim limit.
    /// Absent or `replicas: 0`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<PoolWarm>,
    /// Whether a dynamic pool honours pods' preferences (preferred node affinity, preferred
    /// pod affinity and anti-affinity, `ScheduleAnyway` topology spread) when it chooses
    /// their nodes: `Respect` (the default) honours them all at first and drops them one
    /// term at a time, the lightest first, for a pod that fits nowhere with them;
    /// `Ignore` packs pods as if they had none (fewer, fuller nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preference_policy: Option<PreferencePolicy>,
}

/// Whether a dynamic pool honours pods' preferences, as Karpenter's preference policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PreferencePolicy {
    /// Honour them, dropping them one term at a time for a pod that fits nowhere with
    /// them.
    #[default]
    Respect,
    /// Pack pods as if they had none.
    Ignore,
}

/// Largest `warm.replicas` of a NodePool.
pub const MAX_POOL_WARM_REPLICAS: i32 = 10;

/// How many warm VMs a NodePool keeps.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolWarm {
    /// Warm VMs to keep for the pool (0 to 10), as far as the namespace's NodeQuotas, the
    /// controller's claim limit per namespace and the type's `maxCapacity` leave room
    /// besides the claims.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10))]
    pub replicas: i32,
}

/// The warm VMs of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolWarm {
    /// The node type of the pool's warm VMs: the cheapest the pool's template accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    /// `spec.warm.replicas`, as far as the namespace's room and the type's `maxCapacity`
    /// leave.
    #[serde(default)]
    pub replicas: i64,
    /// Warm VMs that exist for the pool and are taken by no claim.
    #[serde(default)]
    pub current: i64,
    /// Of those, the ones whose guest reports in (a claim of the pool can take them).
    #[serde(default)]
    pub ready: i64,
}

/// Most entries of [`Repair::conditions`].
pub const MAX_REPAIR_CONDITIONS: usize = 16;

/// How unhealthy nodes are repaired: which Node conditions make a node unhealthy and for
/// how long each is tolerated, a VM restart as the first step, and how much of a pool may
/// be repaired at once.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Repair {
    /// Node conditions that make a node unhealthy once they have held for their
    /// `tolerationDuration` (e.g. node-problem-detector's `KernelDeadlock=True`). Absent:
    /// `Ready` being `False` or `Unknown` for the controller's `--node-repair-after`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_REPAIR_CONDITIONS))]
    pub conditions: Vec<RepairCondition>,
    /// The first step for an unhealthy node is restarting its VM; the node is replaced
    /// only if it is still unhealthy this long after the restart, or turns unhealthy again
    /// later. A Go duration such as `5m`, or `Never` to replace at once without a restart.
    /// Absent: `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_timeout: Option<DurationOrNever>,
    /// The most nodes of the pool that may be unhealthy for repair to go on: a count (`2`)
    /// or a percentage of the pool's nodes (`20%`). Beyond it nothing is repaired (the
    /// cause is likely not the nodes) and the pool's `NodeRepair` condition says so. `"0"`
    /// turns repair off for the pool. Absent: `20%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 8), regex(pattern = BUDGET_NODES_PATTERN))]
    pub max_unhealthy: Option<String>,
    /// Keep a replaced node's VM halted this long for debugging (its Node drained and
    /// removed from the tenant, the VM stopped, labelled and outside the pool's capacity),
    /// then remove it. A Go duration of at most `24h`. Absent or `0`: removed at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_failed_for: Option<DurationOrNever>,
}

/// A Node condition that makes a node unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepairCondition {
    /// The Node condition's type (`Ready`, `KernelDeadlock`, `ReadonlyFilesystem`, …).
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316), regex(pattern = crate::schema::QUALIFIED_NAME_PATTERN))]
    pub type_: String,
    /// The status that is unhealthy: `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// How long the condition may hold before the node is repaired: a Go duration such as
    /// `10m`.
    pub toleration_duration: DurationOrNever,
}

/// A Node condition's status.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Nobody knows (the kubelet stopped posting).
    Unknown,
}

impl ConditionStatus {
    /// The status as Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
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
    /// never. The pool's top-level `expireAfter` takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after: Option<DurationOrNever>,
    /// How many nodes may be disrupted at once (consolidation, roll-out, expiry), when
    /// `budgets` is empty. Absent, with no `budgets`: 10 % of the pool's nodes, rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub budget: Option<i32>,
    /// Which nodes consolidation may remove: `WhenEmpty` (nodes without non-DaemonSet
    /// pods) or `WhenEmptyOrUnderutilized` (also nodes whose pods fit elsewhere). Absent:
    /// `WhenEmptyOrUnderutilized`, as Karpenter and vCluster default it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation_policy: Option<ConsolidationPolicy>,
    /// Disruption budgets as Karpenter writes them; when several are active the most
    /// restrictive wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::schema::MAX_BUDGETS))]
    pub budgets: Vec<Budget>,
    /// Whether nodes whose kubelet is of another minor release than the tenant (after a
    /// vCluster upgrade) are Drifted and rolled within the budgets. Absent: `Enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version_drift: Option<VersionDrift>,
}

/// Whether a pool rolls nodes whose kubelet's minor release differs from the tenant's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VersionDrift {
    /// Such nodes are Drifted and rolled within the budgets.
    Enabled,
    /// Such nodes stay (their claims still show `Drifted=True`).
    Disabled,
}

/// Which nodes consolidation may remove.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConsolidationPolicy {
    /// Only nodes that run no non-DaemonSet pod.
    WhenEmpty,
    /// Empty nodes and nodes whose pods would fit on the pool's other nodes.
    WhenEmptyOrUnderutilized,
}

/// Pattern of [`Budget::nodes`]: a count (`3`) or a percentage of the pool (`10%`).
pub const BUDGET_NODES_PATTERN: &str = r"^((100|[0-9]{1,2})%|[0-9]+)$";

/// Pattern of [`Budget::schedule`]: five cron fields (minute hour day-of-month month
/// day-of-week) or a macro such as `@daily`.
pub const BUDGET_SCHEDULE_PATTERN: &str = r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly)|[0-9*,/?A-Za-z-]+( +[0-9*,/?A-Za-z-]+){4})$";

/// Pattern of [`Budget::duration`]: hours and minutes (`8h`, `1h30m`, `90m`), as Karpenter
/// accepts.
pub const BUDGET_DURATION_PATTERN: &str = r"^([0-9]+h)?([0-9]+m)?$";

/// How many of a pool's nodes may be disrupted at once, always or in a window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.schedule) == has(self.duration)",
    "message": "a budget's schedule needs a duration, and its duration a schedule"
}]))]
pub struct Budget {
    /// Most nodes disrupted at once: a count (`3`) or a percentage of the pool's nodes
    /// (`10%`, rounded up). `"0"` blocks voluntary disruption while the budget is active.
    #[schemars(length(min = 1, max = 8), regex(pattern = BUDGET_NODES_PATTERN))]
    pub nodes: String,
    /// When the budget becomes active (cron, UTC). Absent: always active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = BUDGET_SCHEDULE_PATTERN))]
    pub schedule: Option<String>,
    /// How long the budget stays active after each schedule hit (`8h`, `30m`); required
    /// with `schedule`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 16), regex(pattern = BUDGET_DURATION_PATTERN))]
    pub duration: Option<String>,
    /// The disruptions the budget limits: `Empty`, `Underutilized`, `Drifted`,
    /// `HostMaintenance`. Absent or empty: all of them, and also expiry and a scale-down's
    /// pace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub reasons: Vec<DisruptionReason>,
}

/// A kind of voluntary disruption a [`Budget`] may be limited to, as Karpenter names them.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum DisruptionReason {
    /// Removing a node that runs no non-DaemonSet pod.
    Empty,
    /// Removing a node whose pods fit elsewhere, or replacing it by a cheaper one.
    Underutilized,
    /// Replacing a node that no longer matches its pool's template or its node type.
    Drifted,
    /// Replacing a node whose VM's host node is being drained and cannot live-migrate it
    /// (condition `HostMaintenance`).
    HostMaintenance,
}

/// The pool's claims that failed before their node was ready (a launch, registration or
/// initialization timeout, a VM lost before its node joined), counted in a row until a
/// claim of the pool becomes Available.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationStatus {
    /// Claims that failed in a row since the last one that became Available.
    #[serde(default)]
    pub consecutive_failures: i32,
    /// The reason of the last failure (`LaunchTimeout`, `RegistrationTimeout`,
    /// `InitializationTimeout`, `VirtualMachineLost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_reason: Option<String>,
    /// When the pool counted the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The pool creates no claims before this time (set once failures in a row reach the
    /// threshold; doubles with each further failure, up to a cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_until: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// Replica bounds for the cluster-autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.maxReplicas > self.minReplicas",
    "message": "maxReplicas must exceed minReplicas by at least 1 (the cluster-autoscaler ignores a group that cannot scale)"
}]))]
pub struct Autoscaling {
    /// Fewest replicas the autoscaler may set.
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub min_replicas: i32,
    /// Most replicas the autoscaler may set, at most 1000.
    #[schemars(range(min = 1, max = MAX_REPLICAS))]
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
    /// Extended resources (`nvidia.com/gpu`) over all nodes of the pool, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, Quantity>,
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
    /// How the pool's latest claims fared before their node was ready: consecutive
    /// failures, the last one's reason, and the back-off they caused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<RegistrationStatus>,
    /// The pool's warm VMs (`spec.warm`); absent when it keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<NodePoolWarm>,
    /// Conditions `Ready`, `LimitReached` (True when demand is blocked by `limits`),
    /// `NodeRepair`, `NodeRegistrationHealthy`, `WarmReady` for a pool with `spec.warm`
    /// and, for imported pools, `VClusterConfig`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}
