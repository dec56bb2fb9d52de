//! What wakes a NodePool, coalesced: a change of one of its claims, and a change the
//! tenant's watch caches saw (pods, nodes, DaemonSets of its vCluster). Every pool asked for
//! within [`COALESCE`] is reconciled once, at most [`COALESCE`] after the first ask, however
//! often it is asked meanwhile. (A debounce that waits for the triggers to stop would hold a
//! pool back for as long as a burst of pending pods lasts: the kube-scheduler marks them
//! unschedulable one after the other, at its own pace.)

use std::time::Duration;

use futures::{stream, Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::scheduler::{scheduler, ScheduleRequest};
use kube::ResourceExt;

use autonodes_api::{NodeClaim, NodePool};

/// How long the asks for one pool are gathered before it is reconciled.
pub(crate) const COALESCE: Duration = Duration::from_millis(300);

/// The pools that own `claim` (by owner reference).
fn owners(claim: &NodeClaim) -> Vec<ObjectRef<NodePool>> {
    let namespace = claim.namespace().unwrap_or_default();
    claim
        .owner_references()
        .iter()
        .filter(|o| o.kind == "NodePool" && o.api_version.starts_with("autonodes.io/"))
        .map(|o| ObjectRef::new(&o.name).within(&namespace))
        .collect()
}

/// The pools to reconcile: the owners of the `claims` that changed and the `asks`, each
/// pool at most once per [`COALESCE`].
pub(crate) fn coalesced<C, A>(claims: C, asks: A) -> impl Stream<Item = ObjectRef<NodePool>> + Send
where
    C: Stream<Item = std::sync::Arc<NodeClaim>> + Send + 'static,
    A: Stream<Item = ObjectRef<NodePool>> + Send + 'static,
{
    let from_claims = claims.flat_map(|c| stream::iter(owners(&c)));
    scheduler(
        stream::select(from_claims, asks).map(|pool| ScheduleRequest {
            message: pool,
            run_at: tokio::time::Instant::now() + COALESCE,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    fn pool(name: &str) -> ObjectRef<NodePool> {
        ObjectRef::new(name).within("t")
    }

    fn claim_of(pool: &str) -> std::sync::Arc<NodeClaim> {
        std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": format!("{pool}-x"), "namespace": "t",
                    "ownerReferences": [{"apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
                                          "name": pool, "uid": "u", "controller": true}]},
                "spec": {"vClusterRef": {"name": "v"}},
            }))
            .expect("claim"),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_asked_for_without_pause_is_reconciled_once_per_window_and_never_held_back() {
        let (tx, rx) = mpsc::unbounded();
        let (claims_tx, claims_rx) = mpsc::unbounded();
        let mut out = Box::pin(coalesced(claims_rx, rx));
        // Asked for every 50 ms for 2 s, by the tenant and by a claim in turn: a debounce
        // of 300 ms would never fire.
        let feeder = tokio::spawn(async move {
            for i in 0..40 {
                if i % 2 == 0 {
                    let _ = tx.unbounded_send(pool("blue"));
                } else {
                    let _ = claims_tx.unbounded_send(claim_of("blue"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let start = tokio::time::Instant::now();
        let mut at = Vec::new();
        while let Some(p) = out.next().await {
            assert_eq!(p, pool("blue"));
            at.push(start.elapsed());
        }
        feeder.await.expect("feeder");
        // First after the window, then about once per window until the asks stop.
        assert_eq!(at.first().copied(), Some(COALESCE));
        assert!((6..=8).contains(&at.len()), "{at:?}");
        for pair in at.windows(2) {
            assert!(pair[1] - pair[0] >= COALESCE, "{at:?}");
        }
    }
}
