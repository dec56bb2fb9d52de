//! The tenant side of dynamic pools: the watch caches of each tenant's pods, nodes and
//! DaemonSets ([`super::tenant_cache`]), which wake the tenant's dynamic pools when they
//! change and are what a reconcile reads.
//!
//! The node and DaemonSet watches start only once a pool of the tenant has something to
//! plan with them: a pod the scheduler marked unschedulable, or a claim of one of the
//! tenant's pools (to consolidate). Before that the plan is the same without them (no pod
//! to place, no node to remove, no node whose DaemonSets to count), and an idle tenant
//! costs one watch (its pods), not three, and none of its Nodes' memory.

use std::sync::Arc;

use autonodes_core::pool::pack::is_unschedulable;
use autonodes_core::pool::plan::Verdict;
use autonodes_core::pool::tenant_view;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::{PoolContext, TenantWatch};
use super::tenant_cache::{self, TenantCaches};
use crate::remote::clients::{ClusterKey, Remote};
use autonodes_api::reasons::PoolReason;

/// The tenant's pods, nodes and DaemonSets from its watch caches (started if they were
/// not), or why they cannot be planned for (`TenantUnreachable`, `TenantTooLarge`).
pub(super) async fn objects(
    pctx: &PoolContext,
    remote: &Arc<Remote>,
) -> Result<(Vec<Pod>, Vec<Node>, Vec<DaemonSet>), Verdict> {
    let caches = ensure_watch(pctx, remote).await;
    let pods = caches.pods.snapshot().await;
    let planning = has_pool_claims(pctx, &remote.key)
        || pods
            .as_ref()
            .is_ok_and(|pods| pods.iter().any(is_unschedulable));
    let (nodes, daemonsets) = match ensure_planning_watches(pctx, remote, planning).await {
        Some(caches) => futures::join!(caches.nodes.snapshot(), caches.daemonsets.snapshot()),
        None => (Ok(Vec::new()), Ok(Vec::new())),
    };
    match (pods, nodes, daemonsets) {
        (Ok(p), Ok(n), Ok(d)) => Ok((p, n, d)),
        (p, n, d) => {
            // Every kind's problem, the most telling reason first (too large, then
            // unreachable).
            let mut problems: Vec<Verdict> =
                [p.err(), n.err(), d.err()].into_iter().flatten().collect();
            problems.sort_by_key(|v| v.reason != PoolReason::TenantTooLarge);
            let message = problems
                .iter()
                .map(|v| v.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            let reason = problems
                .first()
                .map_or(PoolReason::TenantUnreachable, |v| v.reason);
            Err(Verdict::problem(reason, message))
        }
    }
}

/// The namespace and vCluster of tenant `key` (`None` for a host).
fn tenant_of(key: &ClusterKey) -> Option<(&str, &str)> {
    match key {
        ClusterKey::Tenant {
            namespace,
            vcluster,
        } => Some((namespace, vcluster)),
        ClusterKey::Host(_) => None,
    }
}

/// Whether a live claim of a pool of tenant `key` exists (its namespace's claims labelled
/// with a pool, of that vCluster).
fn has_pool_claims(pctx: &PoolContext, key: &ClusterKey) -> bool {
    let Some((namespace, vcluster)) = tenant_of(key) else {
        return false;
    };
    pctx.ctx.claims().state().iter().any(|c| {
        c.namespace().as_deref() == Some(namespace)
            && c.spec.v_cluster_ref.name == vcluster
            && c.labels().contains_key(autonodes_api::LABEL_NODEPOOL)
    })
}

/// The tenant's caches once their node and DaemonSet watches run: started now when
/// `needed` and not yet, kept once started (until the tenant's watches stop); `None` while
/// not started.
async fn ensure_planning_watches(
    pctx: &PoolContext,
    remote: &Arc<Remote>,
    needed: bool,
) -> Option<Arc<TenantCaches>> {
    let mut watches = pctx.watches.lock().await;
    let watch = watches.get_mut(&remote.key)?;
    if !watch.planning_started {
        if !needed {
            return None;
        }
        let cluster = remote.key.to_string();
        watch.tasks.push(tenant_cache::spawn(
            cluster.clone(),
            watch.caches.nodes.clone(),
            Api::all(remote.client.clone()),
            tenant_view::node,
            wake_pools(pctx, &remote.key),
        ));
        watch.tasks.push(tenant_cache::spawn(
            cluster,
            watch.caches.daemonsets.clone(),
            Api::<DaemonSet>::all(remote.client.clone()),
            tenant_view::daemonset,
            wake_pools(pctx, &remote.key),
        ));
        watch.planning_started = true;
        tracing::info!(cluster = %remote.key, "watching tenant nodes and DaemonSets for node pools");
    }
    Some(watch.caches.clone())
}

/// Wakes the dynamic pools of tenant `key`.
fn wake_pools(pctx: &PoolContext, key: &ClusterKey) -> impl Fn() + Send + Clone + 'static {
    let pools = pctx.pools.clone();
    let wake = pctx.wake.clone();
    let (namespace, vcluster) = tenant_of(key)
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .unwrap_or_default();
    move || {
        for p in pools.state() {
            if p.namespace().as_deref() == Some(namespace.as_str())
                && p.spec.v_cluster_ref.name == vcluster
                && p.spec.replicas.is_none()
            {
                let _ = wake.unbounded_send(ObjectRef::from_obj(&*p));
            }
        }
    }
}

