//! Watch caches of remote clusters: VirtualMachines, VirtualMachineInstances, DataVolumes,
//! Nodes and bound pods on host clusters (the last two for host capacity,
//! [`crate::remote::host_room`]), Nodes and bootstrap-token Secrets on tenant clusters
//! (those of one namespace's claims, started when a claim first reads them).
//!
//! One watch per kind and cluster (labelled objects only) fills a store the claim
//! controller reads instead of sending a GET or LIST per reconcile; every change also wakes
//! the NodeClaim named by the object's labels, after the store holds the change, so a claim
//! moves on within seconds and sees what woke it. A host node that is cordoned or
//! uncordoned wakes the claims whose VMs run on it (host maintenance).
//!
//! A store answers only while its watch is live (its latest full list arrived and no error
//! since; a watch that fails lists again after a backoff): otherwise [`Watched::get`] says
//! so and the caller asks the API server, which also turns a cluster that went away into a
//! `…Unreachable` condition as before. Objects are
//! kept trimmed to what the controller reads (KubeVirt objects are read as
//! [`Observed`] ones: no spec, no `managedFields`; Nodes lose their images), so the caches
//! stay small with thousands of claims.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc::UnboundedSender;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use super::caches::{
    resource_version, HostCache, Own, TenantCache, TenantWatches, Watched, TOKEN_NAMESPACE,
};
use crate::remote::clients::{ClusterKey, Connected, OnConnect, Remote, RemoteCache};
use crate::remote::egress::passed_body_limit;
use autonodes_api::kubevirt::{
    Observed, ObservedDataVolume, ObservedKind, ObservedVm, ObservedVmi,
};
use autonodes_api::{
    NodeClaim, LABEL_INSTALLATION, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_NODECLAIM_NAMESPACE,
    LABEL_NODECLAIM_UID, MANAGED_BY,
};
use autonodes_core::host_capacity;
use autonodes_core::kubeversion::KubeVersion;

/// What a kind needs to be watched and shared: a typed Kubernetes object that crosses
/// tasks.
pub(crate) trait Kind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Kind for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The claim an object belongs to, from its `autonodes.io/nodeclaim{,-namespace}` labels;
/// when the name label is a shortened one (a claim name longer than a label value may be),
/// from its `autonodes.io/nodeclaim-uid` label and the claim cache.
pub(crate) fn claim_of(
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

/// The hook that starts the watch caches of each newly connected remote cluster.
pub(crate) fn watch_hook(
    wake: UnboundedSender<ObjectRef<NodeClaim>>,
    claims: Store<NodeClaim>,
    installation: &str,
) -> OnConnect {
    // What a tenant's caches hold carries this installation's label: Nodes its VMs
    // registered and the tokens it minted; nothing else a tenant writes is cached.
    let installed = format!(
        "{LABEL_INSTALLATION}={}",
        autonodes_core::names::label_value(installation)
    );
    Arc::new(move |remote: &Remote| -> Connected {
        let cluster = remote.key.to_string();
        let managed = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
        let waker = Waker {
            wake: wake.clone(),
            claims: claims.clone(),
        };
        match &remote.key {
            ClusterKey::Host(_) => {
                let (vms, vm_task) = spawn_typed(
                    &cluster,
                    Api::<ObservedVm>::all(remote.client.clone()),
                    &managed,
                    Some(waker.by_labels()),
                    trim_observed,
                );
                let (vmis, vmi_task) = spawn_typed(
                    &cluster,
                    Api::<ObservedVmi>::all(remote.client.clone()),
                    &managed,
                    Some(waker.by_labels()),
                    trim_observed,
                );
                // Read only when a claim is deleted: its changes wake nobody.
                let (data_volumes, dv_task) = spawn_typed(
                    &cluster,
                    Api::<ObservedDataVolume>::all(remote.client.clone()),
                    &managed,
                    None,
                    trim_observed,
                );
                // Read when a claim is scheduled, when a NodeType's host room is shown, and
                // for host maintenance: a node cordoned or uncordoned wakes the claims of
                // the VMs on it.
                let (nodes, host_node_task) = spawn_configured(
                    &cluster,
                    Api::<Node>::all(remote.client.clone()),
                    watcher::Config::default().any_semantic(),
                    Lists::StreamedWhereServed,
                    Some(waker.by_host_node(vmis.store.clone())),
                    trim_host_node,
                );
                let (pods, pod_task) = spawn_configured(
                    &cluster,
                    Api::<Pod>::all(remote.client.clone()),
                    watcher::Config::default().fields(BOUND_PODS).any_semantic(),
                    Lists::StreamedWhereServed,
                    None,
                    trim_pod,
                );
                Connected {
                    tasks: vec![vm_task, vmi_task, dv_task, host_node_task, pod_task],
                    cache: RemoteCache::Host(Arc::new(HostCache {
                        vms,
                        vmis,
                        data_volumes,
                        nodes,
                        pods,
                    })),
                }
            }
            ClusterKey::Tenant { namespace, .. } => {
                // A tenant is reached per namespace of claims (its `vc-` Secret's): its
                // caches hold what the claims of that namespace made, not what another
                // namespace's claims made in the same cluster. They start when a claim
                // first reads them.
                let this_namespace = format!("{LABEL_NODECLAIM_NAMESPACE}={namespace}");
                let client = remote.client.clone();
                let installed = installed.clone();
                let start = move || {
                    let (nodes, node_task) = spawn_configured(
                        &cluster,
                        Api::<Node>::all(client.clone()),
                        watcher::Config::default()
                            .labels(&format!("{LABEL_NODECLAIM},{installed},{this_namespace}"))
                            .page_size(TENANT_PAGE)
                            .any_semantic(),
                        Lists::Paged,
                        Some(waker.by_labels()),
                        trim_node,
                    );
                    let (tokens, token_task) = spawn_configured(
                        &cluster,
                        Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE),
                        watcher::Config::default()
                            .labels(&format!("{managed},{installed},{this_namespace}"))
                            .page_size(TOKEN_PAGE)
                            .any_semantic(),
                        Lists::Paged,
                        Some(waker.by_labels()),
                        trim_token,
                    );
                    (TenantWatches { nodes, tokens }, vec![node_task, token_task])
                };
                Connected {
                    tasks: Vec::new(),
                    cache: RemoteCache::Tenant(Arc::new(TenantCache::lazy(Box::new(start)))),
                }
            }
        }
    })
}

