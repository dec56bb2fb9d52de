//! The catalogue: NodeTypes (and their providers) prepared once into [`PreparedType`]s —
//! template composed, resources, cost, capacity, problems — and collected in a
//! [`Catalogue`], cheapest first. Pure code, no I/O.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use serde_json::Value;

use crate::properties::{
    PROP_ARCH, PROP_CAPACITY_TYPE, PROP_IMAGE_URL, PROP_INSTANCE_TYPE, PROP_NODE_TYPE,
    PROP_NODE_TYPE_ALIAS, PROP_OS, PROP_PROVIDER, PROP_ROOT_DISK_SIZE,
};
use crate::requirements::{self};
use crate::resources::{ResourceAmounts, ResourceError};
use crate::template::error::TemplateError;
use crate::template::{self, TypeTemplateInput};
use autonodes_api::reasons::TypeReason;
use autonodes_api::{
    NodeClaim, NodeProvider, NodeType, NodeTypeCapacity, NodeTypePhase, NodeTypeSpec, Properties,
    ResourceList, LABEL_PROVIDER,
};

/// The NodeType name of a provider entry: `<provider>.<type>`.
pub fn node_type_name(provider: &str, short_name: &str) -> String {
    format!("{provider}.{short_name}")
}

/// The short name of a NodeType: its name without the `<provider>.` prefix (or the whole
/// name when it does not have that prefix, e.g. a NodeType created by hand).
pub(crate) fn short_type_name<'a>(node_type: &'a str, provider: &str) -> &'a str {
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
    /// `vmNamespacePerTenant`: VMs go to a host namespace per tenant namespace (`None`: all
    /// to `vm_namespace`).
    pub per_tenant: Option<PerTenantNamespaces>,
}

/// A provider's host namespace per tenant namespace, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerTenantNamespaces {
    /// The prefix (`clusterRef.namespace` and a dash by default).
    pub prefix: String,
    /// Whether autonodes creates (and deletes) the namespaces; else they must exist.
    pub create: bool,
}

impl PerTenantNamespaces {
    /// The host namespace of tenant namespace `tenant`.
    pub fn namespace_of(&self, tenant: &str) -> String {
        crate::names::tenant_vm_namespace(&self.prefix, tenant)
    }
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
            per_tenant: spec.kube_virt.vm_namespace_per_tenant.as_ref().map(|p| {
                PerTenantNamespaces {
                    prefix: p
                        .prefix
                        .clone()
                        .unwrap_or_else(|| format!("{}-", spec.kube_virt.cluster_ref.namespace)),
                    create: p.policy != Some(autonodes_api::NamespacePolicy::Existing),
                }
            }),
        }
    }

    /// The provider `name` of the unit tests: host `h`, VM namespace `vms`, an empty VM
    /// template, no properties, open to every tenant namespace.
    #[cfg(test)]
    pub(crate) fn for_tests(name: &str) -> Self {
        Self {
            name: name.into(),
            properties: Properties::new(),
            base_template: Some(serde_json::json!({"spec": {"template": {"spec": {}}}})),
            host_cluster: "h".into(),
            vm_namespace: "vms".into(),
            tenant_namespaces: None,
            per_tenant: None,
        }
    }
}

