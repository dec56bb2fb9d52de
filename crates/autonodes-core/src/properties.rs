//! Property keys of node types, pools and claims that autonodes reads (beside labels
//! every node gets), and their parsers: what a property means is looked up here.

use autonodes_api::{Properties, LABEL_PROVIDER};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::resources::ResourceAmounts;
use crate::resources::Room;

/// Built-in property: the short node type name (the entry name in the provider).
pub(crate) const PROP_NODE_TYPE: &str = "autonodes.io/node-type";
/// Built-in property: alias of [`PROP_NODE_TYPE`], as vCluster spells it.
pub(crate) const PROP_NODE_TYPE_ALIAS: &str = "vcluster.com/node-type";
/// Built-in property: the NodeProvider name.
pub(crate) const PROP_PROVIDER: &str = LABEL_PROVIDER;
/// Built-in property: the NodeType name (`<provider>.<type>`).
pub(crate) const PROP_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Built-in property: the operating system (`linux`).
pub(crate) const PROP_OS: &str = "kubernetes.io/os";
/// Built-in property: the CPU architecture (`amd64` unless a property overrides it).
pub(crate) const PROP_ARCH: &str = "kubernetes.io/arch";
/// Built-in property: the capacity type (`on-demand`).
pub(crate) const PROP_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Property holding the user's own cloud-config, merged into the user data.
pub(crate) const PROP_USER_DATA: &str = "autonodes.io/user-data";
/// Property holding SSH public keys for the node, one per line.
pub(crate) const PROP_SSH_KEYS: &str = "autonodes.io/ssh-keys";
/// Property choosing the built-in user data template: `kubeadm` (default) or `vcluster`.
pub(crate) const PROP_USER_DATA_TEMPLATE: &str = "autonodes.io/user-data-template";
/// Property saying the type's image has containerd, the kubelet and kubeadm already
/// (`"true"`): the user data installs nothing. Otherwise it installs them.
pub(crate) const PROP_IMAGE_PREPARED: &str = "autonodes.io/image-prepared";
/// Property naming where the type's nodes download the kubelet and kubeadm (a mirror);
/// it replaces `autonodes run --kubernetes-download-url` for the type.
pub(crate) const PROP_KUBERNETES_DOWNLOAD_URL: &str = "autonodes.io/kubernetes-download-url";
/// vCluster's spelling of [`PROP_USER_DATA`] (the autonodes one wins when both are set).
pub(crate) const PROP_VCLUSTER_USER_DATA: &str = "vcluster.com/user-data";
/// vCluster's spelling of [`PROP_SSH_KEYS`] (the autonodes one wins when both are set).
pub(crate) const PROP_VCLUSTER_SSH_KEYS: &str = "vcluster.com/ssh-keys";
/// vCluster's KubeVirt property: the image of a root disk the type's template lacks.
pub(crate) const PROP_IMAGE_URL: &str = "kubevirt.vcluster.com/image-url";
/// vCluster's KubeVirt property: the size of that root disk (default 20Gi).
pub(crate) const PROP_ROOT_DISK_SIZE: &str = "kubevirt.vcluster.com/root-disk-size";
/// Properties that configure the node rather than describe it: never node labels.
pub(crate) const CONFIG_PROPERTIES: &[&str] = &[
    PROP_USER_DATA,
    PROP_SSH_KEYS,
    PROP_USER_DATA_TEMPLATE,
    PROP_IMAGE_PREPARED,
    PROP_KUBERNETES_DOWNLOAD_URL,
    PROP_VCLUSTER_USER_DATA,
    PROP_VCLUSTER_SSH_KEYS,
    PROP_IMAGE_URL,
    PROP_ROOT_DISK_SIZE,
    crate::properties::PROP_ROOT_DISK_STORAGE_CLASS,
    crate::properties::PROP_DATA_DISKS,
    crate::properties::PROP_NETWORKS,
    crate::properties::PROP_DEFAULT_NETWORK,
    crate::properties::PROP_VM_AFFINITY,
    crate::properties::PROP_VM_ANTI_AFFINITY,
    crate::properties::PROP_VM_AFFINITY_SCOPE,
    crate::properties::PROP_HOST_NODE_SELECTOR,
    crate::properties::PROP_HOST_NODE_PREFERENCE,
    crate::properties::PROP_GOLDEN_IMAGE,
    crate::properties::PROP_INSTANCETYPE,
    crate::properties::PROP_PREFERENCE,
];

/// Of [`CONFIG_PROPERTIES`], those a warm VM can be given with its binding instead of at
/// boot: the node's user data and SSH keys (both spellings).
pub(crate) const AT_BINDING_PROPERTIES: &[&str] = &[
    PROP_USER_DATA,
    PROP_SSH_KEYS,
    PROP_VCLUSTER_USER_DATA,
    PROP_VCLUSTER_SSH_KEYS,
];

