//! The autonodes API: `autonodes.io/v1alpha1` custom resources (DESIGN §2).
//!
//! Pure data types. Nothing here does I/O; the CRD YAML in `crds/` is generated
//! from these types by `autonodes crdgen`.

pub mod common;
pub mod nodeclaim;
pub mod nodepool;
pub mod nodeprovider;
pub mod nodetype;
pub mod schema;

pub use common::*;
pub use nodeclaim::*;
pub use nodepool::*;
pub use nodeprovider::*;
pub use nodetype::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

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
/// Label naming the NodePool a NodeClaim belongs to.
pub const LABEL_NODEPOOL: &str = "autonodes.io/nodepool";
/// Finalizer that holds a NodeClaim until its remote objects are gone.
pub const FINALIZER: &str = "autonodes.io/cleanup";

/// Every CustomResourceDefinition of the `autonodes.io` group, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        NodeClaim::crd(),
        NodePool::crd(),
        NodeProvider::crd(),
        NodeType::crd(),
    ]
}
