//! Composing the KubeVirt VirtualMachine of a node (DESIGN §3). Pure code, no I/O.
//!
//! The order is fixed and deterministic:
//! 1. the provider's base template, or the node type's replacement `virtualMachineTemplate`;
//! 2. the node type's `mergeVirtualMachineTemplate`, as a strategic merge ([`strategic_merge`]);
//! 3. the node type's `resources` into `spec.template.spec.domain.resources` ([`apply_resources`]);
//! 4. the forced fields, last ([`finalize_vm`]).
//!
//! Steps 1–3 depend only on the node type, so they are done once per type
//! ([`compose_type_template`]); step 4 depends on the claim and is cheap.
//!
//! Between steps 3 and 4, a type's configuration properties add devices to its template:
//! a root disk from an image ([`add_root_disk`]), blank data disks ([`disks`]), Multus
//! networks ([`networks`]), and image imports turned into clones of golden volumes
//! ([`golden`]).

pub mod disks;
pub mod golden;
pub mod instancetype;
pub mod networks;
pub mod placement;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Map, Value};

use crate::api::{
    ResourceList, LABEL_INSTALLATION, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_NODECLAIM_NAMESPACE,
    LABEL_NODECLAIM_UID, MANAGED_BY,
};
use crate::resources::{self, QuantityError, CPU, MEMORY};

/// Name of the cloud-init volume and disk autonodes adds to every VirtualMachine.
pub const CLOUD_INIT_VOLUME: &str = "cloudinitdisk";
/// Key of the user data in the `<vm>-userdata` Secret.
pub const USER_DATA_KEY: &str = "userdata";
/// API version of the VirtualMachines autonodes writes.
pub const VM_API_VERSION: &str = "kubevirt.io/v1";
/// Kind of the VirtualMachines autonodes writes.
pub const VM_KIND: &str = "VirtualMachine";
/// The longest name Kubernetes accepts for a DNS-1123 label (VM names, hostnames).
pub const MAX_DNS_LABEL: usize = 63;
/// The longest DataVolume / PersistentVolumeClaim name (a DNS-1123 subdomain).
pub const MAX_DNS_SUBDOMAIN: usize = 253;

/// Lists that merge element by element, keyed by a field, instead of being replaced:
/// `(path of the list, path of the key inside each element)`.
pub const MERGE_KEYS: &[(&[&str], &[&str])] = &[
    (
        &["spec", "template", "spec", "domain", "devices", "disks"],
        &["name"],
    ),
    (
        &[
            "spec",
            "template",
            "spec",
            "domain",
            "devices",
            "interfaces",
        ],
        &["name"],
    ),
    (&["spec", "template", "spec", "networks"], &["name"]),
    (&["spec", "template", "spec", "volumes"], &["name"]),
    (&["spec", "dataVolumeTemplates"], &["metadata", "name"]),
];

/// The directive key of a strategic merge patch (`$patch: delete | replace | merge`).
pub const PATCH_DIRECTIVE: &str = "$patch";

/// Why a strategic merge failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// An element of a list merged by key lacks the key.
    #[error("{path}[{index}]: element has no merge key {key}")]
    MissingMergeKey {
        /// Dotted path of the list.
        path: String,
        /// Index of the element in the patch list.
        index: usize,
        /// The dotted key path (`name`, `metadata.name`).
        key: String,
    },
    /// An element of a list merged by key is not an object.
    #[error("{path}[{index}]: element of a list merged by {key} must be an object")]
    NotAnObject {
        /// Dotted path of the list.
        path: String,
        /// Index of the element in the patch list.
        index: usize,
        /// The dotted key path.
        key: String,
    },
    /// A `$patch` directive with an unknown value.
    #[error("{path}: unknown $patch directive {value:?} (expected delete, replace or merge)")]
    UnknownDirective {
        /// Dotted path of the object with the directive.
        path: String,
        /// The directive value.
        value: String,
    },
}

/// Why a node type's VirtualMachine cannot be composed. Every variant names the node type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    /// Both `mergeVirtualMachineTemplate` and `virtualMachineTemplate` are set.
    #[error("node type {node_type}: mergeVirtualMachineTemplate and virtualMachineTemplate are mutually exclusive; set at most one")]
    BothTemplates {
        /// The node type.
        node_type: String,
    },
    /// Neither the type nor its provider has a template.
    #[error("node type {node_type}: no VirtualMachine template (neither the type's virtualMachineTemplate nor the provider's)")]
    NoTemplate {
        /// The node type.
        node_type: String,
    },
    /// A template or a part of it is not a JSON object.
    #[error("node type {node_type}: {field} must be an object")]
    NotAnObject {
        /// The node type.
        node_type: String,
        /// The offending field.
        field: String,
    },
    /// The strategic merge failed.
    #[error("node type {node_type}: mergeVirtualMachineTemplate: {source}")]
    Merge {
        /// The node type.
        node_type: String,
        /// What went wrong.
        source: MergeError,
    },
    /// A quantity in the type or its template does not parse.
    #[error("node type {node_type}: {field}: {source}")]
    Quantity {
        /// The node type.
        node_type: String,
        /// The field holding the quantity.
        field: String,
        /// The parse error.
        source: QuantityError,
    },
    /// A CPU topology value is not a positive integer.
    #[error("node type {node_type}: {field} must be a positive integer")]
    BadTopology {
        /// The node type.
        node_type: String,
        /// The field.
        field: String,
    },
    /// Memory can be found neither in `resources` nor in the template.
    #[error("node type {node_type}: memory is not set: give resources.memory, or spec.template.spec.domain.memory.guest or domain.resources.requests.memory in the template")]
    MemoryNotFound {
        /// The node type.
        node_type: String,
    },
    /// `spec.template.spec.taints` is not a list of taints.
    #[error("node type {node_type}: spec.template.spec.taints: {message}")]
    BadTaints {
        /// The node type.
        node_type: String,
        /// What is wrong.
        message: String,
    },
    /// The template sets both `spec.running` and `spec.runStrategy`, which KubeVirt rejects.
    #[error("node type {node_type}: the template sets both spec.running and spec.runStrategy; KubeVirt accepts only one")]
    RunningAndRunStrategy {
        /// The node type.
        node_type: String,
    },
    /// A name built from the VM name is too long or invalid.
    #[error("node type {node_type}: {field}: {message}")]
    BadName {
        /// The node type.
        node_type: String,
        /// The field the name goes to.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl TemplateError {
    /// A type property autonodes cannot use (`field` is `property <key>`).
    pub fn property(node_type: &str, property: &str, message: impl Into<String>) -> Self {
        TemplateError::BadName {
            node_type: node_type.to_string(),
            field: format!("property {property}"),
            message: message.into(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Strategic merge
// ---------------------------------------------------------------------------------------

/// Strategic merge of `patch` over `base`, returning the result:
/// - objects merge key by key; a `null` value deletes the key;
/// - lists listed in [`MERGE_KEYS`] merge element by element on their key (elements of the
///   patch with a key found in the base are merged into that element, others are appended;
///   an element with `$patch: delete` removes the base element with its key);
/// - every other list, and every scalar, is replaced by the patch;
/// - an object with `$patch: replace` replaces the base object instead of merging.
///
/// An empty patch object leaves the base unchanged. Never panics, whatever the input.
pub fn strategic_merge(base: &Value, patch: &Value) -> Result<Value, MergeError> {
    let mut out = base.clone();
    merge_into(&mut out, patch)?;
    Ok(out)
}

/// In-place form of [`strategic_merge`].
pub fn merge_into(base: &mut Value, patch: &Value) -> Result<(), MergeError> {
    let mut path = Vec::new();
    merge_value(base, patch, &mut path)
}

fn dotted(path: &[&str]) -> String {
    if path.is_empty() {
        "<root>".to_string()
    } else {
        path.join(".")
    }
}

fn merge_key_for(path: &[&str]) -> Option<&'static [&'static str]> {
    MERGE_KEYS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, key)| *key)
}

fn lookup<'v>(value: &'v Value, key_path: &[&str]) -> Option<&'v Value> {
    key_path.iter().try_fold(value, |v, k| v.get(k))
}

