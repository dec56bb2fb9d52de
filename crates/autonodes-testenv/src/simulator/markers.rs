//! The names the simulator marks objects with and looks for: the label selector of the
//! VirtualMachines it plays KubeVirt for, its finalizer and its annotations.

/// The label selector of the VirtualMachines the simulator plays KubeVirt for.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=autonodes";
/// The finalizer the simulator keeps on VirtualMachines until it has torn them down.
pub const FINALIZER: &str = "simulator.autonodes.io/teardown";
/// VMI annotation: why the guest did not join (absent once it joined).
pub const JOIN_ERROR_ANNOTATION: &str = "simulator.autonodes.io/join-error";
/// VM annotation (set by tests, or by hand in the playground): the guest's kubelet has
/// stopped — its joined Node turns `Ready=Unknown` and stays so until the annotation goes.
pub const KUBELET_STOPPED_ANNOTATION: &str = "simulator.autonodes.io/kubelet-stopped";
/// VM annotation (set by tests, or by hand in the playground): the version the guest's
/// kubelet reports in its Node's `status.nodeInfo` from now on (`v1.19.7`), as a node that
/// joined before its tenant was upgraded would; on a VM made with it (from its template),
/// the Node registers with that version, as a baked kubelet would.
pub const KUBELET_VERSION_ANNOTATION: &str = "simulator.autonodes.io/kubelet-version";
/// VM annotation (set by tests, or by hand in the playground): every live migration of the
/// VM's instance fails as soon as it is asked for, with the annotation's value as its
/// `failureReason` (a default reason when the value is empty or `true`).
pub const MIGRATION_FAILS_ANNOTATION: &str = "simulator.autonodes.io/migration-fails";
/// Prefix of a join error the guest no longer retries.
pub const GAVE_UP_PREFIX: &str = "gave up: ";

/// The annotation `key` of a KubeVirt object, if it has it.
pub(crate) fn annotation<'a>(obj: &'a kube::api::DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}
