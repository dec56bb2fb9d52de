//! Scheduling (DESIGN §4): node type properties, requirements (validated here, matched by
//! [`crate::requirements`]), resource fit, cost, capacity, the choice of a node type for a
//! claim, and the node labels and taints that follow from it. Pure code, no I/O.
//!
//! A controller turns the NodeTypes it lists (plus their providers) into [`PreparedType`]s
//! with [`prepare_type`] — that composes each type's template once — collects them in a
//! [`Catalogue`], and asks [`choose`] for the type of a claim ([`ClaimRequest`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use serde_json::Value;

use crate::api::{
    NodeClaim, NodeClaimSpec, NodePoolSpec, NodeProvider, NodeType, NodeTypeCapacity,
    NodeTypePhase, NodeTypeSpec, Operator, Properties, Requirement, ResourceList, LABEL_NODECLAIM,
    LABEL_NODECLAIM_NAMESPACE, LABEL_NODECLAIM_UID, LABEL_NODEPOOL, LABEL_PROVIDER,
};
use crate::requirements::{self, RequirementMiss};
use crate::resources::{self, ResourceAmounts, ResourceError};
use crate::template::{self, TemplateError, TypeTemplateInput};
use crate::zones;

/// Built-in property: the short node type name (the entry name in the provider).
pub const PROP_NODE_TYPE: &str = "autonodes.io/node-type";
/// Built-in property: alias of [`PROP_NODE_TYPE`], as vCluster spells it.
pub const PROP_NODE_TYPE_ALIAS: &str = "vcluster.com/node-type";
/// Built-in property: the NodeProvider name.
pub const PROP_PROVIDER: &str = LABEL_PROVIDER;
/// Built-in property: the NodeType name (`<provider>.<type>`).
pub const PROP_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Built-in property: the operating system (`linux`).
pub const PROP_OS: &str = "kubernetes.io/os";
/// Built-in property: the CPU architecture (`amd64` unless a property overrides it).
pub const PROP_ARCH: &str = "kubernetes.io/arch";
/// Built-in property: the capacity type (`on-demand`).
pub const PROP_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Property holding the user's own cloud-config, merged into the user data.
pub const PROP_USER_DATA: &str = "autonodes.io/user-data";
/// Property holding SSH public keys for the node, one per line.
pub const PROP_SSH_KEYS: &str = "autonodes.io/ssh-keys";
/// Property choosing the built-in user data template: `kubeadm` (default) or `vcluster`.
pub const PROP_USER_DATA_TEMPLATE: &str = "autonodes.io/user-data-template";
/// Property saying the type's image has containerd, the kubelet and kubeadm already
/// (`"true"`): the user data installs nothing. Otherwise it installs them.
pub const PROP_IMAGE_PREPARED: &str = "autonodes.io/image-prepared";
/// Property naming where the type's nodes download the kubelet and kubeadm (a mirror);
/// it replaces `autonodes run --kubernetes-download-url` for the type.
pub const PROP_KUBERNETES_DOWNLOAD_URL: &str = "autonodes.io/kubernetes-download-url";
/// vCluster's spelling of [`PROP_USER_DATA`] (the autonodes one wins when both are set).
pub const PROP_VCLUSTER_USER_DATA: &str = "vcluster.com/user-data";
/// vCluster's spelling of [`PROP_SSH_KEYS`] (the autonodes one wins when both are set).
pub const PROP_VCLUSTER_SSH_KEYS: &str = "vcluster.com/ssh-keys";
/// vCluster's KubeVirt property: the image of a root disk the type's template lacks.
pub const PROP_IMAGE_URL: &str = "kubevirt.vcluster.com/image-url";
/// vCluster's KubeVirt property: the size of that root disk (default 20Gi).
pub const PROP_ROOT_DISK_SIZE: &str = "kubevirt.vcluster.com/root-disk-size";
/// Properties that configure the node rather than describe it: never node labels.
pub const CONFIG_PROPERTIES: &[&str] = &[
    PROP_USER_DATA,
    PROP_SSH_KEYS,
    PROP_USER_DATA_TEMPLATE,
    PROP_IMAGE_PREPARED,
    PROP_KUBERNETES_DOWNLOAD_URL,
    PROP_VCLUSTER_USER_DATA,
    PROP_VCLUSTER_SSH_KEYS,
    PROP_IMAGE_URL,
    PROP_ROOT_DISK_SIZE,
    template::disks::PROP_ROOT_DISK_STORAGE_CLASS,
    template::disks::PROP_DATA_DISKS,
    template::networks::PROP_NETWORKS,
    template::networks::PROP_DEFAULT_NETWORK,
    template::placement::PROP_VM_AFFINITY,
    template::placement::PROP_VM_ANTI_AFFINITY,
    template::placement::PROP_VM_AFFINITY_SCOPE,
    template::placement::PROP_HOST_NODE_SELECTOR,
    template::placement::PROP_HOST_NODE_PREFERENCE,
    template::golden::PROP_GOLDEN_IMAGE,
    template::instancetype::PROP_INSTANCETYPE,
    template::instancetype::PROP_PREFERENCE,
];

/// A configuration property in autonodes' spelling, else in vCluster's.
pub fn config_property<'p>(properties: &'p Properties, autonodes: &str) -> Option<&'p String> {
    let vcluster = match autonodes {
        PROP_USER_DATA => PROP_VCLUSTER_USER_DATA,
        PROP_SSH_KEYS => PROP_VCLUSTER_SSH_KEYS,
        _ => return properties.get(autonodes),
    };
    properties
        .get(autonodes)
        .or_else(|| properties.get(vcluster))
}

/// The taint every node registers with until autonodes has seen it join.
pub const REGISTRATION_TAINT_KEY: &str = "autonodes.io/unregistered";

/// Condition reason when no node type fits a claim.
pub const REASON_NO_MATCHING_NODE_TYPE: &str = "NoMatchingNodeType";
/// Reason: the tenant's quotas allow none of the fitting node types with capacity.
pub const REASON_QUOTA_EXCEEDED: &str = "QuotaExceeded";
/// Reason: no node of the host cluster has room for the VM of any fitting node type.
pub const REASON_HOST_CAPACITY_EXHAUSTED: &str = "HostCapacityExhausted";
/// Condition reason when fitting node types exist but none has capacity left.
pub const REASON_INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";

/// The NodeType name of a provider entry: `<provider>.<type>`.
pub fn node_type_name(provider: &str, short_name: &str) -> String {
    format!("{provider}.{short_name}")
}

/// The short name of a NodeType: its name without the `<provider>.` prefix (or the whole
/// name when it does not have that prefix, e.g. a NodeType created by hand).
pub fn short_type_name<'a>(node_type: &'a str, provider: &str) -> &'a str {
    node_type
        .strip_prefix(provider)
        .and_then(|rest| rest.strip_prefix('.'))
        .filter(|s| !s.is_empty())
        .unwrap_or(node_type)
}

/// What a node type needs from its NodeProvider.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderContext {
    /// The provider name.
    pub name: String,
    /// The provider's properties (lowest precedence).
    pub properties: Properties,
    /// The provider's base VirtualMachine template.
    pub base_template: Option<Value>,
    /// `clusterRef.cluster`: the host cluster.
    pub host_cluster: String,
    /// `clusterRef.namespace`: where VMs and their Secrets go.
    pub vm_namespace: String,
    /// `tenantNamespaceSelector`: the tenant namespaces that may use the provider's types
    /// (`None`: every namespace).
    pub tenant_namespaces: Option<LabelSelector>,
}

impl ProviderContext {
    /// The context of a NodeProvider object (its name is `metadata.name`).
    pub fn from_provider(provider: &NodeProvider) -> Self {
        let spec = &provider.spec;
        Self {
            name: provider.metadata.name.clone().unwrap_or_default(),
            properties: spec.properties.clone(),
            base_template: spec.kube_virt.virtual_machine_template.clone(),
            host_cluster: spec.kube_virt.cluster_ref.cluster.clone(),
            vm_namespace: spec.kube_virt.cluster_ref.namespace.clone(),
            tenant_namespaces: spec.tenant_namespace_selector.clone(),
        }
    }
}

/// The NodeType objects a NodeProvider's entries become: named `<provider>.<type>`,
/// labelled `autonodes.io/provider` plus the entry's `metadata.labels`, annotated with its
/// `metadata.annotations`, and owned by the provider when it has a UID.
pub fn node_types_from_provider(provider: &NodeProvider) -> Vec<NodeType> {
    let provider_name = provider.metadata.name.clone().unwrap_or_default();
    let owner = provider.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: format!("{}/{}", crate::api::GROUP, crate::api::VERSION),
        kind: "NodeProvider".to_string(),
        name: provider_name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    provider
        .spec
        .kube_virt
        .node_types
        .iter()
        .map(|entry| {
            let meta = entry.metadata.clone().unwrap_or_default();
            let mut labels = meta.labels;
            labels.insert(LABEL_PROVIDER.to_string(), provider_name.clone());
            NodeType {
                metadata: ObjectMeta {
                    name: Some(node_type_name(&provider_name, &entry.name)),
                    labels: Some(labels),
                    annotations: (!meta.annotations.is_empty()).then_some(meta.annotations),
                    owner_references: owner.clone().map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec: NodeTypeSpec {
                    provider_ref: provider_name.clone(),
                    display_name: entry.display_name.clone(),
                    resources: entry.resources.clone(),
                    overhead: entry.overhead.clone(),
                    cost: entry.cost,
                    max_capacity: entry.max_capacity,
                    properties: entry.properties.clone(),
                    taints: entry.taints.clone(),
                    merge_virtual_machine_template: entry.merge_virtual_machine_template.clone(),
                    virtual_machine_template: entry.virtual_machine_template.clone(),
                },
                status: None,
            }
        })
        .collect()
}

/// Why a node type cannot be used (its phase is Failed).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TypeProblem {
    /// The provider named by `spec.providerRef` is unknown.
    #[error("node type {node_type}: NodeProvider {provider} not found")]
    ProviderNotFound {
        /// The node type.
        node_type: String,
        /// The missing provider.
        provider: String,
    },
    /// The template cannot be composed, or resources cannot be discovered from it.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A resource quantity is invalid.
    #[error("node type {node_type}: {source}")]
    Resources {
        /// The node type.
        node_type: String,
        /// What is wrong.
        source: ResourceError,
    },
    /// The provider exists but cannot be used (host unreachable, invalid templates,
    /// being deleted).
    #[error("node type {node_type}: {message}")]
    ProviderNotReady {
        /// The node type.
        node_type: String,
        /// Why the provider cannot be used.
        message: String,
    },
    /// A taint of the type is invalid.
    #[error("node type {node_type}: spec.taints: {message}")]
    Taints {
        /// The node type.
        node_type: String,
        /// What is wrong.
        message: String,
    },
    /// The type's instance type could not be read from the host (not there, unreadable,
    /// or without a guest CPU and memory), so its resources are unknown.
    #[error("node type {node_type}: instance type {instancetype}: {message}")]
    Instancetype {
        /// The node type.
        node_type: String,
        /// The instance type, `<kind>/<name>`.
        instancetype: String,
        /// Why its resources are unknown.
        message: String,
    },
}

