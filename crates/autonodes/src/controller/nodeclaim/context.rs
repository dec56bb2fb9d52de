//! The claim controller's own state beside the shared [`Context`]: claims as this process
//! last wrote them, finalizers it saw released, progress not written yet, and the lock
//! that keeps scheduling decisions one at a time.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;

use kube::ResourceExt;
use tokio::sync::Mutex;

use crate::controller::context::Context;
use autonodes_api::NodeClaim;

/// Claims whose cleanup this process finished, so a reconcile of a cached copy from before
/// does not clean up again (the capacity they held is the ledger's: [`Context::ledger`]).
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// UIDs of claims whose cleanup finished (their capacity is free).
    pub released: HashSet<String>,
}

/// An object as a status write returned it, and the version that write replaced.
pub(crate) struct Written<K> {
    /// The `resourceVersion` the write was conditional on.
    pub replaced: String,
    /// The object the API server returned.
    pub object: Arc<K>,
}

/// The claim controller's context: the shared one ([`Deref`]) and the claims' own state.
pub(crate) struct ClaimContext {
    /// The context every controller shares.
    pub ctx: Arc<Context>,
    /// Serializes scheduling decisions so capacity is never exceeded (held only while a
    /// decision is made in memory, never across an API call).
    pub scheduling: Mutex<Reservations>,
    /// Claims as this process last wrote them, until the store catches up ([`ClaimContext::fresher`]).
    pub written: std::sync::Mutex<HashMap<String, Written<NodeClaim>>>,
    /// UIDs of deleted claims whose finalizer this process saw released
    /// ([`ClaimContext::finalized`]).
    pub finalized: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Since when each claim has had progress this process has not written yet, by UID
    /// ([`super::status::STATUS_WRITE_GAP`]).
    pub status_pending: std::sync::Mutex<HashMap<String, std::time::Instant>>,
}

impl Deref for ClaimContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.ctx
    }
}

impl ClaimContext {
    /// The claim controller's context on the shared one, its own state empty.
    pub(crate) fn new(ctx: Arc<Context>) -> Self {
        ClaimContext {
            ctx,
            scheduling: Mutex::new(Reservations::default()),
            written: Default::default(),
            finalized: Default::default(),
            status_pending: Default::default(),
        }
    }

    /// The newer of `claim` (from the store) and the claim as this process last wrote it.
    ///
    /// The store lags behind our own writes by a watch event; a reconcile that ran on the
    /// store's copy would write on a stale version and get a conflict. While the store
    /// still shows the version a write replaced, the written object is the current one.
    pub(crate) fn fresher(&self, claim: Arc<NodeClaim>) -> Arc<NodeClaim> {
        let (Some(uid), Some(rv)) = (claim.uid(), claim.resource_version()) else {
            return claim;
        };
        let Ok(mut written) = self.written.lock() else {
            return claim;
        };
        match written.get(&uid) {
            Some(w) if w.replaced == rv => w.object.clone(),
            Some(_) => {
                written.remove(&uid);
                claim
            }
            None => claim,
        }
    }

    /// Remembers a claim as a status write returned it (see [`ClaimContext::fresher`]).
    pub(crate) fn remember_written(
        &self,
        replaced: Option<String>,
        mut object: NodeClaim,
    ) -> Arc<NodeClaim> {
        object.metadata.managed_fields = None;
        let object = Arc::new(object);
        if let (Some(uid), Ok(mut pending)) = (object.uid(), self.status_pending.lock()) {
            pending.remove(&uid);
        }
        if let (Some(uid), Some(replaced), Ok(mut written)) =
            (object.uid(), replaced, self.written.lock())
        {
            written.insert(
                uid,
                Written {
                    replaced,
                    object: object.clone(),
                },
            );
        }
        object
    }

    /// Forgets what [`ClaimContext::remember_written`] kept of a claim (its cleanup finished).
    pub(crate) fn forget_written(&self, uid: &str) {
        if let Ok(mut written) = self.written.lock() {
            written.remove(uid);
        }
        if let Ok(mut pending) = self.status_pending.lock() {
            pending.remove(uid);
        }
    }

    /// True when this process saw the finalizer of the deleted claim `uid` released: a
    /// reconcile of the store's older copy (woken by a watch event that came first) has
    /// nothing left to do, and its patch to release the finalizer once more would only be
    /// answered 404. `release` records it (a `true` answer).
    pub(crate) fn finalized(&self, uid: &str, release: bool) -> bool {
        let Ok(mut finalized) = self.finalized.lock() else {
            return false;
        };
        if !release {
            return finalized.contains(uid);
        }
        finalized.insert(uid.to_string());
        // Now and then, forget claims the store no longer holds.
        if finalized.len() % 256 == 0 {
            let live: HashSet<String> = self
                .claims()
                .state()
                .iter()
                .filter_map(|c| c.uid())
                .collect();
            finalized.retain(|u| live.contains(u));
        }
        true
    }

    /// Since when the claim with `uid` has had progress not written yet (from now on, if
    /// it had none); `done` forgets it (the status needs no write).
    pub(crate) fn progress_pending(&self, uid: &str, done: bool) -> Option<std::time::Instant> {
        let mut pending = self.status_pending.lock().ok()?;
        if done {
            pending.remove(uid);
            return None;
        }
        Some(
            *pending
                .entry(uid.to_string())
                .or_insert_with(std::time::Instant::now),
        )
    }
}
