//! Where on the host a VM runs: the host node affinity of its zone, and the placement
//! presets a node type sets as properties (Kubermatic's `podAffinityPreset`,
//! `podAntiAffinityPreset` and `nodeAffinityPreset`). Pure code, no I/O.
//!
//! All of it is written into the VM's `spec.template.spec.affinity` (core/v1 Affinity,
//! which KubeVirt gives the VM's launcher pod), keeping what the template has there:
//! - required host node requirements (the zone, `autonodes.io/host-node-selector`) are added
//!   to every required node selector term of the template (one term made when it has
//!   none): a pod may go where any term matches, so each must also hold them;
//! - `autonodes.io/host-node-preference` adds a preferred node affinity term;
//! - `autonodes.io/vm-affinity` / `vm-anti-affinity` add a pod (anti-)affinity term over
//!   the launcher pods of the VMs of the same group (the claim's tenant cluster, or its
//!   node pool) per host node (`kubernetes.io/hostname`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::error::TemplateError;
use crate::names::{is_label_value, is_qualified_name};
use crate::properties::PROP_ZONE;
use crate::properties::{
    PROP_HOST_NODE_PREFERENCE, PROP_HOST_NODE_SELECTOR, PROP_VM_AFFINITY, PROP_VM_AFFINITY_SCOPE,
    PROP_VM_ANTI_AFFINITY,
};
use autonodes_api::{NodeClaim, Properties, LABEL_NODECLAIM_NAMESPACE, LABEL_NODEPOOL};

/// Label on every VM's launcher pod (its VMI template): the claim's tenant cluster
/// (`vClusterRef.name`), for the group selectors.
pub const LABEL_VCLUSTER: &str = "autonodes.io/vcluster";
/// The topology of VM (anti-)affinity: one host node.
pub(crate) const HOST_TOPOLOGY: &str = "kubernetes.io/hostname";
/// The weight of the preferred terms autonodes writes.
pub(crate) const PREFERRED_WEIGHT: i32 = 100;
/// The most requirements one host node property may hold.
const MAX_HOST_REQUIREMENTS: usize = 16;

const REQUIRED_TERMS: &str = "/spec/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";

/// How strongly a preset holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strength {
    /// Preferred by the host's scheduler (`preferredDuringScheduling…`).
    Soft,
    /// Required (`requiredDuringScheduling…`): a VM that cannot get it stays Pending.
    Hard,
}

/// Which VMs a (anti-)affinity preset groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// The VMs of the claim's tenant cluster.
    #[default]
    Tenant,
    /// The VMs of the claim's node pool.
    Pool,
}

/// One host node requirement: a label key and the values it may have (any when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRequirement {
    /// The label key.
    pub key: String,
    /// Values the label may have; empty means the label exists with any value.
    pub values: Vec<String>,
}

impl HostRequirement {
    fn expression(&self) -> Value {
        if self.values.is_empty() {
            json!({"key": self.key, "operator": "Exists"})
        } else {
            json!({"key": self.key, "operator": "In", "values": self.values})
        }
    }
}

/// A node type's placement presets, read from its properties.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Pod affinity (`Some((false, s))`) or anti-affinity (`Some((true, s))`) of the group.
    pub vm_affinity: Option<(bool, Strength)>,
    /// The group.
    pub scope: Scope,
    /// Host node labels required.
    pub host_required: Vec<HostRequirement>,
    /// Host node labels preferred.
    pub host_preferred: Vec<HostRequirement>,
}

impl Placement {
    /// Whether the presets write nothing.
    pub fn is_empty(&self) -> bool {
        self.vm_affinity.is_none()
            && self.host_required.is_empty()
            && self.host_preferred.is_empty()
    }
}

fn strength(value: &str) -> Result<Strength, String> {
    match value.trim() {
        "soft" => Ok(Strength::Soft),
        "hard" => Ok(Strength::Hard),
        other => Err(format!(
            "{:?} is neither soft nor hard",
            other.chars().take(32).collect::<String>()
        )),
    }
}