impl TypeProblem {
    /// A CamelCase condition reason for the problem.
    pub fn reason(&self) -> &'static str {
        match self {
            TypeProblem::ProviderNotFound { .. } => "ProviderNotFound",
            TypeProblem::ProviderNotReady { .. } => "ProviderNotReady",
            TypeProblem::Template(TemplateError::MemoryNotFound { .. }) => "MemoryNotFound",
            TypeProblem::Template(_) => "InvalidTemplate",
            TypeProblem::Resources { .. } => "InvalidResources",
            TypeProblem::Taints { .. } => "InvalidTaints",
            TypeProblem::Instancetype { .. } => "InstancetypeUnavailable",
        }
    }
}

/// A node type ready for scheduling and rendering: properties merged, resources
/// discovered, cost computed, template composed (steps 1–3 of DESIGN §3).
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedType {
    /// NodeType name, `<provider>.<type>`.
    pub name: String,
    /// Short name (the provider entry name).
    pub short_name: String,
    /// The NodeProvider.
    pub provider: String,
    /// Display name, if any.
    pub display_name: Option<String>,
    /// The provider's host cluster (empty when the provider is missing).
    pub host_cluster: String,
    /// Namespace of the VMs on the host cluster (empty when the provider is missing).
    pub vm_namespace: String,
    /// The tenant namespaces that may use the type: its provider's
    /// `tenantNamespaceSelector` (`None`: every namespace; see [`crate::access`]).
    pub tenant_namespaces: Option<LabelSelector>,
    /// The type's properties: built-in defaults < provider < type < built-in identity.
    pub properties: Properties,
    /// Effective resources: from the spec, else discovered from the template.
    pub resources: ResourceList,
    /// `resources`, parsed.
    pub amounts: ResourceAmounts,
    /// Effective cost: `spec.cost`, else the default formula over `resources`.
    pub cost: i64,
    /// `maxCapacity`; `None` is unlimited.
    pub max_capacity: Option<i64>,
    /// Node taints of the type: `spec.taints` plus the template's `spec.template.spec.taints`.
    pub taints: Vec<Taint>,
    /// The composed template (merge and resources applied, taints taken out).
    pub template: Value,
    /// Why the type cannot be used, if it cannot.
    pub problem: Option<TypeProblem>,
    /// A hash of what the type's VMs are made from ([`definition_hash`]); claims record it
    /// and have drifted when it changes.
    pub definition: String,
    /// The golden volumes the type's VMs clone their images from
    /// ([`template::golden`]); empty unless `autonodes.io/golden-image` is `true`.
    pub golden: Vec<template::golden::GoldenVolume>,
    /// The instance type the type's VMs use (`autonodes.io/instancetype`), if any: its
    /// resources come from the host ([`prepare_type_with`]).
    pub instancetype: Option<template::instancetype::Matcher>,
}

