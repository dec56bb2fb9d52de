//! Watches on remote clusters: VirtualMachines and VirtualMachineInstances on host clusters,
//! Nodes on tenant clusters. Every change wakes the NodeClaim named by the object's labels,
//! so a claim moves on within seconds instead of at its next resync.

use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio::task::JoinHandle;

use crate::api::{
    NodeClaim, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_NODECLAIM_NAMESPACE, LABEL_NODECLAIM_UID,
    MANAGED_BY,
};
use crate::clients::{ClusterKey, OnConnect, Remote};
use crate::kubevirt;

/// The claim an object belongs to, from its `autonodes.io/nodeclaim{,-namespace}` labels;
/// when the name label is a shortened one (a claim name longer than a label value may be),
/// from its `autonodes.io/nodeclaim-uid` label and the claim cache.
pub fn claim_of(
    labels: &std::collections::BTreeMap<String, String>,
    claims: &Store<NodeClaim>,
) -> Option<ObjectRef<NodeClaim>> {
    let name = labels.get(LABEL_NODECLAIM)?;
    let ns = labels.get(LABEL_NODECLAIM_NAMESPACE)?;
    let by_name = ObjectRef::new(name).within(ns);
    if claims.get(&by_name).is_some() {
        return Some(by_name);
    }
    let uid = labels.get(LABEL_NODECLAIM_UID)?;
    claims
        .find(|c| c.metadata.uid.as_ref() == Some(uid))
        .map(|c| ObjectRef::from_obj(&*c))
}

/// The hook that starts watches for each newly connected remote cluster.
pub fn watch_hook(
    wake: UnboundedSender<ObjectRef<NodeClaim>>,
    claims: Store<NodeClaim>,
) -> OnConnect {
    Arc::new(move |remote: &Remote| -> Vec<JoinHandle<()>> {
        match &remote.key {
            ClusterKey::Host(_) => {
                let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
                let vms: Api<DynamicObject> =
                    Api::all_with(remote.client.clone(), &kubevirt::virtual_machine());
                let vmis: Api<DynamicObject> =
                    Api::all_with(remote.client.clone(), &kubevirt::virtual_machine_instance());
                vec![
                    spawn_watch(
                        remote.key.to_string(),
                        vms,
                        selector.clone(),
                        wake.clone(),
                        claims.clone(),
                    ),
                    spawn_watch(
                        remote.key.to_string(),
                        vmis,
                        selector,
                        wake.clone(),
                        claims.clone(),
                    ),
                ]
            }
            ClusterKey::Tenant { .. } => {
                let nodes: Api<Node> = Api::all(remote.client.clone());
                vec![spawn_watch(
                    remote.key.to_string(),
                    nodes,
                    LABEL_NODECLAIM.to_string(),
                    wake.clone(),
                    claims.clone(),
                )]
            }
        }
    })
}

fn spawn_watch<K>(
    cluster: String,
    api: Api<K>,
    selector: String,
    wake: UnboundedSender<ObjectRef<NodeClaim>>,
    claims: Store<NodeClaim>,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let config = watcher::Config::default().labels(&selector);
        let mut stream = watcher(api, config)
            .default_backoff()
            .touched_objects()
            .boxed();
        while let Some(item) = stream.next().await {
            match item {
                Ok(obj) => {
                    if let Some(claim) = claim_of(obj.labels(), &claims) {
                        let _ = wake.unbounded_send(claim);
                    }
                }
                Err(e) => tracing::debug!(%cluster, error = %e, "remote watch error (retrying)"),
            }
        }
    })
}
