//! Our own KubeVirt and CDI CustomResourceDefinitions for test and playground host clusters.
//!
//! Written from KubeVirt's API reference (and checked field by field against KubeVirt's
//! generated CRDs), not copied from them. They are *structural for every field autonodes
//! writes*: no `x-kubernetes-preserve-unknown-fields` on any object along those paths, so
//! the API server prunes a misspelt field (say `cloudInitNoCloud.userDataSecretRef`) exactly
//! as a real KubeVirt installation does. Parts autonodes never writes itself (affinity,
//! probes, firmware, …) preserve unknown fields so that user templates survive.
//!
//! Differences from KubeVirt's own CRDs, all on purpose: `spec.runStrategy` and the VMI
//! `status.phase` carry an `enum` (KubeVirt checks those values in a webhook instead);
//! `spec.template.metadata` and `spec.dataVolumeTemplates[].metadata` are structural
//! (`name`, `namespace`, `labels`, `annotations`) where KubeVirt preserves unknown fields;
//! only the served versions autonodes uses are defined (`kubevirt.io/v1`,
//! `cdi.kubevirt.io/v1beta1`); no CEL rules (the test API server is v1.20). The subresources
//! are KubeVirt's: VirtualMachine and DataVolume have a status subresource, the
//! VirtualMachineInstance has none (its status is written with the object).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps, JSONSchemaPropsOrArray,
    JSONSchemaPropsOrBool, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

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