/// Reads a host node property: requirements `key`, `key=value` or `key=v1|v2`, separated
/// by commas. Keys are qualified names (label keys), values label values.
pub(crate) fn parse_host_requirements(value: &str) -> Result<Vec<HostRequirement>, String> {
    let mut out: Vec<HostRequirement> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let shown: String = entry.chars().take(64).collect();
        let (key, values) = match entry.split_once('=') {
            Some((k, v)) => (
                k.trim(),
                v.split('|')
                    .map(str::trim)
                    .map(str::to_string)
                    .collect::<Vec<_>>(),
            ),
            None => (entry, Vec::new()),
        };
        if !is_qualified_name(key) {
            return Err(format!("{shown:?}: {key:?} is not a label key"));
        }
        if values.iter().any(|v| v.is_empty() || !is_label_value(v)) {
            return Err(format!("{shown:?}: a value is empty or not a label value"));
        }
        if out.iter().any(|r| r.key == key) {
            return Err(format!("{shown:?}: the key {key} is given twice"));
        }
        if out.len() == MAX_HOST_REQUIREMENTS {
            return Err(format!("more than {MAX_HOST_REQUIREMENTS} requirements"));
        }
        out.push(HostRequirement {
            key: key.to_string(),
            values,
        });
    }
    Ok(out)
}

/// Reads a type's placement presets. The error names the property and what is wrong.
pub fn parse_placement(properties: &Properties) -> Result<Placement, (&'static str, String)> {
    let mut p = Placement::default();
    let affinity = properties.get(PROP_VM_AFFINITY);
    let anti = properties.get(PROP_VM_ANTI_AFFINITY);
    if affinity.is_some() && anti.is_some() {
        return Err((
            PROP_VM_ANTI_AFFINITY,
            format!("{PROP_VM_AFFINITY} and {PROP_VM_ANTI_AFFINITY} exclude each other; set one"),
        ));
    }
    if let Some(v) = affinity {
        p.vm_affinity = Some((false, strength(v).map_err(|m| (PROP_VM_AFFINITY, m))?));
    }
    if let Some(v) = anti {
        p.vm_affinity = Some((true, strength(v).map_err(|m| (PROP_VM_ANTI_AFFINITY, m))?));
    }
    if let Some(v) = properties.get(PROP_VM_AFFINITY_SCOPE) {
        p.scope = match v.trim() {
            "tenant" => Scope::Tenant,
            "pool" => Scope::Pool,
            other => {
                return Err((
                    PROP_VM_AFFINITY_SCOPE,
                    format!(
                        "{:?} is neither tenant nor pool",
                        other.chars().take(32).collect::<String>()
                    ),
                ))
            }
        };
    }
    if let Some(v) = properties.get(PROP_HOST_NODE_SELECTOR) {
        p.host_required = parse_host_requirements(v).map_err(|m| (PROP_HOST_NODE_SELECTOR, m))?;
        if p.host_required.iter().any(|r| r.key == PROP_ZONE) {
            return Err((
                PROP_HOST_NODE_SELECTOR,
                format!("list zones in the {PROP_ZONE} property, not here"),
            ));
        }
    }
    if let Some(v) = properties.get(PROP_HOST_NODE_PREFERENCE) {
        p.host_preferred =
            parse_host_requirements(v).map_err(|m| (PROP_HOST_NODE_PREFERENCE, m))?;
    }
    Ok(p)
}

/// The labels that select a claim's group of VMs: its namespace and tenant cluster, and
/// for [`Scope::Pool`] its node pool (when it has one).
pub(crate) fn group_labels(
    scope: Scope,
    claim_namespace: &str,
    vcluster: &str,
    pool: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            LABEL_NODECLAIM_NAMESPACE.to_string(),
            crate::names::label_value(claim_namespace),
        ),
        (
            LABEL_VCLUSTER.to_string(),
            crate::names::label_value(vcluster),
        ),
    ]);
    if let (Scope::Pool, Some(pool)) = (scope, pool) {
        labels.insert(LABEL_NODEPOOL.to_string(), crate::names::label_value(pool));
    }
    labels
}

/// The node pool a claim belongs to (its `autonodes.io/nodepool` label), if any.
pub(crate) fn claim_pool(claim: &NodeClaim) -> Option<&str> {
    claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_NODEPOOL))
        .map(String::as_str)
}

/// [`group_labels`] of a claim: its namespace, its tenant cluster (`vClusterRef`) and its
/// pool ([`claim_pool`]).
pub fn claim_group(scope: Scope, claim: &NodeClaim) -> BTreeMap<String, String> {
    group_labels(
        scope,
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        &claim.spec.v_cluster_ref.name,
        claim_pool(claim),
    )
}

