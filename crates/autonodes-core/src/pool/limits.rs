//! How many claims one reconcile of a pool may create: never more than [`CREATE_BATCH`] at
//! once, and never beyond what its namespace may hold — the controller's cap on claims per
//! namespace (`--max-claims-per-namespace`) and the `nodes` limit of every NodeQuota
//! covering the namespace. A pool held back by the namespace's cap or a quota says so in
//! `LimitReached`; one held back by the batch only looks again soon.
//!
//! A namespace's claims are counted while they hold a VM or will ([`holds_a_place`]): live
//! ones and those being deleted (a claim's finalizer goes only once its VM is gone, so a
//! drain that waits does not free its place), not Failed ones, which a pool deletes in the
//! same reconcile that replaces them.

use autonodes_api::reasons::PoolReason;

use super::plan::Verdict;

/// The most claims one reconcile of a pool creates; a pool that wants more creates the
/// rest in the reconciles that follow (each claim it creates wakes it again).
pub(crate) const CREATE_BATCH: usize = 20;

/// Whether a claim takes a place under the namespace's cap and quota: any claim not
/// Failed, also one being deleted (its VM runs until its drain ends).
pub fn holds_a_place(c: &autonodes_api::NodeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase) != Some(autonodes_api::NodeClaimPhase::Failed)
}

/// The default of the controller's `--max-claims-per-namespace`.
pub const DEFAULT_MAX_CLAIMS_PER_NAMESPACE: usize = 1000;

/// What bounds the claims of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceClaims<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// Its claims that hold a place ([`holds_a_place`]: of every pool, written by hand,
    /// and being deleted).
    pub live: usize,
    /// The controller's cap on claims per namespace.
    pub max: usize,
    /// The smallest `nodes` limit of the NodeQuotas covering the namespace, with the
    /// quota's name, if any limits `nodes`.
    pub quota_nodes: Option<(&'a str, usize)>,
    /// The controller requires a NodeQuota (`--require-quota`) and none covers the
    /// namespace: it may hold no claims at all.
    pub quota_missing: bool,
}

/// Why a pool may create no more claims than [`ClaimRoom::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Only the per-reconcile batch: the rest follows soon.
    Batch,
    /// The namespace holds the controller's cap of claims.
    Namespace {
        /// The namespace.
        namespace: String,
        /// Its claims that hold a place.
        live: usize,
        /// The cap.
        max: usize,
    },
    /// The pool backs off after claims failed in a row ([`super::registration`]); its
    /// `NodeRegistrationHealthy` condition says why.
    Backoff,
    /// A NodeQuota's `nodes` limit.
    Quota {
        /// The namespace.
        namespace: String,
        /// The quota.
        quota: String,
        /// Its `nodes` limit.
        nodes: usize,
        /// The namespace's claims that hold a place.
        live: usize,
    },
    /// The controller requires a NodeQuota (`--require-quota`) and none covers the
    /// namespace.
    NoQuota {
        /// The namespace.
        namespace: String,
    },
}

/// How many claims a pool may create in one reconcile, and what bounds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRoom {
    /// The most claims to create now.
    pub create: usize,
    /// What sets [`ClaimRoom::create`].
    pub bound: Bound,
}

impl ClaimRoom {
    /// Room for any number of claims (tests of plans that are not about bounds).
    #[cfg(test)]
    pub const UNBOUNDED: ClaimRoom = ClaimRoom {
        create: usize::MAX,
        bound: Bound::Batch,
    };

    /// `LimitReached=True` when `short` claims the pool wanted were not created because of
    /// the namespace's cap or a quota; `None` when nothing is short or only the batch held
    /// them back.
    pub fn verdict(&self, short: usize) -> Option<Verdict> {
        if short == 0 {
            return None;
        }
        match &self.bound {
            Bound::Batch | Bound::Backoff => None,
            Bound::Namespace {
                namespace,
                live,
                max,
            } => Some(Verdict::new(
                true,
                PoolReason::NamespaceClaimLimit,
                format!(
                    "{short} more claim(s) wanted, but namespace {namespace} holds {} claims (those being deleted included) with the ones created now, and the controller allows {max} per namespace (--max-claims-per-namespace)",
                    live + self.create
                ),
            )),
            Bound::Quota {
                namespace,
                quota,
                nodes,
                live,
            } => Some(Verdict::new(
                true,
                PoolReason::QuotaExceeded,
                format!(
                    "{short} more claim(s) wanted, but NodeQuota {quota} limits namespace {namespace} to {nodes} nodes, and it holds {} claims (those being deleted included) with the ones created now",
                    live + self.create
                ),
            )),
            Bound::NoQuota { namespace } => Some(Verdict::new(
                true,
                PoolReason::NoQuota,
                format!(
                    "{short} more claim(s) wanted, but no NodeQuota covers namespace {namespace}, and the controller requires one (--require-quota)"
                ),
            )),
        }
    }
}