/// The NodeType objects a NodeProvider's entries become: named `<provider>.<type>`,
/// labelled `autonodes.io/provider` plus the entry's `metadata.labels`, annotated with its
/// `metadata.annotations`, and owned by the provider when it has a UID.
pub fn node_types_from_provider(provider: &NodeProvider) -> Vec<NodeType> {
    let provider_name = provider.metadata.name.clone().unwrap_or_default();
    let owner = provider.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: format!("{}/{}", autonodes_api::GROUP, autonodes_api::VERSION),
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
                    warm: entry.warm.clone(),
                    address_pool: entry
                        .address_pool
                        .clone()
                        .or_else(|| provider.spec.kube_virt.address_pool.clone()),
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
    /// The type's `addressPool` cannot be used.
    #[error("node type {node_type}: {message}")]
    AddressPool {
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
    /// The NodeType condition reason for the problem.
    pub fn reason(&self) -> TypeReason {
        match self {
            TypeProblem::ProviderNotFound { .. } => TypeReason::ProviderNotFound,
            TypeProblem::ProviderNotReady { .. } => TypeReason::ProviderNotReady,
            TypeProblem::Template(TemplateError::MemoryNotFound { .. }) => {
                TypeReason::MemoryNotFound
            }
            TypeProblem::Template(_) => TypeReason::InvalidTemplate,
            TypeProblem::Resources { .. } => TypeReason::InvalidResources,
            TypeProblem::Taints { .. } => TypeReason::InvalidTaints,
            TypeProblem::Instancetype { .. } => TypeReason::InstancetypeUnavailable,
            TypeProblem::AddressPool { .. } => TypeReason::InvalidAddressPool,
        }
    }
}

/// A node type ready for scheduling and rendering: properties merged, resources
/// discovered, cost computed, template composed (the steps of VM composition that depend
/// on the type alone, [`crate::template`]).
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
    /// Namespace of the VMs on the host cluster (empty when the provider is missing); with
    /// `per_tenant`, the provider's own (its golden volumes and warm VMs).
    pub vm_namespace: String,
    /// The provider's host namespace per tenant namespace, if it places VMs so.
    pub per_tenant: Option<PerTenantNamespaces>,
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
    /// `spec.warm.replicas` (0 when absent), at most [`autonodes_api::MAX_WARM_REPLICAS`].
    pub warm_replicas: i64,
    /// The static addresses the type's claims get (`spec.addressPool`), if it has them.
    pub address_pool: Option<crate::address_pool::PreparedAddressPool>,
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
    let mut described = described;
    // Only a provider placing VMs per tenant has that in its types' hash: the others keep
    // the hash they had before.
    if let (Some(p), Some(map)) = (
        provider.and_then(|p| p.per_tenant.as_ref()),
        described.as_object_mut(),
    ) {
        map.insert("perTenant".into(), serde_json::json!([p.prefix, p.create]));
    }
    // Only a type with an address pool has it in its hash: types without one keep the hash
    // they had before address pools existed.
    if let (Some(pool), Some(map)) = (&spec.address_pool, described.as_object_mut()) {
        map.insert("addressPool".into(), serde_json::json!(pool));
    }
    let digest = Sha256::digest(described.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The built-in properties of a type whose values cannot be overridden.
pub(crate) fn identity_properties(
    name: &str,
    short: &str,
    provider: &str,
) -> [(&'static str, String); 4] {
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
pub(crate) fn type_properties(
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
        per_tenant: provider.and_then(|p| p.per_tenant.clone()),
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
        warm_replicas: spec.warm.as_ref().map_or(0, |w| {
            i64::from(w.replicas.clamp(0, autonodes_api::MAX_WARM_REPLICAS))
        }),
        address_pool: None,
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
    if let Some(pool) = &spec.address_pool {
        let pool = crate::address_pool::PreparedAddressPool::new(pool).map_err(|message| {
            TypeProblem::AddressPool {
                node_type: t.name.clone(),
                message,
            }
        })?;
        t.address_pool = Some(pool);
    }
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
    if t.address_pool.is_some() && template::first_interface(&composed.template).is_none() {
        return Err(TypeProblem::AddressPool {
            node_type: t.name.clone(),
            message: "addressPool needs the VM template to name the network interface the address goes to (spec.template.spec.domain.devices.interfaces[0], on a bridge or Multus network that carries the subnet)".to_string(),
        });
    }
    let golden = template::golden::wanted(
        t.properties
            .get(crate::properties::PROP_GOLDEN_IMAGE)
            .map(String::as_str),
    )
    .map_err(|message| {
        TemplateError::property(&t.name, crate::properties::PROP_GOLDEN_IMAGE, message)
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
        .get(crate::properties::PROP_INSTANCETYPE)
        .map(|v| it::parse_instancetype(v))
        .transpose()
        .map_err(|m| bad(crate::properties::PROP_INSTANCETYPE, m))?;
    let preference = properties
        .get(crate::properties::PROP_PREFERENCE)
        .map(|v| it::parse_preference(v))
        .transpose()
        .map_err(|m| bad(crate::properties::PROP_PREFERENCE, m))?;
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
            prop(crate::properties::PROP_ROOT_DISK_STORAGE_CLASS),
            node_type,
        )?;
    }
    if let Some(value) = prop(crate::properties::PROP_DATA_DISKS) {
        let data = disks::parse_data_disks(value)
            .map_err(|m| bad(crate::properties::PROP_DATA_DISKS, m))?;
        disks::add_data_disks(template, &data, node_type)?;
    }
    let default_network = prop(crate::properties::PROP_DEFAULT_NETWORK)
        .map(networks::parse_default_network)
        .transpose()
        .map_err(|m| bad(crate::properties::PROP_DEFAULT_NETWORK, m))?;
    let secondary = prop(crate::properties::PROP_NETWORKS)
        .map(networks::parse_networks)
        .transpose()
        .map_err(|m| bad(crate::properties::PROP_NETWORKS, m))?
        .unwrap_or_default();
    networks::add_networks(template, default_network.as_deref(), &secondary, node_type)?;
    // Placement is written per claim (its group depends on the claim); checked here so a
    // type whose presets cannot be used is Failed rather than failing each claim.
    template::placement::parse_placement(properties).map_err(|(property, m)| bad(property, m))?;
    crate::properties::host_overhead(properties)
        .map_err(|m| bad(crate::properties::PROP_HOST_OVERHEAD, m))?;
    Ok(())
}

impl PreparedType {
    /// The host namespace the VM of a claim of tenant namespace `tenant` goes to.
    pub fn vm_namespace_for(&self, tenant: &str) -> String {
        match &self.per_tenant {
            Some(p) => p.namespace_of(tenant),
            None => self.vm_namespace.clone(),
        }
    }

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
    pub fn status(&self, claimed: i64) -> autonodes_api::NodeTypeStatus {
        autonodes_api::NodeTypeStatus {
            phase: Some(self.phase(claimed)),
            observed_generation: None,
            cost: self.is_usable().then_some(self.cost),
            capacity: Some(self.capacity(claimed)),
            resources: self.resources.clone(),
            requirements: self.requirements(),
            definition_hash: Some(self.definition.clone()),
            host: None,
            warm: None,
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
        if s.and_then(|s| s.phase) == Some(autonodes_api::NodeClaimPhase::Failed)
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

/// Merges taint lists, keeping one taint per (key, effect): a later list's taint replaces
/// an earlier one's value in place (Kubernetes rejects duplicates).
pub(crate) fn merge_taints<'a>(lists: impl IntoIterator<Item = &'a [Taint]>) -> Vec<Taint> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(
        provider_pool: Option<&str>,
        type_pool: Option<&str>,
    ) -> autonodes_api::NodeProvider {
        provider_with_interface(provider_pool, type_pool, true)
    }

    fn provider_with_interface(
        provider_pool: Option<&str>,
        type_pool: Option<&str>,
        interface: bool,
    ) -> autonodes_api::NodeProvider {
        let interfaces = if interface {
            serde_json::json!([{"name": "nodes", "bridge": {}}])
        } else {
            serde_json::json!([])
        };
        let pool = |cidr: Option<&str>| {
            cidr.map(|c| serde_json::json!({"cidr": c, "gateway": "10.1.0.1"}))
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeProvider",
            "metadata": {"name": "p", "uid": "pu"},
            "spec": {"kubeVirt": {
                "clusterRef": {"cluster": "h", "namespace": "vms"},
                "addressPool": pool(provider_pool),
                "virtualMachineTemplate": {"spec": {"template": {"spec": {
                    "domain": {
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        "devices": {"interfaces": interfaces},
                    },
                    "networks": [{"name": "nodes", "multus": {"networkName": "nodes"}}],
                }}}},
                "nodeTypes": [
                    {"name": "own", "addressPool": pool(type_pool)},
                    {"name": "inherits"},
                ],
            }},
        }))
        .unwrap()
    }

    #[test]
    fn a_provider_with_a_namespace_per_tenant_sends_each_tenant_s_vms_to_its_own_and_only_its_hash_changes(
    ) {
        let plain = provider(None, None);
        let mut split = plain.clone();
        split.spec.kube_virt.vm_namespace_per_tenant = Some(autonodes_api::VmNamespacePerTenant {
            prefix: None,
            policy: Some(autonodes_api::NamespacePolicy::Existing),
        });
        let c = Catalogue::from_provider(&plain);
        let t = &c.types()[0];
        assert_eq!(t.vm_namespace_for("team-a"), "vms");
        let before = t.definition.clone();
        let c = Catalogue::from_provider(&split);
        let t = &c.types()[0];
        assert_eq!(t.vm_namespace_for("team-a"), "vms-team-a");
        assert_eq!(t.vm_namespace_for("team-b"), "vms-team-b");
        assert!(!t.per_tenant.as_ref().expect("per tenant").create);
        assert_ne!(t.definition, before, "a change of where VMs go is drift");
        let long = t.vm_namespace_for(&"t".repeat(70));
        assert!(
            crate::names::is_dns_label(&long) && long.len() <= 63,
            "{long}"
        );
        assert_ne!(long, t.vm_namespace_for(&"t".repeat(71)));
    }

    #[test]
    fn a_type_s_own_address_pool_replaces_its_provider_s_and_one_that_cannot_be_used_fails_the_type(
    ) {
        let c = Catalogue::from_provider(&provider(Some("10.1.0.0/24"), Some("10.1.0.0/28")));
        assert!(
            c.types().iter().all(|t| t.problem.is_none()),
            "{:?}",
            c.types()[0].problem
        );
        let own = c.named("p.own").unwrap().address_pool.clone().unwrap();
        let inherits = c.named("p.inherits").unwrap().address_pool.clone().unwrap();
        assert_eq!(own.usable(), 16 - 3);
        assert_eq!(inherits.usable(), 256 - 3);

        let c = Catalogue::from_provider(&provider(None, Some("10.1.0.0/40")));
        let own = c.named("p.own").unwrap();
        let problem = own.problem.as_ref().expect("a problem");
        assert_eq!(
            problem.reason(),
            autonodes_api::reasons::TypeReason::InvalidAddressPool
        );
        assert!(problem.to_string().contains("prefix length"), "{problem}");
        assert!(c.named("p.inherits").unwrap().address_pool.is_none());

        // The address goes to the template's first interface: without one, no type can
        // have a pool.
        let c =
            Catalogue::from_provider(&provider_with_interface(Some("10.1.0.0/24"), None, false));
        let problem = c
            .named("p.inherits")
            .unwrap()
            .problem
            .as_ref()
            .expect("a problem");
        assert!(problem.to_string().contains("interfaces[0]"), "{problem}");
    }

    #[test]
    fn only_a_type_with_an_address_pool_has_it_in_its_definition_hash() {
        let without = Catalogue::from_provider(&provider(None, None));
        let with = Catalogue::from_provider(&provider(None, Some("10.1.0.0/24")));
        let hash = |c: &Catalogue, t: &str| c.named(t).unwrap().definition.clone();
        // Types without a pool keep the hash they had before pools existed.
        assert_eq!(hash(&without, "p.inherits"), hash(&with, "p.inherits"));
        assert_ne!(hash(&without, "p.own"), hash(&with, "p.own"));
    }
}