/// Wakes the claim an object belongs to.
#[derive(Clone)]
struct Waker {
    wake: UnboundedSender<ObjectRef<NodeClaim>>,
    claims: Store<NodeClaim>,
}

impl Waker {
    fn wake(&self, labels: &std::collections::BTreeMap<String, String>) {
        if let Some(claim) = claim_of(labels, &self.claims) {
            let _ = self.wake.unbounded_send(claim);
        }
    }

    /// Wakes the claim an object's labels name.
    fn by_labels<K: Kind>(&self) -> Wake<K> {
        let waker = self.clone();
        Arc::new(move |obj: &K| waker.wake(obj.labels()))
    }

    /// Wakes, when a host node is cordoned or uncordoned (or first seen cordoned), the
    /// claims of the VM instances `vmis` shows on it. Other changes of a node (its
    /// heartbeats, its room) wake nobody.
    fn by_host_node(&self, vmis: Store<ObservedVmi>) -> Wake<Node> {
        let waker = self.clone();
        let cordons = Mutex::new(std::collections::HashMap::<String, bool>::new());
        Arc::new(move |node: &Node| {
            let name = node.name_any();
            let cordoned = node_cordoned(node);
            let changed = match cordons.lock() {
                Ok(mut seen) => match seen.insert(name.clone(), cordoned) {
                    Some(before) => before != cordoned,
                    None => cordoned,
                },
                Err(_) => true,
            };
            if !changed {
                return;
            }
            for vmi in vmis.state() {
                if vmi.status.node_name.as_deref() == Some(name.as_str()) {
                    waker.wake(vmi.labels());
                }
            }
        })
    }
}

/// Whether a host node is cordoned (`spec.unschedulable`).
pub(crate) fn node_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// What a watch calls with each object it delivers, after its store holds it.
type Wake<K> = Arc<dyn Fn(&K) + Send + Sync>;

/// Wakes the claims an object concerns, if the watch wakes claims at all.
fn wake<K>(waker: &Option<Wake<K>>, obj: &K) {
    if let Some(w) = waker {
        w(obj)
    }
}

