//! Which tenant namespaces this replica acts for, and whether it leads.
//!
//! One replica (no `--shard-tenants`) acts for every namespace and makes every scheduling
//! decision. With `--shard-tenants`, each replica is a member ([`crate::membership`] keeps
//! its Lease and reads the others'): it acts for the namespaces
//! [`autonodes_core::shards::Ownership`] gives it, and only the holder of the leader Lease
//! runs what is cluster-wide (providers, node types, quotas, the host sweep) and schedules
//! claims (chooses their type, the capacity ledger's write).
//!
//! Every claim, pool, import and mirror reconcile asks [`Shards::acts_for`] first; a replica
//! that could not renew its member Lease for the renew deadline acts for nothing from that
//! moment on, before its process stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use autonodes_core::shards::Ownership;

/// How long the vCluster import and the Cluster API mirror wait before they look again at
/// an object of a namespace another replica acts for (the claim and pool controllers are
/// woken when this replica gains one).
pub(crate) const NOT_OURS_RETRY: Duration = Duration::from_secs(15);

/// Which namespaces this replica acts for, and whether it leads.
pub(crate) struct Shards {
    /// `None`: one replica, acting for everything.
    members: Option<Members>,
    /// This replica holds the leader Lease (always, without `--shard-tenants`).
    leading: tokio::sync::watch::Sender<bool>,
}

/// The member side of [`Shards`].
struct Members {
    /// The ownership as the last list of member Leases left it.
    ownership: RwLock<Ownership>,
    /// When this replica last both renewed its Lease and listed the others'.
    last_ok: RwLock<Option<Instant>>,
    /// How long without a renewal and a list before this replica acts for nothing.
    renew_deadline: Duration,
    /// The member Lease is lost: nothing is acted for any more.
    lost: AtomicBool,
}

impl Shards {
    /// One replica: it acts for every namespace and leads.
    pub(crate) fn single() -> Self {
        Shards {
            members: None,
            leading: tokio::sync::watch::Sender::new(true),
        }
    }

    /// A member named `me` whose Leases hold for `lease_duration` and must be renewed
    /// within `renew_deadline`; it acts for nothing until its first list of the members,
    /// and leads once [`Shards::set_leading`] says so.
    pub(crate) fn member(me: &str, lease_duration: Duration, renew_deadline: Duration) -> Self {
        Shards {
            members: Some(Members {
                ownership: RwLock::new(Ownership::new(me, lease_duration)),
                last_ok: RwLock::new(None),
                renew_deadline,
                lost: AtomicBool::new(false),
            }),
            leading: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Whether replicas share the tenants (`--shard-tenants`).
    pub(crate) fn sharded(&self) -> bool {
        self.members.is_some()
    }

    /// This member's name (`None` for one replica).
    pub(crate) fn me(&self) -> Option<String> {
        let m = self.members.as_ref()?;
        Some(read(&m.ownership).me().to_string())
    }

    /// Whether this replica acts for the claims, pools and tenant clusters of `namespace`
    /// now.
    pub(crate) fn acts_for(&self, namespace: &str) -> bool {
        let Some(m) = &self.members else {
            return true;
        };
        let now = Instant::now();
        if m.lost.load(Ordering::SeqCst) {
            return false;
        }
        let fresh =
            read(&m.last_ok).is_some_and(|t| now.saturating_duration_since(t) <= m.renew_deadline);
        fresh && read(&m.ownership).acts_for(namespace, now)
    }

    /// The member that owns `namespace` in this replica's latest view (`None` for one
    /// replica, or before the first list).
    pub(crate) fn owner_of(&self, namespace: &str) -> Option<String> {
        let m = self.members.as_ref()?;
        read(&m.ownership).owner_of(namespace).map(str::to_string)
    }

    /// The live members of this replica's latest view (empty for one replica).
    pub(crate) fn members(&self) -> Vec<String> {
        self.members
            .as_ref()
            .and_then(|m| {
                read(&m.ownership)
                    .members()
                    .map(|s| s.iter().cloned().collect())
            })
            .unwrap_or_default()
    }

    /// Whether this replica makes scheduling decisions and runs the cluster-wide
    /// controllers now.
    pub(crate) fn leads(&self) -> bool {
        *self.leading.borrow()
            && self
                .members
                .as_ref()
                .is_none_or(|m| !m.lost.load(Ordering::SeqCst))
    }

    /// Resolves once this replica leads (at once for one replica).
    pub(crate) async fn wait_leading(&self) {
        let mut rx = self.leading.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Records that this replica holds the leader Lease (or no longer does).
    pub(crate) fn set_leading(&self, leading: bool) {
        self.leading.send_replace(leading);
    }

    /// Records a renewal of this member's Lease and a list of the members answered at
    /// `at` (`update` applies what the list showed).
    pub(crate) fn listed(&self, at: Instant, update: impl FnOnce(&mut Ownership)) {
        let Some(m) = &self.members else {
            return;
        };
        update(
            &mut m
                .ownership
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        *m.last_ok
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
    }

    /// This member lost its Lease: it acts for nothing from now on.
    pub(crate) fn lose(&self) {
        if let Some(m) = &self.members {
            m.lost.store(true, Ordering::SeqCst);
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn one_replica_acts_for_every_namespace_and_leads() {
        let s = Shards::single();
        assert!(s.acts_for("any") && s.leads() && !s.sharded());
        assert_eq!(s.owner_of("any"), None);
    }

    #[test]
    fn a_member_acts_only_while_its_lists_are_fresh_and_nothing_once_lost() {
        let window = Duration::from_millis(10);
        let s = Shards::member("a", window, Duration::from_secs(5));
        assert!(!s.acts_for("n"), "nothing before the first list");
        let t = Instant::now() - Duration::from_millis(20);
        s.listed(t, |o| o.observe(t, BTreeSet::new()));
        assert!(s.acts_for("n"), "alone, after the window");
        assert_eq!(s.owner_of("n").as_deref(), Some("a"));
        assert!(!s.leads());
        s.set_leading(true);
        assert!(s.leads());
        s.lose();
        assert!(!s.acts_for("n") && !s.leads());
        let stale = Shards::member("a", window, Duration::from_millis(1));
        let t = Instant::now() - Duration::from_millis(20);
        stale.listed(t, |o| o.observe(t, BTreeSet::new()));
        assert!(
            !stale.acts_for("n"),
            "its last list is older than the renew deadline"
        );
    }
}
