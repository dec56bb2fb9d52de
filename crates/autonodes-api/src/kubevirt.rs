//! The KubeVirt kinds autonodes reads and writes on host clusters: written as dynamic
//! objects, read as [`Observed`] ones.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::NamespaceResourceScope;
use kube_core::{ApiResource, DynamicObject, GroupVersionKind, Resource};
use serde::Deserialize;

/// `kubevirt.io/v1` VirtualMachine.
pub fn virtual_machine() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    )
}

/// `kubevirt.io/v1` VirtualMachineInstance.
pub fn virtual_machine_instance() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

/// `kubevirt.io/v1` VirtualMachineInstanceMigration: a live migration of one instance.
pub fn virtual_machine_instance_migration() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstanceMigration"),
        "virtualmachineinstancemigrations",
    )
}

/// `cdi.kubevirt.io/v1beta1` DataVolume.
pub fn data_volume() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        "datavolumes",
    )
}

/// `instancetype.kubevirt.io/v1beta1` instance types and preferences of `kind`
/// (`VirtualMachineClusterInstancetype`, `VirtualMachineInstancetype`,
/// `VirtualMachineClusterPreference`, `VirtualMachinePreference`).
pub fn instancetype(kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("instancetype.kubevirt.io", "v1beta1", kind),
        &format!("{}s", kind.to_lowercase()),
    )
}

/// A kind of KubeVirt object an [`Observed`] stands for.
pub trait ObservedKind: Clone + std::fmt::Debug + Default + Send + Sync + 'static {
    /// The API group.
    const GROUP: &'static str = "kubevirt.io";
    /// The API version.
    const VERSION: &'static str = "v1";
    /// `group/version`.
    const API_VERSION: &'static str = "kubevirt.io/v1";
    /// The kind, e.g. `VirtualMachine`.
    const KIND: &'static str;
    /// Its plural, e.g. `virtualmachines`.
    const PLURAL: &'static str;
}

/// Marks an [`Observed`] `kubevirt.io/v1` VirtualMachine.
#[derive(Clone, Debug, Default)]
pub struct VirtualMachineKind;

impl ObservedKind for VirtualMachineKind {
    const KIND: &'static str = "VirtualMachine";
    const PLURAL: &'static str = "virtualmachines";
}

/// Marks an [`Observed`] `kubevirt.io/v1` VirtualMachineInstance.
#[derive(Clone, Debug, Default)]
pub struct VirtualMachineInstanceKind;

impl ObservedKind for VirtualMachineInstanceKind {
    const KIND: &'static str = "VirtualMachineInstance";
    const PLURAL: &'static str = "virtualmachineinstances";
}

/// Marks an [`Observed`] `cdi.kubevirt.io/v1beta1` DataVolume (autonodes reads only its
/// metadata; its `status.phase` is decoded like a VMI's and left unread).
#[derive(Clone, Debug, Default)]
pub struct DataVolumeKind;

impl ObservedKind for DataVolumeKind {
    const GROUP: &'static str = "cdi.kubevirt.io";
    const VERSION: &'static str = "v1beta1";
    const API_VERSION: &'static str = "cdi.kubevirt.io/v1beta1";
    const KIND: &'static str = "DataVolume";
    const PLURAL: &'static str = "datavolumes";
}

/// A VirtualMachine or VirtualMachineInstance as the controller reads it: its metadata
/// (without `managedFields`, annotations, owner references and finalizers) and the status
/// fields autonodes acts on. Reading a KubeVirt object into this type skips the rest of it
/// (the spec, conditions, volume and guest details) without building it, which is most of
/// what decoding a VM costs, and keeps a watch cache of thousands of VMs small.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Observed<K: ObservedKind> {
    /// Name, namespace, UID, resource version, labels, generation, creation and deletion.
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    /// What autonodes reads of the spec.
    #[serde(default)]
    pub spec: ObservedSpec,
    /// What autonodes reads of the status.
    #[serde(default)]
    pub status: ObservedStatus,
    #[serde(skip)]
    kind: std::marker::PhantomData<K>,
}

