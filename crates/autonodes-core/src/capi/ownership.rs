//! Which objects belong to which pool's mirror (owner references, pool labels), and the
//! names of the claims' fields the mirror reads.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::label_value;
use autonodes_api::capi::LABEL_POOL_NAME;
use autonodes_api::LABEL_NODEPOOL;

/// Names the mirror reads on NodeClaims that the claim and pool controllers define. They
/// are passed in, so each stays defined once, beside the controller that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimNames {
    /// The claim annotation that makes the pool controller remove the claim first on
    /// scale-down (the pool controller's `ANNOTATION_DELETE_FIRST`).
    pub delete_first: &'static str,
    /// The claim condition: its node is Ready.
    pub ready: &'static str,
    /// The claim condition: its VM runs.
    pub provisioned: &'static str,
}

/// The name of the controlling owner of kind `kind` (owner references hold full names;
/// labels may hold shortened ones).
pub fn owner_named(meta: &ObjectMeta, kind: &str) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind && o.controller == Some(true))
        .map(|o| o.name.clone())
}

/// Whether an owner of kind `kind` with uid `uid` is among the owners in `meta`.
pub fn owned_by(meta: &ObjectMeta, kind: &str, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == kind && o.uid == uid)
}

/// The label selector of the Machines of the pool `pool`.
pub fn machine_selector(pool: &str) -> String {
    format!("{LABEL_POOL_NAME}={}", label_value(pool))
}

/// The label selector of the NodeClaims of the pool `pool`.
pub fn claim_selector(pool: &str) -> String {
    format!("{LABEL_NODEPOOL}={}", label_value(pool))
}

/// Whether `meta` is in namespace `ns` and labelled `key` for the pool `pool`.
pub(crate) fn labelled_for(meta: &ObjectMeta, ns: &str, key: &str, pool: &str) -> bool {
    meta.namespace.as_deref() == Some(ns)
        && meta.labels.as_ref().and_then(|l| l.get(key)) == Some(&label_value(pool))
}

/// Whether `meta` is of a Machine of the pool `pool` in `ns`.
pub fn is_machine_of(meta: &ObjectMeta, ns: &str, pool: &str) -> bool {
    labelled_for(meta, ns, LABEL_POOL_NAME, pool)
}
