//! Types shared by several autonodes resources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Resources by name (`cpu`, `memory`, `nvidia.com/gpu`, ...).
pub type ResourceList = BTreeMap<String, Quantity>;

/// Free-form string properties (`key: value`) used for scheduling and node labels.
pub type Properties = BTreeMap<String, String>;

/// Node taints, as in a Kubernetes Node's `spec.taints`.
pub type Taints = Vec<Taint>;

/// Conditions as `metav1.Condition`s.
pub type Conditions = Vec<Condition>;

/// How a requirement compares a property of a node type with its values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Operator {
    /// The property is set and its value is one of `values`.
    In,
    /// The property is unset, or its value is none of `values`.
    NotIn,
    /// The property is set (any value).
    Exists,
    /// The property is not set.
    DoesNotExist,
    /// Synonym of `DoesNotExist`, as vCluster Platform spells it.
    NotExists,
    /// The property is an integer greater than the single integer in `values`.
    Gt,
    /// The property is an integer less than the single integer in `values`.
    Lt,
}

impl Operator {
    /// The operator's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::NotExists => "NotExists",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
        }
    }
}

/// One scheduling requirement on the properties of a node type.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Requirement {
    /// The property key, e.g. `autonodes.io/node-type` or `topology.kubernetes.io/zone`.
    #[schemars(length(min = 1))]
    pub key: String,
    /// How the property is compared with `values`: In, NotIn, Exists, DoesNotExist
    /// (or its synonym NotExists), Gt, Lt.
    pub operator: Operator,
    /// Values to compare with. In and NotIn take one or more; Gt and Lt exactly one
    /// integer; Exists and DoesNotExist none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Where a provider's virtual machines run: a KubeVirt host cluster and a namespace in it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ClusterRef {
    /// The host cluster: `local` for the management cluster itself, otherwise the name of a
    /// Secret in the autonodes service namespace whose key `kubeconfig` reaches the host cluster.
    #[schemars(length(min = 1))]
    pub cluster: String,
    /// The namespace on the host cluster where VirtualMachines and their Secrets are created.
    #[schemars(length(min = 1))]
    pub namespace: String,
}

/// The tenant cluster (vCluster) a node joins.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct VClusterRef {
    /// Name of the vCluster. Its kubeconfig is read from the Secret `vc-<name>` (key `config`)
    /// in the namespace of the claim, as vCluster exports it.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Labels and annotations copied onto the NodeType generated from a provider entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TypeMetadata {
    /// Labels copied onto the NodeType object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations copied onto the NodeType object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Resources the kubelet reserves on a node of this type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overhead {
    /// Resources reserved for Kubernetes system daemons (the kubelet's `kubeReserved`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::api::schema::resource_list")]
    pub kube_reserved: ResourceList,
}