/// An observed VirtualMachine.
pub type ObservedVm = Observed<VirtualMachineKind>;
/// An observed VirtualMachineInstance.
pub type ObservedVmi = Observed<VirtualMachineInstanceKind>;
/// An observed DataVolume.
pub type ObservedDataVolume = Observed<DataVolumeKind>;

/// The spec fields of a VirtualMachineInstance autonodes reads (a VirtualMachine's spec
/// has none of them at its top).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSpec {
    /// VirtualMachineInstance: `spec.evictionStrategy` (`None`, `LiveMigrate`,
    /// `LiveMigrateIfPossible`, `External`); absent when the template sets none.
    #[serde(default)]
    pub eviction_strategy: Option<String>,
}

/// The status fields of a VirtualMachine or VirtualMachineInstance autonodes reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedStatus {
    /// VirtualMachine: `status.ready`.
    #[serde(default)]
    pub ready: Option<bool>,
    /// VirtualMachine: `status.printableStatus` (`Starting`, `Running`, ...).
    #[serde(default)]
    pub printable_status: Option<String>,
    /// VirtualMachine: `status.created`.
    #[serde(default)]
    pub created: Option<bool>,
    /// VirtualMachineInstance: `status.phase` (`Pending`, `Scheduling`, `Running`, ...).
    #[serde(default)]
    pub phase: Option<String>,
    /// VirtualMachineInstance: the addresses of `status.interfaces`.
    #[serde(default)]
    pub interfaces: Vec<ObservedInterface>,
    /// VirtualMachineInstance: `status.nodeName`, the host node it runs on.
    #[serde(default)]
    pub node_name: Option<String>,
    /// VirtualMachineInstance: `status.evacuationNodeName`, set by KubeVirt when the VM is
    /// asked to leave that host node (an eviction of its launcher pod under eviction
    /// strategy `External` or a live migration KubeVirt starts itself).
    #[serde(default)]
    pub evacuation_node_name: Option<String>,
    /// VirtualMachineInstance: `status.migrationState`, its last live migration.
    #[serde(default)]
    pub migration_state: Option<ObservedMigrationState>,
    /// The conditions autonodes reads ([`READ_CONDITIONS`]: a VirtualMachineInstance's
    /// `LiveMigratable`); the others are skipped when the object is read.
    #[serde(default, deserialize_with = "read_conditions")]
    pub conditions: Vec<ObservedCondition>,
}

/// A VirtualMachineInstance's last live migration (`status.migrationState`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedMigrationState {
    /// The host node it left, or is leaving.
    #[serde(default)]
    pub source_node: Option<String>,
    /// The host node it goes to.
    #[serde(default)]
    pub target_node: Option<String>,
    /// The migration completed.
    #[serde(default)]
    pub completed: Option<bool>,
    /// The migration failed.
    #[serde(default)]
    pub failed: Option<bool>,
    /// Why it failed.
    #[serde(default)]
    pub failure_reason: Option<String>,
}

impl ObservedMigrationState {
    /// Neither completed nor failed yet.
    pub fn in_progress(&self) -> bool {
        self.completed != Some(true) && self.failed != Some(true)
    }
}

/// The condition types of a KubeVirt object autonodes reads.
pub const READ_CONDITIONS: [&str; 1] = ["LiveMigratable"];

/// A VirtualMachineInstance's condition saying whether KubeVirt can live-migrate it.
pub const LIVE_MIGRATABLE: &str = "LiveMigratable";

/// Reads `status.conditions`, keeping only [`READ_CONDITIONS`].
fn read_conditions<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<ObservedCondition>, D::Error> {
    let all = Option::<Vec<ObservedCondition>>::deserialize(d)?.unwrap_or_default();
    Ok(all
        .into_iter()
        .filter(|c| READ_CONDITIONS.contains(&c.type_.as_str()))
        .collect())
}

/// A condition of a KubeVirt object: type, status and reason.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ObservedCondition {
    /// The condition's type.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Its reason.
    #[serde(default)]
    pub reason: Option<String>,
}