/// A configuration property in autonodes' spelling, else in vCluster's.
pub(crate) fn config_property<'p>(
    properties: &'p Properties,
    autonodes: &str,
) -> Option<&'p String> {
    let vcluster = match autonodes {
        PROP_USER_DATA => PROP_VCLUSTER_USER_DATA,
        PROP_SSH_KEYS => PROP_VCLUSTER_SSH_KEYS,
        _ => return properties.get(autonodes),
    };
    properties
        .get(autonodes)
        .or_else(|| properties.get(vcluster))
}

/// Property: what a VM's launcher pod asks of a host node beyond the guest's cpu and memory
/// (KubeVirt's virt-launcher, QEMU and page tables), as `cpu=<quantity>,memory=<quantity>`.
pub(crate) const PROP_HOST_OVERHEAD: &str = "autonodes.io/host-overhead";

/// The launcher overhead when [`PROP_HOST_OVERHEAD`] is not set: about what KubeVirt adds
/// to a small VM's launcher pod.
pub(crate) const DEFAULT_HOST_OVERHEAD: &str = "cpu=100m,memory=256Mi";

/// The property (and node label, and host node label) naming a zone.
pub const PROP_ZONE: &str = "topology.kubernetes.io/zone";

/// Property: `soft` or `hard` pod affinity between the VMs of a group (on one host node).
pub(crate) const PROP_VM_AFFINITY: &str = "autonodes.io/vm-affinity";

/// Property: `soft` or `hard` pod anti-affinity between the VMs of a group (each on its own
/// host node).
pub(crate) const PROP_VM_ANTI_AFFINITY: &str = "autonodes.io/vm-anti-affinity";

/// Property: the group (anti-)affinity is about: `tenant` (default: the VMs of the claim's
/// tenant cluster) or `pool` (the VMs of the claim's node pool; a claim without a pool is
/// grouped with its tenant).
pub(crate) const PROP_VM_AFFINITY_SCOPE: &str = "autonodes.io/vm-affinity-scope";

/// Property: host node labels the VM must run on: `key=value`, `key=v1|v2` or `key` (any
/// value), separated by commas.
pub(crate) const PROP_HOST_NODE_SELECTOR: &str = "autonodes.io/host-node-selector";

/// Property: host node labels the VM prefers, in the same form.
pub(crate) const PROP_HOST_NODE_PREFERENCE: &str = "autonodes.io/host-node-preference";

/// The property listing secondary networks.
pub(crate) const PROP_NETWORKS: &str = "autonodes.io/networks";

/// The property naming the network that replaces the pod network.
pub(crate) const PROP_DEFAULT_NETWORK: &str = "autonodes.io/default-network";

/// Property: the instance type, `[<kind>/]<name>`; the kind is
/// `VirtualMachineClusterInstancetype` (default) or `VirtualMachineInstancetype`.
pub(crate) const PROP_INSTANCETYPE: &str = "autonodes.io/instancetype";

/// Property: the preference, `[<kind>/]<name>`; the kind is
/// `VirtualMachineClusterPreference` (default) or `VirtualMachinePreference`.
pub(crate) const PROP_PREFERENCE: &str = "autonodes.io/preference";

/// The property listing a node type's blank data disks.
pub(crate) const PROP_DATA_DISKS: &str = "autonodes.io/data-disks";

/// The property naming the storage class of the root disk autonodes makes from an image.
pub(crate) const PROP_ROOT_DISK_STORAGE_CLASS: &str = "autonodes.io/root-disk-storage-class";

/// Property: `"true"` makes a type's image imports golden (see the module documentation).
pub(crate) const PROP_GOLDEN_IMAGE: &str = "autonodes.io/golden-image";

/// Reads [`PROP_HOST_OVERHEAD`] (or its default); the error says what is wrong with it.
pub(crate) fn host_overhead(properties: &Properties) -> Result<Room, String> {
    let value = properties
        .get(PROP_HOST_OVERHEAD)
        .map(String::as_str)
        .unwrap_or(DEFAULT_HOST_OVERHEAD);
    let mut room = Room::default();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let shown: String = entry.chars().take(48).collect();
        let (name, quantity) = entry
            .split_once('=')
            .ok_or_else(|| format!("{shown:?} is not name=quantity"))?;
        let mut list = BTreeMap::new();
        list.insert(
            name.trim().to_string(),
            Quantity(quantity.trim().to_string()),
        );
        let amounts = ResourceAmounts::from_list(&list).map_err(|e| e.to_string())?;
        match name.trim() {
            "cpu" => room.cpu_millis = amounts.cpu_millis(),
            "memory" => room.memory = amounts.memory_bytes(),
            other => {
                return Err(format!(
                    "{:?} is neither cpu nor memory",
                    other.chars().take(32).collect::<String>()
                ))
            }
        }
    }
    Ok(room)
}
