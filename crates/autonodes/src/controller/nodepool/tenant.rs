//! The tenant side of dynamic pools: pod and node watches that wake the tenant's dynamic
//! pools, and the pods and nodes a reconcile reads.

use std::sync::Arc;

use autonodes_core::pool::do_not_disrupt::annotation_read_by_planning;
use autonodes_core::pool::plan::Verdict;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::ResourceExt;

use super::context::{PoolContext, TenantWatch};
use crate::controller::context::Context;
use crate::remote::calls::remote_call;
use crate::remote::clients::{ClusterKey, Remote};
use autonodes_api::reasons::PoolReason;

/// Objects per page when a dynamic pool lists its tenant's pods and nodes.
const PAGE: u32 = 100;
/// The most pods, and the most nodes, a dynamic pool reads of its tenant; a tenant with
/// more gets `TenantTooLarge` instead of being planned for.
pub const MAX_TENANT_OBJECTS: usize = 20_000;

/// Every pod and node of a tenant, or why they could not be read (`TenantUnreachable`;
/// `TenantTooLarge` past [`MAX_TENANT_OBJECTS`]). Listed in pages, each object trimmed
/// of managed fields and of the annotations planning does not read as it arrives.
pub(super) async fn pods_and_nodes(
    ctx: &Context,
    remote: &Remote,
) -> Result<(Vec<Pod>, Vec<Node>), Verdict> {
    let pods = list_paged(ctx, remote, Api::<Pod>::all(remote.client.clone()), "pods")
        .await
        .map_err(ListFailure::verdict)?;
    let nodes = list_paged(
        ctx,
        remote,
        Api::<Node>::all(remote.client.clone()),
        "nodes",
    )
    .await
    .map_err(ListFailure::verdict)?;
    Ok((pods, nodes))
}

/// The tenant's DaemonSets, whose pods take room on every node they run on. A tenant
/// identity that may not list them (401, 403), or a tenant that does not serve them (404),
/// gets none: its pools size nodes for the pending pods alone, and the controller logs why.
pub(super) async fn daemonsets(ctx: &Context, remote: &Remote) -> Result<Vec<DaemonSet>, Verdict> {
    let listed = list_paged(
        ctx,
        remote,
        Api::<DaemonSet>::all(remote.client.clone()),
        "daemonsets",
    )
    .await;
    match listed {
        Err(ListFailure::Remote(e)) if refused_or_not_served(&e) => {
            tracing::debug!(tenant = %remote.key, error = %e, "autonodes cannot list the tenant's DaemonSets; dynamic pools size new nodes without their pods");
            Ok(Vec::new())
        }
        other => other.map_err(ListFailure::verdict),
    }
}

/// Whether a tenant refused a call (401, 403) or does not serve what it asked for (404).
fn refused_or_not_served(e: &crate::controller::error::Error) -> bool {
    matches!(e, crate::controller::error::Error::Remote { source, .. }
        if crate::remote::clients::forbidden(source)
            || matches!(source, kube::Error::Api(s) if s.code == 404))
}

/// Why a tenant's objects could not be listed.
enum ListFailure {
    /// The tenant's API server failed or refused.
    Remote(crate::controller::error::Error),
    /// More than [`MAX_TENANT_OBJECTS`] of the kind.
    TooLarge(String),
}

impl ListFailure {
    /// The pool's verdict: `TenantUnreachable` or `TenantTooLarge`.
    fn verdict(self) -> Verdict {
        match self {
            ListFailure::Remote(e) => Verdict::problem(PoolReason::TenantUnreachable, e.to_string()),
            ListFailure::TooLarge(what) => Verdict::problem(
                PoolReason::TenantTooLarge,
                format!(
                    "the tenant has more than {MAX_TENANT_OBJECTS} {what}; dynamic pools plan only for tenants with fewer"
                ),
            ),
        }
    }
}

/// Every object of `api`, page by page, trimmed of managed fields and of the annotations
/// planning does not read.
async fn list_paged<K>(
    ctx: &Context,
    remote: &Remote,
    api: Api<K>,
    what: &str,
) -> Result<Vec<K>, ListFailure>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = remote_call(ctx, remote, &format!("listing {what}"), api.list(&params))
            .await
            .map_err(ListFailure::Remote)?;
        out.extend(page.items.into_iter().map(|mut o| {
            let meta = o.meta_mut();
            meta.managed_fields = None;
            if let Some(a) = meta.annotations.as_mut() {
                a.retain(|k, _| annotation_read_by_planning(k));
            }
            o
        }));
        if out.len() > MAX_TENANT_OBJECTS {
            return Err(ListFailure::TooLarge(what.to_string()));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Whether a dynamic pool that is not being deleted reads the tenant `key`.
fn watched_by_a_pool(pctx: &PoolContext, key: &ClusterKey) -> bool {
    let ClusterKey::Tenant {
        namespace,
        vcluster,
    } = key
    else {
        return false;
    };
    pctx.pools.state().iter().any(|p| {
        p.namespace().as_deref() == Some(namespace.as_str())
            && p.spec.v_cluster_ref.name == *vcluster
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

/// Starts (or keeps) the pod and node watches on the pool's tenant, and stops those of
/// tenants no dynamic pool reads any more.
pub(super) async fn ensure_watch(pctx: &PoolContext, remote: &Arc<Remote>) {
    let mut watches = pctx.watches.lock().await;
    watches.retain(|key, _| *key == remote.key || watched_by_a_pool(pctx, key));
    if watches
        .get(&remote.key)
        .is_some_and(|w| Arc::ptr_eq(&w.remote, remote))
    {
        return;
    }
    let ClusterKey::Tenant {
        namespace,
        vcluster,
    } = remote.key.clone()
    else {
        return;
    };
    let wake_pools = {
        let pools = pctx.pools.clone();
        let wake = pctx.wake.clone();
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
    };
    // Only that something changed matters here: the watches read metadata alone.
    let pods: Api<PartialObjectMeta<Pod>> = Api::all(remote.client.clone());
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(remote.client.clone());
    let tasks = vec![
        spawn_wake_watch(remote.key.to_string(), pods, wake_pools.clone()),
        spawn_wake_watch(remote.key.to_string(), nodes, wake_pools),
    ];
    tracing::info!(cluster = %remote.key, "watching tenant pods and nodes for node pools");
    watches.insert(
        remote.key.clone(),
        TenantWatch {
            remote: remote.clone(),
            tasks,
        },
    );
}

fn spawn_wake_watch<K>(
    cluster: String,
    api: Api<K>,
    wake: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        use kube::runtime::WatchStreamExt;
        let mut stream = watcher(
            api,
            watcher::Config::default().page_size(500).any_semantic(),
        )
        .default_backoff()
        .boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                Ok(_) => wake(),
                Err(e) => tracing::debug!(%cluster, error = %e, "tenant watch error (retrying)"),
            }
        }
    })
}