/// Whether a dynamic pool that is not being deleted reads the tenant `key`.
fn watched_by_a_pool(pctx: &PoolContext, key: &ClusterKey) -> bool {
    let Some((namespace, vcluster)) = tenant_of(key) else {
        return false;
    };
    if !pctx.ctx.shards.acts_for(namespace) {
        return false;
    }
    pctx.pools.state().iter().any(|p| {
        p.namespace().as_deref() == Some(namespace)
            && p.spec.v_cluster_ref.name == vcluster
            && p.spec.replicas.is_none()
            && p.metadata.deletion_timestamp.is_none()
    })
}

/// Stops the pod and node watches of tenants no dynamic pool reads any more (their pools
/// were deleted or made static).
pub(super) async fn forget_unused_watches(pctx: &PoolContext) {
    let mut watches = pctx.watches.lock().await;
    watches.retain(|key, _| watched_by_a_pool(pctx, key));
}

/// Starts (or keeps) the watch caches of the pool's tenant, and stops those of tenants no
/// dynamic pool reads any more; the tenant's caches.
pub(super) async fn ensure_watch(pctx: &PoolContext, remote: &Arc<Remote>) -> Arc<TenantCaches> {
    let mut watches = pctx.watches.lock().await;
    watches.retain(|key, _| *key == remote.key || watched_by_a_pool(pctx, key));
    if let Some(w) = watches
        .get(&remote.key)
        .filter(|w| Arc::ptr_eq(&w.remote, remote) && !w.caches.wants_restart())
    {
        return w.caches.clone();
    }
    let caches = Arc::new(TenantCaches::new());
    if !matches!(remote.key, ClusterKey::Tenant { .. }) {
        return caches;
    }
    let wake_pools = wake_pools(pctx, &remote.key);
    let cluster = remote.key.to_string();
    let tasks = vec![tenant_cache::spawn(
        cluster,
        caches.pods.clone(),
        Api::all(remote.client.clone()),
        tenant_view::pod,
        wake_pools,
    )];
    tracing::info!(cluster = %remote.key, "watching tenant pods for node pools");
    watches.insert(
        remote.key.clone(),
        TenantWatch {
            remote: remote.clone(),
            caches: caches.clone(),
            tasks,
            planning_started: false,
        },
    );
    caches
}