/// The room a pool of the namespace `ns` has for new claims in one reconcile: the batch,
/// the namespace's cap and its quota's `nodes`, whichever is least (the cap or quota named
/// when it is what binds, or when it leaves no room at all).
pub fn claim_room(ns: &NamespaceClaims) -> ClaimRoom {
    if ns.quota_missing {
        return ClaimRoom {
            create: 0,
            bound: Bound::NoQuota {
                namespace: ns.namespace.to_string(),
            },
        };
    }
    let mut room = ClaimRoom {
        create: CREATE_BATCH,
        bound: Bound::Batch,
    };
    let left = ns.max.saturating_sub(ns.live);
    if left <= room.create {
        room = ClaimRoom {
            create: left,
            bound: Bound::Namespace {
                namespace: ns.namespace.to_string(),
                live: ns.live,
                max: ns.max,
            },
        };
    }
    if let Some((quota, nodes)) = ns.quota_nodes {
        let left = nodes.saturating_sub(ns.live);
        if left <= room.create {
            room = ClaimRoom {
                create: left,
                bound: Bound::Quota {
                    namespace: ns.namespace.to_string(),
                    quota: quota.to_string(),
                    nodes,
                    live: ns.live,
                },
            };
        }
    }
    room
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(
        live: usize,
        max: usize,
        quota: Option<(&'static str, usize)>,
    ) -> NamespaceClaims<'static> {
        NamespaceClaims {
            namespace: "tenant-a",
            live,
            max,
            quota_nodes: quota,
            quota_missing: false,
        }
    }

    #[test]
    fn a_claim_being_deleted_holds_its_place_until_it_is_gone_and_a_failed_one_does_not() {
        let claim = |deleting: bool, phase: Option<autonodes_api::NodeClaimPhase>| {
            let mut c: autonodes_api::NodeClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": "c", "namespace": "tenant-a"},
                "spec": {"vClusterRef": {"name": "t"}},
            }))
            .expect("claim");
            if deleting {
                c.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            c.status = Some(autonodes_api::NodeClaimStatus {
                phase,
                ..Default::default()
            });
            c
        };
        use autonodes_api::NodeClaimPhase::{Available, Failed, Terminating};
        assert!(holds_a_place(&claim(false, Some(Available))));
        assert!(holds_a_place(&claim(false, None)));
        // A drain that waits (terminationGracePeriod Never behind a PodDisruptionBudget)
        // keeps its VM running: its place stays taken.
        assert!(holds_a_place(&claim(true, Some(Terminating))));
        assert!(!holds_a_place(&claim(false, Some(Failed))));
        assert!(!holds_a_place(&claim(true, Some(Failed))));
    }

    #[test]
    fn a_namespace_without_the_quota_the_controller_requires_gets_no_claims() {
        let mut missing = ns(0, 1000, None);
        missing.quota_missing = true;
        let room = claim_room(&missing);
        assert_eq!(room.create, 0);
        let verdict = room.verdict(3).expect("a limit");
        assert!(verdict.status);
        assert_eq!(verdict.reason, PoolReason::NoQuota);
        assert!(
            verdict.message.contains("--require-quota"),
            "{}",
            verdict.message
        );
    }

    #[test]
    fn a_namespace_far_from_its_bounds_gets_one_batch() {
        let room = claim_room(&ns(3, 1000, Some(("q", 500))));
        assert_eq!(room.create, CREATE_BATCH);
        assert_eq!(room.bound, Bound::Batch);
        assert_eq!(room.verdict(10), None, "the batch alone is no limit");
    }

    #[test]
    fn the_namespace_cap_bounds_the_room_and_names_the_flag_when_claims_are_short() {
        let room = claim_room(&ns(995, 1000, None));
        assert_eq!(room.create, 5);
        let v = room.verdict(7).expect("a verdict");
        assert!(v.status);
        assert_eq!(v.reason, PoolReason::NamespaceClaimLimit);
        assert!(
            v.message.contains("--max-claims-per-namespace"),
            "{}",
            v.message
        );
        assert!(
            v.message
                .contains("holds 1000 claims (those being deleted included)"),
            "{}",
            v.message
        );
        assert_eq!(room.verdict(0), None);
    }

    #[test]
    fn a_namespace_over_its_cap_has_no_room_at_all() {
        let room = claim_room(&ns(1200, 1000, None));
        assert_eq!(room.create, 0);
        assert!(room.verdict(1).is_some());
    }

    #[test]
    fn the_tightest_of_cap_and_quota_wins() {
        let room = claim_room(&ns(8, 1000, Some(("small", 10))));
        assert_eq!(room.create, 2);
        let v = room.verdict(3).expect("a verdict");
        assert_eq!(v.reason, PoolReason::QuotaExceeded);
        assert!(v.message.contains("NodeQuota small"), "{}", v.message);
        let room = claim_room(&ns(8, 9, Some(("small", 10))));
        assert_eq!(room.create, 1);
        assert_eq!(
            room.verdict(3).map(|v| v.reason),
            Some(PoolReason::NamespaceClaimLimit)
        );
    }

    #[test]
    fn a_quota_of_zero_nodes_leaves_no_room() {
        let room = claim_room(&ns(0, 1000, Some(("none", 0))));
        assert_eq!(room.create, 0);
        assert_eq!(
            room.verdict(1).map(|v| v.reason),
            Some(PoolReason::QuotaExceeded)
        );
    }
}