/// The pods that take room on a host node: bound, and not ended.
const BOUND_PODS: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// How a watch reads its initial list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lists {
    /// In pages, then a watch (every server; what a tenant's watches do, so that each
    /// answer stays under the tenant's body limit).
    Paged,
    /// Streamed in the watch itself (`sendInitialEvents`) where the server's version
    /// streams them by default ([`KubeVersion::streams_initial_lists`]), else in pages; a
    /// streamed list that fails before its end is read in pages at once, and from then on
    /// where the server refused it ([`stream_failure`]). The host clusters' watches: the
    /// API server then never holds a whole list in memory.
    StreamedWhereServed,
}

/// A watch of the objects `selector` labels.
fn spawn_typed<K: Kind>(
    cluster: &str,
    api: Api<K>,
    selector: &str,
    waker: Option<Wake<K>>,
    trim: fn(&mut K),
) -> (Watched<K>, JoinHandle<()>) {
    let config = watcher::Config::default().labels(selector).any_semantic();
    spawn_configured(
        cluster,
        api,
        config,
        Lists::StreamedWhereServed,
        waker,
        trim,
    )
}

/// A watch of `api` with `config` filling a [`Watched`] store, its initial list read as
/// `lists` says, waking the claims of what changes when `waker` is given.
fn spawn_configured<K: Kind>(
    cluster: &str,
    api: Api<K>,
    config: watcher::Config,
    lists: Lists,
    waker: Option<Wake<K>>,
    trim: fn(&mut K),
) -> (Watched<K>, JoinHandle<()>) {
    let writer = Writer::<K>::default();
    let watched = Watched {
        store: writer.as_reader(),
        dyntype: (),
        live: Arc::new(AtomicBool::new(false)),
        written: Arc::new(Mutex::new(Own::new())),
        trim,
    };
    let task = spawn_reflector(
        cluster.to_string(),
        api,
        config,
        lists,
        writer,
        &watched,
        waker,
    );
    (watched, task)
}

/// What a streamed initial list that failed before its end says about the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamFailure {
    /// The server answered it with a Status (the WatchList feature off: 400, 403 or 422
    /// for `sendInitialEvents`; a storage that cannot stream, as etcd before 3.4.31 and
    /// 3.5.13 without progress notifications: a 500 `ERROR` event, "the required storage
    /// feature RequestWatchProgress is disabled"), or the stream passed the body limit:
    /// it would again, so this watch lists in pages from now on.
    Refused,
    /// Anything else (a connection that broke, an expired version): this list is read in
    /// pages, and the watch's next full list streams again.
    Transient,
}

/// How `e`, met before a streamed initial list ended, is taken. As client-go's reflector
/// does, every such error falls back to a paged list at once (making progress rather than
/// retrying a stream the server may never give).
fn stream_failure(e: &watcher::Error) -> StreamFailure {
    // An expired version (410) and load shedding (429) say nothing about streaming.
    let refused = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => {
            (400..500).contains(&s.code) && !matches!(s.code, 410 | 429)
        }
        watcher::Error::WatchError(s) => !matches!(s.code, 410 | 429),
        _ => passed_body_limit(e),
    };
    if refused {
        StreamFailure::Refused
    } else {
        StreamFailure::Transient
    }
}

/// Whether the server `client` reaches streams initial lists by default (its
/// `/version`); `false` when the version cannot be read.
async fn streams_initial_lists(client: kube::Client) -> bool {
    match client.apiserver_version().await {
        Ok(info) => KubeVersion::parse(&info.git_version).is_ok_and(|v| v.streams_initial_lists()),
        Err(_) => false,
    }
}