/// The Kubernetes quantity pattern KubeVirt puts on int-or-string quantities.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The three CRDs a host cluster needs for autonodes: `virtualmachines.kubevirt.io`,
/// `virtualmachineinstances.kubevirt.io` and `datavolumes.cdi.kubevirt.io`.
pub fn kubevirt_crds() -> Vec<CustomResourceDefinition> {
    vec![
        virtual_machine_crd(),
        virtual_machine_instance_crd(),
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
    let transition = object(
        "When the VirtualMachineInstance entered a phase.",
        [
            ("phase", string("The phase.")),
            (
                "phaseTransitionTimestamp",
                Schema::of(JSONSchemaProps {
                    type_: Some("string".into()),
                    format: Some("date-time".into()),
                    description: Some("When.".into()),
                    ..Default::default()
                }),
            ),
        ],
    );
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
            ("conditions", array("Conditions.", preserve("A condition."))),
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

// ---------------------------------------------------------------------------------------
// The VirtualMachineInstance template: the part autonodes composes.

/// `metadata` inside a template: structural, unlike the object's own metadata.
fn template_metadata(description: &str) -> Schema {
    object(
        description,
        [
            ("name", string("Name.")),
            ("namespace", string("Namespace.")),
            ("labels", string_map("Labels.")),
            ("annotations", string_map("Annotations.")),
        ],
    )
}

/// The fields of a DataVolume's `storage` (CDI fills what is missing from the storage
/// profile), and with `volumeAttributesClassName` of its `pvc` (a full claim spec).
fn claim_fields() -> [(&'static str, Schema); 8] {
    [
        (
            "accessModes",
            array("Access modes.", string("An access mode.")),
        ),
        (
            "resources",
            object(
                "The storage size.",
                [
                    ("requests", quantity_map("Requested size (`storage`).")),
                    ("limits", quantity_map("Size limits.")),
                ],
            ),
        ),
        ("storageClassName", string("Storage class of the volume.")),
        ("volumeMode", string("Filesystem or Block.")),
        ("volumeName", string("A PersistentVolume to bind.")),
        (
            "selector",
            preserve("A label selector over PersistentVolumes."),
        ),
        ("dataSource", preserve("A data source.")),
        ("dataSourceRef", preserve("A data source reference.")),
    ]
}

/// Where a DataVolumeSpec is used: a DataVolume of CDI's CRD, or a VirtualMachine's
/// `dataVolumeTemplates[]`, whose schema KubeVirt generates from an older CDI API (without
/// `serviceAccountName` and the HTTP source's `checksum` and `insecureSkipVerify`, which
/// a real KubeVirt therefore prunes from a VM).
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataVolumeIn {
    Cdi,
    VmTemplate,
}

/// A DataVolumeSpec: structural for the sources and the `storage` and `pvc` fields autonodes
/// writes (blank, registry, HTTP and PVC sources; size, storage class, access and volume
/// modes; a golden volume copies a template's `pvc`), preserving the rest (other sources).
fn data_volume_spec(used_in: DataVolumeIn) -> Schema {
    let storage = object(
        "The storage the DataVolume asks for; CDI fills what is missing from the storage profile.",
        claim_fields(),
    );
    let pvc = object("A full PersistentVolumeClaim spec.", claim_fields()).with_property(
        "volumeAttributesClassName",
        string("A VolumeAttributesClass."),
    );
    let mut http = object(
        "A disk image over HTTP(S).",
        [
            ("url", string("The image URL.")),
            ("secretRef", string("Secret with credentials.")),
            ("certConfigMap", string("ConfigMap with a CA bundle.")),
            ("extraHeaders", array("Extra headers.", string("A header."))),
            (
                "secretExtraHeaders",
                array("Secrets with extra headers.", string("A Secret name.")),
            ),
        ],
    )
    .required(&["url"]);
    if used_in == DataVolumeIn::Cdi {
        http = http
            .with_property("checksum", string("Expected checksum."))
            .with_property("insecureSkipVerify", boolean("Skip TLS verification."));
    }
    let source = object(
        "Where the data comes from; exactly one source.",
        [
            ("blank", empty_object("An empty disk.")),
            (
                "registry",
                object(
                    "A container disk image from a registry.",
                    [
                        ("url", string("`docker://…` or `oci-archive://…`.")),
                        ("pullMethod", string("pod or node.")),
                        ("secretRef", string("Secret with registry credentials.")),
                        ("certConfigMap", string("ConfigMap with a CA bundle.")),
                        ("imageStream", string("An OpenShift image stream.")),
                        ("platform", preserve("Image platform.")),
                    ],
                ),
            ),
            ("http", http),
            (
                "pvc",
                object(
                    "A PersistentVolumeClaim to clone.",
                    [
                        ("name", string("The source claim.")),
                        ("namespace", string("Its namespace.")),
                    ],
                )
                .required(&["name", "namespace"]),
            ),
            ("gcs", preserve("Google Cloud Storage.")),
            ("imageio", preserve("oVirt imageio.")),
            ("s3", preserve("S3.")),
            ("snapshot", preserve("A VolumeSnapshot.")),
            ("upload", preserve("An upload.")),
            ("vddk", preserve("VMware VDDK.")),
        ],
    );
    let spec = object(
        "DataVolumeSpec: where the data comes from and the volume it goes to.",
        [
            ("source", source),
            ("sourceRef", preserve("A DataSource reference.")),
            ("storage", storage),
            ("pvc", pvc),
            ("contentType", string("kubevirt or archive.")),
            ("preallocation", boolean("Preallocate the volume.")),
            ("priorityClassName", string("Priority of the importer pod.")),
            (
                "checkpoints",
                array("Checkpoints.", preserve("A checkpoint.")),
            ),
            ("finalCheckpoint", boolean("The last checkpoint.")),
        ],
    );
    match used_in {
        DataVolumeIn::VmTemplate => spec,
        DataVolumeIn::Cdi => spec.with_property(
            "serviceAccountName",
            string("Service account of the importer pod."),
        ),
    }
}

fn data_volume_template() -> Schema {
    object(
        "A DataVolume to create for the VirtualMachine.",
        [
            ("apiVersion", string("APIVersion of the DataVolume.")),
            ("kind", string("Kind of the DataVolume.")),
            (
                "metadata",
                template_metadata("Metadata of the DataVolume; `name` is its name."),
            ),
            ("spec", data_volume_spec(DataVolumeIn::VmTemplate)),
            ("status", preserve("DataVolume status.")),
        ],
    )
    .required(&["spec"])
}

fn vmi_template() -> Schema {
    object(
        "The VirtualMachineInstance to run.",
        [
            (
                "metadata",
                template_metadata("Labels and annotations of the VirtualMachineInstance."),
            ),
            (
                "spec",
                vmi_spec("The VirtualMachineInstanceSpec: hardware, network and disks."),
            ),
        ],
    )
}

/// A VirtualMachineInstance spec (the VM's `spec.template.spec` and the VMI's `spec`).
fn vmi_spec(description: &str) -> Schema {
    let toleration = object(
        "A toleration of the launcher pod.",
        [
            ("key", string("Taint key.")),
            ("operator", string("Exists or Equal.")),
            ("value", string("Taint value.")),
            (
                "effect",
                string("NoSchedule, PreferNoSchedule or NoExecute."),
            ),
            (
                "tolerationSeconds",
                int64("How long a NoExecute taint is tolerated."),
            ),
        ],
    );
    object(
        description,
        [
            ("hostname", string("The guest's hostname.")),
            ("subdomain", string("The guest's DNS subdomain.")),
            ("domain", domain()),
            (
                "networks",
                array("Networks the guest attaches to.", network()),
            ),
            ("volumes", array("Volumes the disks use.", volume())),
            (
                "nodeSelector",
                string_map("Host node labels the guest must run on."),
            ),
            ("affinity", affinity()),
            (
                "tolerations",
                array("Tolerations of the launcher pod.", toleration),
            ),
            (
                "evictionStrategy",
                string("What happens on node drain: LiveMigrate, External, None, …"),
            ),
            (
                "terminationGracePeriodSeconds",
                int64("Grace period for the guest to shut down."),
            ),
            (
                "accessCredentials",
                array(
                    "SSH keys and passwords to inject.",
                    preserve("A credential."),
                ),
            ),
            ("readinessProbe", preserve("Readiness probe of the guest.")),
            ("livenessProbe", preserve("Liveness probe of the guest.")),
            (
                "architecture",
                string("CPU architecture (amd64, arm64, …)."),
            ),
            ("dnsPolicy", string("DNS policy of the launcher pod.")),
            (
                "dnsConfig",
                preserve("DNS configuration of the launcher pod."),
            ),
            (
                "priorityClassName",
                string("Priority class of the launcher pod."),
            ),
            ("schedulerName", string("Scheduler of the launcher pod.")),
            ("startStrategy", string("Paused to start paused.")),
            (
                "topologySpreadConstraints",
                array("Topology spread.", preserve("A constraint.")),
            ),
            (
                "serviceAccountName",
                string("Service account of the launcher pod."),
            ),
            (
                "resourceClaims",
                array("Dynamic resource claims.", preserve("A claim.")),
            ),
            (
                "utilityVolumes",
                array("Utility volumes.", preserve("A volume.")),
            ),
        ],
    )
    .required(&["domain"])
}

/// core/v1 Affinity of the launcher pod: structural for the node and pod (anti-)affinity
/// autonodes writes (zones, placement presets).
fn affinity() -> Schema {
    let requirement = object(
        "A node selector requirement.",
        [
            ("key", string("The label key.")),
            (
                "operator",
                string("In, NotIn, Exists, DoesNotExist, Gt or Lt."),
            ),
            ("values", array("The values.", string("A value."))),
        ],
    )
    .required(&["key", "operator"]);
    let term = object(
        "A node selector term: all its requirements hold.",
        [
            (
                "matchExpressions",
                array("Requirements on node labels.", requirement.clone()),
            ),
            (
                "matchFields",
                array("Requirements on node fields.", requirement),
            ),
        ],
    );
    object(
        "Affinity of the launcher pod (core/v1 Affinity).",
        [
            (
                "nodeAffinity",
                object(
                    "Node affinity.",
                    [
                        (
                            "requiredDuringSchedulingIgnoredDuringExecution",
                            object(
                                "Host nodes the pod must run on: any term matches.",
                                [("nodeSelectorTerms", array("The terms.", term.clone()))],
                            )
                            .required(&["nodeSelectorTerms"]),
                        ),
                        (
                            "preferredDuringSchedulingIgnoredDuringExecution",
                            array(
                                "Preferred host nodes.",
                                object(
                                    "A weighted term.",
                                    [("weight", int32("1–100.")), ("preference", term)],
                                )
                                .required(&["weight", "preference"]),
                            ),
                        ),
                    ],
                ),
            ),
            (
                "podAffinity",
                pod_affinity("Pod affinity: run near these pods."),
            ),
            (
                "podAntiAffinity",
                pod_affinity("Pod anti-affinity: run away from these pods."),
            ),
        ],
    )
}

/// core/v1 PodAffinity or PodAntiAffinity: structural for the label selector and topology
/// key autonodes writes.
fn pod_affinity(description: &str) -> Schema {
    let selector_requirement = object(
        "A label selector requirement.",
        [
            ("key", string("The label key.")),
            ("operator", string("In, NotIn, Exists or DoesNotExist.")),
            ("values", array("The values.", string("A value."))),
        ],
    )
    .required(&["key", "operator"]);
    let selector = |what: &str| {
        object(
            what,
            [
                ("matchLabels", string_map("Labels that must match.")),
                (
                    "matchExpressions",
                    array("Requirements.", selector_requirement.clone()),
                ),
            ],
        )
    };
    let term = object(
        "Pods in a topology domain.",
        [
            ("labelSelector", selector("The pods.")),
            ("namespaceSelector", selector("The namespaces of the pods.")),
            (
                "namespaces",
                array("The namespaces of the pods.", string("A namespace.")),
            ),
            (
                "topologyKey",
                string("The node label that defines a domain."),
            ),
            (
                "matchLabelKeys",
                array("Pod label keys added to the selector.", string("A key.")),
            ),
            (
                "mismatchLabelKeys",
                array("Pod label keys excluded by the selector.", string("A key.")),
            ),
        ],
    )
    .required(&["topologyKey"]);
    object(
        description,
        [
            (
                "requiredDuringSchedulingIgnoredDuringExecution",
                array("Terms that must hold.", term.clone()),
            ),
            (
                "preferredDuringSchedulingIgnoredDuringExecution",
                array(
                    "Terms preferred.",
                    object(
                        "A weighted term.",
                        [("weight", int32("1–100.")), ("podAffinityTerm", term)],
                    )
                    .required(&["weight", "podAffinityTerm"]),
                ),
            ),
        ],
    )
}

fn domain() -> Schema {
    let cpu = object(
        "CPU topology of the guest.",
        [
            ("cores", int32("Cores per socket.")),
            ("sockets", int32("Sockets.")),
            ("threads", int32("Threads per core.")),
            (
                "model",
                string("CPU model (host-model, host-passthrough, …)."),
            ),
            (
                "dedicatedCpuPlacement",
                boolean("Pin the guest to dedicated host CPUs."),
            ),
            (
                "isolateEmulatorThread",
                boolean("Run the emulator thread on its own CPU."),
            ),
            ("maxSockets", int32("Maximum sockets for CPU hotplug.")),
            ("features", array("CPU features.", preserve("A feature."))),
            ("numa", preserve("NUMA topology.")),
            ("realtime", preserve("Realtime tuning.")),
        ],
    );
    let memory = object(
        "Memory of the guest.",
        [
            ("guest", quantity("Memory visible inside the guest.")),
            ("maxGuest", quantity("Maximum guest memory for hotplug.")),
            ("hugepages", preserve("Hugepages backing the guest memory.")),
            ("reservedOverhead", preserve("Reserved memory overhead.")),
        ],
    );
    let resources = object(
        "Resources of the launcher pod.",
        [
            (
                "requests",
                quantity_map("Requested resources (cpu, memory, extended)."),
            ),
            ("limits", quantity_map("Resource limits.")),
            (
                "overcommitGuestOverhead",
                boolean("Do not add the guest overhead to the memory request."),
            ),
        ],
    );
    object(
        "The guest's virtual hardware.",
        [
            ("cpu", cpu),
            ("memory", memory),
            ("resources", resources),
            (
                "machine",
                object(
                    "Machine type.",
                    [("type", string("QEMU machine type (q35, …)."))],
                ),
            ),
            ("firmware", preserve("Firmware (BIOS/EFI, serial, uuid).")),
            (
                "features",
                preserve("Hypervisor features (acpi, apic, smm, …)."),
            ),
            ("clock", preserve("Guest clock.")),
            ("chassis", preserve("Chassis information.")),
            ("ioThreadsPolicy", string("IO threads policy.")),
            ("ioThreads", preserve("IO threads.")),
            (
                "launchSecurity",
                preserve("Confidential computing (SEV, SNP, TDX)."),
            ),
            (
                "rebootPolicy",
                string("Reboot or Terminate on guest reboot."),
            ),
            ("devices", devices()),
        ],
    )
    .required(&["devices"])
}

fn devices() -> Schema {
    let bus_readonly = |what: &str| {
        object(
            what,
            [
                ("bus", string("Bus: virtio, sata, scsi, usb.")),
                ("readonly", boolean("Read-only.")),
            ],
        )
    };
    let disk = object(
        "A disk of the guest; `name` is the volume it shows.",
        [
            ("name", string("The volume this disk shows.")),
            ("bootOrder", integer("Boot order (lower first).")),
            ("serial", string("Serial number.")),
            (
                "disk",
                bus_readonly("A plain disk.").with_property("pciAddress", string("PCI address.")),
            ),
            (
                "cdrom",
                bus_readonly("A CD-ROM.").with_property("tray", string("Tray state.")),
            ),
            ("lun", preserve("A LUN.")),
            ("cache", string("Cache mode.")),
            ("io", string("IO mode.")),
            ("dedicatedIOThread", boolean("Use a dedicated IO thread.")),
            ("shareable", boolean("Shared between guests.")),
            ("errorPolicy", string("What happens on IO errors.")),
            ("tag", string("Device role tag.")),
            ("blockSize", preserve("Block size.")),
            ("changedBlockTracking", boolean("Changed block tracking.")),
        ],
    )
    .required(&["name"]);
    let interface = object(
        "A network interface of the guest; `name` is its network.",
        [
            ("name", string("The network this interface connects to.")),
            ("model", string("NIC model (virtio, e1000, …).")),
            ("macAddress", string("MAC address.")),
            ("masquerade", empty_object("NAT behind the pod's address.")),
            ("bridge", empty_object("Bridge to the pod network.")),
            ("sriov", empty_object("SR-IOV passthrough.")),
            ("slirp", empty_object("User-mode networking.")),
            ("passt", empty_object("passt networking.")),
            ("macvtap", empty_object("macvtap.")),
            ("binding", preserve("A network binding plugin.")),
            ("ports", array("Ports to forward.", preserve("A port."))),
            ("bootOrder", integer("Boot order.")),
            ("pciAddress", string("PCI address.")),
            ("dhcpOptions", preserve("DHCP options.")),
            ("tag", string("Device role tag.")),
            ("state", string("Desired link state.")),
            ("acpiIndex", integer("ACPI index.")),
            ("passtBinding", empty_object("passt binding.")),
            (
                "portRanges",
                array("Port ranges to forward.", preserve("A range.")),
            ),
        ],
    )
    .required(&["name"]);
    object(
        "Devices of the guest.",
        [
            ("disks", array("Disks.", disk)),
            ("interfaces", array("Network interfaces.", interface)),
            (
                "autoattachPodInterface",
                boolean("Attach the pod network when no interface is listed."),
            ),
            (
                "autoattachGraphicsDevice",
                boolean("Attach a graphics device."),
            ),
            (
                "autoattachSerialConsole",
                boolean("Attach a serial console."),
            ),
            ("autoattachMemBalloon", boolean("Attach a memory balloon.")),
            ("autoattachInputDevice", boolean("Attach an input device.")),
            ("autoattachVSOCK", boolean("Attach a VSOCK device.")),
            ("rng", empty_object("A virtio random number generator.")),
            ("gpus", array("GPUs passed through.", preserve("A GPU."))),
            (
                "hostDevices",
                array("Host devices passed through.", preserve("A host device.")),
            ),
            (
                "networkInterfaceMultiqueue",
                boolean("Multi-queue network interfaces."),
            ),
            ("blockMultiQueue", boolean("Multi-queue block devices.")),
            ("inputs", array("Input devices.", preserve("An input."))),
            (
                "filesystems",
                array("Shared filesystems.", preserve("A filesystem.")),
            ),
            ("tpm", preserve("A TPM.")),
            ("watchdog", preserve("A watchdog.")),
            ("video", preserve("A video device.")),
            (
                "useVirtioTransitional",
                boolean("Virtio transitional devices."),
            ),
            ("disableHotplug", boolean("Disable device hotplug.")),
            ("clientPassthrough", preserve("USB client passthrough.")),
            ("downwardMetrics", empty_object("Downward metrics device.")),
            ("logSerialConsole", boolean("Log the serial console.")),
            (
                "panicDevices",
                array("Panic devices.", preserve("A panic device.")),
            ),
            ("sound", preserve("A sound device.")),
        ],
    )
}

fn network() -> Schema {
    object(
        "A network the guest attaches to.",
        [
            (
                "name",
                string("The network name, referenced by an interface."),
            ),
            (
                "pod",
                object(
                    "The pod network.",
                    [
                        ("vmNetworkCIDR", string("IPv4 CIDR of the guest network.")),
                        (
                            "vmIPv6NetworkCIDR",
                            string("IPv6 CIDR of the guest network."),
                        ),
                    ],
                ),
            ),
            (
                "multus",
                object(
                    "A Multus network.",
                    [
                        (
                            "networkName",
                            string("NetworkAttachmentDefinition, [namespace/]name."),
                        ),
                        ("default", boolean("Use as the pod's default network.")),
                    ],
                )
                .required(&["networkName"]),
            ),
            (
                "resourceClaim",
                object(
                    "A network from a dynamic resource claim.",
                    [
                        ("claimName", string("Claim name.")),
                        ("requestName", string("Request name.")),
                    ],
                ),
            ),
        ],
    )
    .required(&["name"])
}

fn volume() -> Schema {
    let secret_ref = |what: &str| object(what, [("name", string("Secret name."))]);
    let cloud_init = |what: &str| {
        object(
            what,
            [
                (
                    "secretRef",
                    secret_ref("Secret whose `userdata` (or `userData`) key holds the user data."),
                ),
                ("userData", string("Inline user data.")),
                ("userDataBase64", string("Inline user data, base64.")),
                ("networkData", string("Inline network data.")),
                ("networkDataBase64", string("Inline network data, base64.")),
                (
                    "networkDataSecretRef",
                    secret_ref("Secret holding the network data."),
                ),
            ],
        )
    };
    object(
        "A volume, shown to the guest by the disk of the same name.",
        [
            ("name", string("Volume name.")),
            (
                "dataVolume",
                object(
                    "A DataVolume.",
                    [
                        ("name", string("DataVolume name.")),
                        ("hotpluggable", boolean("Hot-pluggable.")),
                    ],
                )
                .required(&["name"]),
            ),
            (
                "persistentVolumeClaim",
                object(
                    "A PersistentVolumeClaim.",
                    [
                        ("claimName", string("Claim name.")),
                        ("readOnly", boolean("Read-only.")),
                        ("hotpluggable", boolean("Hot-pluggable.")),
                    ],
                )
                .required(&["claimName"]),
            ),
            (
                "containerDisk",
                object(
                    "A disk image from a container image.",
                    [
                        ("image", string("Image reference.")),
                        ("imagePullPolicy", string("Always, IfNotPresent, Never.")),
                        ("imagePullSecret", string("Pull secret name.")),
                        ("path", string("Path of the disk inside the image.")),
                    ],
                )
                .required(&["image"]),
            ),
            (
                "cloudInitNoCloud",
                cloud_init("cloud-init NoCloud data source."),
            ),
            (
                "cloudInitConfigDrive",
                cloud_init("cloud-init ConfigDrive data source."),
            ),
            (
                "emptyDisk",
                object(
                    "A sparse, empty disk.",
                    [("capacity", quantity("Disk size."))],
                )
                .required(&["capacity"]),
            ),
            (
                "secret",
                object(
                    "A Secret as a disk.",
                    [
                        ("secretName", string("Secret name.")),
                        ("optional", boolean("May be missing.")),
                        ("volumeLabel", string("Filesystem label.")),
                    ],
                ),
            ),
            (
                "configMap",
                object(
                    "A ConfigMap as a disk.",
                    [
                        ("name", string("ConfigMap name.")),
                        ("optional", boolean("May be missing.")),
                        ("volumeLabel", string("Filesystem label.")),
                    ],
                ),
            ),
            (
                "serviceAccount",
                object(
                    "A service account token as a disk.",
                    [("serviceAccountName", string("Service account name."))],
                ),
            ),
            ("ephemeral", preserve("An ephemeral overlay on a claim.")),
            ("hostDisk", preserve("A disk image on the host.")),
            ("downwardAPI", preserve("Downward API as a disk.")),
            ("downwardMetrics", empty_object("Downward metrics.")),
            ("sysprep", preserve("Sysprep data.")),
            ("memoryDump", preserve("A memory dump target.")),
            (
                "containerPath",
                preserve("A path of the launcher container."),
            ),
        ],
    )
    .required(&["name"])
}

// ---------------------------------------------------------------------------------------
// Schema and CRD builders.

/// A schema under construction.
#[derive(Clone)]
struct Schema(JSONSchemaProps);

impl Schema {
    fn of(props: JSONSchemaProps) -> Self {
        Schema(props)
    }

    fn required(mut self, fields: &[&str]) -> Self {
        self.0.required = Some(fields.iter().map(|f| f.to_string()).collect());
        self
    }

    fn with_property(mut self, name: &str, schema: Schema) -> Self {
        self.0
            .properties
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_string(), schema.0);
        self
    }
}

fn typed(type_: &str, description: &str) -> JSONSchemaProps {
    JSONSchemaProps {
        type_: Some(type_.to_string()),
        description: Some(description.to_string()),
        ..Default::default()
    }
}

fn string(description: &str) -> Schema {
    Schema(typed("string", description))
}

fn boolean(description: &str) -> Schema {
    Schema(typed("boolean", description))
}

fn integer(description: &str) -> Schema {
    Schema(typed("integer", description))
}

fn int32(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        format: Some("int32".into()),
        ..typed("integer", description)
    })
}

