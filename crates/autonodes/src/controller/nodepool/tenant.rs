//! The tenant side of dynamic pools: pod and node watches that wake the tenant's dynamic
//! pools, and the pods and nodes a reconcile reads.

use std::sync::Arc;

use autonodes_core::pool::status::Verdict;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::ResourceExt;

use super::PoolContext;
use crate::api::reasons::PoolReason;
use crate::clients::{ClusterKey, Remote};
use crate::controller::calls::remote_call;
use crate::controller::{Context, Error};

/// The watches of one tenant: the client they use and their tasks (stopped when dropped).
pub(super) struct TenantWatch {
    remote: Arc<Remote>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Every pod and node of a tenant, or why they could not be read (`TenantUnreachable`).
pub(super) async fn pods_and_nodes(
    ctx: &Context,
    remote: &Remote,
) -> Result<(Vec<Pod>, Vec<Node>), Verdict> {
    let pods: Api<Pod> = Api::all(remote.client.clone());
    let nodes: Api<Node> = Api::all(remote.client.clone());
    let unreachable = |e: Error| Verdict::problem(PoolReason::TenantUnreachable, e.to_string());
    let pods = remote_call(
        ctx,
        remote,
        "listing pods",
        pods.list(&ListParams::default()),
    )
    .await
    .map_err(unreachable)?;
    let nodes = remote_call(
        ctx,
        remote,
        "listing nodes",
        nodes.list(&ListParams::default()),
    )
    .await
    .map_err(unreachable)?;
    Ok((pods.items, nodes.items))
}

/// Starts (or keeps) the pod and node watches on the pool's tenant.
pub(super) async fn ensure_watch(pctx: &PoolContext, remote: &Arc<Remote>) {
    let mut watches = pctx.watches.lock().await;
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
    let pods: Api<Pod> = Api::all(remote.client.clone());
    let nodes: Api<Node> = Api::all(remote.client.clone());
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
        let mut stream = watcher(api, watcher::Config::default().any_semantic())
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