/// A hash (16 hex digits of SHA-256) of what a type's VMs are made from, as the user wrote
/// it: the type's resources, overhead, properties (user data and its template among them),
/// taints and templates, and its provider's base template, properties, host cluster and
/// namespace. Cost and `maxCapacity` are not part of it (they change no VM), and neither is
/// how autonodes composes the template, so an upgrade of autonodes makes no claim drift.
pub fn definition_hash(spec: &NodeTypeSpec, provider: Option<&ProviderContext>) -> String {
    use sha2::{Digest, Sha256};
    let described = serde_json::json!({
        "resources": spec.resources,
        "overhead": spec.overhead,
        "properties": spec.properties,
        "taints": spec.taints,
        "merge": spec.merge_virtual_machine_template,
        "replacement": spec.virtual_machine_template,
        "provider": provider.map(|p| serde_json::json!({
            "template": p.base_template,
            "properties": p.properties,
            "cluster": p.host_cluster,
            "namespace": p.vm_namespace,
        })),
    });
    let digest = Sha256::digest(described.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The built-in properties of a type whose values cannot be overridden.
fn identity_properties(name: &str, short: &str, provider: &str) -> [(&'static str, String); 4] {
    [
        (PROP_NODE_TYPE, short.to_string()),
        (PROP_NODE_TYPE_ALIAS, short.to_string()),
        (PROP_PROVIDER, provider.to_string()),
        (PROP_INSTANCE_TYPE, name.to_string()),
    ]
}

/// The properties of a node type: `kubernetes.io/os=linux`, `kubernetes.io/arch=amd64` and
/// `karpenter.sh/capacity-type=on-demand` as defaults, then the provider's, then the
/// type's, then the identity (`autonodes.io/node-type`, `vcluster.com/node-type`,
/// `autonodes.io/provider`, `node.kubernetes.io/instance-type`), which nothing overrides.
pub fn type_properties(
    name: &str,
    short: &str,
    provider: &str,
    provider_properties: &Properties,
    type_properties: &Properties,
) -> Properties {
    let mut p = Properties::from([
        (PROP_OS.to_string(), "linux".to_string()),
        (PROP_ARCH.to_string(), "amd64".to_string()),
        (PROP_CAPACITY_TYPE.to_string(), "on-demand".to_string()),
    ]);
    p.extend(
        provider_properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    p.extend(type_properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in identity_properties(name, short, provider) {
        p.insert(k.to_string(), v);
    }
    p
}

/// Prepares one NodeType for scheduling and rendering. `provider` is the NodeProvider named
/// by `spec.providerRef` (`None` when it does not exist). Never fails: a type that cannot
/// be used carries its [`TypeProblem`] (phase Failed) and is never chosen.
pub fn prepare_type(
    name: &str,
    spec: &NodeTypeSpec,
    provider: Option<&ProviderContext>,
) -> PreparedType {
    prepare_type_with(name, spec, provider, Err("not read from the host yet"))
}

/// [`prepare_type`] for a type whose instance type's resources were read from the host
/// (`Ok`), or could not be (`Err`, why). Only a type with `autonodes.io/instancetype`
/// reads it.
pub fn prepare_type_with(
    name: &str,
    spec: &NodeTypeSpec,
    provider: Option<&ProviderContext>,
    instancetype: Result<&ResourceList, &str>,
) -> PreparedType {
    let provider_name = spec.provider_ref.clone();
    let short = short_type_name(name, &provider_name).to_string();
    let empty = Properties::new();
    let properties = type_properties(
        name,
        &short,
        &provider_name,
        provider.map_or(&empty, |p| &p.properties),
        &spec.properties,
    );
    let mut prepared = PreparedType {
        name: name.to_string(),
        short_name: short,
        provider: provider_name.clone(),
        display_name: spec.display_name.clone(),
        host_cluster: provider.map(|p| p.host_cluster.clone()).unwrap_or_default(),
        vm_namespace: provider.map(|p| p.vm_namespace.clone()).unwrap_or_default(),
        tenant_namespaces: provider.and_then(|p| p.tenant_namespaces.clone()),
        properties,
        resources: spec.resources.clone(),
        amounts: ResourceAmounts::default(),
        cost: spec.cost.unwrap_or(0),
        max_capacity: spec.max_capacity,
        taints: spec.taints.clone(),
        template: Value::Null,
        problem: None,
        definition: String::new(),
        golden: Vec::new(),
        instancetype: None,
    };
    if let Err(problem) = fill_prepared(&mut prepared, spec, provider, instancetype) {
        prepared.problem = Some(problem);
    }
    prepared.definition = definition_hash(spec, provider);
    prepared
}

fn fill_prepared(
    t: &mut PreparedType,
    spec: &NodeTypeSpec,
    provider: Option<&ProviderContext>,
    instancetype_resources: Result<&ResourceList, &str>,
) -> Result<(), TypeProblem> {
    let provider = provider.ok_or_else(|| TypeProblem::ProviderNotFound {
        node_type: t.name.clone(),
        provider: t.provider.clone(),
    })?;
    for taint in &spec.taints {
        template::check_taint(taint).map_err(|message| TypeProblem::Taints {
            node_type: t.name.clone(),
            message,
        })?;
    }
    let mut composed = template::compose_type_template(&TypeTemplateInput {
        node_type: &t.name,
        base: provider.base_template.as_ref(),
        merge: spec.merge_virtual_machine_template.as_ref(),
        replacement: spec.virtual_machine_template.as_ref(),
        resources: &spec.resources,
    })?;
    add_property_devices(&mut composed.template, &t.properties, &t.name)?;
    let golden = template::golden::wanted(
        t.properties
            .get(template::golden::PROP_GOLDEN_IMAGE)
            .map(String::as_str),
    )
    .map_err(|message| {
        TemplateError::property(&t.name, template::golden::PROP_GOLDEN_IMAGE, message)
    })?;
    if golden {
        t.golden = template::golden::use_golden_images(
            &mut composed.template,
            &t.provider,
            &t.vm_namespace,
            &t.name,
        )?;
    }
    let instancetype = use_instancetype(&mut composed.template, &t.properties, spec, &t.name)?;
    t.instancetype = instancetype.clone();
    // What rendering a claim's VM (or KubeVirt's admission) would refuse is found here, so
    // the type is Failed and never chosen rather than failing every claim sent to it.
    template::check_vm_template(&composed.template, &t.name)?;
    t.resources = match &instancetype {
        None => template::effective_resources(&t.name, &spec.resources, &composed.template)?,
        Some(it) => {
            let mut resources =
                instancetype_resources
                    .cloned()
                    .map_err(|message| TypeProblem::Instancetype {
                        node_type: t.name.clone(),
                        instancetype: format!("{}/{}", it.kind, it.name),
                        message: message.to_string(),
                    })?;
            // Extended resources the type lists count too (the instance type has none).
            resources.extend(spec.resources.clone());
            resources
        }
    };
    t.amounts =
        ResourceAmounts::from_list(&t.resources).map_err(|source| TypeProblem::Resources {
            node_type: t.name.clone(),
            source,
        })?;
    t.cost = spec.cost.unwrap_or_else(|| t.amounts.default_cost());
    t.taints = merge_taints([spec.taints.as_slice(), composed.taints.as_slice()]);
    t.template = composed.template;
    Ok(())
}

/// Points the template at the type's instance type and preference
/// (`autonodes.io/instancetype`, `autonodes.io/preference`), taking out the cpu and memory
/// the instance type sets; returns the instance type. A type that names one and also gives
/// cpu or memory in `resources` is an error.
fn use_instancetype(
    template: &mut Value,
    properties: &Properties,
    spec: &NodeTypeSpec,
    node_type: &str,
) -> Result<Option<template::instancetype::Matcher>, TemplateError> {
    use template::instancetype as it;
    let bad =
        |property: &str, message: String| TemplateError::property(node_type, property, message);
    let instancetype = properties
        .get(it::PROP_INSTANCETYPE)
        .map(|v| it::parse_instancetype(v))
        .transpose()
        .map_err(|m| bad(it::PROP_INSTANCETYPE, m))?;
    let preference = properties
        .get(it::PROP_PREFERENCE)
        .map(|v| it::parse_preference(v))
        .transpose()
        .map_err(|m| bad(it::PROP_PREFERENCE, m))?;
    if instancetype.is_some() {
        it::check_no_own_resources(&spec.resources, node_type)?;
    }
    it::use_instancetype(template, instancetype.as_ref(), preference.as_ref());
    Ok(instancetype)
}

/// The devices a type's configuration properties add to its template: the root disk from
/// `kubevirt.vcluster.com/image-url`, blank data disks, Multus networks; and the check of
/// its placement presets. A value autonodes cannot use is an error naming the property
/// (the type is Failed).
fn add_property_devices(
    template: &mut Value,
    properties: &Properties,
    node_type: &str,
) -> Result<(), TemplateError> {
    use template::{disks, networks};
    let bad =
        |property: &str, message: String| TemplateError::property(node_type, property, message);
    let prop = |key: &str| properties.get(key).map(String::as_str);
    if let Some(url) = prop(PROP_IMAGE_URL) {
        template::add_root_disk(
            template,
            url,
            prop(PROP_ROOT_DISK_SIZE),
            prop(disks::PROP_ROOT_DISK_STORAGE_CLASS),
            node_type,
        )?;
    }
    if let Some(value) = prop(disks::PROP_DATA_DISKS) {
        let data = disks::parse_data_disks(value).map_err(|m| bad(disks::PROP_DATA_DISKS, m))?;
        disks::add_data_disks(template, &data, node_type)?;
    }
    let default_network = prop(networks::PROP_DEFAULT_NETWORK)
        .map(networks::parse_default_network)
        .transpose()
        .map_err(|m| bad(networks::PROP_DEFAULT_NETWORK, m))?;
    let secondary = prop(networks::PROP_NETWORKS)
        .map(networks::parse_networks)
        .transpose()
        .map_err(|m| bad(networks::PROP_NETWORKS, m))?
        .unwrap_or_default();
    networks::add_networks(template, default_network.as_deref(), &secondary, node_type)?;
    // Placement is written per claim (its group depends on the claim); checked here so a
    // type whose presets cannot be used is Failed rather than failing each claim.
    template::placement::parse_placement(properties).map_err(|(property, m)| bad(property, m))?;
    crate::host_capacity::host_overhead(properties)
        .map_err(|m| bad(crate::host_capacity::PROP_HOST_OVERHEAD, m))?;
    Ok(())
}

impl PreparedType {
    /// Whether the type can be used at all (phase is not Failed).
    pub fn is_usable(&self) -> bool {
        self.problem.is_none()
    }

    /// Capacity given how many claims are scheduled to the type.
    pub fn capacity(&self, claimed: i64) -> NodeTypeCapacity {
        capacity(self.max_capacity, claimed)
    }

    /// Whether another claim may be scheduled to the type.
    pub fn has_capacity(&self, claimed: i64) -> bool {
        self.max_capacity.is_none_or(|max| claimed < max)
    }

    /// The phase: Failed with a problem, Exhausted when every unit is claimed, else Available.
    pub fn phase(&self, claimed: i64) -> NodeTypePhase {
        if self.problem.is_some() {
            NodeTypePhase::Failed
        } else if self.has_capacity(claimed) {
            NodeTypePhase::Available
        } else {
            NodeTypePhase::Exhausted
        }
    }

    /// The type's properties as node selector requirements: `key In [value]`, `key In
    /// [a, b]` for a property offering several values (`a,b`), `key Exists` for one
    /// offering any (`*`).
    pub fn requirements(&self) -> Vec<NodeSelectorRequirement> {
        self.properties
            .iter()
            .map(|(k, v)| {
                let (operator, values) = match requirements::Offer::parse(v) {
                    requirements::Offer::One => ("In", Some(vec![v.clone()])),
                    requirements::Offer::Several(choices) => (
                        "In",
                        Some(choices.into_iter().map(str::to_string).collect()),
                    ),
                    requirements::Offer::Any => ("Exists", None),
                };
                NodeSelectorRequirement {
                    key: k.clone(),
                    operator: operator.to_string(),
                    values,
                }
            })
            .collect()
    }

    /// The status fields autonodes computes for a NodeType (all but conditions,
    /// observedGeneration and the host's room, which the controller sets).
    pub fn status(&self, claimed: i64) -> crate::api::NodeTypeStatus {
        crate::api::NodeTypeStatus {
            phase: Some(self.phase(claimed)),
            observed_generation: None,
            cost: self.is_usable().then_some(self.cost),
            capacity: Some(self.capacity(claimed)),
            resources: self.resources.clone(),
            requirements: self.requirements(),
            definition_hash: Some(self.definition.clone()),
            host: None,
            conditions: Vec::new(),
        }
    }
}

/// Capacity of a type: `total` = `maxCapacity`, `available = total − claimed` (never below
/// zero); `total` and `available` are absent when unlimited.
pub fn capacity(max_capacity: Option<i64>, claimed: i64) -> NodeTypeCapacity {
    NodeTypeCapacity {
        total: max_capacity,
        claimed,
        available: max_capacity.map(|max| (max - claimed).max(0)),
    }
}

/// The one capacity rule: counts, per NodeType name, the claims that hold a unit of its
/// capacity. A claim holds one once it is scheduled (`status.typeRef`) and until its VM is
/// gone: Terminating claims count; Failed claims (their VM is removed) and `released` ones
/// (cleaned up, by UID, while a cache may still show them) do not. `reserved` adds the
/// scheduling decisions (claim UID → type) the claims do not show yet; a claim counts once.
pub fn count_claimed<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    reserved: &HashMap<String, String>,
    released: &HashSet<String>,
) -> BTreeMap<String, i64> {
    let mut by_uid: HashMap<String, &str> = HashMap::new();
    for claim in claims {
        let Some(uid) = claim.metadata.uid.as_ref() else {
            continue;
        };
        let s = claim.status.as_ref();
        if s.and_then(|s| s.phase) == Some(crate::api::NodeClaimPhase::Failed)
            || released.contains(uid)
        {
            continue;
        }
        if let Some(t) = s.and_then(|s| s.type_ref.as_deref()) {
            by_uid.insert(uid.clone(), t);
        }
    }
    for (uid, t) in reserved {
        if !released.contains(uid) {
            by_uid.insert(uid.clone(), t);
        }
    }
    let mut counts = BTreeMap::new();
    for t in by_uid.into_values() {
        *counts.entry(t.to_string()).or_insert(0) += 1;
    }
    counts
}

/// Node types to choose from, ordered by cost, then name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalogue {
    types: Vec<PreparedType>,
}

impl Catalogue {
    /// A catalogue of prepared types.
    pub fn new(mut types: Vec<PreparedType>) -> Self {
        types.sort_by(|a, b| a.cost.cmp(&b.cost).then_with(|| a.name.cmp(&b.name)));
        Self { types }
    }

    /// The catalogue of one NodeProvider's entries (what `autonodes render` uses). Read
    /// without a host: a type's instance type counts as no cpu and memory (its VM is the
    /// same whatever they are).
    pub fn from_provider(provider: &NodeProvider) -> Self {
        let ctx = ProviderContext::from_provider(provider);
        let offline = ResourceList::new();
        Self::new(
            node_types_from_provider(provider)
                .iter()
                .map(|nt| {
                    prepare_type_with(
                        nt.metadata.name.as_deref().unwrap_or_default(),
                        &nt.spec,
                        Some(&ctx),
                        Ok(&offline),
                    )
                })
                .collect(),
        )
    }

    /// The types, cheapest first (ties by name).
    pub fn types(&self) -> &[PreparedType] {
        &self.types
    }

    /// The type of exactly this NodeType name (no short names: a ledger's or claim's
    /// `typeRef`).
    pub fn named(&self, name: &str) -> Option<&PreparedType> {
        self.types.iter().find(|t| t.name == name)
    }

    /// A type by NodeType name, or by short name when that is unambiguous.
    pub fn get(&self, name: &str) -> Option<&PreparedType> {
        self.named(name).or_else(|| {
            let mut by_short = self.types.iter().filter(|t| t.short_name == name);
            match (by_short.next(), by_short.next()) {
                (Some(t), None) => Some(t),
                _ => None,
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Requirements
// ---------------------------------------------------------------------------------------

/// A requirement that is invalid in itself (wrong number of values, non-integer Gt/Lt).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A requirement is malformed.
    #[error("{field}: requirement on {key}: {message}")]
    InvalidRequirement {
        /// Where it is, e.g. `spec.requirements[2]`.
        field: String,
        /// The requirement key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A desired capacity quantity is invalid.
    #[error("spec.desiredCapacity: {source}")]
    InvalidDesiredCapacity {
        /// The parse error, naming the resource.
        source: ResourceError,
    },
}

/// A validated requirement: a [`requirements::Requirement`] and its text for messages.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRequirement {
    requirement: requirements::Requirement,
    text: String,
}

impl fmt::Display for CheckedRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl CheckedRequirement {
    /// Validates a requirement. `field` locates it for error messages.
    pub fn new(req: &Requirement, field: &str) -> Result<Self, RequestError> {
        let invalid = |message: String| RequestError::InvalidRequirement {
            field: field.to_string(),
            key: req.key.clone(),
            message,
        };
        if req.key.is_empty() {
            return Err(invalid("the key is empty".to_string()));
        }
        let one_integer = || -> Result<i64, RequestError> {
            match req.values.as_slice() {
                [v] => requirements::integer(v).ok_or_else(|| {
                    invalid(format!(
                        "{} needs an integer value, got {v:?}",
                        req.operator.as_str()
                    ))
                }),
                vs => Err(invalid(format!(
                    "{} needs exactly one integer value, got {}",
                    req.operator.as_str(),
                    vs.len()
                ))),
            }
        };
        let operator = match req.operator {
            Operator::In | Operator::NotIn if req.values.is_empty() => {
                return Err(invalid(format!(
                    "{} needs at least one value",
                    req.operator.as_str()
                )))
            }
            Operator::In => requirements::Operator::In(req.values.clone()),
            Operator::NotIn => requirements::Operator::NotIn(req.values.clone()),
            Operator::Exists | Operator::DoesNotExist | Operator::NotExists
                if !req.values.is_empty() =>
            {
                return Err(invalid(format!(
                    "{} takes no values",
                    req.operator.as_str()
                )))
            }
            Operator::Exists => requirements::Operator::Exists,
            Operator::DoesNotExist | Operator::NotExists => requirements::Operator::DoesNotExist,
            Operator::Gt => requirements::Operator::Gt(one_integer()?),
            Operator::Lt => requirements::Operator::Lt(one_integer()?),
        };
        let text = if req.values.is_empty() {
            format!("{} {}", req.key, req.operator.as_str())
        } else {
            format!(
                "{} {} [{}]",
                req.key,
                req.operator.as_str(),
                req.values.join(", ")
            )
        };
        Ok(Self {
            requirement: requirements::Requirement {
                key: req.key.clone(),
                operator,
            },
            text,
        })
    }

    /// The property key.
    pub fn key(&self) -> &str {
        &self.requirement.key
    }

    /// Checks the requirement against properties.
    /// Node type properties may offer several values (`a,b`) or any (`*`); see
    /// [`requirements::Requirement::matches_offer`].
    pub fn matches(&self, properties: &Properties) -> Result<(), RequirementMiss> {
        self.requirement.matches_offer(properties)
    }

    /// Whether this requirement names `t` explicitly (`node-type In [...]` or
    /// `instance-type In [...]` listing it).
    fn names_type(&self, t: &PreparedType) -> bool {
        match &self.requirement.operator {
            requirements::Operator::In(values) => match self.key() {
                PROP_NODE_TYPE | PROP_NODE_TYPE_ALIAS => values.contains(&t.short_name),
                PROP_INSTANCE_TYPE => values.contains(&t.name),
                _ => false,
            },
            _ => false,
        }
    }
}

/// What a claim asks of a node type: its (and its pool's) requirements, desired
/// capacity, provider and pinned type. Validated once, then matched against many types.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// Only types of this provider.
    pub provider_ref: Option<String>,
    /// Only this type (NodeType name, or short name when unambiguous).
    pub type_ref: Option<String>,
    requirements: Vec<CheckedRequirement>,
    desired: ResourceAmounts,
}

impl ClaimRequest {
    /// Builds the request of a claim, with the requirements of its pool (if it has one and
    /// they were not copied into the claim) also applying. Errors name the field.
    pub fn new(claim: &NodeClaimSpec, pool: Option<&NodePoolSpec>) -> Result<Self, RequestError> {
        let mut requirements = Vec::new();
        if let Some(pool) = pool {
            for (i, r) in pool.requirements.iter().enumerate() {
                let checked =
                    CheckedRequirement::new(r, &format!("NodePool spec.requirements[{i}]"))?;
                if !requirements.contains(&checked) {
                    requirements.push(checked);
                }
            }
        }
        for (i, r) in claim.requirements.iter().enumerate() {
            let checked = CheckedRequirement::new(r, &format!("spec.requirements[{i}]"))?;
            if !requirements.contains(&checked) {
                requirements.push(checked);
            }
        }
        let desired = ResourceAmounts::from_list(&claim.desired_capacity)
            .map_err(|source| RequestError::InvalidDesiredCapacity { source })?;
        Ok(Self {
            provider_ref: claim
                .provider_ref
                .clone()
                .or_else(|| pool.and_then(|p| p.provider_ref.clone())),
            type_ref: claim.type_ref.clone(),
            requirements,
            desired,
        })
    }

    /// The validated requirements.
    pub fn requirements(&self) -> &[CheckedRequirement] {
        &self.requirements
    }

    fn pins(&self, t: &PreparedType) -> bool {
        self.type_ref
            .as_deref()
            .is_some_and(|r| r == t.name || r == t.short_name)
    }

    /// Whether the claim considers the type at all (provider and pinned type).
    pub fn considers(&self, t: &PreparedType) -> bool {
        self.provider_ref.as_deref().is_none_or(|p| p == t.provider)
            && self.type_ref.as_ref().is_none_or(|_| self.pins(t))
    }
}

/// One reason a type does not fit a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The type cannot be used at all.
    Failed(String),
    /// A requirement does not hold.
    Requirement {
        /// The requirement, e.g. `autonodes.io/node-type In [gpu]`.
        requirement: String,
        /// How it failed.
        miss: RequirementMiss,
    },
    /// The type lacks a desired resource.
    Resources(String),
    /// The type has an extended resource the claim did not ask for.
    UnrequestedExtended(String),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Failed(why) => write!(f, "the type is Failed ({why})"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotMet { actual: Some(a) },
            } => write!(f, "requirement `{requirement}` not met (the type has {a:?})"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotMet { actual: None },
            } => write!(f, "requirement `{requirement}` not met (the type has no such property)"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotAnInteger { actual },
            } => write!(
                f,
                "requirement `{requirement}` cannot be checked: the type's value {actual:?} is not an integer"
            ),
            Mismatch::Resources(s) => write!(f, "desiredCapacity not covered: {s}"),
            Mismatch::UnrequestedExtended(r) => write!(
                f,
                "the type has {r}, which the claim does not request (extended resources are only chosen when requested)"
            ),
        }
    }
}

/// Every reason `t` does not fit `req` (empty when it fits). Capacity is not checked here.
pub fn mismatches(t: &PreparedType, req: &ClaimRequest) -> Vec<Mismatch> {
    let mut out = Vec::new();
    if let Some(p) = &t.problem {
        out.push(Mismatch::Failed(p.to_string()));
        return out;
    }
    for r in &req.requirements {
        if let Err(miss) = r.matches(&t.properties) {
            out.push(Mismatch::Requirement {
                requirement: r.to_string(),
                miss,
            });
        }
    }
    if let Some(s) = t.amounts.shortfall(&req.desired) {
        out.push(Mismatch::Resources(s.to_string()));
    }
    let named = req.pins(t) || req.requirements.iter().any(|r| r.names_type(t));
    if !named {
        for (name, _) in t.amounts.extended() {
            if req.desired.milli(name) == 0 {
                out.push(Mismatch::UnrequestedExtended(name.to_string()));
            }
        }
    }
    out
}

/// Whether `t` fits `req` (requirements, resources, extended resources); capacity aside.
pub fn fits(t: &PreparedType, req: &ClaimRequest) -> bool {
    t.problem.is_none()
        && req
            .requirements
            .iter()
            .all(|r| r.matches(&t.properties).is_ok())
        && t.amounts.shortfall(&req.desired).is_none()
        && (req.pins(t)
            || req.requirements.iter().any(|r| r.names_type(t))
            || t.amounts
                .extended()
                .all(|(name, _)| req.desired.milli(name) > 0))
}

/// Why no node type was chosen: the `Scheduled=False` reason and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct NoFit {
    /// [`REASON_NO_MATCHING_NODE_TYPE`], [`REASON_INSUFFICIENT_CAPACITY`],
    /// [`REASON_QUOTA_EXCEEDED`] or [`REASON_HOST_CAPACITY_EXHAUSTED`].
    pub reason: &'static str,
    /// Human-readable detail: the nearest type and what failed, or the exhausted types.
    pub message: String,
}

/// Chooses the node type for a claim: the cheapest type (ties by name) that the claim
/// considers, that fits, and that has capacity (`claimed` maps NodeType names to the
/// number of claims scheduled to them, see [`count_claimed`]).
///
/// When nothing fits: [`REASON_NO_MATCHING_NODE_TYPE`] naming the nearest type (fewest
/// failed checks, then cheapest) and every check it failed; when fitting types are all
/// full: [`REASON_INSUFFICIENT_CAPACITY`] listing them.
pub fn choose<'c>(
    catalogue: &'c Catalogue,
    req: &ClaimRequest,
    claimed: &BTreeMap<String, i64>,
) -> Result<&'c PreparedType, NoFit> {
    choose_within(catalogue, req, claimed, |_| Ok(()))
}

