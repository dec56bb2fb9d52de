//! KubeVirt instance types and preferences: a node type may name a
//! `VirtualMachineClusterInstancetype` (or a `VirtualMachineInstancetype` in the provider's
//! VM namespace) and a preference instead of giving resources. Its VMs then carry
//! `spec.instancetype` / `spec.preference` and no CPU or memory of their own (KubeVirt
//! refuses a VM that sets what its instance type sets); scheduling and cost count the
//! instance type's `spec.cpu.guest` and `spec.memory.guest`, which the controller reads
//! from the host. Pure code, no I/O.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Value};

use super::error::TemplateError;
use crate::names::is_dns_subdomain;
use crate::properties::PROP_INSTANCETYPE;
use crate::resources::{parse_quantity, CPU, MEMORY};
use autonodes_api::ResourceList;

/// The cluster-scoped instance type kind.
pub const CLUSTER_INSTANCETYPE: &str = "VirtualMachineClusterInstancetype";
/// The namespaced instance type kind.
pub(crate) const NAMESPACED_INSTANCETYPE: &str = "VirtualMachineInstancetype";
/// The cluster-scoped preference kind.
pub(crate) const CLUSTER_PREFERENCE: &str = "VirtualMachineClusterPreference";
/// The namespaced preference kind.
pub(crate) const NAMESPACED_PREFERENCE: &str = "VirtualMachinePreference";

/// A reference to an instance type or preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// The kind (one of the four above).
    pub kind: String,
    /// The object's name.
    pub name: String,
}

impl Matcher {
    /// Whether the kind is cluster-scoped (else it lives in the VM's namespace).
    pub fn is_cluster_scoped(&self) -> bool {
        self.kind == CLUSTER_INSTANCETYPE || self.kind == CLUSTER_PREFERENCE
    }
}

fn parse(value: &str, cluster: &str, namespaced: &str) -> Result<Matcher, String> {
    let value = value.trim();
    let (kind, name) = match value.split_once('/') {
        Some((kind, name)) => (kind, name),
        None => (cluster, value),
    };
    if kind != cluster && kind != namespaced {
        return Err(format!(
            "the kind {:?} is neither {cluster} nor {namespaced}",
            kind.chars().take(64).collect::<String>()
        ));
    }
    if !is_dns_subdomain(name, 253) {
        return Err(format!(
            "{:?} is not a DNS-1123 subdomain",
            name.chars().take(64).collect::<String>()
        ));
    }
    Ok(Matcher {
        kind: kind.to_string(),
        name: name.to_string(),
    })
}

/// Reads [`PROP_INSTANCETYPE`].
pub(crate) fn parse_instancetype(value: &str) -> Result<Matcher, String> {
    parse(value, CLUSTER_INSTANCETYPE, NAMESPACED_INSTANCETYPE)
}

/// Reads [`crate::properties::PROP_PREFERENCE`].
pub(crate) fn parse_preference(value: &str) -> Result<Matcher, String> {
    parse(value, CLUSTER_PREFERENCE, NAMESPACED_PREFERENCE)
}

/// Points a type's template at its instance type and preference (either may be absent)
/// and, with an instance type, takes out what it sets: `domain.cpu`, `domain.memory` and
/// the cpu and memory of `domain.resources` (requests and limits).
pub(crate) fn use_instancetype(
    template: &mut Value,
    instancetype: Option<&Matcher>,
    preference: Option<&Matcher>,
) {
    if let Some(spec) = template.get_mut("spec").and_then(Value::as_object_mut) {
        for (field, matcher) in [("instancetype", instancetype), ("preference", preference)] {
            if let Some(m) = matcher {
                spec.insert(field.to_string(), json!({"kind": m.kind, "name": m.name}));
            }
        }
    }
    if instancetype.is_none() {
        return;
    }
    if let Some(domain) = template
        .pointer_mut("/spec/template/spec/domain")
        .and_then(Value::as_object_mut)
    {
        domain.remove("cpu");
        domain.remove("memory");
        if let Some(resources) = domain.get_mut("resources").and_then(Value::as_object_mut) {
            for list in ["requests", "limits"] {
                if let Some(l) = resources.get_mut(list).and_then(Value::as_object_mut) {
                    l.remove(CPU);
                    l.remove(MEMORY);
                    if l.is_empty() {
                        resources.remove(list);
                    }
                }
            }
            if resources.is_empty() {
                domain.remove("resources");
            }
        }
    }
}

