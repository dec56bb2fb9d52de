//! `NodeQuota`: what the tenants in some namespaces may claim, each namespace on its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// Limits on the nodes the claims of each of some tenant namespaces hold: which node types
/// they may be scheduled to, and how many nodes, cpu, memory, cost (and extended
/// resources) they hold at most per namespace. Every quota that covers a namespace
/// applies; a claim that would go over one stays Pending with reason `QuotaExceeded`.
// clippy takes the repeated `type_ = ...` of printcolumn(...) for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "autonodes.io",
    version = "v1alpha1",
    kind = "NodeQuota",
    plural = "nodequotas",
    shortname = "nquota",
    category = "autonodes",
    status = "NodeQuotaStatus",
    doc = "Limits on the nodes the claims of each of some tenant namespaces may hold.",
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
    printcolumn(name = "NAMESPACES", type_ = "string", json_path = ".spec.namespaces"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeQuotaSpec {
    /// The tenant namespaces the quota limits, each on its own (the limits hold per
    /// namespace, not for their sum). Empty: every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The node types the claims of those namespaces may be scheduled to, selected by
    /// their properties (the keys claims' requirements use: `autonodes.io/node-type`,
    /// `autonodes.io/provider`, `node.kubernetes.io/instance-type`, the types' own
    /// properties). Absent: any type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type_selector: Option<LabelSelector>,
    /// The most each namespace's claims may hold together: `nodes` (claims), `cpu`,
    /// `memory`, `cost` (the sum of the types' costs) and any extended resource (e.g.
    /// `nvidia.com/gpu`), counted from the node types' resources. A resource not listed
    /// is not limited.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub limits: ResourceList,
}

/// What one namespace's claims hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceUsage {
    /// The namespace.
    pub namespace: String,
    /// What its claims hold: `nodes`, `cpu`, `memory`, `cost` and the extended resources
    /// the quota limits.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    #[schemars(schema_with = "crate::schema::resource_list")]
    pub used: ResourceList,
}

/// Observed state of a NodeQuota.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeQuotaStatus {
    /// The `.metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Use per covered namespace that has claims holding nodes, by namespace name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceUsage>,
    /// Condition `Ready`: True (reason `Enforced`) while the quota can be applied; False
    /// (reason `InvalidQuota`) when its selector or limits cannot be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Conditions,
}