fn directive(obj: &Map<String, Value>) -> Option<&Value> {
    obj.get(PATCH_DIRECTIVE)
}

/// A copy of a patch value for insertion: `null` map values and `$patch` directives removed.
fn cleaned(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !v.is_null() && k.as_str() != PATCH_DIRECTIVE)
                .map(|(k, v)| (k.clone(), cleaned(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(cleaned).collect()),
        other => other.clone(),
    }
}

fn merge_value<'p>(
    base: &mut Value,
    patch: &'p Value,
    path: &mut Vec<&'p str>,
) -> Result<(), MergeError> {
    match patch {
        Value::Object(pmap) => {
            match directive(pmap) {
                None => {}
                Some(Value::String(d)) if d == "merge" => {}
                Some(Value::String(d)) if d == "replace" => {
                    *base = cleaned(patch);
                    return Ok(());
                }
                Some(other) => {
                    return Err(MergeError::UnknownDirective {
                        path: dotted(path),
                        value: other
                            .as_str()
                            .map_or_else(|| other.to_string(), str::to_string),
                    })
                }
            }
            let Value::Object(bmap) = base else {
                *base = cleaned(patch);
                return Ok(());
            };
            for (k, pv) in pmap {
                if k == PATCH_DIRECTIVE {
                    continue;
                }
                if pv.is_null() {
                    bmap.remove(k);
                    continue;
                }
                match bmap.get_mut(k) {
                    Some(bv) => {
                        path.push(k);
                        let r = merge_value(bv, pv, path);
                        path.pop();
                        r?;
                    }
                    None => {
                        bmap.insert(k.clone(), cleaned(pv));
                    }
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            match (merge_key_for(path), base) {
                (Some(key), Value::Array(base_items)) => {
                    merge_keyed_list(base_items, items, key, path)
                }
                (Some(key), base) => {
                    // Nothing to merge into: validate the directives, then take the patch.
                    let mut fresh = Vec::new();
                    merge_keyed_list(&mut fresh, items, key, path)?;
                    *base = Value::Array(fresh);
                    Ok(())
                }
                (None, base) => {
                    *base = cleaned(patch);
                    Ok(())
                }
            }
        }
        Value::Null => {
            *base = Value::Null;
            Ok(())
        }
        scalar => {
            *base = scalar.clone();
            Ok(())
        }
    }
}

fn merge_keyed_list<'p>(
    base: &mut Vec<Value>,
    patch: &'p [Value],
    key: &[&str],
    path: &mut Vec<&'p str>,
) -> Result<(), MergeError> {
    for (index, item) in patch.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(MergeError::NotAnObject {
                path: dotted(path),
                index,
                key: key.join("."),
            });
        };
        let Some(wanted) = lookup(item, key).filter(|v| !v.is_null()) else {
            return Err(MergeError::MissingMergeKey {
                path: dotted(path),
                index,
                key: key.join("."),
            });
        };
        let found = base
            .iter()
            .position(|b| lookup(b, key).is_some_and(|k| k == wanted));
        if matches!(directive(obj), Some(Value::String(d)) if d == "delete") {
            base.retain(|b| lookup(b, key).is_none_or(|k| k != wanted));
            continue;
        }
        match found {
            Some(i) => {
                path.push("[]");
                let r = merge_value(&mut base[i], item, path);
                path.pop();
                r?;
            }
            None => {
                // Validate directives nested in the new element, then append it.
                if let Some(Value::String(d)) = directive(obj) {
                    if d != "replace" && d != "merge" {
                        return Err(MergeError::UnknownDirective {
                            path: format!("{}[{index}]", dotted(path)),
                            value: d.clone(),
                        });
                    }
                }
                base.push(cleaned(item));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Composition
// ---------------------------------------------------------------------------------------

/// What a node type contributes to its VirtualMachine.
#[derive(Debug, Clone, Copy)]
pub struct TypeTemplateInput<'a> {
    /// Name of the node type, used in error messages.
    pub node_type: &'a str,
    /// The provider's base `virtualMachineTemplate`, if any.
    pub base: Option<&'a Value>,
    /// The type's `mergeVirtualMachineTemplate`, if any.
    pub merge: Option<&'a Value>,
    /// The type's replacement `virtualMachineTemplate`, if any.
    pub replacement: Option<&'a Value>,
    /// The type's `resources` (may be empty).
    pub resources: &'a ResourceList,
}

/// The per-type part of a VirtualMachine: steps 1–3 of the composition done, with
/// `spec.template.spec.taints` taken out.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeTemplate {
    /// The template (`metadata` + `spec`) after merge and resources.
    pub template: Value,
    /// The taints found in `spec.template.spec.taints`.
    pub taints: Vec<Taint>,
}

/// Steps 1–3 of the composition for one node type: pick the base or replacement template,
/// strategic-merge `mergeVirtualMachineTemplate`, write `resources` into the domain, and
/// take `spec.template.spec.taints` out of the template (returned as node taints).
pub fn compose_type_template(input: &TypeTemplateInput<'_>) -> Result<TypeTemplate, TemplateError> {
    let node_type = input.node_type;
    if input.merge.is_some() && input.replacement.is_some() {
        return Err(TemplateError::BothTemplates {
            node_type: node_type.to_string(),
        });
    }
    let (start, field) = match (input.replacement, input.base) {
        (Some(r), _) => (r, "virtualMachineTemplate"),
        (None, Some(b)) => (b, "provider virtualMachineTemplate"),
        (None, None) => {
            return Err(TemplateError::NoTemplate {
                node_type: node_type.to_string(),
            })
        }
    };
    if !start.is_object() {
        return Err(TemplateError::NotAnObject {
            node_type: node_type.to_string(),
            field: field.to_string(),
        });
    }
    let mut template = start.clone();
    if let Some(patch) = input.merge {
        if !patch.is_object() {
            return Err(TemplateError::NotAnObject {
                node_type: node_type.to_string(),
                field: "mergeVirtualMachineTemplate".to_string(),
            });
        }
        merge_into(&mut template, patch).map_err(|source| TemplateError::Merge {
            node_type: node_type.to_string(),
            source,
        })?;
    }
    let taints = take_taints(&mut template, node_type)?;
    apply_resources(&mut template, input.resources, node_type)?;
    Ok(TypeTemplate { template, taints })
}

/// Removes `spec.template.spec.taints` (not a KubeVirt field, but used in published
/// examples) and returns its entries as taints.
pub fn take_taints(template: &mut Value, node_type: &str) -> Result<Vec<Taint>, TemplateError> {
    let Some(vmi_spec) = template
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    else {
        return Ok(Vec::new());
    };
    let Some(raw) = vmi_spec.remove("taints") else {
        return Ok(Vec::new());
    };
    if raw.is_null() {
        return Ok(Vec::new());
    }
    let taints: Vec<Taint> = serde_json::from_value(raw).map_err(|e| TemplateError::BadTaints {
        node_type: node_type.to_string(),
        message: e.to_string(),
    })?;
    for t in &taints {
        check_taint(t).map_err(|message| TemplateError::BadTaints {
            node_type: node_type.to_string(),
            message,
        })?;
    }
    Ok(taints)
}

/// Checks a taint as the API server checks a Node's: its key a qualified name, its value
/// a label value (or empty), its effect one of the three Kubernetes knows. The CRDs' taint
/// schema (`api::schema::taints`) admits exactly these.
pub fn check_taint(t: &Taint) -> Result<(), String> {
    if t.key.is_empty() {
        return Err("a taint has an empty key".to_string());
    }
    if !crate::names::is_qualified_name(&t.key) {
        return Err(format!(
            "taint key {:?} is not a qualified name (`example.com/name`)",
            t.key.chars().take(80).collect::<String>()
        ));
    }
    if let Some(v) = t.value.as_deref().filter(|v| !v.is_empty()) {
        if !crate::names::is_label_value(v) {
            return Err(format!(
                "taint {}: value {:?} is not a label value",
                t.key,
                v.chars().take(80).collect::<String>()
            ));
        }
    }
    match t.effect.as_str() {
        "NoSchedule" | "PreferNoSchedule" | "NoExecute" => Ok(()),
        other => Err(format!(
            "taint {}: effect {other:?} is not NoSchedule, PreferNoSchedule or NoExecute",
            t.key
        )),
    }
}

fn object_at<'v>(root: &'v mut Value, path: &[&str]) -> Option<&'v mut Map<String, Value>> {
    let mut cur = root;
    for key in path {
        let map = cur.as_object_mut()?;
        cur = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    cur.as_object_mut()
}

