//! Our own KubeVirt and CDI CustomResourceDefinitions for test and playground host clusters.
//!
//! Written from KubeVirt's API reference (and checked field by field against KubeVirt's
//! generated CRDs), not copied from them. They are *structural for every field autonodes
//! writes*: no `x-kubernetes-preserve-unknown-fields` on any object along those paths, so
//! the API server prunes a misspelt field (say `cloudInitNoCloud.userDataSecretRef`) exactly
//! as a real KubeVirt installation does. Parts autonodes never writes itself (affinity,
//! probes, firmware, …) preserve unknown fields so that user templates survive.
//!
//! Differences from KubeVirt's own CRDs, all on purpose: `spec.runStrategy`,
//! `spec.evictionStrategy`, the VMI `status.phase` and the migration `status.phase` carry an
//! `enum` (KubeVirt checks those values in a webhook, or not at all);
//! `spec.template.metadata` and `spec.dataVolumeTemplates[].metadata` are structural
//! (`name`, `namespace`, `labels`, `annotations`) where KubeVirt preserves unknown fields;
//! only the served versions autonodes uses are defined (`kubevirt.io/v1`,
//! `cdi.kubevirt.io/v1beta1`); no CEL rules (the test API server is v1.20). The subresources
//! are KubeVirt's: VirtualMachine, VirtualMachineInstanceMigration and DataVolume have a
//! status subresource, the VirtualMachineInstance has none (its status is written with the
//! object). Of a migration's state (`migrationState`, on the VMI and on the migration) only
//! the fields a migration's progress and outcome are read from are defined; the rest is
//! pruned (the simulator writes no more).

mod parts;
mod schema;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};

pub use parts::EVICTION_STRATEGIES;
use parts::*;
use schema::*;

/// The run strategies KubeVirt documents for `spec.runStrategy`.
pub const RUN_STRATEGIES: [&str; 6] = [
    "Always",
    "RerunOnFailure",
    "Manual",
    "Halted",
    "Once",
    "WaitAsReceiver",
];

/// The VirtualMachineInstance phases KubeVirt documents for `status.phase`.
pub const VMI_PHASES: [&str; 7] = [
    "Pending",
    "Scheduling",
    "Scheduled",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
];

/// The phases KubeVirt documents for a VirtualMachineInstanceMigration's `status.phase`,
/// in the order a migration goes through them (it ends `Succeeded` or `Failed`).
pub const MIGRATION_PHASES: [&str; 9] = [
    "Pending",
    "Scheduling",
    "Scheduled",
    "PreparingTarget",
    "TargetReady",
    "Running",
    "Succeeded",
    "Failed",
    "Unknown",
];

/// The four CRDs a host cluster needs for autonodes: `virtualmachines.kubevirt.io`,
/// `virtualmachineinstances.kubevirt.io`, `virtualmachineinstancemigrations.kubevirt.io` and
/// `datavolumes.cdi.kubevirt.io`.
pub fn kubevirt_crds() -> Vec<CustomResourceDefinition> {
    vec![
        virtual_machine_crd(),
        virtual_machine_instance_crd(),
        virtual_machine_instance_migration_crd(),
        data_volume_crd(),
    ]
}

