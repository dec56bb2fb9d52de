//! Blank data disks a node type asks for with the property `autonodes.io/data-disks`
//! (Gardener's worker `dataVolumes`, Kubermatic's secondary disks). Pure code, no I/O.
//!
//! The property holds a list of entries separated by commas or new lines, each
//! `<name>:<size>[:<storage class>[:<bus>]]`, for example
//! `data:50Gi, logs:10Gi:fast-ssd:scsi` or `scratch:20Gi::sata`. Each entry becomes a
//! DataVolume template with a blank source (its name gets the VM's name in front when the
//! VM is finalized, so no two VMs share a disk), a volume and a disk of that name.

use serde_json::{json, Value};

use super::error::TemplateError;
use super::merge::merge_into;
use super::names::{CLOUD_INIT_VOLUME, ROOT_DISK};
use crate::names::{is_dns_label, is_dns_subdomain};
use crate::properties::PROP_DATA_DISKS;
use crate::resources::parse_quantity;

/// The most data disks one node type may ask for.
pub(crate) const MAX_DATA_DISKS: usize = 16;
/// The longest data disk name: the VM name (≤ 63) and a dash in front stay within a
/// DataVolume name, and the name stays readable in `virtctl` output.
pub(crate) const MAX_DATA_DISK_NAME: usize = 40;
/// The longest value of [`PROP_DATA_DISKS`] read.
const MAX_PROPERTY_LEN: usize = 4096;

/// The bus a data disk is attached with, as KubeVirt's `disk.bus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskBus {
    /// `virtio` (the default): the paravirtualised bus every cloud image drives.
    Virtio,
    /// `sata`: for guests without virtio drivers.
    Sata,
    /// `scsi`: a virtio-scsi controller, for many disks or SCSI features.
    Scsi,
}

impl DiskBus {
    /// KubeVirt's name of the bus.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DiskBus::Virtio => "virtio",
            DiskBus::Sata => "sata",
            DiskBus::Scsi => "scsi",
        }
    }
}

/// One blank data disk of a node type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DataDisk {
    /// Name of the disk, its volume and its DataVolume template (before the VM's name is
    /// put in front of the DataVolume's).
    pub name: String,
    /// Size, a Kubernetes quantity such as `50Gi`.
    pub size: String,
    /// Storage class of the DataVolume; the host's default class when absent.
    pub storage_class: Option<String>,
    /// The bus the disk is attached with.
    pub bus: DiskBus,
}

/// Reads the value of [`PROP_DATA_DISKS`]. An empty value means no disk. The error says
/// which entry is wrong and why, in at most a line.
pub(crate) fn parse_data_disks(value: &str) -> Result<Vec<DataDisk>, String> {
    if value.len() > MAX_PROPERTY_LEN {
        return Err(format!("longer than {MAX_PROPERTY_LEN} characters"));
    }
    let mut disks: Vec<DataDisk> = Vec::new();
    for entry in value
        .split([',', '\n'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let shown: String = entry.chars().take(64).collect();
        let fields: Vec<&str> = entry.split(':').map(str::trim).collect();
        if fields.len() < 2 || fields.len() > 4 {
            return Err(format!(
                "{shown:?} is not <name>:<size>[:<storage class>[:<bus>]]"
            ));
        }
        let name = fields[0];
        if !is_dns_label(name) || name.len() > MAX_DATA_DISK_NAME {
            return Err(format!(
                "{shown:?}: the name must be a DNS-1123 label of at most {MAX_DATA_DISK_NAME} characters"
            ));
        }
        if name == ROOT_DISK || name == CLOUD_INIT_VOLUME {
            return Err(format!("{shown:?}: the name {name} is autonodes' own"));
        }
        if disks.iter().any(|d| d.name == name) {
            return Err(format!("{shown:?}: the name {name} is used twice"));
        }
        let size = fields[1];
        if !matches!(parse_quantity(size), Ok(bytes) if bytes > 0) {
            return Err(format!(
                "{shown:?}: the size must be a positive quantity such as 50Gi"
            ));
        }
        let storage_class = match fields.get(2).copied() {
            None | Some("") => None,
            Some(class) if is_dns_subdomain(class, 253) => Some(class.to_string()),
            Some(_) => {
                return Err(format!(
                    "{shown:?}: the storage class must be a DNS-1123 subdomain"
                ))
            }
        };
        let bus = match fields.get(3).copied() {
            None | Some("") | Some("virtio") => DiskBus::Virtio,
            Some("sata") => DiskBus::Sata,
            Some("scsi") => DiskBus::Scsi,
            Some(_) => return Err(format!("{shown:?}: the bus must be virtio, sata or scsi")),
        };
        if disks.len() == MAX_DATA_DISKS {
            return Err(format!("more than {MAX_DATA_DISKS} disks"));
        }
        disks.push(DataDisk {
            name: name.to_string(),
            size: size.to_string(),
            storage_class,
            bus,
        });
    }
    Ok(disks)
}

/// Whether a storage class name is one autonodes writes into a DataVolume.
pub(crate) fn check_storage_class(class: &str) -> Result<(), String> {
    if is_dns_subdomain(class, 253) {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a DNS-1123 subdomain",
            class.chars().take(64).collect::<String>()
        ))
    }
}