/// [`choose`] among the types `admit` allows (the tenant's quotas, [`crate::quota`]; the
/// host's room, [`crate::host_capacity`]): a fitting type with capacity that `admit`
/// refuses is passed over for the next one. When every fitting type with capacity is
/// refused: the first refusal, its reason kept ([`REASON_QUOTA_EXCEEDED`],
/// [`REASON_HOST_CAPACITY_EXHAUSTED`]).
pub fn choose_within<'c>(
    catalogue: &'c Catalogue,
    req: &ClaimRequest,
    claimed: &BTreeMap<String, i64>,
    mut admit: impl FnMut(&PreparedType) -> Result<(), NoFit>,
) -> Result<&'c PreparedType, NoFit> {
    let count = |t: &PreparedType| claimed.get(&t.name).copied().unwrap_or(0);
    let mut full: Vec<&PreparedType> = Vec::new();
    let mut refused: Vec<NoFit> = Vec::new();
    for t in catalogue.types.iter().filter(|t| req.considers(t)) {
        if fits(t, req) {
            if !t.has_capacity(count(t)) {
                full.push(t);
                continue;
            }
            match admit(t) {
                Ok(()) => return Ok(t),
                Err(why) => refused.push(why),
            }
        }
    }
    let others = refused.len().saturating_sub(1);
    if let Some(first) = refused.into_iter().next() {
        let more = match others {
            0 => String::new(),
            n => format!(" (and {n} more fitting node type(s) refused)"),
        };
        return Err(NoFit {
            reason: first.reason,
            message: format!("{}{more}", first.message),
        });
    }
    if !full.is_empty() {
        let list: Vec<String> = full
            .iter()
            .map(|t| {
                format!(
                    "{} ({}/{} claimed)",
                    t.name,
                    count(t),
                    t.max_capacity.unwrap_or_default()
                )
            })
            .collect();
        return Err(NoFit {
            reason: REASON_INSUFFICIENT_CAPACITY,
            message: format!(
                "every fitting node type is at maxCapacity: {}",
                list.join(", ")
            ),
        });
    }
    let considered: Vec<&PreparedType> = catalogue
        .types
        .iter()
        .filter(|t| req.considers(t))
        .collect();
    if considered.is_empty() {
        let message = match (&req.type_ref, &req.provider_ref) {
            (Some(t), Some(p)) => format!("node type {t} of provider {p} does not exist"),
            (Some(t), None) => format!("node type {t} does not exist"),
            (None, Some(p)) => format!("provider {p} offers no node types"),
            (None, None) => "there are no node types".to_string(),
        };
        return Err(NoFit {
            reason: REASON_NO_MATCHING_NODE_TYPE,
            message,
        });
    }
    // Nearest: fewest mismatches; usable before Failed; then catalogue order (cost, name).
    let (nearest, misses) = considered
        .iter()
        .map(|t| (*t, mismatches(t, req)))
        .min_by_key(|(t, m)| (t.problem.is_some(), m.len()))
        .ok_or_else(|| NoFit {
            reason: REASON_NO_MATCHING_NODE_TYPE,
            message: "there are no node types".to_string(),
        })?;
    let details: Vec<String> = misses.iter().map(ToString::to_string).collect();
    Err(NoFit {
        reason: REASON_NO_MATCHING_NODE_TYPE,
        message: format!(
            "none of {} node type(s) fits; nearest is {}: {}",
            considered.len(),
            nearest.name,
            details.join("; ")
        ),
    })
}

// ---------------------------------------------------------------------------------------
// Node properties, labels, taints
// ---------------------------------------------------------------------------------------