/// An interface of a VirtualMachineInstance, by its address only.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObservedInterface {
    /// `ipAddress`.
    #[serde(default)]
    pub ip_address: Option<String>,
}

impl<K: ObservedKind> Observed<K> {
    /// True when a VirtualMachine reports `status.ready: true`.
    pub fn ready(&self) -> bool {
        self.status.ready == Some(true)
    }

    /// The phase of a VirtualMachineInstance.
    pub fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }

    /// The first IP address a VirtualMachineInstance reports.
    pub fn ip(&self) -> Option<&str> {
        self.status.interfaces.first()?.ip_address.as_deref()
    }

    /// A condition of the object, by type.
    pub fn condition(&self, type_: &str) -> Option<&ObservedCondition> {
        self.status.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The object an API server returned (e.g. to a create), as observed.
    pub fn from_object(obj: &DynamicObject) -> Self {
        let status = obj
            .data
            .get("status")
            .and_then(|s| ObservedStatus::deserialize(s).ok())
            .unwrap_or_default();
        let spec = obj
            .data
            .get("spec")
            .and_then(|s| ObservedSpec::deserialize(s).ok())
            .unwrap_or_default();
        let m = &obj.metadata;
        Observed {
            metadata: ObjectMeta {
                name: m.name.clone(),
                namespace: m.namespace.clone(),
                uid: m.uid.clone(),
                resource_version: m.resource_version.clone(),
                generation: m.generation,
                labels: m.labels.clone(),
                creation_timestamp: m.creation_timestamp.clone(),
                deletion_timestamp: m.deletion_timestamp.clone(),
                ..ObjectMeta::default()
            },
            spec,
            status,
            kind: std::marker::PhantomData,
        }
    }
}

impl<K: ObservedKind> Resource for Observed<K> {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn group(_: &()) -> Cow<'_, str> {
        K::GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        K::VERSION.into()
    }

    fn kind(_: &()) -> Cow<'_, str> {
        K::KIND.into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        K::API_VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        K::PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads an object's metadata without what autonodes never reads of a KubeVirt object