/// Names a template already uses for disks, volumes or DataVolume templates.
fn names_in_use(template: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for (pointer, key) in [
        ("/spec/template/spec/domain/devices/disks", "/name"),
        ("/spec/template/spec/volumes", "/name"),
        ("/spec/dataVolumeTemplates", "/metadata/name"),
    ] {
        if let Some(items) = template.pointer(pointer).and_then(Value::as_array) {
            names.extend(
                items
                    .iter()
                    .filter_map(|i| i.pointer(key).and_then(Value::as_str))
                    .map(str::to_string),
            );
        }
    }
    names
}

/// Adds `disks` to a type's template: for each, a DataVolume template with a blank source
/// and the size (and storage class) asked, a volume using it and a disk on the bus asked,
/// after the template's own. A name the template already uses is an error naming the
/// property, never a silent merge into the template's disk.
pub(crate) fn add_data_disks(
    template: &mut Value,
    disks: &[DataDisk],
    node_type: &str,
) -> Result<(), TemplateError> {
    if disks.is_empty() {
        return Ok(());
    }
    let used = names_in_use(template);
    if let Some(taken) = disks.iter().find(|d| used.contains(&d.name)) {
        return Err(TemplateError::property(
            node_type,
            PROP_DATA_DISKS,
            format!(
                "the template already has a disk, volume or DataVolume named {}",
                taken.name
            ),
        ));
    }
    let templates: Vec<Value> = disks
        .iter()
        .map(|d| {
            let mut storage = json!({"resources": {"requests": {"storage": d.size}}});
            if let Some(class) = &d.storage_class {
                storage["storageClassName"] = json!(class);
            }
            json!({"metadata": {"name": d.name}, "spec": {"source": {"blank": {}}, "storage": storage}})
        })
        .collect();
    let volumes: Vec<Value> = disks
        .iter()
        .map(|d| json!({"name": d.name, "dataVolume": {"name": d.name}}))
        .collect();
    let devices: Vec<Value> = disks
        .iter()
        .map(|d| json!({"name": d.name, "disk": {"bus": d.bus.as_str()}}))
        .collect();
    // Lists merged by name append what is new, after what the template has.
    let patch = json!({"spec": {
        "dataVolumeTemplates": templates,
        "template": {"spec": {"domain": {"devices": {"disks": devices}}, "volumes": volumes}},
    }});
    merge_into(template, &patch).map_err(|source| TemplateError::Merge {
        node_type: node_type.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, size: &str, class: Option<&str>, bus: DiskBus) -> DataDisk {
        DataDisk {
            name: name.into(),
            size: size.into(),
            storage_class: class.map(str::to_string),
            bus,
        }
    }

    #[test]
    fn data_disk_entries_read_name_size_storage_class_and_bus_with_defaults() {
        let got = parse_data_disks("data:50Gi, logs:10Gi:fast-ssd:scsi\nscratch:20Gi::sata,")
            .expect("parses");
        assert_eq!(
            got,
            vec![
                disk("data", "50Gi", None, DiskBus::Virtio),
                disk("logs", "10Gi", Some("fast-ssd"), DiskBus::Scsi),
                disk("scratch", "20Gi", None, DiskBus::Sata),
            ]
        );
        assert_eq!(parse_data_disks("  ").expect("empty"), vec![]);
    }

    #[test]
    fn a_data_disk_entry_autonodes_cannot_use_is_refused_with_the_entry_and_the_reason() {
        for (value, says) in [
            ("data", "is not <name>:<size>"),
            ("data:1Gi:a:virtio:x", "is not <name>:<size>"),
            ("Data:1Gi", "DNS-1123 label"),
            (&format!("{}:1Gi", "d".repeat(41)), "at most 40"),
            ("rootdisk:1Gi", "autonodes' own"),
            ("cloudinitdisk:1Gi", "autonodes' own"),
            ("a:1Gi,a:2Gi", "used twice"),
            ("a:big", "positive quantity"),
            ("a:0", "positive quantity"),
            ("a:1Gi:Fast_SSD", "storage class"),
            ("a:1Gi::usb", "virtio, sata or scsi"),
            (&"x".repeat(5000), "longer than"),
        ] {
            let e = parse_data_disks(value).expect_err(value);
            assert!(e.contains(says), "{value}: {e}");
            assert!(e.len() < 200, "{value}: message not bounded: {e}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("d{i}:1Gi")).collect();
        let e = parse_data_disks(&many.join(",")).expect_err("17 disks");
        assert!(e.contains("more than 16"), "{e}");
    }

    #[test]
    fn data_disks_become_blank_data_volume_templates_volumes_and_disks_after_the_templates_own() {
        let mut t = json!({"spec": {
            "dataVolumeTemplates": [{"metadata": {"name": "root"}, "spec": {"source": {"http": {"url": "http://x"}}}}],
            "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
                "volumes": [{"name": "root", "dataVolume": {"name": "root"}}],
            }},
        }});
        let disks = vec![
            disk("data", "50Gi", None, DiskBus::Virtio),
            disk("logs", "10Gi", Some("fast-ssd"), DiskBus::Scsi),
        ];
        add_data_disks(&mut t, &disks, "p.t").expect("adds");
        assert_eq!(
            t["spec"]["dataVolumeTemplates"],
            json!([
                {"metadata": {"name": "root"}, "spec": {"source": {"http": {"url": "http://x"}}}},
                {"metadata": {"name": "data"}, "spec": {"source": {"blank": {}},
                    "storage": {"resources": {"requests": {"storage": "50Gi"}}}}},
                {"metadata": {"name": "logs"}, "spec": {"source": {"blank": {}},
                    "storage": {"resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "fast-ssd"}}},
            ])
        );
        assert_eq!(
            t["spec"]["template"]["spec"]["volumes"],
            json!([
                {"name": "root", "dataVolume": {"name": "root"}},
                {"name": "data", "dataVolume": {"name": "data"}},
                {"name": "logs", "dataVolume": {"name": "logs"}},
            ])
        );
        assert_eq!(
            t["spec"]["template"]["spec"]["domain"]["devices"]["disks"],
            json!([
                {"name": "root", "disk": {"bus": "virtio"}},
                {"name": "data", "disk": {"bus": "virtio"}},
                {"name": "logs", "disk": {"bus": "scsi"}},
            ])
        );
    }

    #[test]
    fn a_data_disk_named_like_a_disk_of_the_template_is_an_error_not_a_merge() {
        let mut t = json!({"spec": {"template": {"spec": {
            "volumes": [{"name": "data", "containerDisk": {"image": "x"}}],
        }}}});
        let before = t.clone();
        let e = add_data_disks(&mut t, &[disk("data", "1Gi", None, DiskBus::Virtio)], "p.t")
            .expect_err("taken");
        assert!(e.to_string().contains(PROP_DATA_DISKS), "{e}");
        assert!(e.to_string().contains("p.t"), "{e}");
        assert_eq!(t, before, "nothing written on error");
    }

    #[test]
    fn storage_class_names_must_be_dns_subdomains() {
        assert!(check_storage_class("fast-ssd.example.com").is_ok());
        assert!(check_storage_class("Fast SSD").is_err());
        assert!(check_storage_class("").is_err());
    }
}