/// Puts the labels a group selector matches on the VM's launcher pod (its VMI template):
/// the tenant cluster, and the node pool when the claim has one.
pub(crate) fn label_launcher_pod(
    vm: &mut Value,
    vcluster: &str,
    pool: Option<&str>,
    node_type: &str,
) -> Result<(), TemplateError> {
    let labels = object_at(vm, "/spec/template/metadata/labels", node_type)?;
    labels.insert(
        LABEL_VCLUSTER.to_string(),
        Value::String(crate::names::label_value(vcluster)),
    );
    if let Some(pool) = pool {
        labels.insert(
            LABEL_NODEPOOL.to_string(),
            Value::String(crate::names::label_value(pool)),
        );
    }
    Ok(())
}

/// The object at `pointer`, made (with its parents) when missing.
fn object_at<'v>(
    root: &'v mut Value,
    pointer: &str,
    node_type: &str,
) -> Result<&'v mut Map<String, Value>, TemplateError> {
    super::merge::ensure_object(root, pointer).ok_or_else(|| TemplateError::NotAnObject {
        node_type: node_type.to_string(),
        field: pointer.trim_start_matches('/').replace('/', "."),
    })
}

/// The list at `pointer`, made (with its parents) when missing.
fn list_at<'v>(
    root: &'v mut Value,
    pointer: &str,
    node_type: &str,
) -> Result<&'v mut Vec<Value>, TemplateError> {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    let field = pointer.trim_start_matches('/').replace('/', ".");
    let slot = object_at(root, parent, node_type)?
        .entry(key)
        .or_insert_with(|| json!([]));
    slot.as_array_mut()
        .ok_or_else(|| TemplateError::NotAnObject {
            node_type: node_type.to_string(),
            field: format!("{field} (a list)"),
        })
}

/// Makes the VM's launcher pod run only on host nodes matching `requirements`: match
/// expressions added to every required node selector term of the template (one term
/// made when it has none), replacing expressions on the same keys there.
pub(crate) fn require_host_labels(
    vm: &mut Value,
    requirements: &[HostRequirement],
    node_type: &str,
) -> Result<(), TemplateError> {
    if requirements.is_empty() {
        return Ok(());
    }
    let expressions: Vec<Value> = requirements
        .iter()
        .map(HostRequirement::expression)
        .collect();
    let terms = list_at(vm, REQUIRED_TERMS, node_type)?;
    if terms.is_empty() {
        terms.push(json!({"matchExpressions": expressions}));
        return Ok(());
    }
    for term in terms.iter_mut() {
        let term = term
            .as_object_mut()
            .ok_or_else(|| TemplateError::NotAnObject {
                node_type: node_type.to_string(),
                field: "a nodeSelectorTerm of spec.template.spec.affinity.nodeAffinity".to_string(),
            })?;
        let list = term
            .entry("matchExpressions")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or_else(|| TemplateError::NotAnObject {
                node_type: node_type.to_string(),
                field: "matchExpressions (a list)".to_string(),
            })?;
        list.retain(|e| {
            let key = e.get("key").and_then(Value::as_str);
            !requirements.iter().any(|r| Some(r.key.as_str()) == key)
        });
        list.extend(expressions.iter().cloned());
    }
    Ok(())
}

/// Makes the VM's launcher pod run only on host nodes labelled `topology.kubernetes.io/zone
/// = zone` ([`require_host_labels`]).
pub(crate) fn require_host_zone(
    vm: &mut Value,
    zone: &str,
    node_type: &str,
) -> Result<(), TemplateError> {
    require_host_labels(
        vm,
        &[HostRequirement {
            key: PROP_ZONE.to_string(),
            values: vec![zone.to_string()],
        }],
        node_type,
    )
}