/// (`managedFields` above all: decoding it is a good part of decoding a whole VM).
fn lean_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Lean {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        uid: Option<String>,
        #[serde(default)]
        resource_version: Option<String>,
        #[serde(default)]
        generation: Option<i64>,
        #[serde(default)]
        labels: Option<std::collections::BTreeMap<String, String>>,
        #[serde(default)]
        creation_timestamp: Option<Time>,
        #[serde(default)]
        deletion_timestamp: Option<Time>,
    }
    let l = Lean::deserialize(d)?;
    Ok(ObjectMeta {
        name: l.name,
        namespace: l.namespace,
        uid: l.uid,
        resource_version: l.resource_version,
        generation: l.generation,
        labels: l.labels,
        creation_timestamp: l.creation_timestamp,
        deletion_timestamp: l.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_instance_type_kind_is_served_under_its_lowercase_plural() {
        let r = instancetype("VirtualMachineInstancetype");
        assert_eq!(r.plural, "virtualmachineinstancetypes");
        assert_eq!(r.api_version, "instancetype.kubevirt.io/v1beta1");
        assert_eq!(r.kind, "VirtualMachineInstancetype");
    }

    #[test]
    fn readiness_is_read_from_vm_status_and_vmi_phase() {
        let vm: ObservedVm = serde_json::from_value(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},"status":{"ready":true}}),
        )
        .expect("vm");
        assert!(vm.ready());
        let vm: ObservedVm = serde_json::from_value(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"}}),
        )
        .expect("vm");
        assert!(!vm.ready());
        let vmi: ObservedVmi = serde_json::from_value(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"a"},
            "status":{"phase":"Running","interfaces":[{"ipAddress":"10.0.0.7"}]}}),
        )
        .expect("vmi");
        assert_eq!(vmi.phase(), Some("Running"));
        assert_eq!(vmi.ip(), Some("10.0.0.7"));
    }

    fn full_vmi() -> serde_json::Value {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "vm", "namespace": "ns", "uid": "u", "resourceVersion": "9", "generation": 2,
                "creationTimestamp": "2026-11-26T03:00:00Z",
                "labels": {"autonodes.io/nodeclaim": "c", "kubevirt.io/nodeName": "host-1"},
                "annotations": {"kubevirt.io/latest-observed-api-version": "v1"},
                "finalizers": ["foregroundDeleteVirtualMachine"],
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm", "uid": "v"}],
                "managedFields": [{"manager": "virt-controller", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {"domain": {"devices": {"disks": [{"name": "root"}]}}, "evictionStrategy": "LiveMigrate"},
            "status": {
                "phase": "Running",
                "nodeName": "host-1",
                "interfaces": [{"name": "default", "ipAddress": "10.0.0.7", "mac": "aa"}],
                "conditions": [{"type": "Ready", "status": "True"},
                               {"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable",
                                "message": "cannot migrate VMI: PVC root is not shared"}],
                "migrationState": {"sourceNode": "host-0", "targetNode": "host-1", "completed": true,
                                   "migrationUid": "m", "mode": "PreCopy"},
                "guestOSInfo": {"name": "Debian"},
            },
        })
    }

    #[test]
    fn an_observed_kubevirt_object_keeps_identity_labels_and_the_status_autonodes_reads_and_nothing_else(
    ) {
        let vmi: ObservedVmi = serde_json::from_value(full_vmi()).expect("vmi");
        let m = &vmi.metadata;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref(), m.uid.as_deref()),
            (Some("vm"), Some("ns"), Some("u"))
        );
        assert_eq!(m.resource_version.as_deref(), Some("9"));
        assert_eq!(m.generation, Some(2));
        assert!(m.creation_timestamp.is_some());
        assert_eq!(m.labels.as_ref().map(|l| l.len()), Some(2));
        assert!(m.managed_fields.is_none() && m.annotations.is_none());
        assert!(m.finalizers.is_none() && m.owner_references.is_none());
        assert_eq!(
            vmi.status,
            ObservedStatus {
                phase: Some("Running".into()),
                interfaces: vec![ObservedInterface {
                    ip_address: Some("10.0.0.7".into())
                }],
                node_name: Some("host-1".into()),
                migration_state: Some(ObservedMigrationState {
                    source_node: Some("host-0".into()),
                    target_node: Some("host-1".into()),
                    completed: Some(true),
                    ..Default::default()
                }),
                conditions: vec![ObservedCondition {
                    type_: "LiveMigratable".into(),
                    status: "False".into(),
                    reason: Some("DisksNotLiveMigratable".into()),
                }],
                ..Default::default()
            }
        );
        assert_eq!(vmi.spec.eviction_strategy.as_deref(), Some("LiveMigrate"));
    }

    #[test]
    fn an_object_returned_by_a_create_is_observed_as_a_watch_would_deliver_it() {
        let obj: DynamicObject = serde_json::from_value(full_vmi()).expect("object");
        let from_object = ObservedVmi::from_object(&obj);
        let decoded: ObservedVmi = serde_json::from_value(full_vmi()).expect("vmi");
        assert_eq!(from_object.metadata, decoded.metadata);
        assert_eq!(from_object.status, decoded.status);
    }

    #[test]
    fn observed_kinds_name_kubevirts_and_cdis_resources() {
        assert_eq!(ObservedVm::plural(&()), virtual_machine().plural);
        assert_eq!(ObservedVmi::plural(&()), virtual_machine_instance().plural);
        assert_eq!(ObservedVmi::kind(&()), virtual_machine_instance().kind);
        assert_eq!(ObservedVm::api_version(&()), virtual_machine().api_version);
        let dv = data_volume();
        assert_eq!(
            (
                ObservedDataVolume::group(&()),
                ObservedDataVolume::version(&()),
                ObservedDataVolume::api_version(&()),
                ObservedDataVolume::kind(&()),
                ObservedDataVolume::plural(&())
            ),
            (
                dv.group.as_str().into(),
                dv.version.as_str().into(),
                dv.api_version.as_str().into(),
                dv.kind.as_str().into(),
                dv.plural.as_str().into()
            )
        );
    }
}