/// KubeVirt's instance type CRDs (`instancetype.kubevirt.io/v1beta1`): the cluster-scoped
/// `VirtualMachineClusterInstancetype` and the namespaced `VirtualMachineInstancetype`,
/// structural for the guest cpu and memory autonodes reads, preserving the rest.
pub fn instancetype_crds() -> Vec<CustomResourceDefinition> {
    let spec = || {
        object(
            "VirtualMachineInstancetypeSpec: the resources of the VMs that use it.",
            [
                (
                    "cpu",
                    object(
                        "The guest's CPUs.",
                        [
                            ("guest", int32("Number of vCPUs.")),
                            ("model", string("CPU model.")),
                            ("dedicatedCPUPlacement", boolean("Pin vCPUs to host CPUs.")),
                        ],
                    )
                    .required(&["guest"]),
                ),
                (
                    "memory",
                    object(
                        "The guest's memory.",
                        [
                            ("guest", quantity("Memory the guest sees.")),
                            ("hugepages", preserve("Hugepages.")),
                            ("overcommitPercent", int32("Overcommit.")),
                        ],
                    )
                    .required(&["guest"]),
                ),
                ("gpus", array("GPUs.", preserve("A GPU."))),
                ("hostDevices", array("Host devices.", preserve("A device."))),
                ("ioThreadsPolicy", string("IO threads policy.")),
                ("launchSecurity", preserve("Launch security.")),
                ("nodeSelector", string_map("Host node labels.")),
                ("schedulerName", string("Scheduler.")),
                ("annotations", string_map("Annotations.")),
            ],
        )
        .required(&["cpu", "memory"])
    };
    let mut cluster = crd(CrdParts {
        group: "instancetype.kubevirt.io",
        version: "v1beta1",
        kind: "VirtualMachineClusterInstancetype",
        plural: "virtualmachineclusterinstancetypes",
        singular: "virtualmachineclusterinstancetype",
        short_names: &["vmclusterinstancetype", "vmcf"],
        description: "The cpu and memory (and more) VMs of any namespace may take by name.",
        spec: spec(),
        spec_required: true,
        status: preserve("Unused."),
        status_subresource: false,
        columns: Vec::new(),
    });
    cluster.spec.scope = "Cluster".to_string();
    let namespaced = crd(CrdParts {
        group: "instancetype.kubevirt.io",
        version: "v1beta1",
        kind: "VirtualMachineInstancetype",
        plural: "virtualmachineinstancetypes",
        singular: "virtualmachineinstancetype",
        short_names: &["vminstancetype", "vmf"],
        description: "The cpu and memory (and more) VMs of its namespace may take by name.",
        spec: spec(),
        spec_required: true,
        status: preserve("Unused."),
        status_subresource: false,
        columns: Vec::new(),
    });
    vec![cluster, namespaced]
}

/// A VM's `spec.instancetype` or `spec.preference`: which object, by kind and name.
fn matcher(description: &str) -> Schema {
    object(
        description,
        [
            ("kind", string("The kind (cluster-scoped or namespaced).")),
            ("name", string("The object's name.")),
            ("revisionName", string("The ControllerRevision captured.")),
            ("inferFromVolume", string("A volume to infer it from.")),
            (
                "inferFromVolumeFailurePolicy",
                string("What an inference failure does."),
            ),
        ],
    )
}

/// The `virtualmachines.kubevirt.io` CRD.
pub fn virtual_machine_crd() -> CustomResourceDefinition {
    let spec = object(
        "VirtualMachineSpec: the desired state of the VirtualMachine.",
        [
            (
                "runStrategy",
                string_enum(
                    "When the VirtualMachineInstance runs. Mutually exclusive with `running`.",
                    &RUN_STRATEGIES,
                ),
            ),
            (
                "running",
                boolean("Deprecated on/off switch; mutually exclusive with `runStrategy`."),
            ),
            (
                "dataVolumeTemplates",
                array(
                    "DataVolumes created for, and owned by, the VirtualMachine.",
                    data_volume_template(),
                ),
            ),
            ("template", vmi_template()),
            (
                "instancetype",
                matcher("The instance type the VM's cpu and memory come from."),
            ),
            (
                "preference",
                matcher("The preference the VM's defaults come from."),
            ),
            (
                "updateVolumesStrategy",
                string("How volume updates are applied."),
            ),
        ],
    )
    .required(&["template"]);
    let status = object(
        "VirtualMachineStatus: the observed state of the VirtualMachine.",
        [
            (
                "ready",
                boolean("True when the VirtualMachineInstance is running and ready."),
            ),
            (
                "created",
                boolean("True when the VirtualMachineInstance exists."),
            ),
            (
                "printableStatus",
                string("Human readable status (Stopped, Starting, Running, …)."),
            ),
            ("conditions", array("Conditions.", preserve("A condition."))),
            ("observedGeneration", int64("Generation last acted on.")),
            (
                "desiredGeneration",
                int64("Generation of the VirtualMachine."),
            ),
            ("runStrategy", string("The effective run strategy.")),
            ("startFailure", preserve("Information about failed starts.")),
            (
                "stateChangeRequests",
                array("Pending state changes.", preserve("A state change.")),
            ),
            (
                "volumeSnapshotStatuses",
                array("Snapshot support per volume.", preserve("A status.")),
            ),
            ("restoreInProgress", string("The restore in progress.")),
            ("snapshotInProgress", string("The snapshot in progress.")),
            (
                "volumeRequests",
                array("Hotplug requests.", preserve("A request.")),
            ),
            ("volumeUpdateState", preserve("Volume update state.")),
            ("instancetypeRef", preserve("The instancetype in use.")),
            ("preferenceRef", preserve("The preference in use.")),
            ("memoryDumpRequest", preserve("A memory dump request.")),
            (
                "changedBlockTracking",
                preserve("Changed block tracking state."),
            ),
        ],
    );
    crd(CrdParts {
        group: "kubevirt.io",
        version: "v1",
        kind: "VirtualMachine",
        plural: "virtualmachines",
        singular: "virtualmachine",
        short_names: &["vm", "vms"],
        description: "VirtualMachine handles the VirtualMachines that are not running or are \
                      in a stopped state; it is the template of its VirtualMachineInstance.",
        spec,
        spec_required: true,
        status,
        status_subresource: true,
        columns: vec![
            column("Age", "date", ".metadata.creationTimestamp", None),
            column(
                "Status",
                "string",
                ".status.printableStatus",
                Some("Human Readable Status"),
            ),
            column(
                "Ready",
                "string",
                ".status.conditions[?(@.type=='Ready')].status",
                None,
            ),
        ],
    })
}

