//! Node pools, the pure half of the NodePool controller: what a pool's claims
//! look like, which to keep, delete and create, and the status that follows.
//!
//! - here: the claim template and its hash, claim names and objects, ownership, the claims'
//!   selector, the disruption settings (budget, `consolidateAfter`, `expireAfter`) and when
//!   a wait is over;
//! - [`budget`]: how many of a pool's nodes may be disrupted now (`disruption.budgets`,
//!   their cron windows, the older `disruption.budget`, the default 10 %);
//! - [`repair`]: which claims whose node stopped being Ready are replaced, and when the
//!   pool stops repairing (more than a fifth unhealthy);
//! - [`plan`]: the claims of a pool to delete and create (scale, replace, roll);
//! - [`limits`]: how many claims one reconcile may create (a batch, the namespace's cap,
//!   its NodeQuotas' `nodes`);
//! - [`pack`]: pending pods packed onto the room of existing nodes and onto new nodes of the
//!   cheapest accepting type, within the pool's limits;
//! - [`dynamic`]: a dynamic pool's new claims for pending pods (by weight among the
//!   tenant's pools), its conditions;
//! - [`consolidate`]: a dynamic pool's empty and underutilized nodes marked and removed;
//! - [`do_not_disrupt`]: the pods, Nodes and claims marked to be left alone by voluntary
//!   disruption;
//! - [`reconcile`]: one reconcile as data, from what the controller observed to the plan
//!   (claims to delete and create, marks to set, conditions, when to look again);
//! - [`status`]: the status that plan leaves the pool with, and which condition changes
//!   are problems;
//! - [`expectations`]: the claims this process created, deleted or annotated that the
//!   claim store does not show yet, laid over the store's claims.

pub mod budget;
pub mod consolidate;
pub mod daemonsets;
pub mod do_not_disrupt;
pub mod dynamic;
pub mod expectations;
pub mod limits;
pub mod pack;
pub mod plan;
pub mod reconcile;
pub mod registration;
pub mod repair;
pub mod status;
pub mod tenant_view;

pub(crate) use budget::{allowed_disruptions, disruption_problem};

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

use autonodes_api::{
    DurationOrNever, NodeClaim, NodeClaimSpec, NodePool, NodePoolSpec, ResourceList, GROUP,
    LABEL_NODEPOOL, VERSION,
};

/// Label on a pool's claims: hash of the claim template they were made from.
pub const LABEL_TEMPLATE_HASH: &str = "autonodes.io/nodepool-template-hash";
/// Annotation on a replacement claim: the claim it replaces (rolling update, expiry).
pub(crate) const ANNOTATION_REPLACES: &str = "autonodes.io/replaces";
/// Annotation on a claim: remove this claim first when the pool scales down. The
/// `capi.autonodes.io` mirror sets it from the Machine's `capi.autonodes.io/delete-machine`.
pub const ANNOTATION_DELETE_FIRST: &str = "autonodes.io/delete-first";
/// Annotation on a dynamic pool's claim: since when its node runs no non-DaemonSet pod.
pub const ANNOTATION_EMPTY_SINCE: &str = "autonodes.io/empty-since";
/// Annotation on a dynamic pool's claim: since when its node's pods would all fit the
/// room of the tenant's other nodes ([`consolidate`]).
pub const ANNOTATION_UNDERUTILIZED_SINCE: &str = "autonodes.io/underutilized-since";
/// Default of `disruption.consolidateAfter`.
pub(crate) const DEFAULT_CONSOLIDATE_AFTER: Duration = Duration::from_secs(30);
/// How long after a node became Ready its free room still counts for pods the scheduler
/// marked unschedulable (it may not have retried them yet). Afterwards such pods evidently
/// do not fit for reasons autonodes does not model, and new nodes are made for them.
pub(crate) const READY_NODE_GRACE: Duration = Duration::from_secs(30);

/// The claim spec every claim of the pool starts from (without `desiredCapacity`/`typeRef`).
pub fn template_spec(pool: &NodePoolSpec) -> NodeClaimSpec {
    NodeClaimSpec {
        provider_ref: pool.provider_ref.clone(),
        type_ref: None,
        requirements: pool.requirements.clone(),
        desired_capacity: ResourceList::new(),
        v_cluster_ref: pool.v_cluster_ref.clone(),
        properties: pool.properties.clone(),
        taints: pool.taints.clone(),
        startup_taints: pool.startup_taints.clone(),
        labels: pool.labels.clone(),
        kubelet_args: pool.kubelet_args.clone(),
        kubernetes_version: None,
        power: None,
    }
}

/// A short stable hash of the pool's claim template: claims whose label differs are rolled.
pub(crate) fn template_hash(pool: &NodePoolSpec) -> String {
    let bytes = serde_json::to_vec(&template_spec(pool)).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// `<pool>-<5 [a-z0-9]>`, the five characters taken from the first five bytes of `random`
/// (the caller brings the randomness; fewer bytes make a shorter suffix).
pub fn claim_name(pool: &str, random: &[u8]) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = random
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    crate::names::child_name(pool, &format!("-{suffix}"))
}

