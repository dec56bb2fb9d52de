//! The parts of the KubeVirt and CDI schemas the CRDs share: a VM's instance template
//! (domain, devices, networks, volumes, affinity) and a DataVolume's spec.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

use super::schema::*;

/// The eviction strategies KubeVirt documents for a VMI's `spec.evictionStrategy`.
pub const EVICTION_STRATEGIES: [&str; 4] =
    ["None", "LiveMigrate", "LiveMigrateIfPossible", "External"];

// ---------------------------------------------------------------------------------------
// The VirtualMachineInstance template: the part autonodes composes.

// ---------------------------------------------------------------------------------------
// Status parts: conditions, phase transitions, a live migration's state.

/// A condition of a KubeVirt object (`type` and `status` required; times may be null).
pub(super) fn condition(description: &str) -> Schema {
    object(
        description,
        [
            (
                "type",
                string("The condition type (Ready, LiveMigratable, …)."),
            ),
            ("status", string("True, False or Unknown.")),
            ("reason", string("Why, in CamelCase.")),
            ("message", string("Why, for humans.")),
            ("lastProbeTime", timestamp("When last probed.")),
            (
                "lastTransitionTime",
                timestamp("When the status last changed."),
            ),
        ],
    )
    .required(&["type", "status"])
}

/// When an object entered a phase (`phaseTransitionTimestamps[]`).
pub(super) fn phase_transition(description: &str) -> Schema {
    object(
        description,
        [
            ("phase", string("The phase.")),
            (
                "phaseTransitionTimestamp",
                Schema::of(JSONSchemaProps {
                    format: Some("date-time".into()),
                    ..typed("string", "When.")
                }),
            ),
        ],
    )
}

/// A live migration's state (`migrationState` of a VMI and of a migration): structural
/// for where it goes and how it ended; KubeVirt's finer details (launcher pods' states,
/// the migration's configuration) keep what they are given.
pub(super) fn migration_state(description: &str) -> Schema {
    object(
        description,
        [
            (
                "migrationUid",
                string("The uid of the VirtualMachineInstanceMigration."),
            ),
            (
                "sourceNode",
                string("The host node the guest left or leaves."),
            ),
            ("targetNode", string("The host node the guest goes to.")),
            (
                "targetNodeAddress",
                string("The target node's migration address."),
            ),
            ("sourcePod", string("The launcher pod on the source.")),
            ("targetPod", string("The launcher pod on the target.")),
            ("mode", string("PreCopy or PostCopy.")),
            ("startTimestamp", timestamp("When the migration started.")),
            ("endTimestamp", timestamp("When the migration ended.")),
            ("completed", boolean("The migration completed.")),
            ("failed", boolean("The migration failed.")),
            ("failureReason", string("Why the migration failed.")),
            ("abortRequested", boolean("An abort was asked for.")),
            ("abortStatus", string("How the abort went.")),
            (
                "targetNodeDomainDetected",
                boolean("The target saw the guest start."),
            ),
            (
                "targetNodeDomainReadyTimestamp",
                timestamp("When the guest was ready on the target."),
            ),
            (
                "migrationPolicyName",
                string("The MigrationPolicy applied."),
            ),
            (
                "migrationConfiguration",
                preserve("The migration configuration applied."),
            ),
            ("sourceState", preserve("The source handler's state.")),
            ("targetState", preserve("The target handler's state.")),
        ],
    )
}

/// `metadata` inside a template: structural, unlike the object's own metadata.
pub(super) fn template_metadata(description: &str) -> Schema {
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
pub(super) fn claim_fields() -> [(&'static str, Schema); 8] {
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
pub(super) enum DataVolumeIn {
    Cdi,
    VmTemplate,
}

/// A DataVolumeSpec: structural for the sources and the `storage` and `pvc` fields autonodes
/// writes (blank, registry, HTTP and PVC sources; size, storage class, access and volume
/// modes; a golden volume copies a template's `pvc`), preserving the rest (other sources).
pub(super) fn data_volume_spec(used_in: DataVolumeIn) -> Schema {
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

pub(super) fn data_volume_template() -> Schema {
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

pub(super) fn vmi_template() -> Schema {
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
pub(super) fn vmi_spec(description: &str) -> Schema {
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
                string_enum(
                    "What happens to the guest when its host node is drained.",
                    &EVICTION_STRATEGIES,
                ),
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
pub(super) fn affinity() -> Schema {
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
pub(super) fn pod_affinity(description: &str) -> Schema {
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

pub(super) fn domain() -> Schema {
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

pub(super) fn devices() -> Schema {
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

pub(super) fn network() -> Schema {
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

pub(super) fn volume() -> Schema {
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