/// The `virtualmachineinstances.kubevirt.io` CRD.
pub fn virtual_machine_instance_crd() -> CustomResourceDefinition {
    let interface_status = object(
        "A network interface of the running guest.",
        [
            ("name", string("The interface name from the spec.")),
            ("ipAddress", string("The primary IP address.")),
            (
                "ipAddresses",
                array("All IP addresses.", string("An address.")),
            ),
            ("mac", string("The MAC address.")),
            ("interfaceName", string("The name inside the guest.")),
            ("infoSource", string("Where the information came from.")),
            ("linkState", string("Link state.")),
            ("podInterfaceName", string("The pod interface.")),
            ("queueCount", int32("Queue count.")),
        ],
    );
    let transition = phase_transition("When the VirtualMachineInstance entered a phase.");
    let status = object(
        "VirtualMachineInstanceStatus: the observed state of the guest.",
        [
            (
                "phase",
                string_enum("The lifecycle phase of the guest.", &VMI_PHASES),
            ),
            ("reason", string("Why the guest is in this phase.")),
            (
                "interfaces",
                array("The guest's network interfaces.", interface_status),
            ),
            ("nodeName", string("The host node the guest runs on.")),
            (
                "evacuationNodeName",
                string("The host node the guest is being evicted from."),
            ),
            (
                "migrationState",
                migration_state("The guest's last live migration."),
            ),
            (
                "conditions",
                array(
                    "Conditions (Ready, LiveMigratable, …).",
                    condition("A condition of the guest."),
                ),
            ),
            (
                "phaseTransitionTimestamps",
                array("Phase transitions.", transition),
            ),
            ("qosClass", string("The QoS class of the launcher pod.")),
            (
                "guestOSInfo",
                preserve("Guest OS information from the agent."),
            ),
            (
                "launcherContainerImageVersion",
                string("The launcher image."),
            ),
            ("migrationMethod", string("Live migration method.")),
            ("activePods", preserve("Pods of the guest, by UID.")),
            (
                "volumeStatus",
                array("Volume status.", preserve("A volume status.")),
            ),
        ],
    );
    crd(CrdParts {
        group: "kubevirt.io",
        version: "v1",
        kind: "VirtualMachineInstance",
        plural: "virtualmachineinstances",
        singular: "virtualmachineinstance",
        short_names: &["vmi", "vmis"],
        description: "VirtualMachineInstance is a running virtual machine.",
        spec: vmi_spec("VirtualMachineInstanceSpec: the guest's hardware, network and disks."),
        spec_required: true,
        status,
        status_subresource: false,
        columns: vec![
            column("Age", "date", ".metadata.creationTimestamp", None),
            column("Phase", "string", ".status.phase", None),
            column("IP", "string", ".status.interfaces[0].ipAddress", None),
            column("NodeName", "string", ".status.nodeName", None),
            column(
                "Ready",
                "string",
                ".status.conditions[?(@.type=='Ready')].status",
                None,
            ),
            // Shown with `-o wide`, as KubeVirt's.
            CustomResourceColumnDefinition {
                priority: Some(1),
                ..column(
                    "Live-Migratable",
                    "string",
                    ".status.conditions[?(@.type=='LiveMigratable')].status",
                    None,
                )
            },
        ],
    })
}