fn spawn_reflector<K>(
    cluster: String,
    api: Api<K>,
    config: watcher::Config,
    lists: Lists,
    writer: Writer<K>,
    watched: &Watched<K>,
    waker: Option<Wake<K>>,
) -> JoinHandle<()>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let (dyntype, live, written, trim) = (
        watched.dyntype.clone(),
        watched.live.clone(),
        watched.written.clone(),
        watched.trim,
    );
    tokio::spawn(async move {
        let mut writer = writer;
        let mut backoff = watcher::DefaultBackoff::default();
        let mut server_streams = lists == Lists::StreamedWhereServed
            && streams_initial_lists(api.clone().into_client()).await;
        let (mut page_once, mut fell_back) = (false, false);
        loop {
            let streaming = server_streams && !std::mem::take(&mut page_once);
            let config = if streaming {
                config.clone().streaming_lists()
            } else {
                config.clone()
            };
            let mut listed = false;
            let mut stream = watcher(api.clone(), config).modify(trim).boxed();
            while let Some(item) = stream.next().await {
                let event = match item {
                    Ok(event) => event,
                    Err(e) if streaming && !listed => {
                        // Pages at once, without a backoff: for good where the server
                        // refused the stream, for this list where it merely broke.
                        match stream_failure(&e) {
                            StreamFailure::Refused => {
                                tracing::info!(%cluster, error = %e, "remote watch lists in pages from now on (the server refused a streamed initial list)");
                                server_streams = false;
                            }
                            StreamFailure::Transient => {
                                tracing::debug!(%cluster, error = %e, "remote watch lists in pages this time (its streamed initial list broke)");
                                page_once = true;
                            }
                        }
                        fell_back = true;
                        break;
                    }
                    Err(e) if passed_body_limit(&e) => {
                        // The connection ended at its body limit; the watcher opens it again
                        // from the last version it delivered (an event the limit cut comes
                        // again), so the store misses nothing and stays live.
                        tracing::debug!(%cluster, "remote watch passed its body limit (resuming)");
                        continue;
                    }
                    Err(e) => {
                        live.store(false, Ordering::Release);
                        tracing::debug!(%cluster, error = %e, "remote watch error (listing again)");
                        break;
                    }
                };
                // The store holds the change before the claim it wakes reads it.
                writer.apply_watcher_event(&event);
                match event {
                    watcher::Event::InitDone => {
                        listed = true;
                        // Everything written before the list is in it.
                        if let Ok(mut w) = written.lock() {
                            *w = Own::new();
                        }
                        live.store(true, Ordering::Release)
                    }
                    watcher::Event::Apply(obj) => {
                        if let Ok(mut w) = written.lock() {
                            // Once ours arrived, the store is at least as new.
                            w.delivered(obj.to_object_ref(dyntype.clone()), resource_version(&obj));
                        }
                        wake(&waker, &obj)
                    }
                    watcher::Event::Delete(obj) => {
                        if let Ok(mut w) = written.lock() {
                            w.gone(&obj.to_object_ref(dyntype.clone()));
                        }
                        wake(&waker, &obj)
                    }
                    watcher::Event::InitApply(obj) => wake(&waker, &obj),
                    watcher::Event::Init => {}
                }
            }
            if std::mem::take(&mut fell_back) {
                continue;
            }
            // A watch that failed starts over with a full list, after a backoff: resumed
            // from its last version it would never say when it caught up, and the store
            // would stay unread (every read a request to the API server) until the next
            // list. The list costs what a `410 Gone` costs anyway.
            tokio::time::sleep(backoff.next().unwrap_or(RELIST_BACKOFF_MAX)).await;
        }
    })
}

/// The longest wait before a failed remote watch lists again (the default backoff's own
/// cap; it never runs out).
const RELIST_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps only autonodes' own labels of an observed KubeVirt object (which claim it belongs
/// to); KubeVirt's and the template's go. What [`trim_meta`] drops was never read into an
/// [`Observed`] one.
fn trim_observed<K: ObservedKind>(obj: &mut Observed<K>) {
    if let Some(labels) = obj.metadata.labels.as_mut() {
        labels.retain(|k, _| k.starts_with(AUTONODES_LABEL_PREFIX) || k == LABEL_MANAGED_BY);
    }
}

/// Prefix of the labels autonodes puts on what it creates.
const AUTONODES_LABEL_PREFIX: &str = "autonodes.io/";

