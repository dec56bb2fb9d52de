//! Composing the KubeVirt VirtualMachine of a node. Pure code, no I/O.
//!
//! The order is fixed and deterministic:
//! 1. the provider's base template, or the node type's replacement `virtualMachineTemplate`;
//! 2. the node type's `mergeVirtualMachineTemplate`, as a strategic merge ([`merge::strategic_merge`]);
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
pub mod error;
pub mod golden;
pub mod instancetype;
pub mod merge;
pub mod names;
pub mod networks;
pub mod placement;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Map, Value};

use crate::resources::{self, QuantityError, CPU, MEMORY};
use crate::template::error::TemplateError;
use crate::template::merge::merge_into;
use crate::template::names::{
    managed_labels, user_data_secret_name, VmIdentity, CLOUD_INIT_VOLUME, DEFAULT_ROOT_DISK_SIZE,
    MAX_DNS_LABEL, MAX_DNS_SUBDOMAIN, ROOT_DISK, VM_API_VERSION, VM_KIND,
};
use autonodes_api::ResourceList;

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
pub(crate) struct TypeTemplate {
    /// The template (`metadata` + `spec`) after merge and resources.
    pub template: Value,
    /// The taints found in `spec.template.spec.taints`.
    pub taints: Vec<Taint>,
}

/// Steps 1–3 of the composition for one node type: pick the base or replacement template,
/// strategic-merge `mergeVirtualMachineTemplate`, write `resources` into the domain, and
/// take `spec.template.spec.taints` out of the template (returned as node taints).
pub(crate) fn compose_type_template(
    input: &TypeTemplateInput<'_>,
) -> Result<TypeTemplate, TemplateError> {
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
pub(crate) fn take_taints(
    template: &mut Value,
    node_type: &str,
) -> Result<Vec<Taint>, TemplateError> {
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
/// schema (`autonodes_api::schema::taints`) admits exactly these.
pub(crate) fn check_taint(t: &Taint) -> Result<(), String> {
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

/// Step 3: writes the type's resources into `spec.template.spec.domain.resources.requests`,
/// and into `limits` for each resource the template already limits. When the template
/// fixes the guest topology (`domain.cpu`) or `domain.memory.guest`, those follow the
/// type's cpu (as `cores`, one socket, one thread) and memory, so the guest sees what the
/// type promises.
pub(crate) fn apply_resources(
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
pub(crate) fn effective_resources(
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

/// Gives a template without a root disk (no volume but cloud-init) one: a DataVolume
/// template importing `image_url` (`docker://…` from a registry, `http(s)://…` over HTTP)
/// into `size` of storage (of `storage_class`, else the host's default class), its volume
/// and a virtio disk, as vCluster's KubeVirt properties `kubevirt.vcluster.com/image-url`
/// and `root-disk-size` (and autonodes' `autonodes.io/root-disk-storage-class`) ask. A
/// template that has a disk already is left alone (`Ok(false)`). An image URL, size or
/// storage class autonodes cannot use is an error naming the property.
pub(crate) fn add_root_disk(
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
            crate::properties::PROP_IMAGE_URL,
            "not a docker://, https:// or http:// URL".to_string(),
        ));
    };
    if image_url.len() > 2048 || image_url.chars().any(char::is_whitespace) {
        return Err(bad(
            crate::properties::PROP_IMAGE_URL,
            "longer than 2048 characters or with blanks".to_string(),
        ));
    }
    let size = size.unwrap_or(DEFAULT_ROOT_DISK_SIZE).trim();
    match crate::resources::parse_quantity(size) {
        Ok(bytes) if bytes > 0 => {}
        _ => {
            return Err(bad(
                crate::properties::PROP_ROOT_DISK_SIZE,
                format!(
                    "{:?} is not a positive quantity such as 20Gi",
                    size.chars().take(64).collect::<String>()
                ),
            ))
        }
    }
    if let Some(class) = storage_class {
        disks::check_storage_class(class)
            .map_err(|m| bad(crate::properties::PROP_ROOT_DISK_STORAGE_CLASS, m))?;
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

/// The first network interface of a VM template (`domain.devices.interfaces[0]`): the one a
/// static address goes to.
pub fn first_interface(vm: &Value) -> Option<&Map<String, Value>> {
    vm.pointer("/spec/template/spec/domain/devices/interfaces/0")?
        .as_object()
}

/// Points the cloud-init volume of a finished VM (see [`finalize_vm`]) at network data
/// (key `networkdata` of its user-data Secret, which KubeVirt hands the guest as the
/// NoCloud `network-config`), and gives its first interface the MAC address `mac` the
/// network data matches.
pub fn use_network_data(
    vm: &mut Value,
    vm_name: &str,
    mac: &str,
    node_type: &str,
) -> Result<(), TemplateError> {
    let not_object = |field: &str| TemplateError::NotAnObject {
        node_type: node_type.to_string(),
        field: field.to_string(),
    };
    vm.pointer_mut("/spec/template/spec/domain/devices/interfaces/0")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_object("spec.template.spec.domain.devices.interfaces[0]"))?
        .insert("macAddress".into(), Value::String(mac.to_string()));
    let volumes = vm
        .pointer_mut("/spec/template/spec/volumes")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| not_object("spec.template.spec.volumes (a list)"))?;
    let volume = volumes
        .iter_mut()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(CLOUD_INIT_VOLUME))
        .and_then(|v| v.get_mut("cloudInitNoCloud"))
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_object("the cloud-init volume"))?;
    volume.insert(
        "networkDataSecretRef".into(),
        serde_json::json!({"name": user_data_secret_name(vm_name)}),
    );
    Ok(())
}

/// Runs the checks of step 4 (and those KubeVirt's admission makes on what it forces, such
/// as `running` together with `runStrategy`) on a type's template, with the longest VM name
/// a claim can get, so a template no claim could use is found when the type is evaluated.
pub(crate) fn check_vm_template(template: &Value, node_type: &str) -> Result<(), TemplateError> {
    let longest = "n".repeat(MAX_DNS_LABEL);
    let labels = managed_labels("check", "check", "check", "check");
    let id = VmIdentity {
        name: &longest,
        namespace: "check",
        labels: &labels,
    };
    finalize_vm(template, &id, node_type).map(|_| ())
}

#[cfg(test)]
mod tests;
