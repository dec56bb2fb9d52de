//! The autonodes API: `autonodes.io/v1alpha1` custom resources.
//!
//! Pure data types built on `kube-core` (the types half of kube, no client). The CRD YAML
//! in `crds/` is generated from these types by [`crdgen`] (`autonodes crdgen`). Also here:
//! [`conditions`] (condition bookkeeping), [`reasons`] (condition types and reasons as
//! types) and [`kubevirt`] (the KubeVirt kinds autonodes
//! reads and writes).

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
// Documented for the workspace's developers (`cargo doc --document-private-items`): public
// items may name the private helpers they are made of.
#![allow(rustdoc::private_intra_doc_links)]

pub mod capi;
pub mod common;
pub mod conditions;
pub mod crdgen;
pub mod kubevirt;
pub mod nodeclaim;
pub mod nodepool;
pub mod nodeprovider;
pub mod nodequota;
pub mod nodetype;
pub mod reasons;
pub mod schema;

pub use common::*;
pub use nodeclaim::*;
pub use nodepool::*;
pub use nodeprovider::*;
pub use nodequota::*;
pub use nodetype::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

/// The API group of every autonodes resource.
pub const GROUP: &str = "autonodes.io";
/// The API version served and stored.
pub const VERSION: &str = "v1alpha1";

/// Label put on every object autonodes creates, in any cluster.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "autonodes";
/// Label naming the NodeProvider a NodeType belongs to.
pub const LABEL_PROVIDER: &str = "autonodes.io/provider";
/// Label naming the NodeClaim an object was created for.
pub const LABEL_NODECLAIM: &str = "autonodes.io/nodeclaim";
/// Label naming the namespace of the NodeClaim an object was created for.
pub const LABEL_NODECLAIM_NAMESPACE: &str = "autonodes.io/nodeclaim-namespace";
/// Label holding the UID of the NodeClaim an object was created for.
pub const LABEL_NODECLAIM_UID: &str = "autonodes.io/nodeclaim-uid";
/// Label holding the id of the autonodes installation that created an object on a host or
/// tenant cluster (`--installation-id`): only that installation sweeps, adopts or deletes
/// it, so two installations sharing a host namespace leave each other's objects alone.
pub const LABEL_INSTALLATION: &str = "autonodes.io/installation";
/// The installation a controller started without `--installation` labels its objects with.
pub const DEFAULT_INSTALLATION: &str = "default";
/// Label naming the NodePool a NodeClaim belongs to.
pub const LABEL_NODEPOOL: &str = "autonodes.io/nodepool";
/// Key of the host kubeconfig in its Secret.
pub const HOST_KUBECONFIG_KEY: &str = "kubeconfig";
/// The `clusterRef.cluster` that makes a provider's VMs go to the management cluster
/// itself (no host kubeconfig Secret).
pub const LOCAL_HOST_CLUSTER: &str = "local";
/// Key of the tenant kubeconfig in the `vc-<name>` Secret.
pub const TENANT_KUBECONFIG_KEY: &str = "config";
/// Finalizer that holds a NodeClaim until its remote objects are gone.
pub const FINALIZER: &str = "autonodes.io/cleanup";
/// Label on a warm VM and the objects made for it: the NodeType it is warm for (as a label
/// value, shortened like a name when too long).
pub const LABEL_WARM_NODETYPE: &str = "autonodes.io/warm-nodetype";
/// Label on a warm VM kept for one NodePool (`spec.warm` of the pool): the pool's UID. Only
/// a claim of that pool takes it.
pub const LABEL_WARM_NODEPOOL: &str = "autonodes.io/warm-nodepool";
/// Label on the objects made for one warm VM (its credential, heartbeat Lease and
/// binding): the VM's name.
pub const LABEL_WARM_VM: &str = "autonodes.io/warm-vm";
/// Label on a warm VM: the NodeType's definition hash it was made from (a warm VM of an
/// older definition is replaced).
pub const LABEL_WARM_DEFINITION: &str = "autonodes.io/warm-definition";
/// Annotation on a warm VM: when its credential (the token in its user data) expires, as
/// the host API server answered the token request (RFC 3339). The VM is replaced before.
pub const ANNOTATION_WARM_CREDENTIAL_EXPIRES: &str = "autonodes.io/warm-credential-expires";
/// Annotation on a warm VM's ServiceAccount: the UID of the VM's heartbeat Lease, which the
/// VM itself may write (labels included), so that only that Lease is ever deleted for it.
pub const ANNOTATION_WARM_LEASE_UID: &str = "autonodes.io/warm-lease-uid";
/// Annotation on a NodeClaim asking for its VM to be restarted: a new value (any text, such
/// as a time) restarts it once. Node repair sets it; so may a user.
pub const ANNOTATION_RESTART: &str = "autonodes.io/restart";
/// Annotation on a NodeClaim: once the claim is deleted, its VM is kept halted until this
/// time (RFC 3339; at most 24 h after the deletion) for debugging. Node repair sets it from
/// `repair.keepFailedFor`.
pub const ANNOTATION_KEEP_UNTIL: &str = "autonodes.io/keep-failed-until";

