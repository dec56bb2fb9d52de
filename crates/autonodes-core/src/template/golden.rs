//! Golden images: a node type whose VMs import an image into their disks (a DataVolume
//! template with a `registry` or `http` source) can import it once instead, per provider
//! and namespace, into a golden DataVolume that every VM's disk clones (a `pvc` source).
//! Fifty VMs then pull the image once. Pure code, no I/O: the controller creates the
//! golden volumes this module names before a VM clones them, and deletes them when no node
//! type of their provider uses them any more.

use serde_json::{json, Value};

use super::error::TemplateError;
use crate::names::fnv1a;
use crate::properties::PROP_GOLDEN_IMAGE;

/// Label on a golden DataVolume: the provider it was made for (as a label value).
pub const LABEL_GOLDEN_IMAGE: &str = "autonodes.io/golden-image";
/// What a golden DataVolume's name starts with.
pub(crate) const GOLDEN_PREFIX: &str = "autonodes-golden-";

/// A golden DataVolume: imported once, cloned by each VM's disk.
#[derive(Debug, Clone, PartialEq)]
pub struct GoldenVolume {
    /// Its name: [`GOLDEN_PREFIX`] and a hash of the provider, the source and the storage.
    pub name: String,
    /// Its namespace: the provider's VM namespace (a clone source must be reachable).
    pub namespace: String,
    /// Its DataVolume spec: the image source and the storage the VMs' disks ask.
    pub spec: Value,
}

/// Whether a type's properties turn golden images on.
pub fn wanted(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!(
            "{:?} is neither true nor false",
            other.chars().take(32).collect::<String>()
        )),
    }
}