/// Whether the NodePool with UID `pool_uid` is the claim's controller (its ownerReference).
pub fn owned_by(claim: &NodeClaim, pool_uid: &str) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "NodePool" && o.uid == pool_uid && o.controller == Some(true))
}

/// The claim `name` of `pool` with `spec`: in the pool's namespace, labelled with the pool
/// ([`LABEL_NODEPOOL`]) and its template hash ([`LABEL_TEMPLATE_HASH`]), annotated with the
/// claim it replaces ([`ANNOTATION_REPLACES`]), the pool its controller (so the garbage
/// collector removes it with the pool).
pub fn claim_object(
    pool: &NodePool,
    name: &str,
    spec: NodeClaimSpec,
    replaces: Option<&str>,
) -> NodeClaim {
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let owner = OwnerReference {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "NodePool".into(),
        name: pool_name.clone(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    NodeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: pool.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (
                    LABEL_NODEPOOL.to_string(),
                    crate::names::label_value(&pool_name),
                ),
                (LABEL_TEMPLATE_HASH.to_string(), template_hash(&pool.spec)),
            ])),
            annotations: replaces
                .map(|o| BTreeMap::from([(ANNOTATION_REPLACES.to_string(), o.to_string())])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The label selector of a pool's claims (`status.selector`, for the scale subresource).
pub fn selector(pool: &str) -> String {
    format!("{LABEL_NODEPOOL}={}", crate::names::label_value(pool))
}

/// The effective `disruption.consolidateAfter` (default 30s; `None` for `Never`).
pub fn consolidate_after(pool: &NodePoolSpec) -> Option<Duration> {
    pool.disruption
        .as_ref()
        .and_then(|d| d.consolidate_after)
        .map_or(Some(DEFAULT_CONSOLIDATE_AFTER), DurationOrNever::after)
}

/// The pool's `expireAfter` (or its older spelling `disruption.expireAfter`), if set and
/// not `Never`.
pub fn expire_after(pool: &NodePoolSpec) -> Option<Duration> {
    pool.expire_after
        .or_else(|| pool.disruption.as_ref().and_then(|d| d.expire_after))
        .and_then(DurationOrNever::after)
}

/// Whether the pool rolls nodes whose kubelet's minor release differs from the tenant's
/// (`disruption.kubernetesVersionDrift`, absent: `Enabled`).
pub fn rolls_version_drift(pool: &NodePoolSpec) -> bool {
    pool.disruption
        .as_ref()
        .and_then(|d| d.kubernetes_version_drift)
        != Some(autonodes_api::VersionDrift::Disabled)
}

/// Whether a node empty since `since` is due for removal at `now`.
pub(crate) fn due_for_removal(since: Timestamp, now: Timestamp, after: Duration) -> bool {
    let waited = now.as_millisecond() - since.as_millisecond();
    waited >= i64::try_from(after.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_template_hash_changes_with_the_template_only() {
        let spec: NodePoolSpec = serde_json::from_value(json!({
            "vClusterRef": {"name": "t"}, "replicas": 2
        }))
        .expect("spec");
        let mut scaled = spec.clone();
        scaled.replicas = Some(5);
        assert_eq!(template_hash(&spec), template_hash(&scaled));
        let mut labelled = spec.clone();
        labelled.labels.insert("a".into(), "b".into());
        assert_ne!(template_hash(&spec), template_hash(&labelled));
        assert_eq!(template_hash(&spec).len(), 10);
    }

    #[test]
    fn a_claim_name_is_the_pool_name_and_five_characters_drawn_from_the_random_bytes() {
        assert_eq!(
            claim_name("workers", &[0, 25, 26, 35, 36, 99]),
            "workers-az09a"
        );
        let long = "w".repeat(300);
        let name = claim_name(&long, &[1, 2, 3, 4, 5]);
        assert!(name.len() <= 253 && name.ends_with("-bcdef"), "{name}");
    }

    #[test]
    fn the_top_level_expire_after_wins_over_the_disruption_spelling_and_never_turns_it_off() {
        let spec = |v: serde_json::Value| -> NodePoolSpec {
            let mut base = json!({"vClusterRef": {"name": "t"}});
            if let (Some(b), Some(extra)) = (base.as_object_mut(), v.as_object()) {
                b.extend(extra.clone());
            }
            serde_json::from_value(base).expect("spec")
        };
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        assert_eq!(expire_after(&spec(json!({}))), None);
        assert_eq!(
            expire_after(&spec(json!({"disruption": {"expireAfter": "2h"}}))),
            hours(2)
        );
        assert_eq!(
            expire_after(&spec(
                json!({"expireAfter": "1h", "disruption": {"expireAfter": "2h"}})
            )),
            hours(1)
        );
        assert_eq!(
            expire_after(&spec(
                json!({"expireAfter": "Never", "disruption": {"expireAfter": "2h"}})
            )),
            None
        );
    }
}