/// The object at the JSON `pointer` in `root`, made (with its parents) where missing or
/// `null`; `None` when something on the way is not an object. What the property devices
/// ([`networks`], [`placement`]) write into a template goes through it.
pub(crate) fn ensure_object<'v>(
    root: &'v mut Value,
    pointer: &str,
) -> Option<&'v mut Map<String, Value>> {
    let mut at = root;
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
        at = at.as_object_mut()?.entry(part).or_insert(Value::Null);
    }
    if at.is_null() {
        *at = Value::Object(Map::new());
    }
    at.as_object_mut()
}

/// Step 3: writes the type's resources into `spec.template.spec.domain.resources.requests`,
/// and into `limits` for each resource the template already limits. When the template
/// fixes the guest topology (`domain.cpu`) or `domain.memory.guest`, those follow the
/// type's cpu (as `cores`, one socket, one thread) and memory, so the guest sees what the
/// type promises.
pub fn apply_resources(
    template: &mut Value,
    resources: &ResourceList,
    node_type: &str,
) -> Result<(), TemplateError> {
    if resources.is_empty() {
        return Ok(());
    }
    let not_object = |field: &str| TemplateError::NotAnObject {
        node_type: node_type.to_string(),
        field: field.to_string(),
    };
    let domain = object_at(template, &["spec", "template", "spec", "domain"])
        .ok_or_else(|| not_object("spec.template.spec.domain"))?;
    let res = domain
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object("spec.template.spec.domain.resources"))?;
    let requests = res
        .entry("requests")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object("spec.template.spec.domain.resources.requests"))?;
    for (name, q) in resources {
        requests.insert(name.clone(), Value::String(q.0.clone()));
    }
    if let Some(limits) = res.get_mut("limits").and_then(Value::as_object_mut) {
        for (name, q) in resources {
            if limits.contains_key(name) {
                limits.insert(name.clone(), Value::String(q.0.clone()));
            }
        }
    }
    if let Some(cpu) = resources.get(CPU) {
        let millis = resources::cpu_millis(cpu).map_err(|source| TemplateError::Quantity {
            node_type: node_type.to_string(),
            field: "resources.cpu".to_string(),
            source,
        })?;
        if let Some(topology) = domain.get_mut("cpu").and_then(Value::as_object_mut) {
            let sets_topology = ["cores", "sockets", "threads"]
                .iter()
                .any(|k| topology.contains_key(*k));
            if sets_topology && millis % 1000 == 0 && millis > 0 {
                topology.insert("cores".into(), Value::from((millis / 1000) as i64));
                topology.insert("sockets".into(), Value::from(1));
                topology.insert("threads".into(), Value::from(1));
            }
        }
    }
    if let Some(memory) = resources.get(MEMORY) {
        if let Some(mem) = domain.get_mut("memory").and_then(Value::as_object_mut) {
            if mem.contains_key("guest") {
                mem.insert("guest".into(), Value::String(memory.0.clone()));
            }
        }
    }
    Ok(())
}

/// Effective resources of a node type: each entry of `spec_resources`, plus `cpu` and
/// `memory` discovered from the template when the spec lacks them:
/// - cpu: `domain.cpu` cores × sockets × threads (each defaulting to 1), else
///   `domain.resources.requests.cpu`, else `domain.resources.limits.cpu`, else 1 (KubeVirt's
///   default of one vCPU);
/// - memory: `domain.memory.guest`, else `domain.resources.requests.memory`, else
///   `domain.resources.limits.memory`; none of these is [`TemplateError::MemoryNotFound`].
///
/// `template` is the type's template after merge (see [`compose_type_template`]).
pub fn effective_resources(
    node_type: &str,
    spec_resources: &ResourceList,
    template: &Value,
) -> Result<ResourceList, TemplateError> {
    let mut out = spec_resources.clone();
    let domain = template.pointer("/spec/template/spec/domain");
    let at = |p: &str| domain.and_then(|d| d.pointer(p));
    let quantity_at = |p: &str| -> Result<Option<Quantity>, TemplateError> {
        match at(p) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let q = quantity_from_json(v).ok_or_else(|| TemplateError::Quantity {
                    node_type: node_type.to_string(),
                    field: format!("spec.template.spec.domain{}", p.replace('/', ".")),
                    source: QuantityError {
                        input: v.to_string(),
                        reason: "not a string or number",
                    },
                })?;
                resources::parse_quantity(&q.0).map_err(|source| TemplateError::Quantity {
                    node_type: node_type.to_string(),
                    field: format!("spec.template.spec.domain{}", p.replace('/', ".")),
                    source,
                })?;
                Ok(Some(q))
            }
        }
    };
    if !out.contains_key(CPU) {
        let topology = ["cores", "sockets", "threads"]
            .iter()
            .map(|k| match at(&format!("/cpu/{k}")) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
                    TemplateError::BadTopology {
                        node_type: node_type.to_string(),
                        field: format!("spec.template.spec.domain.cpu.{k}"),
                    }
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cpu = if topology.iter().any(Option::is_some) {
            let vcpus = topology
                .iter()
                .map(|n| n.unwrap_or(1))
                .fold(1u64, u64::saturating_mul);
            Quantity(vcpus.to_string())
        } else if let Some(q) = quantity_at("/resources/requests/cpu")? {
            q
        } else if let Some(q) = quantity_at("/resources/limits/cpu")? {
            q
        } else {
            Quantity("1".to_string())
        };
        out.insert(CPU.to_string(), cpu);
    }
    if !out.contains_key(MEMORY) {
        let memory = match quantity_at("/memory/guest")? {
            Some(q) => q,
            None => match quantity_at("/resources/requests/memory")? {
                Some(q) => q,
                None => quantity_at("/resources/limits/memory")?.ok_or_else(|| {
                    TemplateError::MemoryNotFound {
                        node_type: node_type.to_string(),
                    }
                })?,
            },
        };
        out.insert(MEMORY.to_string(), memory);
    }
    Ok(out)
}

fn quantity_from_json(v: &Value) -> Option<Quantity> {
    match v {
        Value::String(s) => Some(Quantity(s.clone())),
        Value::Number(n) => Some(Quantity(n.to_string())),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Forced fields
// ---------------------------------------------------------------------------------------

/// Who a VirtualMachine is for: its name and namespace, and the labels autonodes puts on
/// every object it creates (see [`managed_labels`]).
#[derive(Debug, Clone, Copy)]
pub struct VmIdentity<'a> {
    /// Name of the VirtualMachine (a DNS-1123 label, see [`vm_name_for_claim`]).
    pub name: &'a str,
    /// Namespace on the host cluster.
    pub namespace: &'a str,
    /// Labels forced onto the VM, its VMI template and its DataVolume templates.
    pub labels: &'a BTreeMap<String, String>,
}

/// The labels every object autonodes creates for a claim carries: managed-by, the
/// installation's id ([`LABEL_INSTALLATION`], shortened like a name when too long), and the
/// claim's name (shortened with a hash when longer than a label value may be, see
/// [`crate::names::label_value`]), namespace and UID.
pub fn managed_labels(
    claim_name: &str,
    claim_namespace: &str,
    claim_uid: &str,
    installation: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (
            LABEL_INSTALLATION.to_string(),
            crate::names::label_value(installation),
        ),
        (
            LABEL_NODECLAIM.to_string(),
            crate::names::label_value(claim_name),
        ),
        (
            LABEL_NODECLAIM_NAMESPACE.to_string(),
            claim_namespace.to_string(),
        ),
        (LABEL_NODECLAIM_UID.to_string(), claim_uid.to_string()),
    ])
}

/// Whether an object's `labels` name the claim with UID `uid` ([`LABEL_NODECLAIM_UID`]):
/// only then does autonodes adopt, wait for or delete it for that claim.
pub fn labelled_for_claim(labels: &BTreeMap<String, String>, uid: &str) -> bool {
    labels.get(LABEL_NODECLAIM_UID).map(String::as_str) == Some(uid)
}