/// The properties of a node: the type's (defaults < provider < type), then the pool's,
/// then the claim's; the type identity properties are kept whatever pool or claim say.
/// A type property that offers several values (`a,b`) or any (`*`) becomes the one value
/// the claim's and pool's requirements pick ([`narrow_offer`]).
pub fn node_properties(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> Properties {
    let mut p = t.properties.clone();
    let asked: Vec<requirements::Requirement> = pool
        .map(|p| p.requirements.as_slice())
        .unwrap_or_default()
        .iter()
        .chain(&claim.requirements)
        .filter_map(|r| CheckedRequirement::new(r, "").ok())
        .map(|r| r.requirement)
        .collect();
    for (key, value) in p.iter_mut() {
        let on_key: Vec<&requirements::Requirement> =
            asked.iter().filter(|r| &r.key == key).collect();
        if let Some(chosen) = narrow_offer(value, &on_key) {
            *value = chosen;
        }
    }
    if let Some(pool) = pool {
        p.extend(pool.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    p.extend(claim.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (k, v) in identity_properties(&t.name, &t.short_name, &t.provider) {
        p.insert(k.to_string(), v);
    }
    p
}

/// The properties of a claim's node: [`node_properties`], with the zone the claim was
/// scheduled into (`status.zone`) in place of what its type offers.
pub fn claim_node_properties(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &crate::api::NodeClaim,
) -> Properties {
    let mut p = node_properties(t, pool, &claim.spec);
    if let Some(zone) = claim.status.as_ref().and_then(|s| s.zone.as_ref()) {
        p.insert(zones::PROP_ZONE.to_string(), zone.clone());
    }
    p
}

/// The zone a claim scheduled to `t` goes to: the claim's own `topology.kubernetes.io/zone`
/// property when it sets one, else [`zones::choose_zone`] over the type's zones, the
/// claim's requirements on the zone key and `in_use` (the type's claims per zone).
pub fn zone_for(
    t: &PreparedType,
    claim: &NodeClaimSpec,
    request: &ClaimRequest,
    in_use: &BTreeMap<String, i64>,
) -> Option<String> {
    zone_for_where(t, claim, request, in_use, |_| true)
}

/// [`zone_for`] among the zones `allowed` accepts (those where the host has room): `None`
/// when the claim's own zone, or every zone the type offers it, is refused.
pub fn zone_for_where(
    t: &PreparedType,
    claim: &NodeClaimSpec,
    request: &ClaimRequest,
    in_use: &BTreeMap<String, i64>,
    allowed: impl Fn(&str) -> bool,
) -> Option<String> {
    if let Some(zone) = claim.properties.get(zones::PROP_ZONE) {
        return Some(zone.clone()).filter(|z| allowed(z));
    }
    let on_zone: Vec<&requirements::Requirement> = request
        .requirements()
        .iter()
        .map(|r| &r.requirement)
        .filter(|r| r.key == zones::PROP_ZONE)
        .collect();
    zones::choose_zone_where(
        t.properties.get(zones::PROP_ZONE).map(String::as_str),
        &on_zone,
        in_use,
        allowed,
    )
}

/// The single value a property offering several (`a,b`) or any (`*`) takes under
/// `requirements` on its key: the first value an `In` requirement lists that every
/// requirement accepts, else (for `a,b`) the first choice every requirement accepts.
/// `None` leaves the property as it is: a single value, or no choice fits (then the type
/// did not fit either), or `*` that nothing pins (it stays `*`, which is no label value,
/// so the node gets no label for it).
pub fn narrow_offer(value: &str, requirements: &[&requirements::Requirement]) -> Option<String> {
    let offer = requirements::Offer::parse(value);
    let accepted = |candidate: &str| {
        requirements.iter().all(|r| {
            let single = BTreeMap::from([(r.key.clone(), candidate.to_string())]);
            r.matches(&single).is_ok()
        })
    };
    let offers = |candidate: &str| match &offer {
        requirements::Offer::Any => true,
        requirements::Offer::Several(choices) => choices.contains(&candidate),
        requirements::Offer::One => false,
    };
    if offer == requirements::Offer::One {
        return None;
    }
    let listed = requirements.iter().flat_map(|r| match &r.operator {
        requirements::Operator::In(values) => values.as_slice(),
        _ => &[],
    });
    for v in listed {
        if offers(v) && accepted(v) {
            return Some(v.clone());
        }
    }
    match offer {
        requirements::Offer::Several(choices) => choices
            .into_iter()
            .find(|c| accepted(c))
            .map(str::to_string),
        _ => None,
    }
}

/// Whether `key` is a valid label key: an optional DNS subdomain prefix and `/`, then a
/// name of at most 63 characters of `[A-Za-z0-9-_.]` starting and ending alphanumeric.
pub fn is_valid_label_key(key: &str) -> bool {
    crate::names::is_qualified_name(key)
}

/// Whether `value` is a valid label value (empty, or like a label name).
pub fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || crate::names::is_label_value(value)
}

/// Whether a kubelet accepts `key` in `--node-labels`. Keys in the `kubernetes.io` or
/// `k8s.io` namespaces (or their subdomains) are refused unless they are one of the
/// well-known labels the kubelet sets itself or lie under `kubelet.kubernetes.io` or
/// `node.kubernetes.io` (e.g. `node-role.kubernetes.io/worker` is refused).
pub fn kubelet_may_set_label(key: &str) -> bool {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
    ];
    let Some((namespace, _)) = key.split_once('/') else {
        return true;
    };
    let under = |ns: &str, domain: &str| ns == domain || ns.ends_with(&format!(".{domain}"));
    let restricted = under(namespace, "kubernetes.io") || under(namespace, "k8s.io");
    !restricted
        || ALLOWED.contains(&key)
        || under(namespace, "kubelet.kubernetes.io")
        || under(namespace, "node.kubernetes.io")
}

/// Why a pool or claim may not set the node label `key`, if it may not: labels the
/// kubelet, the node controller or autonodes itself own. Of `node.kubernetes.io/*`, only
/// `exclude-from-external-load-balancers` and `exclude-disruption` (meant for
/// administrators) may be set.
pub fn reserved_label(key: &str) -> Option<&'static str> {
    const USER_NODE_LABELS: &[&str] = &[
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "node.kubernetes.io/exclude-disruption",
    ];
    let (namespace, _) = key.split_once('/').unwrap_or(("", key));
    let under = |domain: &str| namespace == domain || namespace.ends_with(&format!(".{domain}"));
    match key {
        "kubernetes.io/hostname" => Some("the kubelet sets it to the node's name"),
        PROP_OS | PROP_ARCH => {
            Some("the kubelet sets it; choose it with the property of the same name")
        }
        PROP_INSTANCE_TYPE | PROP_NODE_TYPE | PROP_NODE_TYPE_ALIAS | PROP_PROVIDER => {
            Some("autonodes sets it from the node type")
        }
        LABEL_NODECLAIM | LABEL_NODECLAIM_NAMESPACE | LABEL_NODECLAIM_UID | LABEL_NODEPOOL => {
            Some("autonodes sets it to name the node's claim")
        }
        crate::api::LABEL_INSTALLATION => {
            Some("autonodes sets it to the installation that made the node")
        }
        k if USER_NODE_LABELS.contains(&k) => None,
        _ if namespace == "beta.kubernetes.io" => Some("the kubelet sets it"),
        _ if under("node.kubernetes.io") => Some("the kubelet or the node controller owns it"),
        _ if namespace == "topology.kubernetes.io"
            || namespace == "failure-domain.beta.kubernetes.io" =>
        {
            Some("it describes the host; set it as a property of the provider or node type")
        }
        _ => None,
    }
}

/// A node label that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: label {key:?}={value:?}: {message}")]
pub struct LabelError {
    /// Where the label comes from, e.g. `spec.labels`.
    pub field: String,
    /// The label key.
    pub key: String,
    /// The label value.
    pub value: String,
    /// What is wrong.
    pub message: &'static str,
}

/// The labels of a node, split by who sets them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLabels {
    /// Labels the kubelet registers the node with (`--node-labels` in the join config).
    pub join: BTreeMap<String, String>,
    /// Labels the kubelet may not set (see [`kubelet_may_set_label`]); autonodes sets them
    /// on the Node after it joined.
    pub after_join: BTreeMap<String, String>,
}