/// The CPU and memory of an instance type object (its `spec.cpu.guest` vCPUs and
/// `spec.memory.guest`), as the resources scheduling and cost count.
pub fn instancetype_resources(object: &Value) -> Result<ResourceList, String> {
    let cpu = object
        .pointer("/spec/cpu/guest")
        .and_then(Value::as_i64)
        .filter(|n| *n > 0)
        .ok_or("spec.cpu.guest is not a positive number of vCPUs")?;
    let memory = object
        .pointer("/spec/memory/guest")
        .and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .filter(|m| matches!(parse_quantity(m), Ok(q) if q > 0))
        .ok_or("spec.memory.guest is not a positive quantity")?;
    Ok(ResourceList::from([
        (CPU.to_string(), Quantity(cpu.to_string())),
        (MEMORY.to_string(), Quantity(memory)),
    ]))
}

/// The error of a type that names an instance type and also gives resources: those would
/// be written into the VM, which KubeVirt refuses with an instance type.
pub(crate) fn check_no_own_resources(
    spec_resources: &ResourceList,
    node_type: &str,
) -> Result<(), TemplateError> {
    let own: Vec<&str> = spec_resources
        .keys()
        .map(String::as_str)
        .filter(|k| *k == CPU || *k == MEMORY)
        .collect();
    if own.is_empty() {
        Ok(())
    } else {
        Err(TemplateError::property(
            node_type,
            PROP_INSTANCETYPE,
            format!(
                "the type also sets resources {}; an instance type sets cpu and memory itself",
                own.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_read_the_kind_or_default_to_the_cluster_scoped_one() {
        assert_eq!(
            parse_instancetype("u1.medium").expect("ok"),
            Matcher {
                kind: CLUSTER_INSTANCETYPE.into(),
                name: "u1.medium".into()
            }
        );
        let m = parse_instancetype("VirtualMachineInstancetype/small").expect("ok");
        assert!(!m.is_cluster_scoped());
        assert_eq!(
            parse_preference("ubuntu").expect("ok").kind,
            CLUSTER_PREFERENCE
        );
        for bad in ["Pod/x", "VirtualMachinePreference/x", "Bad Name", ""] {
            assert!(parse_instancetype(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_template_with_an_instancetype_names_it_and_loses_its_own_cpu_and_memory() {
        let mut t = json!({"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 2},
            "memory": {"guest": "4Gi"},
            "resources": {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}, "limits": {"memory": "4Gi"}},
            "devices": {"disks": []},
        }}}}});
        let it = parse_instancetype("u1.medium").expect("ok");
        let pref = parse_preference("ubuntu").expect("ok");
        use_instancetype(&mut t, Some(&it), Some(&pref));
        assert_eq!(
            t["spec"]["instancetype"],
            json!({"kind": "VirtualMachineClusterInstancetype", "name": "u1.medium"})
        );
        assert_eq!(
            t["spec"]["preference"],
            json!({"kind": "VirtualMachineClusterPreference", "name": "ubuntu"})
        );
        assert_eq!(
            t["spec"]["template"]["spec"]["domain"],
            json!({"resources": {"requests": {"nvidia.com/gpu": "1"}}, "devices": {"disks": []}})
        );
    }

    #[test]
    fn an_instancetype_object_gives_its_guest_cpu_and_memory() {
        let r = instancetype_resources(
            &json!({"spec": {"cpu": {"guest": 2}, "memory": {"guest": "4Gi"}}}),
        )
        .expect("reads");
        assert_eq!(r["cpu"].0, "2");
        assert_eq!(r["memory"].0, "4Gi");
        for bad in [
            json!({"spec": {"memory": {"guest": "4Gi"}}}),
            json!({"spec": {"cpu": {"guest": 0}, "memory": {"guest": "4Gi"}}}),
            json!({"spec": {"cpu": {"guest": 2}, "memory": {"guest": "lots"}}}),
        ] {
            assert!(instancetype_resources(&bad).is_err(), "{bad}");
        }
        assert!(check_no_own_resources(
            &ResourceList::from([("cpu".to_string(), Quantity("2".into()))]),
            "p.t"
        )
        .is_err());
        assert!(check_no_own_resources(&ResourceList::new(), "p.t").is_ok());
    }
}