/// The labels naming a node's claim, which the kubelet registers the Node with (so tenant
/// Node events find the claim): the installation, and the claim's name (shortened with a
/// hash when longer than a label value may be), namespace and UID.
pub fn node_identity_labels(
    claim_name: &str,
    claim_namespace: &str,
    claim_uid: &str,
    installation: &str,
) -> BTreeMap<String, String> {
    let mut labels = managed_labels(claim_name, claim_namespace, claim_uid, installation);
    labels.remove(LABEL_MANAGED_BY);
    labels
}

/// Name of the Secret that holds a VM's user data.
pub fn user_data_secret_name(vm_name: &str) -> String {
    format!("{vm_name}-userdata")
}

/// A VM name for a claim: `<namespace>-<name>` lowered to `[a-z0-9-]` and cut so that,
/// with a `-` and 6 hex digits derived from namespace, name and UID, it is a DNS-1123 label
/// of at most 63 characters without dots. The suffix keeps claims apart whose names would
/// otherwise collide (`team-a`/`node-1` and `team`/`a-node-1`, or a claim recreated under
/// the same name while its old VM is still going away). Deterministic for the same inputs.
pub fn vm_name_for_claim(claim_namespace: &str, claim_name: &str, claim_uid: &str) -> String {
    let mut name = String::with_capacity(claim_namespace.len() + claim_name.len() + 1);
    for c in claim_namespace
        .chars()
        .chain(std::iter::once('-'))
        .chain(claim_name.chars())
    {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if !(c == '-' && (name.is_empty() || name.ends_with('-'))) {
            name.push(c);
        }
    }
    let digest = crate::names::fnv1a(&[claim_namespace, claim_name, claim_uid]);
    let suffix = format!("{:06x}", digest & 0xff_ffff);
    let prefix: String = name.chars().take(MAX_DNS_LABEL - 7).collect();
    let prefix = prefix.trim_end_matches('-');
    if prefix.is_empty() {
        format!("node-{suffix}")
    } else {
        format!("{prefix}-{suffix}")
    }
}

/// The default size of a root disk made from [`add_root_disk`] without a size.
pub const DEFAULT_ROOT_DISK_SIZE: &str = "20Gi";
/// The name of the root disk, its volume and its DataVolume template (before the VM name
/// is put in front of the DataVolume's).
pub const ROOT_DISK: &str = "rootdisk";

/// Gives a template without a root disk (no volume but cloud-init) one: a DataVolume
/// template importing `image_url` (`docker://…` from a registry, `http(s)://…` over HTTP)
/// into `size` of storage (of `storage_class`, else the host's default class), its volume
/// and a virtio disk, as vCluster's KubeVirt properties `kubevirt.vcluster.com/image-url`
/// and `root-disk-size` (and autonodes' `autonodes.io/root-disk-storage-class`) ask. A
/// template that has a disk already is left alone (`Ok(false)`). An image URL, size or
/// storage class autonodes cannot use is an error naming the property.
pub fn add_root_disk(
    template: &mut Value,
    image_url: &str,
    size: Option<&str>,
    storage_class: Option<&str>,
    node_type: &str,
) -> Result<bool, TemplateError> {
    let bad =
        |property: &str, message: String| TemplateError::property(node_type, property, message);
    let source = if image_url.starts_with("docker://") {
        json!({"registry": {"url": image_url}})
    } else if image_url.starts_with("https://") || image_url.starts_with("http://") {
        json!({"http": {"url": image_url}})
    } else {
        return Err(bad(
            crate::scheduling::PROP_IMAGE_URL,
            "not a docker://, https:// or http:// URL".to_string(),
        ));
    };
    if image_url.len() > 2048 || image_url.chars().any(char::is_whitespace) {
        return Err(bad(
            crate::scheduling::PROP_IMAGE_URL,
            "longer than 2048 characters or with blanks".to_string(),
        ));
    }
    let size = size.unwrap_or(DEFAULT_ROOT_DISK_SIZE).trim();
    match crate::resources::parse_quantity(size) {
        Ok(bytes) if bytes > 0 => {}
        _ => {
            return Err(bad(
                crate::scheduling::PROP_ROOT_DISK_SIZE,
                format!(
                    "{:?} is not a positive quantity such as 20Gi",
                    size.chars().take(64).collect::<String>()
                ),
            ))
        }
    }
    if let Some(class) = storage_class {
        disks::check_storage_class(class)
            .map_err(|m| bad(disks::PROP_ROOT_DISK_STORAGE_CLASS, m))?;
    }
    let has_disk = template
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .is_some_and(|vs| vs.iter().any(|v| !is_cloud_init_volume(v)));
    if has_disk {
        return Ok(false);
    }
    let mut storage = json!({"resources": {"requests": {"storage": size}}});
    if let Some(class) = storage_class {
        storage["storageClassName"] = json!(class);
    }
    let patch = json!({"spec": {
        "dataVolumeTemplates": [{"metadata": {"name": ROOT_DISK}, "spec": {
            "source": source,
            "storage": storage,
        }}],
        "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": ROOT_DISK, "disk": {"bus": "virtio"}, "bootOrder": 1}]}},
            "volumes": [{"name": ROOT_DISK, "dataVolume": {"name": ROOT_DISK}}],
        }},
    }});
    merge_into(template, &patch).map_err(|source| TemplateError::Merge {
        node_type: node_type.to_string(),
        source,
    })?;
    Ok(true)
}

fn is_cloud_init_volume(v: &Value) -> bool {
    v.get("cloudInitNoCloud").is_some()
        || v.get("cloudInitConfigDrive").is_some()
        || v.get("name").and_then(Value::as_str) == Some(CLOUD_INIT_VOLUME)
}