impl NodeLabels {
    /// Every label of the node.
    pub fn all(&self) -> BTreeMap<String, String> {
        let mut all = self.join.clone();
        all.extend(self.after_join.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

/// The labels of a node: every property that is a valid label (key and value) and not a
/// configuration property ([`CONFIG_PROPERTIES`]), then the pool's `labels`, then the
/// claim's `labels`, then `identity` (the labels naming the node's claim). Invalid or
/// reserved ([`reserved_label`]) pool or claim labels are errors naming the field;
/// properties that are not valid labels are simply not labels.
pub fn node_labels(
    properties: &Properties,
    pool_labels: Option<&BTreeMap<String, String>>,
    claim_labels: &BTreeMap<String, String>,
    identity: &BTreeMap<String, String>,
) -> Result<NodeLabels, LabelError> {
    let mut all: BTreeMap<String, String> = properties
        .iter()
        .filter(|(k, v)| {
            !CONFIG_PROPERTIES.contains(&k.as_str())
                && is_valid_label_key(k)
                && is_valid_label_value(v)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (field, labels) in [
        ("NodePool spec.labels", pool_labels),
        ("spec.labels", Some(claim_labels)),
    ] {
        for (k, v) in labels.into_iter().flatten() {
            let error = |message| LabelError {
                field: field.to_string(),
                key: k.clone(),
                value: v.clone(),
                message,
            };
            if !is_valid_label_key(k) {
                return Err(error("not a valid label key"));
            }
            if !is_valid_label_value(v) {
                return Err(error("not a valid label value"));
            }
            if let Some(why) = reserved_label(k) {
                return Err(error(why));
            }
            all.insert(k.clone(), v.clone());
        }
    }
    all.extend(identity.iter().map(|(k, v)| (k.clone(), v.clone())));
    let (join, after_join) = all.into_iter().partition(|(k, _)| kubelet_may_set_label(k));
    Ok(NodeLabels { join, after_join })
}

/// Merges taint lists, keeping one taint per (key, effect): a later list's taint replaces
/// an earlier one's value in place (Kubernetes rejects duplicates).
pub fn merge_taints<'a>(lists: impl IntoIterator<Item = &'a [Taint]>) -> Vec<Taint> {
    let mut out: Vec<Taint> = Vec::new();
    for t in lists.into_iter().flatten() {
        match out
            .iter_mut()
            .find(|o| o.key == t.key && o.effect == t.effect)
        {
            Some(existing) => *existing = t.clone(),
            None => out.push(t.clone()),
        }
    }
    out
}

/// The registration taint, `autonodes.io/unregistered:NoExecute`.
pub fn registration_taint() -> Taint {
    Taint {
        key: REGISTRATION_TAINT_KEY.to_string(),
        effect: "NoExecute".to_string(),
        ..Taint::default()
    }
}

/// The taints of a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTaints {
    /// Taints the node keeps: the type's (spec and template), the pool's, the claim's.
    pub taints: Vec<Taint>,
    /// Startup taints (pool and claim): something else removes them once the node is ready.
    pub startup: Vec<Taint>,
}

impl NodeTaints {
    /// What the node registers with: `taints`, `startup` and the registration taint.
    pub fn registration(&self) -> Vec<Taint> {
        merge_taints([
            self.taints.as_slice(),
            self.startup.as_slice(),
            &[registration_taint()],
        ])
    }
}

/// A taint of a pool or claim that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TaintError {
    /// Where the taint is, e.g. `spec.startupTaints`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The taints of a node of type `t` for a claim (and its pool).
pub fn node_taints(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> Result<NodeTaints, TaintError> {
    let check = |field: &str, list: &[Taint]| -> Result<(), TaintError> {
        list.iter().try_for_each(|taint| {
            template::check_taint(taint).map_err(|message| TaintError {
                field: field.to_string(),
                message,
            })
        })
    };
    let empty: &[Taint] = &[];
    let (pool_taints, pool_startup) = pool.map_or((empty, empty), |p| {
        (p.taints.as_slice(), p.startup_taints.as_slice())
    });
    check("NodePool spec.taints", pool_taints)?;
    check("NodePool spec.startupTaints", pool_startup)?;
    check("spec.taints", &claim.taints)?;
    check("spec.startupTaints", &claim.startup_taints)?;
    Ok(NodeTaints {
        taints: merge_taints([t.taints.as_slice(), pool_taints, claim.taints.as_slice()]),
        startup: merge_taints([pool_startup, claim.startup_taints.as_slice()]),
    })
}

/// The kubelet arguments of a node: the pool's, then the claim's.
pub fn kubelet_args(
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaimSpec,
) -> BTreeMap<String, String> {
    let mut args = pool.map(|p| p.kubelet_args.clone()).unwrap_or_default();
    args.extend(
        claim
            .kubelet_args
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    args
}

/// Formats a type's resources for messages (`4 CPU, 16Gi`).
pub fn describe_resources(amounts: &ResourceAmounts) -> String {
    format!(
        "{} CPU, {}",
        resources::format_cpu(amounts.cpu_millis()),
        resources::format_memory(amounts.memory_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VClusterRef;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn example_provider(file: &str) -> NodeProvider {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("example exists");
        crate::yaml::from_str(&text).expect("example parses")
    }

    fn claim() -> NodeClaimSpec {
        NodeClaimSpec {
            provider_ref: None,
            type_ref: None,
            requirements: vec![],
            desired_capacity: ResourceList::new(),
            v_cluster_ref: VClusterRef {
                name: "tenant".into(),
            },
            properties: Properties::new(),
            taints: vec![],
            startup_taints: vec![],
            labels: BTreeMap::new(),
            kubelet_args: BTreeMap::new(),
            kubernetes_version: None,
        }
    }

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: op,
            values: values.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_string),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn ctx() -> ProviderContext {
        ProviderContext {
            name: "p".into(),
            properties: Properties::from([("zone".to_string(), "a".to_string())]),
            base_template: Some(json!({"spec": {"template": {"spec": {"domain": {
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}}}}})),
            host_cluster: "host".into(),
            vm_namespace: "vms".into(),
            tenant_namespaces: None,
        }
    }

    fn spec(resources: &[(&str, &str)]) -> NodeTypeSpec {
        NodeTypeSpec {
            provider_ref: "p".into(),
            display_name: None,
            resources: resources
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
            overhead: None,
            cost: None,
            max_capacity: None,
            properties: Properties::new(),
            taints: vec![],
            merge_virtual_machine_template: None,
            virtual_machine_template: None,
        }
    }

    fn prepared(short: &str, resources: &[(&str, &str)]) -> PreparedType {
        prepare_type(&format!("p.{short}"), &spec(resources), Some(&ctx()))
    }

    fn request(c: &NodeClaimSpec) -> ClaimRequest {
        ClaimRequest::new(c, None).expect("valid request")
    }

    #[test]
    fn the_definition_hash_follows_what_makes_the_vm_and_not_cost_or_capacity() {
        let base = prepare_type("p.a", &spec(&[("cpu", "2")]), Some(&ctx())).definition;
        assert_eq!(base.len(), 16);
        let hash =
            |s: &NodeTypeSpec, c: &ProviderContext| prepare_type("p.a", s, Some(c)).definition;
        let mut cheaper = spec(&[("cpu", "2")]);
        cheaper.cost = Some(1);
        cheaper.max_capacity = Some(3);
        assert_eq!(
            hash(&cheaper, &ctx()),
            base,
            "cost and capacity change no VM"
        );
        assert_ne!(hash(&spec(&[("cpu", "4")]), &ctx()), base, "resources");
        let mut user_data = spec(&[("cpu", "2")]);
        user_data
            .properties
            .insert("autonodes.io/user-data".into(), "#cloud-config\n".into());
        assert_ne!(hash(&user_data, &ctx()), base, "properties (user data)");
        let mut provider = ctx();
        provider.base_template = Some(json!({"spec": {"template": {"spec": {"domain": {
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}}}}}));
        assert_ne!(
            hash(&spec(&[("cpu", "2")]), &provider),
            base,
            "the provider's base template"
        );
    }

    #[test]
    fn a_type_admit_refuses_is_passed_over_for_the_next_and_all_refused_keeps_the_first_refusals_reason(
    ) {
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
        let no_standard = |t: &PreparedType| {
            if t.short_name == "standard-node" {
                Err(NoFit {
                    reason: REASON_QUOTA_EXCEEDED,
                    message: "NodeQuota q does not allow node type standard-node".to_string(),
                })
            } else {
                Ok(())
            }
        };
        let chosen =
            choose_within(&cat, &request(&claim()), &BTreeMap::new(), no_standard).expect("fits");
        assert_eq!(chosen.short_name, "high-memory-node");
        let e = choose_within(
            &cat,
            &request(&claim()),
            &BTreeMap::new(),
            |t: &PreparedType| {
                Err(NoFit {
                    reason: REASON_HOST_CAPACITY_EXHAUSTED,
                    message: format!("refused {}", t.short_name),
                })
            },
        )
        .expect_err("all refused");
        assert_eq!(
            e.reason, REASON_HOST_CAPACITY_EXHAUSTED,
            "the refusal's reason is kept"
        );
        assert_eq!(
            e.message,
            "refused standard-node (and 1 more fitting node type(s) refused)"
        );
    }

    #[test]
    fn advanced_example_types_cost_28_and_72_with_discovered_and_spec_resources() {
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
        let std = cat.get("standard-node").expect("standard");
        let high = cat
            .get("kubevirt-provider-advanced.high-memory-node")
            .expect("high");
        assert_eq!(std.cost, 28);
        assert_eq!(high.cost, 72);
        assert_eq!(std.resources["cpu"].0, "2");
        assert_eq!(std.resources["memory"].0, "4Gi");
        assert_eq!(high.resources["memory"].0, "16Gi");
        assert_eq!(
            cat.types()
                .iter()
                .map(|t| t.short_name.as_str())
                .collect::<Vec<_>>(),
            vec!["standard-node", "high-memory-node"],
            "cheapest first"
        );
        assert_eq!(
            high.taints,
            vec![taint("workload", Some("high-memory"), "NoSchedule")]
        );
    }

    #[test]
    fn reference_minimal_and_types_examples_prepare_without_problems() {
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-minimal.yaml"));
        let small = cat.get("small-ubuntu-vm").expect("small");
        assert!(small.is_usable());
        assert_eq!(small.cost, 14);
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-types.yaml"));
        for t in cat.types() {
            assert!(t.is_usable(), "{}: {:?}", t.name, t.problem);
        }
        assert_eq!(cat.get("mid-ubuntu-vm-2").map(|t| t.cost), Some(50)); // 4*10 + 5*2
        let replaced = cat
            .get("different-vm-with-different-template-2")
            .expect("type");
        assert_eq!(replaced.cost, 36); // 2*10 + 8*2
        assert_eq!(
            replaced.template["metadata"]["labels"],
            json!({"foo": "baz"})
        );
    }

    #[test]
    fn explicit_cost_wins_over_the_formula() {
        let mut s = spec(&[("cpu", "4"), ("memory", "16Gi")]);
        s.cost = Some(5);
        assert_eq!(prepare_type("p.t", &s, Some(&ctx())).cost, 5);
    }

    #[test]
    fn built_in_properties_are_set_and_only_os_arch_and_capacity_type_can_be_overridden() {
        let mut s = spec(&[]);
        s.properties = Properties::from([
            ("kubernetes.io/arch".to_string(), "arm64".to_string()),
            ("autonodes.io/node-type".to_string(), "fake".to_string()),
            ("zone".to_string(), "b".to_string()),
        ]);
        let t = prepare_type("p.small", &s, Some(&ctx()));
        let p = &t.properties;
        assert_eq!(p["autonodes.io/node-type"], "small");
        assert_eq!(p["vcluster.com/node-type"], "small");
        assert_eq!(p["autonodes.io/provider"], "p");
        assert_eq!(p["node.kubernetes.io/instance-type"], "p.small");
        assert_eq!(p["kubernetes.io/os"], "linux");
        assert_eq!(p["kubernetes.io/arch"], "arm64");
        assert_eq!(p["karpenter.sh/capacity-type"], "on-demand");
        assert_eq!(p["zone"], "b", "type over provider");
        let plain = prepared("plain", &[]);
        assert_eq!(plain.properties["kubernetes.io/arch"], "amd64");
        assert_eq!(plain.properties["zone"], "a");
    }

    #[test]
    fn a_type_offering_several_zones_fits_a_claim_for_either_and_its_node_gets_the_one_asked_for() {
        let mut s = spec(&[]);
        s.properties = Properties::from([
            ("topology.kubernetes.io/zone".to_string(), "a,b".to_string()),
            ("tier".to_string(), "*".to_string()),
        ]);
        let t = prepare_type("p.multi", &s, Some(&ctx()));
        let catalogue = Catalogue::new(vec![t]);
        let mut c = claim();
        c.requirements = vec![
            serde_json::from_value(
                serde_json::json!({"property": "topology.kubernetes.io/zone", "value": "b"}),
            )
            .expect("requirement"),
            serde_json::from_value(
                serde_json::json!({"property": "tier", "operator": "In", "values": ["gold"]}),
            )
            .expect("requirement"),
        ];
        let req = ClaimRequest::new(&c, None).expect("valid");
        let chosen = choose(&catalogue, &req, &BTreeMap::new()).expect("fits");
        let p = node_properties(chosen, None, &c);
        assert_eq!(p["topology.kubernetes.io/zone"], "b");
        assert_eq!(p["tier"], "gold");
        // Nothing asked: the first of several, and `*` stays (no label value: no label).
        let p = node_properties(chosen, None, &claim());
        assert_eq!(p["topology.kubernetes.io/zone"], "a");
        assert_eq!(p["tier"], "*");
        // A zone the type does not offer does not fit.
        c.requirements = vec![serde_json::from_value(
            serde_json::json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["c"]}),
        )
        .expect("requirement")];
        let req = ClaimRequest::new(&c, None).expect("valid");
        assert!(choose(&catalogue, &req, &BTreeMap::new()).is_err());
    }

    #[test]
    fn node_properties_go_provider_then_type_then_pool_then_claim() {
        let mut s = spec(&[]);
        s.properties = Properties::from([
            ("a".to_string(), "type".to_string()),
            ("b".to_string(), "type".to_string()),
        ]);
        let t = prepare_type("p.t", &s, Some(&ctx()));
        let pool = NodePoolSpec {
            v_cluster_ref: VClusterRef { name: "x".into() },
            provider_ref: None,
            requirements: vec![],
            properties: Properties::from([
                ("b".to_string(), "pool".to_string()),
                ("c".to_string(), "pool".to_string()),
            ]),
            taints: vec![],
            startup_taints: vec![],
            labels: BTreeMap::new(),
            kubelet_args: BTreeMap::new(),
            replicas: None,
            limits: None,
            disruption: None,
            termination_grace_period: None,
            expire_after: None,
            weight: None,
            autoscaling: None,
        };
        let mut c = claim();
        c.properties = Properties::from([
            ("c".to_string(), "claim".to_string()),
            ("autonodes.io/provider".to_string(), "evil".to_string()),
        ]);
        let p = node_properties(&t, Some(&pool), &c);
        assert_eq!(p["zone"], "a");
        assert_eq!(p["a"], "type");
        assert_eq!(p["b"], "pool");
        assert_eq!(p["c"], "claim");
        assert_eq!(
            p["autonodes.io/provider"], "p",
            "identity cannot be overridden"
        );
    }

    #[test]
    fn in_notin_exists_and_does_not_exist_match_properties() {
        let props = Properties::from([("zone".to_string(), "a".to_string())]);
        let check = |r: Requirement| {
            CheckedRequirement::new(&r, "f")
                .expect("valid")
                .matches(&props)
                .is_ok()
        };
        assert!(check(req("zone", Operator::In, &["a", "b"])));
        assert!(!check(req("zone", Operator::In, &["b"])));
        assert!(!check(req("missing", Operator::In, &["a"])));
        assert!(check(req("zone", Operator::NotIn, &["b"])));
        assert!(!check(req("zone", Operator::NotIn, &["a"])));
        assert!(check(req("missing", Operator::NotIn, &["a"])));
        assert!(check(req("zone", Operator::Exists, &[])));
        assert!(!check(req("missing", Operator::Exists, &[])));
        assert!(check(req("missing", Operator::DoesNotExist, &[])));
        assert!(!check(req("zone", Operator::DoesNotExist, &[])));
        assert!(
            check(req("missing", Operator::NotExists, &[])),
            "NotExists is DoesNotExist"
        );
        assert!(!check(req("zone", Operator::NotExists, &[])));
    }

    #[test]
    fn gt_and_lt_compare_integers() {
        let props = Properties::from([
            ("cores".to_string(), "8".to_string()),
            ("name".to_string(), "big".to_string()),
        ]);
        let m = |r: Requirement| {
            CheckedRequirement::new(&r, "f")
                .expect("valid")
                .matches(&props)
        };
        assert!(m(req("cores", Operator::Gt, &["4"])).is_ok());
        assert!(m(req("cores", Operator::Gt, &["8"])).is_err());
        assert!(m(req("cores", Operator::Lt, &["10"])).is_ok());
        assert!(m(req("cores", Operator::Lt, &["-1"])).is_err());
        // 10 > 9 numerically even though "10" < "9" as strings.
        let props10 = Properties::from([("cores".to_string(), "10".to_string())]);
        assert!(
            CheckedRequirement::new(&req("cores", Operator::Gt, &["9"]), "f")
                .expect("valid")
                .matches(&props10)
                .is_ok()
        );
        assert_eq!(
            m(req("name", Operator::Gt, &["1"])),
            Err(RequirementMiss::NotAnInteger {
                actual: "big".into()
            })
        );
        assert_eq!(
            m(req("absent", Operator::Lt, &["1"])),
            Err(RequirementMiss::NotMet { actual: None })
        );
    }

    #[test]
    fn a_non_integer_gt_value_is_an_error_naming_the_field() {
        let e = CheckedRequirement::new(
            &req("cores", Operator::Gt, &["four"]),
            "spec.requirements[1]",
        )
        .expect_err("invalid");
        assert_eq!(
            e.to_string(),
            "spec.requirements[1]: requirement on cores: Gt needs an integer value, got \"four\""
        );
        assert!(CheckedRequirement::new(&req("cores", Operator::Lt, &["1", "2"]), "f").is_err());
        assert!(CheckedRequirement::new(&req("cores", Operator::Lt, &[]), "f").is_err());
        assert!(CheckedRequirement::new(&req("zone", Operator::In, &[]), "f").is_err());
        assert!(CheckedRequirement::new(&req("zone", Operator::Exists, &["x"]), "f").is_err());
        let mut c = claim();
        c.requirements = vec![
            req("a", Operator::Exists, &[]),
            req("cores", Operator::Gt, &["x"]),
        ];
        let e = ClaimRequest::new(&c, None).expect_err("invalid");
        assert!(e.to_string().starts_with("spec.requirements[1]:"), "{e}");
    }

    #[test]
    fn the_cheapest_fitting_type_wins_and_ties_go_by_name() {
        let cat = Catalogue::new(vec![
            prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
            prepared("b-small", &[("cpu", "2"), ("memory", "4Gi")]),
            prepared("a-small", &[("cpu", "2"), ("memory", "4Gi")]),
        ]);
        let chosen = choose(&cat, &request(&claim()), &BTreeMap::new()).expect("fits");
        assert_eq!(chosen.name, "p.a-small");
        let mut c = claim();
        c.desired_capacity = ResourceList::from([("memory".to_string(), Quantity("8Gi".into()))]);
        assert_eq!(
            choose(&cat, &request(&c), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.large"
        );
    }

    #[test]
    fn a_full_type_is_skipped_for_the_next_cheapest() {
        let mut small = prepared("small", &[("cpu", "2"), ("memory", "4Gi")]);
        small.max_capacity = Some(2);
        let cat = Catalogue::new(vec![
            small,
            prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
        ]);
        let claimed = BTreeMap::from([("p.small".to_string(), 2)]);
        assert_eq!(
            choose(&cat, &request(&claim()), &claimed)
                .expect("fits")
                .name,
            "p.large"
        );
        let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
        assert_eq!(
            choose(&cat, &request(&claim()), &claimed)
                .expect("fits")
                .name,
            "p.small"
        );
    }

    #[test]
    fn all_fitting_types_full_is_insufficient_capacity() {
        let mut small = prepared("small", &[("cpu", "2"), ("memory", "4Gi")]);
        small.max_capacity = Some(1);
        let cat = Catalogue::new(vec![small]);
        let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
        let e = choose(&cat, &request(&claim()), &claimed).expect_err("full");
        assert_eq!(e.reason, "InsufficientCapacity");
        assert!(e.message.contains("p.small (1/1 claimed)"), "{}", e.message);
    }

    #[test]
    fn no_fit_names_the_failed_requirement_of_the_nearest_type() {
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
        let mut c = claim();
        c.requirements = vec![
            req(
                "autonodes.io/node-type",
                Operator::In,
                &["high-memory-node"],
            ),
            req("topology.kubernetes.io/zone", Operator::In, &["eu-1"]),
        ];
        let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("no fit");
        assert_eq!(e.reason, "NoMatchingNodeType");
        assert_eq!(
            e.message,
            "none of 2 node type(s) fits; nearest is kubevirt-provider-advanced.high-memory-node: \
             requirement `topology.kubernetes.io/zone In [eu-1]` not met (the type has no such property)"
        );
        let mut c = claim();
        c.desired_capacity = ResourceList::from([("memory".to_string(), Quantity("32Gi".into()))]);
        let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("no fit");
        assert!(
            e.message
                .contains("desiredCapacity not covered: memory 32Gi wanted, 4Gi available"),
            "{}",
            e.message
        );
    }

    #[test]
    fn extended_resources_are_chosen_only_when_requested() {
        let cat = Catalogue::new(vec![
            prepared(
                "gpu",
                &[("cpu", "1"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")],
            ),
            prepared("cpu-only", &[("cpu", "16"), ("memory", "64Gi")]),
        ]);
        let gpu_only = Catalogue::new(vec![cat.get("gpu").cloned().expect("gpu")]);
        let e =
            choose(&gpu_only, &request(&claim()), &BTreeMap::new()).expect_err("unrequested gpu");
        assert!(
            e.message
                .contains("nvidia.com/gpu, which the claim does not request"),
            "{}",
            e.message
        );
        let mut c = claim();
        c.desired_capacity =
            ResourceList::from([("nvidia.com/gpu".to_string(), Quantity("1".into()))]);
        assert_eq!(
            choose(&cat, &request(&c), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.gpu"
        );
        // Naming the type explicitly also requests it.
        let mut c = claim();
        c.requirements = vec![req("autonodes.io/node-type", Operator::In, &["gpu"])];
        assert_eq!(
            choose(&cat, &request(&c), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.gpu"
        );
        let mut c = claim();
        c.type_ref = Some("p.gpu".into());
        assert_eq!(
            choose(&cat, &request(&c), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.gpu"
        );
        // Without a request, the cpu-only type is chosen although it costs more per cpu.
        assert_eq!(
            choose(&cat, &request(&claim()), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.cpu-only"
        );
    }

    #[test]
    fn type_ref_and_provider_ref_restrict_the_candidates() {
        let cat = Catalogue::new(vec![
            prepared("small", &[("cpu", "2"), ("memory", "4Gi")]),
            prepared("large", &[("cpu", "8"), ("memory", "32Gi")]),
        ]);
        let mut c = claim();
        c.type_ref = Some("large".into());
        assert_eq!(
            choose(&cat, &request(&c), &BTreeMap::new())
                .expect("fits")
                .name,
            "p.large"
        );
        c.type_ref = Some("p.missing".into());
        let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("missing");
        assert_eq!(e.message, "node type p.missing does not exist");
        let mut c = claim();
        c.provider_ref = Some("other".into());
        let e = choose(&cat, &request(&c), &BTreeMap::new()).expect_err("other provider");
        assert_eq!(e.reason, "NoMatchingNodeType");
        assert_eq!(e.message, "provider other offers no node types");
    }

    #[test]
    fn failed_types_are_never_chosen_and_explain_themselves_when_nearest() {
        let mut s = spec(&[]);
        s.merge_virtual_machine_template = Some(json!({}));
        s.virtual_machine_template = Some(json!({}));
        let both = prepare_type("p.both", &s, Some(&ctx()));
        assert_eq!(both.phase(0), NodeTypePhase::Failed);
        assert_eq!(
            both.problem.as_ref().map(TypeProblem::reason),
            Some("InvalidTemplate")
        );
        let cat = Catalogue::new(vec![both]);
        let e = choose(&cat, &request(&claim()), &BTreeMap::new()).expect_err("failed");
        assert!(e.message.contains("mutually exclusive"), "{}", e.message);
        assert!(e.message.contains("p.both"), "{}", e.message);
    }

    #[test]
    fn a_template_kubevirt_would_refuse_fails_its_type_and_claims_go_to_a_valid_sibling() {
        let mut both = spec(&[("cpu", "1"), ("memory", "1Gi")]);
        both.merge_virtual_machine_template =
            Some(json!({"spec": {"running": true, "runStrategy": "Always"}}));
        let both = prepare_type("p.cheap-but-broken", &both, Some(&ctx()));
        assert_eq!(both.phase(0), NodeTypePhase::Failed);
        assert_eq!(
            both.problem.as_ref().map(TypeProblem::reason),
            Some("InvalidTemplate")
        );
        assert!(both
            .problem
            .as_ref()
            .is_some_and(|p| p.to_string().contains("runStrategy")));
        // A data volume whose name cannot fit beside the longest VM name fails too.
        let mut long_dv = spec(&[]);
        long_dv.merge_virtual_machine_template = Some(json!({"spec": {"dataVolumeTemplates": [
            {"metadata": {"name": "d".repeat(200)}}]}}));
        let long_dv = prepare_type("p.long-dv", &long_dv, Some(&ctx()));
        assert_eq!(long_dv.phase(0), NodeTypePhase::Failed);
        let cat = Catalogue::new(vec![both, long_dv, prepared("valid", &[("cpu", "8")])]);
        let chosen = choose(&cat, &request(&claim()), &BTreeMap::new()).expect("a valid type");
        assert_eq!(chosen.name, "p.valid");
    }

    #[test]
    fn a_type_whose_memory_cannot_be_found_is_failed_with_that_reason() {
        let mut c = ctx();
        c.base_template =
            Some(json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}}));
        let t = prepare_type("p.nomem", &spec(&[]), Some(&c));
        assert_eq!(t.phase(0), NodeTypePhase::Failed);
        assert_eq!(
            t.problem.as_ref().map(TypeProblem::reason),
            Some("MemoryNotFound")
        );
        let status = t.status(0);
        assert_eq!(status.phase, Some(NodeTypePhase::Failed));
        assert_eq!(status.cost, None);
    }

    #[test]
    fn a_type_whose_provider_is_missing_is_failed() {
        let t = prepare_type("p.orphan", &spec(&[]), None);
        assert_eq!(
            t.problem.as_ref().map(TypeProblem::reason),
            Some("ProviderNotFound")
        );
        assert!(t
            .problem
            .as_ref()
            .is_some_and(|p| p.to_string().contains("NodeProvider p not found")));
    }

    #[test]
    fn capacity_reports_total_claimed_and_available_and_absent_when_unlimited() {
        assert_eq!(
            capacity(Some(5), 2),
            NodeTypeCapacity {
                total: Some(5),
                claimed: 2,
                available: Some(3)
            }
        );
        assert_eq!(
            capacity(Some(1), 3),
            NodeTypeCapacity {
                total: Some(1),
                claimed: 3,
                available: Some(0)
            }
        );
        assert_eq!(
            capacity(None, 7),
            NodeTypeCapacity {
                total: None,
                claimed: 7,
                available: None
            }
        );
        let mut t = prepared("t", &[]);
        t.max_capacity = Some(1);
        assert_eq!(t.phase(0), NodeTypePhase::Available);
        assert_eq!(t.phase(1), NodeTypePhase::Exhausted);
    }

    #[test]
    fn claims_hold_capacity_from_scheduling_until_failed_or_released_and_reservations_count_once() {
        let mk = |uid: &str, t: Option<&str>, phase: Option<crate::api::NodeClaimPhase>| {
            let mut c = NodeClaim::new("c", claim());
            c.metadata.uid = Some(uid.to_string());
            c.status = Some(crate::api::NodeClaimStatus {
                type_ref: t.map(str::to_string),
                phase,
                ..Default::default()
            });
            c
        };
        let claims = [
            mk("1", Some("p.a"), None),
            mk(
                "2",
                Some("p.a"),
                Some(crate::api::NodeClaimPhase::Terminating),
            ),
            mk("3", Some("p.b"), None),
            mk("4", None, None),
            mk("5", Some("p.b"), Some(crate::api::NodeClaimPhase::Failed)),
            mk("6", Some("p.b"), None),
        ];
        let reserved = HashMap::from([
            ("1".to_string(), "p.a".to_string()),
            ("4".to_string(), "p.c".to_string()),
        ]);
        let released = HashSet::from(["6".to_string()]);
        let counts = count_claimed(claims.iter(), &reserved, &released);
        assert_eq!(
            counts,
            BTreeMap::from([
                ("p.a".to_string(), 2),
                ("p.b".to_string(), 1),
                ("p.c".to_string(), 1)
            ])
        );
    }

    #[test]
    fn status_lists_properties_as_in_requirements() {
        let t = prepared("t", &[]);
        let s = t.status(0);
        assert_eq!(s.cost, Some(28));
        let r = s
            .requirements
            .iter()
            .find(|r| r.key == "autonodes.io/node-type")
            .expect("present");
        assert_eq!(r.operator, "In");
        assert_eq!(r.values, Some(vec!["t".to_string()]));
    }

    #[test]
    fn kubelet_restricted_labels_are_set_after_join() {
        assert!(kubelet_may_set_label("workload"));
        assert!(kubelet_may_set_label("autonodes.io/node-type"));
        assert!(kubelet_may_set_label("kubernetes.io/arch"));
        assert!(kubelet_may_set_label("node.kubernetes.io/instance-type"));
        assert!(kubelet_may_set_label("node.kubernetes.io/anything"));
        assert!(kubelet_may_set_label("x.kubelet.kubernetes.io/y"));
        assert!(kubelet_may_set_label("topology.kubernetes.io/zone"));
        assert!(!kubelet_may_set_label("node-role.kubernetes.io/worker"));
        assert!(!kubelet_may_set_label("kubernetes.io/role"));
        assert!(!kubelet_may_set_label("example.k8s.io/x"));
        assert!(!kubelet_may_set_label("k8s.io/x"));
        assert!(kubelet_may_set_label("notk8s.io/x"));

        let props = Properties::from([
            ("node-role.kubernetes.io/worker".to_string(), "".to_string()),
            ("autonodes.io/node-type".to_string(), "small".to_string()),
            ("autonodes.io/user-data".to_string(), "x".to_string()),
            ("display".to_string(), "has spaces".to_string()),
        ]);
        let labels = node_labels(
            &props,
            None,
            &BTreeMap::from([("team".to_string(), "a".to_string())]),
            &BTreeMap::new(),
        )
        .expect("valid");
        assert_eq!(
            labels.join,
            BTreeMap::from([
                ("autonodes.io/node-type".to_string(), "small".to_string()),
                ("team".to_string(), "a".to_string()),
            ])
        );
        assert_eq!(
            labels.after_join,
            BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), "".to_string())])
        );
        assert_eq!(labels.all().len(), 3);
    }

    #[test]
    fn labels_the_kubelet_the_node_controller_or_autonodes_own_are_refused() {
        for key in [
            "kubernetes.io/hostname",
            "kubernetes.io/arch",
            "beta.kubernetes.io/instance-type",
            "node.kubernetes.io/instance-type",
            "node.kubernetes.io/windows-build",
            "topology.kubernetes.io/zone",
            "autonodes.io/node-type",
            "autonodes.io/nodeclaim",
        ] {
            let e = node_labels(
                &Properties::new(),
                None,
                &BTreeMap::from([(key.to_string(), "evil".to_string())]),
                &BTreeMap::new(),
            )
            .expect_err(key);
            assert_eq!(e.field, "spec.labels");
            assert_eq!(e.key, key);
        }
        for key in [
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "node-role.kubernetes.io/worker",
            "team",
            "example.com/tier",
        ] {
            assert_eq!(reserved_label(key), None, "{key}");
        }
        // autonodes' own identity labels come last and are not refused.
        let labels = node_labels(
            &Properties::new(),
            None,
            &BTreeMap::new(),
            &BTreeMap::from([("autonodes.io/nodeclaim".to_string(), "c".to_string())]),
        )
        .expect("identity");
        assert_eq!(labels.join["autonodes.io/nodeclaim"], "c");
    }

    #[test]
    fn invalid_claim_labels_are_errors_naming_the_field() {
        let e = node_labels(
            &Properties::new(),
            None,
            &BTreeMap::from([("bad key".to_string(), "v".to_string())]),
            &BTreeMap::new(),
        )
        .expect_err("invalid");
        assert_eq!(
            e.to_string(),
            "spec.labels: label \"bad key\"=\"v\": not a valid label key"
        );
        let e = node_labels(
            &Properties::new(),
            None,
            &BTreeMap::from([("k".to_string(), "a,b".to_string())]),
            &BTreeMap::new(),
        )
        .expect_err("invalid");
        assert!(e.to_string().contains("not a valid label value"));
    }

    #[test]
    fn label_keys_and_values_follow_kubernetes_syntax() {
        assert!(is_valid_label_key("a"));
        assert!(is_valid_label_key("example.com/My_Label.1"));
        assert!(!is_valid_label_key("Example.com/x"));
        assert!(!is_valid_label_key("/x"));
        assert!(!is_valid_label_key("a/b/c"));
        assert!(!is_valid_label_key(&"a".repeat(64)));
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("v1.2_3-x"));
        assert!(!is_valid_label_value("-x"));
        assert!(!is_valid_label_value("a b"));
        assert!(!is_valid_label_value("ä"));
    }

    #[test]
    fn node_taints_merge_type_pool_and_claim_and_register_with_startup_and_unregistered() {
        let cat = Catalogue::from_provider(&example_provider("nodeprovider-advanced.yaml"));
        let high = cat.get("high-memory-node").expect("type");
        let mut c = claim();
        c.taints = vec![
            taint("dedicated", Some("db"), "NoSchedule"),
            taint("workload", Some("other"), "NoSchedule"),
        ];
        c.startup_taints = vec![taint("cni-not-ready", None, "NoSchedule")];
        let t = node_taints(high, None, &c).expect("valid");
        assert_eq!(
            t.taints,
            vec![
                taint("workload", Some("other"), "NoSchedule"),
                taint("dedicated", Some("db"), "NoSchedule")
            ]
        );
        let reg = t.registration();
        assert_eq!(reg.len(), 4);
        assert_eq!(
            reg[3],
            taint("autonodes.io/unregistered", None, "NoExecute")
        );
        c.taints = vec![taint("x", None, "Never")];
        let e = node_taints(high, None, &c).expect_err("bad effect");
        assert!(e.to_string().starts_with("spec.taints:"), "{e}");
    }

    #[test]
    fn generated_node_types_are_named_labelled_and_owned() {
        let mut p = example_provider("nodeprovider-advanced.yaml");
        p.metadata.uid = Some("uid-9".into());
        let types = node_types_from_provider(&p);
        assert_eq!(types.len(), 2);
        let t = &types[1];
        assert_eq!(
            t.metadata.name.as_deref(),
            Some("kubevirt-provider-advanced.high-memory-node")
        );
        assert_eq!(
            t.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("autonodes.io/provider"))
                .map(String::as_str),
            Some("kubevirt-provider-advanced")
        );
        let owner = &t.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("NodeProvider", "uid-9", Some(true))
        );
        assert_eq!(t.spec.max_capacity, Some(5));
        assert_eq!(
            short_type_name(
                "kubevirt-provider-advanced.high-memory-node",
                "kubevirt-provider-advanced"
            ),
            "high-memory-node"
        );
        assert_eq!(short_type_name("custom", "p"), "custom");
    }
}