/// Every CustomResourceDefinition of the `autonodes.io` group, then the Cluster-API-shaped
/// mirrors of `capi.autonodes.io`, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        NodeClaim::crd(),
        NodePool::crd(),
        NodeProvider::crd(),
        NodeQuota::crd(),
        NodeType::crd(),
        capi::MachinePool::crd(),
        capi::Machine::crd(),
        capi::MachineSet::crd(),
    ]
}

#[cfg(test)]
mod cel_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn every_vcluster_reference_example_deserializes_into_a_node_provider() {
        for file in [
            "nodeprovider-minimal.yaml",
            "nodeprovider-advanced.yaml",
            "nodeprovider-types.yaml",
        ] {
            let p: NodeProvider = serde_saphyr::from_str(&example(file))
                .unwrap_or_else(|e| panic!("{file} does not deserialize: {e}"));
            assert_eq!(p.spec.kube_virt.cluster_ref.cluster, "test-kubevirt-1");
            assert!(
                !p.spec.kube_virt.node_types.is_empty(),
                "{file} has node types"
            );
        }
    }

    #[test]
    fn the_node_quota_example_deserializes_with_its_selector_and_limits() {
        let q: NodeQuota = serde_saphyr::from_str(&example("nodequota.yaml")).expect("example");
        assert_eq!(q.spec.namespaces, ["team-a", "team-b"]);
        assert_eq!(q.spec.limits["memory"].0, "20Gi");
        let selector = q.spec.node_type_selector.expect("selector");
        assert_eq!(
            selector.match_labels.expect("labels")["autonodes.io/node-type"],
            "standard-node"
        );
    }

    #[test]
    fn integer_and_string_quantities_both_deserialize() {
        let p: NodeProvider = serde_saphyr::from_str(&example("nodeprovider-advanced.yaml"))
            .expect("advanced example");
        let high = &p.spec.kube_virt.node_types[1];
        assert_eq!(high.resources["cpu"].0, "4");
        assert_eq!(high.resources["memory"].0, "16Gi");
        assert!(high.merge_virtual_machine_template.is_some());
    }

    #[test]
    fn not_exists_is_accepted_as_a_requirement_operator() {
        let r: Requirement =
            serde_json::from_str(r#"{"key":"gpu","operator":"NotExists"}"#).expect("parses");
        assert_eq!(r.operator, Operator::NotExists);
        assert!(r.values.is_empty());
    }

    #[test]
    fn an_unknown_requirement_operator_is_rejected() {
        let r = serde_json::from_str::<Requirement>(r#"{"key":"a","operator":"Matches"}"#);
        assert!(r.is_err());
    }

    #[test]
    fn node_pool_crd_declares_the_scale_subresource_on_replicas_and_selector() {
        let crd = serde_json::to_value(NodePool::crd()).expect("serializes");
        let scale = &crd["spec"]["versions"][0]["subresources"]["scale"];
        assert_eq!(scale["specReplicasPath"], ".spec.replicas");
        assert_eq!(scale["statusReplicasPath"], ".status.replicas");
        assert_eq!(scale["labelSelectorPath"], ".status.selector");
        for crd in crds() {
            let v = serde_json::to_value(&crd).expect("serializes");
            assert!(
                v["spec"]["versions"][0]["subresources"]["status"].is_object(),
                "{:?} lacks the status subresource",
                crd.metadata.name
            );
        }
    }
}