fn int64(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        format: Some("int64".into()),
        ..typed("integer", description)
    })
}

fn string_enum(description: &str, values: &[&str]) -> Schema {
    Schema(JSONSchemaProps {
        enum_: Some(values.iter().map(|v| JSON(json!(v))).collect()),
        ..typed("string", description)
    })
}

fn quantity(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        description: Some(description.to_string()),
        any_of: Some(vec![
            JSONSchemaProps {
                type_: Some("integer".into()),
                ..Default::default()
            },
            JSONSchemaProps {
                type_: Some("string".into()),
                ..Default::default()
            },
        ]),
        pattern: Some(QUANTITY_PATTERN.into()),
        x_kubernetes_int_or_string: Some(true),
        ..Default::default()
    })
}

fn map_of(description: &str, values: Schema) -> Schema {
    Schema(JSONSchemaProps {
        additional_properties: Some(JSONSchemaPropsOrBool::Schema(Box::new(values.0))),
        ..typed("object", description)
    })
}

fn string_map(description: &str) -> Schema {
    map_of(description, string("A value."))
}

fn quantity_map(description: &str) -> Schema {
    map_of(description, quantity("A quantity."))
}

fn array(description: &str, items: Schema) -> Schema {
    Schema(JSONSchemaProps {
        items: Some(JSONSchemaPropsOrArray::Schema(Box::new(items.0))),
        ..typed("array", description)
    })
}