/// Step 4: the forced fields, applied to a copy of a type's template:
/// - `apiVersion`/`kind`, `metadata.name`/`namespace`, the identity labels on the VM,
///   on `spec.template.metadata` and on each DataVolume template;
/// - `spec.template.spec.hostname` = the VM name;
/// - `spec.runStrategy: Always` unless the template sets `runStrategy` or `running`;
/// - DataVolume template names prefixed with `<vm>-`, and the volumes using them renamed;
/// - any cloud-init volume of the template (and its disk) replaced by the `cloudinitdisk`
///   volume reading the Secret `<vm>-userdata`, with a virtio disk.
///
/// Returns the complete VirtualMachine object.
pub fn finalize_vm(
    template: &Value,
    id: &VmIdentity<'_>,
    node_type: &str,
) -> Result<Value, TemplateError> {
    let bad_name = |field: &str, message: String| TemplateError::BadName {
        node_type: node_type.to_string(),
        field: field.to_string(),
        message,
    };
    if !crate::names::is_dns_label(id.name) {
        return Err(bad_name(
            "metadata.name",
            format!(
                "VM name {:?} is not a DNS-1123 label of at most 63 characters",
                id.name
            ),
        ));
    }
    let not_object = |field: &str| TemplateError::NotAnObject {
        node_type: node_type.to_string(),
        field: field.to_string(),
    };
    let src = template
        .as_object()
        .ok_or_else(|| not_object("virtualMachineTemplate"))?;
    if src
        .get("spec")
        .and_then(Value::as_object)
        .is_some_and(|s| s.contains_key("running") && s.contains_key("runStrategy"))
    {
        return Err(TemplateError::RunningAndRunStrategy {
            node_type: node_type.to_string(),
        });
    }

    // metadata: the template's labels and annotations, nothing else.
    let mut metadata = Map::new();
    metadata.insert("name".into(), Value::String(id.name.to_string()));
    metadata.insert("namespace".into(), Value::String(id.namespace.to_string()));
    let mut labels = src
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (k, v) in id.labels {
        labels.insert(k.clone(), Value::String(v.clone()));
    }
    metadata.insert("labels".into(), Value::Object(labels));
    if let Some(annotations) = src
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .filter(|a| a.is_object())
    {
        metadata.insert("annotations".into(), annotations.clone());
    }

    let mut spec = match src.get("spec") {
        Some(Value::Object(s)) => s.clone(),
        Some(_) => return Err(not_object("spec")),
        None => Map::new(),
    };
    if !spec.contains_key("running") && !spec.contains_key("runStrategy") {
        spec.insert("runStrategy".into(), Value::String("Always".into()));
    }

    // DataVolume templates: prefix names, label them, remember the renames.
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    if let Some(dvts) = spec.get_mut("dataVolumeTemplates") {
        let dvts = dvts
            .as_array_mut()
            .ok_or_else(|| not_object("spec.dataVolumeTemplates (a list)"))?;
        for (i, dvt) in dvts.iter_mut().enumerate() {
            let field = format!("spec.dataVolumeTemplates[{i}].metadata.name");
            let meta = object_at(dvt, &["metadata"]).ok_or_else(|| not_object(&field))?;
            let old = meta
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad_name(&field, "missing".to_string()))?
                .to_string();
            let new = format!("{}-{old}", id.name);
            if new.len() > MAX_DNS_SUBDOMAIN {
                return Err(bad_name(
                    &field,
                    format!("{new:?} is longer than {MAX_DNS_SUBDOMAIN} characters"),
                ));
            }
            meta.insert("name".into(), Value::String(new.clone()));
            let dv_labels = meta
                .entry("labels")
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .ok_or_else(|| {
                    not_object(&format!("spec.dataVolumeTemplates[{i}].metadata.labels"))
                })?;
            for (k, v) in id.labels {
                dv_labels.insert(k.clone(), Value::String(v.clone()));
            }
            renamed.insert(old, new);
        }
    }

    // The VMI template.
    let vmi = spec
        .entry("template")
        .or_insert_with(|| Value::Object(Map::new()));
    let vmi_meta =
        object_at(vmi, &["metadata"]).ok_or_else(|| not_object("spec.template.metadata"))?;
    let vmi_labels = vmi_meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| not_object("spec.template.metadata.labels"))?;
    for (k, v) in id.labels {
        vmi_labels.insert(k.clone(), Value::String(v.clone()));
    }
    let vmi_spec = object_at(vmi, &["spec"]).ok_or_else(|| not_object("spec.template.spec"))?;
    vmi_spec.insert("hostname".into(), Value::String(id.name.to_string()));

    // Volumes: rename DataVolume users, drop cloud-init volumes, add ours.
    let volumes = vmi_spec
        .entry("volumes")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| not_object("spec.template.spec.volumes (a list)"))?;
    let mut dropped: Vec<String> = vec![CLOUD_INIT_VOLUME.to_string()];
    volumes.retain(|v| {
        if is_cloud_init_volume(v) {
            if let Some(n) = v.get("name").and_then(Value::as_str) {
                dropped.push(n.to_string());
            }
            false
        } else {
            true
        }
    });
    for v in volumes.iter_mut() {
        for (source, field) in [
            ("dataVolume", "name"),
            ("persistentVolumeClaim", "claimName"),
        ] {
            if let Some(slot) = v.get_mut(source).and_then(|s| s.get_mut(field)) {
                if let Some(new) = slot.as_str().and_then(|old| renamed.get(old)) {
                    *slot = Value::String(new.clone());
                }
            }
        }
    }
    volumes.push(serde_json::json!({
        "name": CLOUD_INIT_VOLUME,
        "cloudInitNoCloud": {"secretRef": {"name": user_data_secret_name(id.name)}}
    }));

    let devices = object_at(vmi, &["spec", "domain", "devices"])
        .ok_or_else(|| not_object("spec.template.spec.domain.devices"))?;
    let disks = devices
        .entry("disks")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| not_object("spec.template.spec.domain.devices.disks (a list)"))?;
    disks.retain(|d| {
        d.get("name")
            .and_then(Value::as_str)
            .is_none_or(|n| !dropped.iter().any(|x| x == n))
    });
    disks.push(serde_json::json!({"name": CLOUD_INIT_VOLUME, "disk": {"bus": "virtio"}}));

    let mut vm = Map::new();
    vm.insert("apiVersion".into(), Value::String(VM_API_VERSION.into()));
    vm.insert("kind".into(), Value::String(VM_KIND.into()));
    vm.insert("metadata".into(), Value::Object(metadata));
    vm.insert("spec".into(), Value::Object(spec));
    Ok(Value::Object(vm))
}

/// Runs the checks of step 4 (and those KubeVirt's admission makes on what it forces, such
/// as `running` together with `runStrategy`) on a type's template, with the longest VM name
/// a claim can get, so a template no claim could use is found when the type is evaluated.
pub fn check_vm_template(template: &Value, node_type: &str) -> Result<(), TemplateError> {
    let longest = "n".repeat(MAX_DNS_LABEL);
    let labels = managed_labels("check", "check", "check", "check");
    let id = VmIdentity {
        name: &longest,
        namespace: "check",
        labels: &labels,
    };
    finalize_vm(template, &id, node_type).map(|_| ())
}

