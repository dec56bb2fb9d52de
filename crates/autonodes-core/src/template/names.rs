//! Names and labels of what autonodes makes for a claim: the VM, its user-data Secret,
//! the volumes every VM has, and the labels that tie them to the claim.

use std::collections::BTreeMap;

use autonodes_api::{
    LABEL_INSTALLATION, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_NODECLAIM_NAMESPACE,
    LABEL_NODECLAIM_UID, LABEL_WARM_VM, MANAGED_BY,
};

/// Name of the cloud-init volume and disk autonodes adds to every VirtualMachine.
pub(crate) const CLOUD_INIT_VOLUME: &str = "cloudinitdisk";
/// Key of the user data in the `<vm>-userdata` Secret.
pub const USER_DATA_KEY: &str = "userdata";
/// The key of the user-data Secret holding the VM's cloud-init network data, when its claim
/// has a static address.
pub const NETWORK_DATA_KEY: &str = "networkdata";
/// API version of the VirtualMachines autonodes writes.
pub(crate) const VM_API_VERSION: &str = "kubevirt.io/v1";
/// Kind of the VirtualMachines autonodes writes.
pub(crate) const VM_KIND: &str = "VirtualMachine";
/// The longest name Kubernetes accepts for a DNS-1123 label (VM names, hostnames).
pub(crate) const MAX_DNS_LABEL: usize = 63;
/// The longest DataVolume / PersistentVolumeClaim name (a DNS-1123 subdomain).
pub(crate) const MAX_DNS_SUBDOMAIN: usize = 253;

/// The default size of a root disk made from [`super::add_root_disk`] without a size.
pub(crate) const DEFAULT_ROOT_DISK_SIZE: &str = "20Gi";
/// The name of the root disk, its volume and its DataVolume template (before the VM name
/// is put in front of the DataVolume's).
pub(crate) const ROOT_DISK: &str = "rootdisk";

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
pub(crate) fn node_identity_labels(
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

/// Whether the user-data Secret of VM `vm_name` carrying `labels` is this installation's
/// to delete: made by autonodes with `installation`'s label, and for the claim with
/// `claim_uid` ([`labelled_for_claim`]) or for the warm VM `vm_name` (which a claim that
/// took it inherits). A Secret of that name someone else made, or another installation's,
/// is left alone.
pub fn user_data_is_ours(
    labels: &BTreeMap<String, String>,
    installation: &str,
    vm_name: &str,
    claim_uid: Option<&str>,
) -> bool {
    let installed = labels.get(LABEL_INSTALLATION).map(String::as_str)
        == Some(crate::names::label_value(installation).as_str());
    let managed = labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY);
    let for_claim = claim_uid.is_some_and(|uid| labelled_for_claim(labels, uid));
    let for_warm_vm = labels.get(LABEL_WARM_VM).map(String::as_str) == Some(vm_name);
    installed && managed && (for_claim || for_warm_vm)
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