/// Writes a type's placement presets into a claim's VM; `group` selects the claim's group
/// of VMs ([`group_labels`]).
pub(crate) fn apply_placement(
    vm: &mut Value,
    placement: &Placement,
    group: &BTreeMap<String, String>,
    node_type: &str,
) -> Result<(), TemplateError> {
    require_host_labels(vm, &placement.host_required, node_type)?;
    if !placement.host_preferred.is_empty() {
        let expressions: Vec<Value> = placement
            .host_preferred
            .iter()
            .map(HostRequirement::expression)
            .collect();
        list_at(
            vm,
            "/spec/template/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution",
            node_type,
        )?
        .push(json!({"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": expressions}}));
    }
    if let Some((anti, strength)) = placement.vm_affinity {
        let term = json!({"labelSelector": {"matchLabels": group}, "topologyKey": HOST_TOPOLOGY});
        let kind = if anti {
            "podAntiAffinity"
        } else {
            "podAffinity"
        };
        let (list, entry) = match strength {
            Strength::Hard => ("requiredDuringSchedulingIgnoredDuringExecution", term),
            Strength::Soft => (
                "preferredDuringSchedulingIgnoredDuringExecution",
                json!({"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}),
            ),
        };
        list_at(
            vm,
            &format!("/spec/template/spec/affinity/{kind}/{list}"),
            node_type,
        )?
        .push(entry);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(vm: &Value) -> &Value {
        vm.pointer(REQUIRED_TERMS).expect("terms")
    }

    #[test]
    fn a_zone_becomes_a_required_host_node_affinity_term() {
        let mut vm = json!({"spec": {"template": {"spec": {}}}});
        require_host_zone(&mut vm, "zone-b", "p.t").expect("adds");
        assert_eq!(
            terms(&vm),
            &json!([{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}]}])
        );
    }

    #[test]
    fn the_zone_joins_every_term_the_template_brings_and_replaces_a_zone_expression_there() {
        let mut vm = json!({"spec": {"template": {"spec": {"affinity": {
            "podAntiAffinity": {"x": 1},
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubevirt.io/schedulable", "operator": "In", "values": ["true"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h1"]}]},
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]},
                ]},
            },
        }}}}});
        require_host_zone(&mut vm, "zone-b", "p.t").expect("adds");
        let zone =
            json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]});
        assert_eq!(
            terms(&vm),
            &json!([
                {"matchExpressions": [{"key": "kubevirt.io/schedulable", "operator": "In", "values": ["true"]}, zone]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h1"]}], "matchExpressions": [zone]},
                {"matchExpressions": [zone]},
            ])
        );
        let affinity = vm
            .pointer("/spec/template/spec/affinity")
            .expect("affinity");
        assert_eq!(affinity["podAntiAffinity"], json!({"x": 1}));
        assert_eq!(
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 1}])
        );
    }

    #[test]
    fn an_affinity_that_is_not_an_object_is_an_error_naming_the_field() {
        let mut vm = json!({"spec": {"template": {"spec": {"affinity": "anywhere"}}}});
        let e = require_host_zone(&mut vm, "zone-a", "p.t").expect_err("refused");
        assert!(e.to_string().contains("affinity"), "{e}");
    }

    fn props(pairs: &[(&str, &str)]) -> Properties {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn placement_presets_read_strength_scope_and_host_node_requirements() {
        let p = parse_placement(&props(&[
            (PROP_VM_ANTI_AFFINITY, "hard"),
            (PROP_VM_AFFINITY_SCOPE, "pool"),
            (
                PROP_HOST_NODE_SELECTOR,
                "node-role.kubernetes.io/kubevirt, disktype=ssd|nvme",
            ),
            (PROP_HOST_NODE_PREFERENCE, "cpu-vendor=amd"),
        ]))
        .expect("reads");
        assert_eq!(p.vm_affinity, Some((true, Strength::Hard)));
        assert_eq!(p.scope, Scope::Pool);
        assert_eq!(
            p.host_required,
            vec![
                HostRequirement {
                    key: "node-role.kubernetes.io/kubevirt".into(),
                    values: vec![]
                },
                HostRequirement {
                    key: "disktype".into(),
                    values: vec!["ssd".into(), "nvme".into()]
                },
            ]
        );
        assert_eq!(p.host_preferred.len(), 1);
        assert!(parse_placement(&props(&[])).expect("empty").is_empty());
    }

    #[test]
    fn a_placement_preset_autonodes_cannot_use_is_refused_naming_the_property() {
        for (pairs, property, says) in [
            (
                vec![(PROP_VM_ANTI_AFFINITY, "always")],
                PROP_VM_ANTI_AFFINITY,
                "neither soft nor hard",
            ),
            (
                vec![(PROP_VM_AFFINITY, "soft"), (PROP_VM_ANTI_AFFINITY, "soft")],
                PROP_VM_ANTI_AFFINITY,
                "exclude each other",
            ),
            (
                vec![(PROP_VM_AFFINITY_SCOPE, "cluster")],
                PROP_VM_AFFINITY_SCOPE,
                "neither tenant nor pool",
            ),
            (
                vec![(PROP_HOST_NODE_SELECTOR, "bad key=x")],
                PROP_HOST_NODE_SELECTOR,
                "not a label key",
            ),
            (
                vec![(PROP_HOST_NODE_SELECTOR, "k=")],
                PROP_HOST_NODE_SELECTOR,
                "not a label value",
            ),
            (
                vec![(PROP_HOST_NODE_SELECTOR, "k=a,k=b")],
                PROP_HOST_NODE_SELECTOR,
                "twice",
            ),
            (
                vec![(PROP_HOST_NODE_SELECTOR, "topology.kubernetes.io/zone=a")],
                PROP_HOST_NODE_SELECTOR,
                "zones",
            ),
            (
                vec![(PROP_HOST_NODE_PREFERENCE, "k=a b")],
                PROP_HOST_NODE_PREFERENCE,
                "not a label value",
            ),
        ] {
            let (got, message) = parse_placement(&props(&pairs)).expect_err("refused");
            assert_eq!(got, property, "{pairs:?}");
            assert!(message.contains(says), "{pairs:?}: {message}");
        }
    }

    #[test]
    fn hard_anti_affinity_keeps_a_groups_vms_on_different_host_nodes_and_soft_prefers_it() {
        let group = group_labels(Scope::Pool, "tenant", "vc", Some("workers"));
        assert_eq!(
            group,
            BTreeMap::from([
                (
                    "autonodes.io/nodeclaim-namespace".to_string(),
                    "tenant".to_string()
                ),
                ("autonodes.io/nodepool".to_string(), "workers".to_string()),
                ("autonodes.io/vcluster".to_string(), "vc".to_string()),
            ])
        );
        let term = json!({"labelSelector": {"matchLabels": group}, "topologyKey": "kubernetes.io/hostname"});
        let mut vm = json!({"spec": {"template": {"spec": {}}}});
        let hard = Placement {
            vm_affinity: Some((true, Strength::Hard)),
            ..Placement::default()
        };
        apply_placement(&mut vm, &hard, &group, "p.t").expect("applies");
        assert_eq!(
            vm.pointer("/spec/template/spec/affinity/podAntiAffinity"),
            Some(&json!({"requiredDuringSchedulingIgnoredDuringExecution": [term.clone()]}))
        );
        let mut vm = json!({"spec": {"template": {"spec": {}}}});
        let soft = Placement {
            vm_affinity: Some((false, Strength::Soft)),
            ..Placement::default()
        };
        apply_placement(&mut vm, &soft, &group, "p.t").expect("applies");
        assert_eq!(
            vm.pointer("/spec/template/spec/affinity/podAffinity"),
            Some(
                &json!({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]})
            )
        );
        // Without a pool, the pool scope groups the tenant's VMs.
        assert!(
            !group_labels(Scope::Pool, "tenant", "vc", None).contains_key("autonodes.io/nodepool")
        );
    }

    #[test]
    fn host_node_presets_become_required_and_preferred_node_affinity() {
        let mut vm = json!({"spec": {"template": {"spec": {}}}});
        let p = Placement {
            host_required: vec![HostRequirement {
                key: "disktype".into(),
                values: vec!["ssd".into()],
            }],
            host_preferred: vec![HostRequirement {
                key: "gpu".into(),
                values: vec![],
            }],
            ..Placement::default()
        };
        apply_placement(&mut vm, &p, &BTreeMap::new(), "p.t").expect("applies");
        require_host_zone(&mut vm, "zone-a", "p.t").expect("zone");
        assert_eq!(
            vm.pointer("/spec/template/spec/affinity/nodeAffinity"),
            Some(&json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "disktype", "operator": "In", "values": ["ssd"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]},
                ]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}},
                ],
            }))
        );
    }

    #[test]
    fn the_launcher_pod_is_labelled_with_its_tenant_and_pool() {
        let mut vm =
            json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {}}}});
        label_launcher_pod(&mut vm, "vc", Some("workers"), "p.t").expect("labels");
        assert_eq!(
            vm.pointer("/spec/template/metadata/labels"),
            Some(
                &json!({"a": "b", "autonodes.io/vcluster": "vc", "autonodes.io/nodepool": "workers"})
            )
        );
    }
}