/// The whole composition (steps 1–4) for one node type and one VM.
pub fn compose_vm(
    input: &TypeTemplateInput<'_>,
    id: &VmIdentity<'_>,
) -> Result<(Value, Vec<Taint>), TemplateError> {
    let t = compose_type_template(input)?;
    let vm = finalize_vm(&t.template, id, input.node_type)?;
    Ok((vm, t.taints))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    fn res(entries: &[(&str, &str)]) -> ResourceList {
        entries.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
    }

    fn yaml(s: &str) -> Value {
        crate::yaml::from_str(s).expect("test YAML parses")
    }

    fn advanced_base() -> Value {
        yaml(
            r#"
metadata:
  labels:
    provider: kubevirt
spec:
  dataVolumeTemplates:
    - metadata:
        name: containerdisk
      spec:
        source:
          registry:
            url: docker://quay.io/containerdisks/ubuntu:22.04
        pvc:
          accessModes: [ReadWriteOnce]
          resources:
            requests:
              storage: '20Gi'
  template:
    spec:
      domain:
        devices:
          disks:
            - name: containerdisk
              disk:
                bus: virtio
          interfaces:
            - name: default
              masquerade: {}
        resources:
          requests:
            cpu: "2"
            memory: "4Gi"
      networks:
        - name: default
          pod: {}
      volumes:
        - name: containerdisk
          dataVolume:
            name: containerdisk
"#,
        )
    }

    fn labels() -> BTreeMap<String, String> {
        managed_labels("claim-1", "tenant", "uid-1", "default")
    }

    fn id<'a>(labels: &'a BTreeMap<String, String>) -> VmIdentity<'a> {
        VmIdentity {
            name: "tenant-claim-1",
            namespace: "vcluster-platform",
            labels,
        }
    }

    /// Arbitrary JSON, with keys drawn from KubeVirt's merge-key paths so keyed lists are hit.
    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        let key = prop_oneof![
            Just("spec".to_string()),
            Just("template".to_string()),
            Just("domain".to_string()),
            Just("devices".to_string()),
            Just("disks".to_string()),
            Just("volumes".to_string()),
            Just("networks".to_string()),
            Just("dataVolumeTemplates".to_string()),
            Just("metadata".to_string()),
            Just("name".to_string()),
            Just("$patch".to_string()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop_oneof![Just("delete"), Just("replace"), Just("merge"), Just("a")]
                .prop_map(Value::from),
            "\\PC{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2000))]

        #[test]
        fn merging_arbitrary_json_never_panics(base in arb_json(), patch in arb_json()) {
            let _ = strategic_merge(&base, &patch);
            // The whole composition must not panic either.
            let r = ResourceList::new();
            let _ = compose_type_template(&TypeTemplateInput {
                node_type: "p.t", base: Some(&base), merge: Some(&patch), replacement: None, resources: &r,
            });
            let l = labels();
            let _ = finalize_vm(&patch, &id(&l), "p.t");
            let _ = effective_resources("p.t", &r, &base);
        }

        #[test]
        fn merging_arbitrary_elements_into_keyed_lists_never_panics(
            items in proptest::collection::vec(
                proptest::prop_oneof![
                    arb_json(),
                    (proptest::prop_oneof![proptest::strategy::Just("containerdisk"), proptest::strategy::Just("default"), proptest::strategy::Just("x")], arb_json())
                        .prop_map(|(n, v)| json!({"name": n, "metadata": {"name": n}, "v": v})),
                    proptest::prop_oneof![proptest::strategy::Just("containerdisk"), proptest::strategy::Just("x")]
                        .prop_map(|n| json!({"name": n, "$patch": "delete"})),
                ],
                0..6,
            )
        ) {
            let base = advanced_base();
            let list = Value::Array(items);
            for patch in [
                json!({"spec": {"template": {"spec": {"volumes": list.clone(), "networks": list.clone()}}}}),
                json!({"spec": {"dataVolumeTemplates": list.clone()}}),
                json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": list.clone(), "interfaces": list.clone()}}}}}}),
            ] {
                if let Ok(merged) = strategic_merge(&base, &patch) {
                    let l = labels();
                    let _ = finalize_vm(&merged, &id(&l), "p.t");
                    let _ = effective_resources("p.t", &ResourceList::new(), &merged);
                }
            }
        }

        #[test]
        fn merging_a_template_with_an_empty_patch_is_the_identity(base in arb_json()) {
            let template = json!({"spec": base});
            proptest::prop_assert_eq!(strategic_merge(&template, &json!({})).ok(), Some(template.clone()));
            if base.is_object() {
                proptest::prop_assert_eq!(strategic_merge(&base, &json!({})).ok(), Some(base.clone()));
            }
        }
    }

    #[test]
    fn merge_keeps_base_disks_and_adds_new_ones_by_name() {
        let base = advanced_base();
        let patch = yaml(
            r#"
spec:
  template:
    spec:
      domain:
        devices:
          disks:
            - name: containerdisk
              bootOrder: 1
            - name: scratch
              disk: {bus: sata}
"#,
        );
        let out = strategic_merge(&base, &patch).expect("merges");
        let disks = &out["spec"]["template"]["spec"]["domain"]["devices"]["disks"];
        assert_eq!(
            disks,
            &json!([
                {"name": "containerdisk", "disk": {"bus": "virtio"}, "bootOrder": 1},
                {"name": "scratch", "disk": {"bus": "sata"}}
            ])
        );
        // Interfaces untouched.
        assert_eq!(
            out["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}}])
        );
    }

    #[test]
    fn merge_by_key_covers_interfaces_networks_volumes_and_data_volume_templates() {
        let base = advanced_base();
        let patch = yaml(
            r#"
spec:
  dataVolumeTemplates:
    - metadata: {name: containerdisk}
      spec:
        source:
          registry: {url: docker://quay.io/containerdisks/fedora:40}
    - metadata: {name: data}
      spec: {pvc: {accessModes: [ReadWriteOnce]}}
  template:
    spec:
      domain:
        devices:
          interfaces:
            - name: secondary
              bridge: {}
      networks:
        - name: secondary
          multus: {networkName: vlan10}
      volumes:
        - name: data
          dataVolume: {name: data}
"#,
        );
        let out = strategic_merge(&base, &patch).expect("merges");
        let dvts = out["spec"]["dataVolumeTemplates"].as_array().expect("list");
        assert_eq!(dvts.len(), 2);
        assert_eq!(
            dvts[0]["spec"]["source"]["registry"]["url"],
            "docker://quay.io/containerdisks/fedora:40"
        );
        // The pvc of the base element is kept (maps merge inside a keyed element).
        assert_eq!(
            dvts[0]["spec"]["pvc"]["resources"]["requests"]["storage"],
            "20Gi"
        );
        assert_eq!(dvts[1]["metadata"]["name"], "data");
        let vmi = &out["spec"]["template"]["spec"];
        assert_eq!(
            vmi["domain"]["devices"]["interfaces"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(vmi["networks"].as_array().map(Vec::len), Some(2));
        assert_eq!(vmi["volumes"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn plain_lists_are_replaced_not_merged() {
        let base = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "d"},
            "spec": {"pvc": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}}}]}});
        let patch = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "d"},
            "spec": {"pvc": {"accessModes": ["ReadWriteMany"]}}}]}});
        let out = strategic_merge(&base, &patch).expect("merges");
        assert_eq!(
            out["spec"]["dataVolumeTemplates"][0]["spec"]["pvc"]["accessModes"],
            json!(["ReadWriteMany"])
        );
        let base =
            json!({"spec": {"template": {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}}});
        let patch = json!({"spec": {"template": {"spec": {"tolerations": [{"key": "c"}]}}}});
        let out = strategic_merge(&base, &patch).expect("merges");
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "c"}])
        );
    }

    #[test]
    fn null_in_the_patch_deletes_the_key() {
        let base = advanced_base();
        let patch = json!({"metadata": {"labels": {"provider": null}},
                           "spec": {"template": {"spec": {"networks": null}}}});
        let out = strategic_merge(&base, &patch).expect("merges");
        assert_eq!(out["metadata"]["labels"], json!({}));
        assert!(out["spec"]["template"]["spec"].get("networks").is_none());
        // Nulls inside newly added content are dropped, not stored.
        let out = strategic_merge(&json!({}), &json!({"a": {"b": null, "c": 1}})).expect("merges");
        assert_eq!(out, json!({"a": {"c": 1}}));
    }

    #[test]
    fn patch_delete_directive_removes_a_keyed_list_element() {
        let base = advanced_base();
        let patch = json!({"spec": {"template": {"spec": {"domain": {"devices": {
            "interfaces": [{"name": "default", "$patch": "delete"}]}}}}}});
        let out = strategic_merge(&base, &patch).expect("merges");
        assert_eq!(
            out["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"],
            json!([])
        );
    }

    #[test]
    fn patch_replace_directive_replaces_an_object_instead_of_merging() {
        let base = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2, "model": "host-model"}}}}}});
        let patch = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"$patch": "replace", "cores": 4}}}}}});
        let out = strategic_merge(&base, &patch).expect("merges");
        assert_eq!(
            out["spec"]["template"]["spec"]["domain"]["cpu"],
            json!({"cores": 4})
        );
    }

    #[test]
    fn keyed_list_elements_without_their_key_are_an_error_naming_the_path() {
        let base = advanced_base();
        let patch = json!({"spec": {"template": {"spec": {"volumes": [{"containerDisk": {}}]}}}});
        let e = strategic_merge(&base, &patch).expect_err("no key");
        assert_eq!(
            e.to_string(),
            "spec.template.spec.volumes[0]: element has no merge key name"
        );
        let patch = json!({"spec": {"dataVolumeTemplates": ["x"]}});
        let e = strategic_merge(&base, &patch).expect_err("not an object");
        assert!(e.to_string().contains("spec.dataVolumeTemplates[0]"), "{e}");
    }

    #[test]
    fn unknown_patch_directives_are_rejected() {
        let e = strategic_merge(&json!({"a": {}}), &json!({"a": {"$patch": "explode"}}))
            .expect_err("bad directive");
        assert!(e.to_string().contains("explode"), "{e}");
    }

    #[test]
    fn an_empty_patch_is_the_identity() {
        let base = advanced_base();
        assert_eq!(strategic_merge(&base, &json!({})).expect("merges"), base);
    }

    #[test]
    fn both_template_fields_are_an_error_naming_the_node_type() {
        let base = advanced_base();
        let r = ResourceList::new();
        let e = compose_type_template(&TypeTemplateInput {
            node_type: "prov.both",
            base: Some(&base),
            merge: Some(&json!({})),
            replacement: Some(&json!({"spec": {}})),
            resources: &r,
        })
        .expect_err("both set");
        assert_eq!(
            e,
            TemplateError::BothTemplates {
                node_type: "prov.both".into()
            }
        );
        assert!(e.to_string().contains("prov.both"));
    }

    #[test]
    fn a_type_without_any_template_is_an_error() {
        let r = ResourceList::new();
        let e = compose_type_template(&TypeTemplateInput {
            node_type: "p.t",
            base: None,
            merge: None,
            replacement: None,
            resources: &r,
        })
        .expect_err("no template");
        assert!(matches!(e, TemplateError::NoTemplate { .. }));
    }

    #[test]
    fn high_memory_merge_adds_the_label_keeps_the_base_one_and_extracts_the_taint() {
        let base = advanced_base();
        let patch = yaml(
            r#"
metadata:
  labels:
    workload: memory-intensive
spec:
  template:
    spec:
      taints:
        - key: "workload"
          value: "high-memory"
          effect: "NoSchedule"
"#,
        );
        let r = res(&[("cpu", "4"), ("memory", "16Gi")]);
        let t = compose_type_template(&TypeTemplateInput {
            node_type: "kubevirt-provider-advanced.high-memory-node",
            base: Some(&base),
            merge: Some(&patch),
            replacement: None,
            resources: &r,
        })
        .expect("composes");
        assert_eq!(
            t.template["metadata"]["labels"],
            json!({"provider": "kubevirt", "workload": "memory-intensive"})
        );
        assert_eq!(t.taints.len(), 1);
        assert_eq!(t.taints[0].key, "workload");
        assert_eq!(t.taints[0].value.as_deref(), Some("high-memory"));
        assert_eq!(t.taints[0].effect, "NoSchedule");
        assert!(t.template["spec"]["template"]["spec"]
            .get("taints")
            .is_none());
        assert_eq!(
            t.template["spec"]["template"]["spec"]["domain"]["resources"]["requests"],
            json!({"cpu": "4", "memory": "16Gi"})
        );
    }

    #[test]
    fn a_replacement_template_ignores_the_base_entirely() {
        let base = json!({"metadata": {"labels": {"foo": "bar"}}, "spec": {"template": {"spec": {
            "domain": {"resources": {"requests": {"memory": "2Gi"}}}}}}});
        let replacement = json!({"metadata": {"labels": {"foo": "baz"}}, "spec": {"template": {"spec": {
            "domain": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}}}}});
        let r = ResourceList::new();
        let t = compose_type_template(&TypeTemplateInput {
            node_type: "p.replace",
            base: Some(&base),
            merge: None,
            replacement: Some(&replacement),
            resources: &r,
        })
        .expect("composes");
        assert_eq!(t.template, replacement);
        assert_eq!(t.template["metadata"]["labels"]["foo"], "baz");
    }

    #[test]
    fn type_resources_go_into_requests_and_into_limits_only_where_the_template_limits() {
        let mut t = json!({"spec": {"template": {"spec": {"domain": {"resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}}}}});
        apply_resources(&mut t, &res(&[("cpu", "4"), ("memory", "5Gi")]), "p.t").expect("applies");
        let r = &t["spec"]["template"]["spec"]["domain"]["resources"];
        assert_eq!(r["requests"], json!({"cpu": "4", "memory": "5Gi"}));
        assert_eq!(r["limits"], json!({"memory": "5Gi"}));
    }

    #[test]
    fn type_resources_also_set_an_explicit_guest_topology_and_guest_memory() {
        let mut t = json!({"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 1, "sockets": 2, "model": "host-model"},
            "memory": {"guest": "2Gi"}}}}}});
        apply_resources(&mut t, &res(&[("cpu", "8"), ("memory", "32Gi")]), "p.t").expect("applies");
        let d = &t["spec"]["template"]["spec"]["domain"];
        assert_eq!(
            d["cpu"],
            json!({"cores": 8, "sockets": 1, "threads": 1, "model": "host-model"})
        );
        assert_eq!(d["memory"]["guest"], "32Gi");
    }

    #[test]
    fn resources_into_a_template_without_a_domain_create_it() {
        let mut t = json!({"spec": {}});
        apply_resources(&mut t, &res(&[("cpu", "2")]), "p.t").expect("applies");
        assert_eq!(
            t["spec"]["template"]["spec"]["domain"]["resources"]["requests"]["cpu"],
            "2"
        );
        let mut bad = json!({"spec": {"template": {"spec": {"domain": "x"}}}});
        let e = apply_resources(&mut bad, &res(&[("cpu", "2")]), "p.t").expect_err("not an object");
        assert!(e.to_string().contains("spec.template.spec.domain"), "{e}");
    }

    #[test]
    fn effective_resources_come_from_the_spec_first() {
        let t = advanced_base();
        let r = effective_resources("p.t", &res(&[("cpu", "4"), ("memory", "16Gi")]), &t)
            .expect("found");
        assert_eq!(r, res(&[("cpu", "4"), ("memory", "16Gi")]));
    }

    #[test]
    fn effective_resources_are_discovered_from_requests() {
        let r = effective_resources("p.t", &ResourceList::new(), &advanced_base()).expect("found");
        assert_eq!(r, res(&[("cpu", "2"), ("memory", "4Gi")]));
    }

    #[test]
    fn effective_cpu_is_cores_times_sockets_times_threads_and_memory_the_guest_memory() {
        let t = json!({"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 2, "sockets": 2, "threads": 2},
            "memory": {"guest": "6Gi"},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}}}}});
        let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
        assert_eq!(r, res(&[("cpu", "8"), ("memory", "6Gi")]));
        // Missing topology parts count as 1.
        let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 3},
            "resources": {"requests": {"memory": 1073741824}}}}}}});
        let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
        assert_eq!(r, res(&[("cpu", "3"), ("memory", "1073741824")]));
    }

    #[test]
    fn a_spec_with_only_cpu_still_discovers_memory_from_the_template() {
        let r = effective_resources("p.t", &res(&[("cpu", "8")]), &advanced_base()).expect("found");
        assert_eq!(r, res(&[("cpu", "8"), ("memory", "4Gi")]));
    }

    #[test]
    fn a_template_without_memory_is_an_error_not_a_panic() {
        let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}});
        let e = effective_resources("prov.nomem", &ResourceList::new(), &t).expect_err("no memory");
        assert_eq!(
            e,
            TemplateError::MemoryNotFound {
                node_type: "prov.nomem".into()
            }
        );
        assert!(e.to_string().contains("memory is not set"));
        // Even with no domain at all.
        assert!(effective_resources("p.t", &ResourceList::new(), &json!({})).is_err());
    }

    #[test]
    fn a_template_without_cpu_gets_one_vcpu() {
        let t = json!({"spec": {"template": {"spec": {"domain": {"memory": {"guest": "1Gi"}}}}}});
        let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
        assert_eq!(r["cpu"], q("1"));
    }

    #[test]
    fn invalid_template_quantities_and_topologies_name_the_field() {
        let t = json!({"spec": {"template": {"spec": {"domain": {"resources": {"requests": {"memory": "lots"}}}}}}});
        let e = effective_resources("p.t", &ResourceList::new(), &t).expect_err("bad");
        assert!(
            e.to_string()
                .contains("spec.template.spec.domain.resources.requests.memory"),
            "{e}"
        );
        let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": "two"}}}}}});
        let e = effective_resources("p.t", &ResourceList::new(), &t).expect_err("bad");
        assert!(e.to_string().contains("domain.cpu.cores"), "{e}");
    }

    #[test]
    fn finalize_forces_name_namespace_labels_hostname_and_run_strategy() {
        let l = labels();
        let vm = finalize_vm(&advanced_base(), &id(&l), "p.t").expect("finalizes");
        assert_eq!(vm["apiVersion"], "kubevirt.io/v1");
        assert_eq!(vm["kind"], "VirtualMachine");
        assert_eq!(vm["metadata"]["name"], "tenant-claim-1");
        assert_eq!(vm["metadata"]["namespace"], "vcluster-platform");
        let expect_labels = json!({
            "provider": "kubevirt",
            "app.kubernetes.io/managed-by": "autonodes",
            "autonodes.io/installation": "default",
            "autonodes.io/nodeclaim": "claim-1",
            "autonodes.io/nodeclaim-namespace": "tenant",
            "autonodes.io/nodeclaim-uid": "uid-1",
        });
        assert_eq!(vm["metadata"]["labels"], expect_labels);
        for (k, v) in &l {
            assert_eq!(vm["spec"]["template"]["metadata"]["labels"][k], json!(v));
        }
        assert_eq!(vm["spec"]["template"]["spec"]["hostname"], "tenant-claim-1");
        assert_eq!(vm["spec"]["runStrategy"], "Always");
    }

    #[test]
    fn a_template_run_strategy_or_running_is_kept() {
        let l = labels();
        let mut t = advanced_base();
        t["spec"]["runStrategy"] = json!("RerunOnFailure");
        let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        assert_eq!(vm["spec"]["runStrategy"], "RerunOnFailure");
        let mut t = advanced_base();
        t["spec"]["running"] = json!(true);
        let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        assert_eq!(vm["spec"]["running"], true);
        assert!(vm["spec"].get("runStrategy").is_none());
        t["spec"]["runStrategy"] = json!("Always");
        let e = finalize_vm(&t, &id(&l), "p.both").expect_err("both");
        assert!(e.to_string().contains("p.both"));
    }

    #[test]
    fn an_image_url_gives_a_template_without_a_disk_a_data_volume_root_disk_and_leaves_others_alone(
    ) {
        let mut bare = yaml("spec:\n  template:\n    spec:\n      domain:\n        resources: {requests: {memory: 1Gi}}\n      volumes:\n      - name: cloudinitdisk\n        cloudInitNoCloud: {userData: x}\n");
        let added = add_root_disk(
            &mut bare,
            "docker://quay.io/containerdisks/ubuntu:22.04",
            Some("15Gi"),
            None,
            "p.t",
        )
        .expect("adds");
        assert!(added);
        assert_eq!(
            bare["spec"]["dataVolumeTemplates"][0],
            json!({"metadata": {"name": ROOT_DISK}, "spec": {
                "source": {"registry": {"url": "docker://quay.io/containerdisks/ubuntu:22.04"}},
                "storage": {"resources": {"requests": {"storage": "15Gi"}}}}})
        );
        let volumes = bare["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        assert!(volumes
            .iter()
            .any(|v| v == &json!({"name": ROOT_DISK, "dataVolume": {"name": ROOT_DISK}})));
        assert_eq!(
            bare["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["name"],
            ROOT_DISK
        );
        // Over HTTP, with the default size.
        let mut http = json!({"spec": {"template": {"spec": {}}}});
        assert!(add_root_disk(
            &mut http,
            "https://images.example.com/jammy.qcow2",
            None,
            Some("fast-ssd"),
            "p.t"
        )
        .expect("adds"));
        assert_eq!(
            http["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["http"]["url"],
            "https://images.example.com/jammy.qcow2"
        );
        assert_eq!(
            http["spec"]["dataVolumeTemplates"][0]["spec"]["storage"]["resources"]["requests"]
                ["storage"],
            DEFAULT_ROOT_DISK_SIZE
        );
        assert_eq!(
            http["spec"]["dataVolumeTemplates"][0]["spec"]["storage"]["storageClassName"],
            "fast-ssd"
        );
        // A template with a disk keeps it.
        let mut advanced = advanced_base();
        let before = advanced.clone();
        assert!(
            !add_root_disk(&mut advanced, "docker://x/y", Some("10Gi"), None, "p.t")
                .expect("reads")
        );
        assert_eq!(advanced, before);
        // What cannot be used is an error naming the property.
        for (url, size, class, says) in [
            ("ftp://x/y", None, None, "image-url"),
            ("docker://x y", None, None, "image-url"),
            ("docker://x/y", Some("big"), None, "root-disk-size"),
            ("docker://x/y", Some("0"), None, "root-disk-size"),
            (
                "docker://x/y",
                None,
                Some("Fast SSD"),
                "root-disk-storage-class",
            ),
        ] {
            let e = add_root_disk(&mut json!({}), url, size, class, "p.t").expect_err("refused");
            assert!(e.to_string().contains(says), "{url} {size:?}: {e}");
        }
    }

    #[test]
    fn data_volume_names_are_prefixed_with_the_vm_name_and_volumes_follow() {
        let l = labels();
        let mut t = advanced_base();
        t["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .expect("list")
            .push(json!({"name": "pvc", "persistentVolumeClaim": {"claimName": "containerdisk"}}));
        let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
            "tenant-claim-1-containerdisk"
        );
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["labels"]["autonodes.io/nodeclaim"],
            "claim-1"
        );
        let vols = &vm["spec"]["template"]["spec"]["volumes"];
        assert_eq!(
            vols[0]["dataVolume"]["name"],
            "tenant-claim-1-containerdisk"
        );
        assert_eq!(
            vols[1]["persistentVolumeClaim"]["claimName"],
            "tenant-claim-1-containerdisk"
        );
        // The base volume name itself (what the disk refers to) is unchanged.
        assert_eq!(vols[0]["name"], "containerdisk");
    }

    #[test]
    fn the_cloudinitdisk_volume_and_disk_replace_any_template_cloud_init() {
        let l = labels();
        let mut t = advanced_base();
        let spec = &mut t["spec"]["template"]["spec"];
        spec["volumes"]
            .as_array_mut()
            .expect("list")
            .push(json!({"name": "seed", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}));
        spec["volumes"]
            .as_array_mut()
            .expect("list")
            .push(json!({"name": "cfg", "cloudInitConfigDrive": {"userData": "x"}}));
        let disks = spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .expect("list");
        disks.push(json!({"name": "seed", "disk": {"bus": "sata"}}));
        disks.push(json!({"name": "cfg", "cdrom": {}}));
        let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        let vmi = &vm["spec"]["template"]["spec"];
        assert_eq!(
            vmi["volumes"],
            json!([
                {"name": "containerdisk", "dataVolume": {"name": "tenant-claim-1-containerdisk"}},
                {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "tenant-claim-1-userdata"}}}
            ])
        );
        assert_eq!(
            vmi["domain"]["devices"]["disks"],
            json!([
                {"name": "containerdisk", "disk": {"bus": "virtio"}},
                {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}
            ])
        );
        assert_eq!(
            vmi["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}}])
        );
    }

    #[test]
    fn finalize_is_deterministic_and_idempotent_on_its_template() {
        let l = labels();
        let t = advanced_base();
        let a = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        let b = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
        assert_eq!(a, b);
        assert_eq!(t, advanced_base(), "the template is not modified");
    }

    #[test]
    fn finalize_rejects_a_vm_name_that_is_not_a_dns_label() {
        let l = labels();
        for bad in ["Upper", "with.dot", "", "-lead", &"a".repeat(64)] {
            let vm = VmIdentity {
                name: bad,
                namespace: "ns",
                labels: &l,
            };
            assert!(finalize_vm(&advanced_base(), &vm, "p.t").is_err(), "{bad}");
        }
    }

    #[test]
    fn vm_names_are_dns_labels_without_dots_and_stable() {
        let plain = vm_name_for_claim("tenant", "high-memory-1", "u");
        assert!(plain.starts_with("tenant-high-memory-1-"), "{plain}");
        assert_eq!(plain.len(), "tenant-high-memory-1-".len() + 6);
        assert_eq!(plain, vm_name_for_claim("tenant", "high-memory-1", "u"));
        let dotted = vm_name_for_claim("team.a", "Node_1", "u");
        assert!(crate::names::is_dns_label(&dotted), "{dotted}");
        assert!(!dotted.contains('.'));
        assert_ne!(
            vm_name_for_claim("team-a", "node-1", "u"),
            vm_name_for_claim("team", "a-node-1", "u"),
            "namespace/name splits that read the same get different names"
        );
        assert_ne!(
            vm_name_for_claim("t", "n", "uid-1"),
            vm_name_for_claim("t", "n", "uid-2"),
            "a recreated claim gets a new VM name"
        );
        let long = vm_name_for_claim(&"n".repeat(63), &"c".repeat(63), "uid");
        assert!(crate::names::is_dns_label(&long), "{long}");
        assert_eq!(long.len(), 63);
        assert!(crate::names::is_dns_label(&vm_name_for_claim(
            "---", "...", "u"
        )));
    }

    #[test]
    fn malformed_template_taints_are_an_error_naming_the_type() {
        let mut t = json!({"spec": {"template": {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}}}});
        let e = take_taints(&mut t, "p.bad").expect_err("bad effect");
        assert!(
            e.to_string().contains("p.bad") && e.to_string().contains("Sometimes"),
            "{e}"
        );
        let mut t = json!({"spec": {"template": {"spec": {"taints": "nope"}}}});
        assert!(take_taints(&mut t, "p.bad").is_err());
    }
}