/// The `virtualmachineinstancemigrations.kubevirt.io` CRD: a request to live-migrate the
/// VirtualMachineInstance `spec.vmiName` (of the same namespace), and how it went.
pub fn virtual_machine_instance_migration_crd() -> CustomResourceDefinition {
    let spec = object(
        "VirtualMachineInstanceMigrationSpec: the instance to migrate.",
        [
            (
                "vmiName",
                string("The VirtualMachineInstance to migrate (same namespace)."),
            ),
            (
                "addedNodeSelector",
                string_map("Host node labels the target must have besides the instance's own."),
            ),
        ],
    )
    .required(&["vmiName"]);
    let status = object(
        "VirtualMachineInstanceMigrationStatus: how the migration goes.",
        [
            (
                "phase",
                string_enum("The migration's phase.", &MIGRATION_PHASES),
            ),
            (
                "phaseTransitionTimestamps",
                array(
                    "Phase transitions.",
                    phase_transition("When the migration entered a phase."),
                ),
            ),
            (
                "migrationState",
                migration_state("The migration's state, as on the instance."),
            ),
            (
                "conditions",
                array("Conditions.", condition("A condition of the migration.")),
            ),
        ],
    );
    crd(CrdParts {
        group: "kubevirt.io",
        version: "v1",
        kind: "VirtualMachineInstanceMigration",
        plural: "virtualmachineinstancemigrations",
        singular: "virtualmachineinstancemigration",
        short_names: &["vmim", "vmims"],
        description: "VirtualMachineInstanceMigration asks for a live migration of a \
                      VirtualMachineInstance to another host node.",
        spec,
        spec_required: true,
        status,
        status_subresource: true,
        columns: vec![
            column("Phase", "string", ".status.phase", None),
            column("VMI", "string", ".spec.vmiName", None),
        ],
    })
}

/// The `datavolumes.cdi.kubevirt.io` CRD.
pub fn data_volume_crd() -> CustomResourceDefinition {
    let status = object(
        "DataVolumeStatus: the import or clone progress.",
        [
            (
                "phase",
                string("Pending, ImportScheduled, ImportInProgress, Succeeded, Failed, …"),
            ),
            (
                "progress",
                string("Transfer progress (e.g. 100.0%) or N/A."),
            ),
            ("restartCount", int32("Restarts of the transfer.")),
            ("claimName", string("The PersistentVolumeClaim.")),
            ("conditions", array("Conditions.", preserve("A condition."))),
        ],
    );
    crd(CrdParts {
        group: "cdi.kubevirt.io",
        version: "v1beta1",
        kind: "DataVolume",
        plural: "datavolumes",
        singular: "datavolume",
        short_names: &["dv", "dvs"],
        description: "DataVolume is an abstraction on top of PersistentVolumeClaims to allow \
                      easy population of those claims.",
        spec: data_volume_spec(DataVolumeIn::Cdi),
        spec_required: true,
        status,
        status_subresource: true,
        columns: vec![
            column(
                "Phase",
                "string",
                ".status.phase",
                Some("The phase the data volume is in"),
            ),
            column(
                "Progress",
                "string",
                ".status.progress",
                Some("Transfer progress in percentage if known, N/A otherwise"),
            ),
            column(
                "Restarts",
                "integer",
                ".status.restartCount",
                Some("The number of times the transfer has been restarted."),
            ),
            column("Age", "date", ".metadata.creationTimestamp", None),
        ],
    })
}

#[cfg(test)]
mod tests;