fn object<const N: usize>(description: &str, properties: [(&str, Schema); N]) -> Schema {
    Schema(JSONSchemaProps {
        properties: Some(
            properties
                .into_iter()
                .map(|(name, schema)| (name.to_string(), schema.0))
                .collect(),
        ),
        ..typed("object", description)
    })
}

/// An object with no fields (`masquerade: {}`): anything inside is pruned.
fn empty_object(description: &str) -> Schema {
    Schema(typed("object", description))
}

/// An object that keeps whatever it is given: only where autonodes writes nothing itself.
fn preserve(description: &str) -> Schema {
    Schema(JSONSchemaProps {
        x_kubernetes_preserve_unknown_fields: Some(true),
        ..typed("object", description)
    })
}

fn column(
    name: &str,
    type_: &str,
    json_path: &str,
    description: Option<&str>,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.to_string(),
        type_: type_.to_string(),
        json_path: json_path.to_string(),
        description: description.map(str::to_string),
        ..Default::default()
    }
}

struct CrdParts {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_names: &'static [&'static str],
    description: &'static str,
    spec: Schema,
    spec_required: bool,
    status: Schema,
    /// Whether `status` is a subresource (KubeVirt's VMI CRD has none: its status is
    /// written with the object).
    status_subresource: bool,
    columns: Vec<CustomResourceColumnDefinition>,
}