/// Labels every kubelet sets on its Node, which autonodes never sets.
const KUBELET_LABELS: [&str; 5] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Keeps a Node's metadata ([`trim_meta`]) without the kubelet's own labels, its spec
/// (taints are patched by position, so they stay exactly as the API server has them), its
/// conditions as node repair reads them ([`repair_conditions`]) and its kubelet's version
/// (version drift); images, volumes, addresses and system details go.
fn trim_node(node: &mut Node) {
    trim_meta(node);
    // The kubelet's own labels: never among those autonodes sets ([`join::node_patch`]
    // compares only those), so not worth a copy per Node.
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.retain(|k, _| !KUBELET_LABELS.contains(&k.as_str()));
    }
    if let Some(s) = node.status.as_mut() {
        let kubelet_version = s.node_info.take().map(|i| i.kubelet_version);
        *s = k8s_openapi::api::core::v1::NodeStatus {
            conditions: repair_conditions(s.conditions.take()),
            node_info: kubelet_version.map(|kubelet_version| {
                k8s_openapi::api::core::v1::NodeSystemInfo {
                    kubelet_version,
                    ..Default::default()
                }
            }),
            ..Default::default()
        };
    }
}

/// Keeps of a host Node what placing a VM reads ([`host_capacity::HostNode::from_node`]):
/// its name, labels, taints, cordon, allocatable and `Ready` condition.
fn trim_host_node(node: &mut Node) {
    trim_meta(node);
    if let Some(spec) = node.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::NodeSpec {
            taints: spec.taints.take(),
            unschedulable: spec.unschedulable,
            ..Default::default()
        };
    }
    if let Some(s) = node.status.as_mut() {
        *s = k8s_openapi::api::core::v1::NodeStatus {
            allocatable: s.allocatable.take(),
            conditions: ready_only(s.conditions.take()),
            ..Default::default()
        };
    }
}