/// Rewrites every DataVolume template of `template` that imports an image (`registry` or
/// `http` source) into a clone of a golden volume in `namespace`, and returns those golden
/// volumes (one per distinct source and storage; templates that share them share the
/// volume). The clone keeps the template's storage, so it is at least as large as the
/// golden volume.
pub(crate) fn use_golden_images(
    template: &mut Value,
    provider: &str,
    namespace: &str,
    node_type: &str,
) -> Result<Vec<GoldenVolume>, TemplateError> {
    let Some(dvts) = template
        .pointer_mut("/spec/dataVolumeTemplates")
        .and_then(Value::as_array_mut)
    else {
        return Ok(Vec::new());
    };
    let mut golden: Vec<GoldenVolume> = Vec::new();
    for (i, dvt) in dvts.iter_mut().enumerate() {
        let Some(spec) = dvt.get_mut("spec").and_then(Value::as_object_mut) else {
            continue;
        };
        let Some(source) = spec.get("source").cloned() else {
            continue;
        };
        if source.get("registry").is_none() && source.get("http").is_none() {
            continue;
        }
        let storage_key = if spec.contains_key("storage") {
            "storage"
        } else if spec.contains_key("pvc") {
            "pvc"
        } else {
            return Err(TemplateError::BadName {
                node_type: node_type.to_string(),
                field: format!("spec.dataVolumeTemplates[{i}].spec"),
                message: format!(
                    "property {PROP_GOLDEN_IMAGE}: an image import needs `storage` or `pvc` to size its golden volume"
                ),
            });
        };
        let storage = spec.get(storage_key).cloned().unwrap_or(Value::Null);
        let identity =
            serde_json::to_string(&json!([provider, namespace, source, storage_key, storage]))
                .unwrap_or_default();
        let name = format!("{GOLDEN_PREFIX}{:016x}", fnv1a(&[&identity]));
        if !golden.iter().any(|g| g.name == name) {
            golden.push(GoldenVolume {
                name: name.clone(),
                namespace: namespace.to_string(),
                spec: json!({"source": source, storage_key: storage}),
            });
        }
        spec.insert(
            "source".to_string(),
            json!({"pvc": {"namespace": namespace, "name": name}}),
        );
    }
    Ok(golden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(url: &str, size: &str) -> Value {
        json!({"spec": {"dataVolumeTemplates": [
            {"metadata": {"name": "root"}, "spec": {
                "source": {"registry": {"url": url}},
                "storage": {"resources": {"requests": {"storage": size}}},
            }},
            {"metadata": {"name": "data"}, "spec": {"source": {"blank": {}}, "storage": {}}},
        ]}})
    }

    #[test]
    fn an_image_import_becomes_a_clone_of_one_golden_volume_per_source_and_storage() {
        let mut t = template("docker://quay.io/containerdisks/ubuntu:22.04", "20Gi");
        let golden = use_golden_images(&mut t, "kv", "vms", "kv.small").expect("rewrites");
        assert_eq!(golden.len(), 1);
        let g = &golden[0];
        assert!(
            g.name.starts_with(GOLDEN_PREFIX) && g.name.len() <= 63,
            "{}",
            g.name
        );
        assert_eq!(g.namespace, "vms");
        assert_eq!(
            g.spec,
            json!({"source": {"registry": {"url": "docker://quay.io/containerdisks/ubuntu:22.04"}},
                   "storage": {"resources": {"requests": {"storage": "20Gi"}}}})
        );
        assert_eq!(
            t["spec"]["dataVolumeTemplates"][0]["spec"],
            json!({"source": {"pvc": {"namespace": "vms", "name": g.name}},
                   "storage": {"resources": {"requests": {"storage": "20Gi"}}}})
        );
        assert_eq!(
            t["spec"]["dataVolumeTemplates"][1]["spec"]["source"],
            json!({"blank": {}}),
            "a blank disk is not an image"
        );
        // The same image and size in another type of the provider: the same volume.
        let mut other = template("docker://quay.io/containerdisks/ubuntu:22.04", "20Gi");
        let again = use_golden_images(&mut other, "kv", "vms", "kv.big").expect("rewrites");
        assert_eq!(again, golden);
        // Another size, provider or namespace: another volume.
        for (url, size, provider, ns) in [
            (
                "docker://quay.io/containerdisks/ubuntu:22.04",
                "30Gi",
                "kv",
                "vms",
            ),
            (
                "docker://quay.io/containerdisks/ubuntu:22.04",
                "20Gi",
                "other",
                "vms",
            ),
            (
                "docker://quay.io/containerdisks/ubuntu:22.04",
                "20Gi",
                "kv",
                "vms-2",
            ),
            (
                "https://images.example.com/jammy.qcow2",
                "20Gi",
                "kv",
                "vms",
            ),
        ] {
            let mut t = template(url, size);
            let g = use_golden_images(&mut t, provider, ns, "t").expect("rewrites");
            assert_ne!(g[0].name, golden[0].name, "{url} {size} {provider} {ns}");
        }
    }

    #[test]
    fn a_template_without_image_imports_has_no_golden_volume() {
        let mut t = json!({"spec": {"template": {"spec": {}}}});
        assert!(use_golden_images(&mut t, "kv", "vms", "t")
            .expect("ok")
            .is_empty());
        let mut blank = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "d"}, "spec": {"source": {"blank": {}}}}]}});
        let before = blank.clone();
        assert!(use_golden_images(&mut blank, "kv", "vms", "t")
            .expect("ok")
            .is_empty());
        assert_eq!(blank, before);
    }

    #[test]
    fn an_image_import_without_a_size_is_an_error_and_the_property_reads_true_or_false() {
        let mut t = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "r"}, "spec": {"source": {"http": {"url": "http://x"}}}}]}});
        let e = use_golden_images(&mut t, "kv", "vms", "kv.t").expect_err("no size");
        assert!(e.to_string().contains(PROP_GOLDEN_IMAGE), "{e}");
        assert_eq!(wanted(None), Ok(false));
        assert_eq!(wanted(Some("true")), Ok(true));
        assert_eq!(wanted(Some(" false ")), Ok(false));
        assert!(wanted(Some("yes")).is_err());
    }
}