fn crd(parts: CrdParts) -> CustomResourceDefinition {
    let root = object(
        parts.description,
        [
            ("apiVersion", string("APIVersion of this object.")),
            ("kind", string("Kind of this object.")),
            // The API server allows nothing but `type: object` on the root metadata.
            (
                "metadata",
                Schema(JSONSchemaProps {
                    type_: Some("object".to_string()),
                    ..Default::default()
                }),
            ),
            ("spec", parts.spec),
            ("status", parts.status),
        ],
    );
    let root = if parts.spec_required {
        root.required(&["spec"])
    } else {
        root
    };
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", parts.plural, parts.group)),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_string(),
                "autonodes-simulator".to_string(),
            )])),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: parts.group.to_string(),
            names: CustomResourceDefinitionNames {
                kind: parts.kind.to_string(),
                list_kind: Some(format!("{}List", parts.kind)),
                plural: parts.plural.to_string(),
                singular: Some(parts.singular.to_string()),
                short_names: Some(parts.short_names.iter().map(|s| s.to_string()).collect()),
                categories: Some(vec!["all".to_string()]),
            },
            scope: "Namespaced".to_string(),
            versions: vec![CustomResourceDefinitionVersion {
                name: parts.version.to_string(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(root.0),
                }),
                subresources: parts
                    .status_subresource
                    .then(|| CustomResourceSubresources {
                        status: Some(CustomResourceSubresourceStatus(json!({}))),
                        scale: None,
                    }),
                additional_printer_columns: Some(parts.columns),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks a schema and returns every path that preserves unknown fields.
    fn preserving_paths(schema: &JSONSchemaProps, path: String, out: &mut Vec<String>) {
        if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
            out.push(path.clone());
        }
        for (name, child) in schema.properties.iter().flatten() {
            preserving_paths(child, format!("{path}.{name}"), out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
            preserving_paths(items, format!("{path}[]"), out);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
            preserving_paths(values, format!("{path}{{}}"), out);
        }
    }

    fn root(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema")
    }

    #[test]
    fn no_object_on_a_path_autonodes_writes_preserves_unknown_fields() {
        let mut paths = Vec::new();
        preserving_paths(root(&virtual_machine_crd()), String::new(), &mut paths);
        let written = [
            ".metadata",
            ".spec",
            ".spec.dataVolumeTemplates[]",
            ".spec.dataVolumeTemplates[].metadata",
            ".spec.template",
            ".spec.template.metadata",
            ".spec.template.spec",
            ".spec.template.spec.domain",
            ".spec.template.spec.domain.cpu",
            ".spec.template.spec.domain.memory",
            ".spec.template.spec.domain.resources",
            ".spec.template.spec.domain.devices",
            ".spec.template.spec.domain.devices.disks[]",
            ".spec.template.spec.domain.devices.interfaces[]",
            ".spec.template.spec.networks[]",
            ".spec.template.spec.volumes[]",
            ".spec.template.spec.volumes[].cloudInitNoCloud",
            ".spec.template.spec.volumes[].cloudInitNoCloud.secretRef",
            ".spec.template.spec.affinity",
            ".spec.template.spec.affinity.nodeAffinity",
            ".spec.template.spec.affinity.podAntiAffinity",
            ".spec.dataVolumeTemplates[].spec",
            ".spec.dataVolumeTemplates[].spec.source",
            ".spec.dataVolumeTemplates[].spec.storage",
            ".spec.dataVolumeTemplates[].spec.pvc",
            ".spec.dataVolumeTemplates[].spec.pvc.resources",
            ".spec.instancetype",
            ".spec.preference",
            ".status",
        ];
        for p in written {
            assert!(
                !paths.iter().any(|q| q == p),
                "{p} preserves unknown fields"
            );
        }
        assert!(paths.contains(&".spec.template.spec.readinessProbe".to_string()));
    }

    /// The property names at `path` (`a.b.c`, through `items` for a list) of a schema.
    fn fields_at(schema: &JSONSchemaProps, path: &str) -> Vec<String> {
        let mut at = schema;
        for step in path.split('.').filter(|s| !s.is_empty()) {
            if let Some(JSONSchemaPropsOrArray::Schema(items)) = &at.items {
                at = items;
            }
            at = &at.properties.as_ref().expect("properties")[step];
        }
        at.properties
            .iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect()
    }

    #[test]
    fn a_vms_data_volume_templates_drop_what_kubevirts_older_cdi_types_lack_and_pvc_is_structural()
    {
        let vm = root(&virtual_machine_crd()).clone();
        let dv = root(&data_volume_crd()).clone();
        let in_vm = fields_at(&vm, "spec.dataVolumeTemplates.spec");
        let in_cdi = fields_at(&dv, "spec");
        assert!(
            !in_vm.contains(&"serviceAccountName".to_string()),
            "{in_vm:?}"
        );
        assert!(
            in_cdi.contains(&"serviceAccountName".to_string()),
            "{in_cdi:?}"
        );
        let http = fields_at(&vm, "spec.dataVolumeTemplates.spec.source.http");
        assert!(!http
            .iter()
            .any(|f| f == "checksum" || f == "insecureSkipVerify"));
        let http = fields_at(&dv, "spec.source.http");
        assert!(http.contains(&"checksum".to_string()), "{http:?}");
        // A golden volume's DataVolume copies a template's `pvc`: pruned like CDI's.
        let mut paths = Vec::new();
        preserving_paths(&dv, String::new(), &mut paths);
        for p in [".spec", ".spec.pvc", ".spec.pvc.resources", ".spec.storage"] {
            assert!(
                !paths.iter().any(|q| q == p),
                "{p} preserves unknown fields"
            );
        }
        let pvc = fields_at(&dv, "spec.pvc");
        assert!(
            pvc.contains(&"volumeAttributesClassName".to_string()),
            "{pvc:?}"
        );
    }

    #[test]
    fn names_and_short_names_match_kubevirt() {
        let crds = kubevirt_crds();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            [
                "virtualmachines.kubevirt.io",
                "virtualmachineinstances.kubevirt.io",
                "datavolumes.cdi.kubevirt.io"
            ]
        );
        assert_eq!(
            crds[0].spec.names.short_names.as_deref(),
            Some(&["vm".to_string(), "vms".to_string()][..])
        );
        // As in KubeVirt's and CDI's CRDs: VirtualMachine and DataVolume have a status
        // subresource, VirtualMachineInstance has none (its status is written with it).
        let has_status: Vec<bool> = crds
            .iter()
            .map(|c| {
                c.spec.versions[0]
                    .subresources
                    .as_ref()
                    .is_some_and(|s| s.status.is_some())
            })
            .collect();
        assert_eq!(has_status, [true, false, true]);
    }
}