/// A Node's conditions as node repair keeps them ([`autonodes_core::node_health::observe`]):
/// type, status and reason (cut), `Ready` first, at most
/// [`autonodes_api::MAX_NODE_CONDITIONS`]; no messages or times, so a heartbeat changes
/// nothing.
fn repair_conditions(
    conditions: Option<Vec<k8s_openapi::api::core::v1::NodeCondition>>,
) -> Option<Vec<k8s_openapi::api::core::v1::NodeCondition>> {
    let seen = autonodes_core::node_health::observe(
        &[],
        conditions.as_deref()?,
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    Some(
        seen.into_iter()
            .map(|c| k8s_openapi::api::core::v1::NodeCondition {
                type_: c.type_,
                status: c.status,
                reason: (!c.reason.is_empty()).then_some(c.reason),
                ..Default::default()
            })
            .collect(),
    )
}

/// A Node's `Ready` condition, without its message and times.
fn ready_only(
    conditions: Option<Vec<k8s_openapi::api::core::v1::NodeCondition>>,
) -> Option<Vec<k8s_openapi::api::core::v1::NodeCondition>> {
    conditions.map(|cs| {
        cs.into_iter()
            .filter(|c| c.type_ == "Ready")
            .map(|c| k8s_openapi::api::core::v1::NodeCondition {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                ..Default::default()
            })
            .collect()
    })
}

/// Keeps of a pod what host capacity reads: its node, its request folded into one
/// container ([`host_capacity::pod_request`]) and, of a VM's launcher pod, its claim and
/// group labels ([`host_capacity::LAUNCHER_LABELS`]).
fn trim_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    trim_meta(pod);
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.retain(|k, _| host_capacity::LAUNCHER_LABELS.contains(&k.as_str()));
    }
    let status = pod.status.take();
    if let Some(spec) = pod.spec.as_mut() {
        let r = host_capacity::pod_request(spec, status.as_ref());
        let requests = std::collections::BTreeMap::from([
            ("cpu".to_string(), Quantity(format!("{}m", r.cpu_millis))),
            ("memory".to_string(), Quantity(r.memory.to_string())),
        ]);
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            containers: vec![Container {
                name: "request".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
    }
}

/// Objects per page when a tenant's caches are listed: a page of objects a tenant may have
/// made large stays well under [`crate::remote::egress::TENANT_BODY_LIMIT`].
const TENANT_PAGE: u32 = 100;

/// Secrets per page when a tenant's bootstrap tokens are listed: Secrets may be large (up
/// to 1 MiB), tokens are a few hundred bytes.
const TOKEN_PAGE: u32 = 25;

/// The data keys of a bootstrap-token Secret autonodes reads (`tokens::ensure_token`).
const TOKEN_KEYS: [&str; 3] = ["token-id", "token-secret", "expiration"];
/// The longest value of those keys kept (a token id is 6 characters, a secret 16, an
/// RFC 3339 time about 25).
const TOKEN_VALUE_MAX: usize = 64;

/// Keeps of a tenant's bootstrap-token Secret what autonodes reads: its metadata (trimmed)
/// and [`TOKEN_KEYS`] of at most [`TOKEN_VALUE_MAX`] bytes. Anything else a Secret that
/// carries autonodes' labels holds is not kept, however large.
fn trim_token(secret: &mut Secret) {
    trim_meta(secret);
    secret.string_data = None;
    if let Some(data) = secret.data.as_mut() {
        data.retain(|k, v| TOKEN_KEYS.contains(&k.as_str()) && v.0.len() <= TOKEN_VALUE_MAX);
    }
}

/// Drops what no controller reads of a remote object's metadata and what grows with the
/// systems that write it: `managedFields`, annotations, owner references and finalizers.
/// Name, namespace, UID, resource version, labels, and creation and deletion timestamps stay.
fn trim_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> Box<kube::core::Status> {
        Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_streamed_list_the_server_refuses_lists_in_pages_for_good_and_one_that_broke_only_this_time(
    ) {
        let gate_off =
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        for code in [400, 403, 422] {
            let refused =
                watcher::Error::WatchStartFailed(kube::Error::Api(status(code, gate_off)));
            assert_eq!(stream_failure(&refused), StreamFailure::Refused, "{code}");
        }
        // What a 1.36 server on an etcd without progress notifications answers: an ERROR
        // event inside the watch, which kube-rs' watcher would retry for ever.
        let storage = watcher::Error::WatchError(status(
            500,
            "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
        ));
        assert_eq!(stream_failure(&storage), StreamFailure::Refused);
        for code in [410, 429] {
            let event = watcher::Error::WatchError(status(code, "later"));
            assert_eq!(stream_failure(&event), StreamFailure::Transient, "{code}");
        }
        for code in [410, 429, 500, 503] {
            let start = watcher::Error::WatchStartFailed(kube::Error::Api(status(code, "later")));
            assert_eq!(stream_failure(&start), StreamFailure::Transient, "{code}");
        }
        assert_eq!(
            stream_failure(&watcher::Error::NoResourceVersion),
            StreamFailure::Transient
        );
    }

    #[test]
    fn a_cached_kubevirt_object_keeps_autonodes_labels_and_the_status_the_controller_reads_and_nothing_else(
    ) {
        let mut vmi: ObservedVmi = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "vm", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                "labels": {"autonodes.io/nodeclaim": "c", "app.kubernetes.io/managed-by": "autonodes",
                           "kubevirt.io/nodeName": "host-1", "workload": "memory-intensive"},
                "annotations": {"kubevirt.io/latest-observed-api-version": "v1"},
                "finalizers": ["foregroundDeleteVirtualMachine"],
                "managedFields": [{"manager": "virt-controller"}],
            },
            "spec": {"domain": {"devices": {}}},
            "status": {
                "phase": "Running", "ready": true,
                "interfaces": [{"name": "default", "ipAddress": "10.0.0.7", "mac": "aa"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "guestOSInfo": {"name": "Debian"},
            },
        }))
        .expect("object");
        trim_observed(&mut vmi);
        assert_eq!(vmi.phase(), Some("Running"));
        assert_eq!(vmi.ip(), Some("10.0.0.7"));
        assert!(vmi.ready());
        assert_eq!(
            vmi.labels().keys().collect::<Vec<_>>(),
            ["app.kubernetes.io/managed-by", "autonodes.io/nodeclaim"],
            "only autonodes' labels stay"
        );
        assert_eq!(vmi.metadata.resource_version.as_deref(), Some("9"));
        assert!(vmi.metadata.annotations.is_none());
        assert!(vmi.metadata.finalizers.is_none());
        assert!(vmi.metadata.managed_fields.is_none());
    }

    #[test]
    fn a_cached_node_keeps_its_spec_its_readiness_its_kubelet_version_and_the_labels_autonodes_may_set(
    ) {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"a": "b", "kubernetes.io/hostname": "n",
                                                 "kubernetes.io/arch": "amd64"},
                         "annotations": {"x": "y"}},
            "spec": {"providerID": "kubevirt://n", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                               {"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status"}],
                "images": [{"names": ["busybox"], "sizeBytes": 1}],
                "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                             "kernelVersion": "k", "kubeProxyVersion": "v", "kubeletVersion": "v",
                             "machineID": "m", "operatingSystem": "linux", "osImage": "o",
                             "systemUUID": "s"},
            },
        }))
        .expect("node");
        let spec = n.spec.clone();
        trim_node(&mut n);
        assert_eq!(n.spec, spec);
        assert_eq!(
            n.labels().keys().collect::<Vec<_>>(),
            ["a"],
            "the kubelet's own labels go"
        );
        assert!(n.metadata.annotations.is_none());
        let status = n.status.expect("status");
        assert!(status.images.is_none());
        let info = status.node_info.expect("nodeInfo");
        assert_eq!(
            (info.kubelet_version.as_str(), info.kernel_version.as_str()),
            ("v", ""),
            "only the kubelet's version is read"
        );
        let conditions = status.conditions.expect("conditions");
        assert_eq!(
            conditions
                .iter()
                .map(|c| (c.type_.as_str(), c.status.as_str()))
                .collect::<Vec<_>>(),
            [("Ready", "True"), ("MemoryPressure", "False")],
            "every condition, Ready first, for node repair"
        );
        assert!(conditions
            .iter()
            .all(|c| c.message.is_none() && c.last_heartbeat_time.is_none()));
    }

    #[test]
    fn a_cached_host_pod_keeps_its_node_its_request_and_its_claim_and_group_labels() {
        let spec = |v: serde_json::Value| -> Pod { serde_json::from_value(v).expect("pod") };
        let mut p = spec(serde_json::json!({
            "metadata": {"name": "virt-launcher-vm-x", "namespace": "vms",
                         "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm",
                                    "kubevirt.io/created-by": "u", "autonodes.io/nodeclaim-uid": "c-u",
                                    "autonodes.io/vcluster": "vc", "autonodes.io/nodeclaim": "c"},
                         "annotations": {"a": "b"}},
            "spec": {"nodeName": "host-1", "containers": [
                {"name": "compute", "image": "virt-launcher", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
                {"name": "guest-console-log", "resources": {"requests": {"cpu": "5m", "memory": "35M"}}}],
                     "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                        "resources": {"requests": {"cpu": "100m"}}}],
                     "overhead": {"memory": "1Mi"}},
            "status": {"phase": "Running"},
        }));
        let before = host_capacity::pod_request(p.spec.as_ref().expect("spec"), p.status.as_ref());
        assert_eq!(before.cpu_millis, 2105, "the sidecar counts");
        trim_pod(&mut p);
        let s = p.spec.as_ref().expect("spec");
        assert_eq!(
            host_capacity::pod_request(s, None),
            before,
            "the same request"
        );
        assert_eq!(s.node_name.as_deref(), Some("host-1"));
        assert_eq!(s.containers.len(), 1);
        assert!(s.containers[0].image.is_none());
        assert_eq!(
            p.labels().keys().collect::<Vec<_>>(),
            ["autonodes.io/nodeclaim-uid", "autonodes.io/vcluster"],
            "its claim and its group"
        );
        assert!(p.status.is_none() && p.metadata.annotations.is_none());
    }

    #[test]
    fn a_cached_host_node_keeps_what_placing_a_vm_reads() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h", "labels": {"kubernetes.io/hostname": "h", "topology.kubernetes.io/zone": "a"}},
            "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": true,
                     "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                       "capacity": {"cpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "message": "m"},
                                      {"type": "DiskPressure", "status": "False"}],
                       "images": [{"names": ["x"], "sizeBytes": 1}]},
        }))
        .expect("node");
        let before = host_capacity::HostNode::from_node(&n);
        trim_host_node(&mut n);
        assert_eq!(host_capacity::HostNode::from_node(&n), before);
        let status = n.status.as_ref().expect("status");
        assert!(status.images.is_none() && status.capacity.is_none());
        assert_eq!(status.conditions.as_ref().map(Vec::len), Some(1));
        assert!(n.spec.as_ref().expect("spec").pod_cidr.is_none());
    }
}
