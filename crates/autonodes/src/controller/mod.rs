//! The controllers: the only code that writes to clusters.
//!
//! - [`provider`]: NodeProvider → host reachability, template validation, one NodeType per entry.
//! - [`nodetype`]: NodeType → effective resources, cost, capacity, phase.
//! - [`nodeclaim`]: NodeClaim → scheduling, host Secret + VM, tenant token, readiness, cleanup.
//! - [`nodepool`]: NodePool → claims kept alive, scaled by `replicas` or by pending pods
//!   (planned by `autonodes_core::pool`).
//! - [`capi`]: NodePool with `spec.autoscaling` → `capi.autonodes.io` MachinePool + Machines.
//! - [`remote`]: watches on host (VM, VMI) and tenant (Node) clusters that wake claims.
//!
//! Each reconcile reads, validates, builds (pure code in `template`, `scheduling`,
//! `requirements`, `pool`, `userdata`), applies, and writes status with server-side apply.

pub mod access;
pub mod calls;
pub mod capi;
pub mod catalogue;
pub mod gauges;
pub mod host;
pub mod host_room;
pub mod lenient;
pub mod nodeclaim;
pub mod nodepool;
pub mod nodequota;
pub mod nodetype;
pub mod provider;
pub mod reflectors;
pub mod remote;
pub mod status;
pub mod sweep;
pub mod tenant;
pub mod vcluster_import;

use std::sync::Arc;
use std::time::Duration;

use autonodes_core::pool::expectations::ClaimExpectations;
use futures::channel::mpsc;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Config as RunConfig;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, Controller};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::api::capi::{Machine, MachinePool};
use crate::api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};
use crate::clients::{remote_error_text, ClientError, ClusterClients};
use crate::kubeconfig::KubeconfigPolicy;
use crate::metrics::Metrics;
use reflectors::{Reflector, Touched};

/// Field manager of every write autonodes makes.
pub const FIELD_MANAGER: &str = "autonodes";

/// Settings of the controllers (from `autonodes run` flags).
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Namespace holding host-cluster kubeconfig Secrets (and the leader Lease).
    pub namespace: String,
    /// How long a VM may take to run before its claim fails.
    pub launch_timeout: Duration,
    /// How long a running VM's Node may take to join before its claim fails.
    pub registration_timeout: Duration,
    /// How long a joined Node may take to be Ready without startup taints before its
    /// claim fails.
    pub initialization_timeout: Duration,
    /// How long an initialized Node may stay not Ready before a pool replaces it (`None`:
    /// never).
    pub node_repair_after: Option<Duration>,
    /// How long draining a Node may take before it is deleted anyway.
    pub drain_timeout: Duration,
    /// What kubeconfig Secrets may contain beyond the defaults.
    pub kubeconfig_policy: KubeconfigPolicy,
    /// How often the orphan sweep looks for objects whose claim is gone.
    pub orphan_sweep_interval: Duration,
    /// Which namespaces' vCluster configurations (`vc-config-*` Secrets) become NodePools.
    pub vcluster_import: vcluster_import::ImportScope,
    /// Where stock images download the kubelet and kubeadm (`--kubernetes-download-url`).
    pub kubernetes_download_url: String,
    /// The most live claims pools may bring one namespace to
    /// (`--max-claims-per-namespace`).
    pub max_claims_per_namespace: usize,
    /// Whether a namespace needs a NodeQuota covering it to claim anything
    /// (`--require-quota`).
    pub require_quota: bool,
    /// This installation's id (`--installation-id`): the value of the
    /// `autonodes.io/installation` label on everything it creates in host and tenant
    /// clusters. Empty: the UID of the namespace in `namespace`, read at start.
    pub installation: String,
    /// Where host and tenant clients may connect ([`crate::egress`]); the management
    /// cluster's API server (its `kubernetes` Service, that Service's endpoints, and
    /// `management_server`) is added at start.
    pub egress: crate::egress::Egress,
    /// The management cluster's API server as this process reaches it (`host:port`), also
    /// refused to host and tenant clients.
    pub management_server: Option<String>,
}

/// The addresses of the management cluster's API server: `server` (`host:port`, resolved)
/// and the `default/kubernetes` Service's cluster IPs and endpoints, each with its ports.
/// What cannot be read is logged and left out.
async fn management_api_server(client: &Client, server: Option<&str>) -> Vec<std::net::SocketAddr> {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    let mut out = Vec::new();
    if let Some(server) = server {
        match tokio::net::lookup_host(server).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => {
                tracing::warn!(%server, error = %e, "cannot resolve the management API server")
            }
        }
    }
    match kube::Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
    {
        Ok(svc) => {
            let spec = svc.spec.unwrap_or_default();
            let ips = spec.cluster_ips.unwrap_or_default();
            for port in spec.ports.unwrap_or_default() {
                for ip in &ips {
                    if let (Ok(ip), Ok(port)) = (ip.parse(), u16::try_from(port.port)) {
                        out.push(std::net::SocketAddr::new(ip, port));
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the default/kubernetes Service"),
    }
    match kube::Api::<Endpoints>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
    {
        Ok(ep) => {
            for subset in ep.subsets.unwrap_or_default() {
                let ports: Vec<u16> = subset
                    .ports
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| u16::try_from(p.port).ok())
                    .collect();
                for a in subset.addresses.unwrap_or_default() {
                    if let Ok(ip) = a.ip.parse() {
                        out.extend(ports.iter().map(|p| std::net::SocketAddr::new(ip, *p)));
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the default/kubernetes Endpoints"),
    }
    out.sort();
    out.dedup();
    out
}

/// The default installation id: the UID of the controller's namespace, unique to this
/// management cluster and namespace and stable for as long as the installation lives.
async fn installation_of_namespace(client: &Client, namespace: &str) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let ns = api.get(namespace).await.with_context(|| {
        format!("reading namespace {namespace} for the installation id (set --installation-id, or let autonodes get that namespace)")
    })?;
    ns.metadata
        .uid
        .with_context(|| format!("namespace {namespace} has no UID"))
}

/// The installation id of [`ControllerConfig::default`] (tests and the playground).
pub const DEFAULT_INSTALLATION: &str = "default";

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: "autonodes-system".into(),
            launch_timeout: Duration::from_secs(600),
            registration_timeout: Duration::from_secs(900),
            initialization_timeout: Duration::from_secs(900),
            node_repair_after: Some(Duration::from_secs(600)),
            drain_timeout: Duration::from_secs(120),
            kubeconfig_policy: KubeconfigPolicy::default(),
            orphan_sweep_interval: Duration::from_secs(300),
            vcluster_import: vcluster_import::ImportScope::Off,
            kubernetes_download_url: crate::userdata::DEFAULT_DOWNLOAD_URL.to_string(),
            max_claims_per_namespace:
                autonodes_core::pool::limits::DEFAULT_MAX_CLAIMS_PER_NAMESPACE,
            require_quota: false,
            installation: DEFAULT_INSTALLATION.to_string(),
            egress: crate::egress::Egress::default(),
            management_server: None,
        }
    }
}

/// Errors a reconcile returns (transient: the object is retried with backoff). Bad input
/// never ends up here: it becomes a status condition and an Event instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the management cluster failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The API error.
        source: kube::Error,
    },
    /// A call to a remote cluster failed.
    #[error("{cluster}: {context}: {}", remote_error_text(.source))]
    Remote {
        /// The cluster.
        cluster: String,
        /// True for a host cluster, false for a tenant.
        on_host: bool,
        /// What was being done.
        context: String,
        /// The API error.
        source: kube::Error,
    },
    /// A remote client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object changed since it was read; the reconcile runs again on the new version.
    #[error("{0} changed while it was reconciled")]
    Conflict(String),
    /// A cleanup is still waiting (for a VM to go, a Node to drain, claims to end). The
    /// finalizer stays; the object is looked at again shortly.
    #[error("waiting: {0}")]
    Waiting(String),
    /// A cleanup step failed (a cluster unreachable, a 403, a kubeconfig Secret missing or
    /// refused). The finalizer stays — what the step guards may still exist — and the
    /// cleanup is retried with backoff ([`cleanup_backoff`]).
    #[error("cleanup blocked ({reason}): {message}")]
    CleanupBlocked {
        /// The condition reason.
        reason: &'static str,
        /// What failed.
        message: String,
    },
    /// An object lacks a field the API server always sets.
    #[error("{0} lacks {1}")]
    Missing(String, &'static str),
    /// Rendering failed for a reason that is not the user's input.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// A management-cluster error with context.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Remote { .. } => "remote",
            Error::Client(_) => "client",
            Error::Finalizer(_) => "finalizer",
            Error::Conflict(_) => "conflict",
            Error::Waiting(_) => "waiting",
            Error::CleanupBlocked { .. } => "cleanup_blocked",
            Error::Missing(..) => "missing",
            Error::Internal(_) => "internal",
        }
    }
}

/// Shared state of the controllers.
pub struct Context {
    /// Management-cluster client.
    pub client: Client,
    /// Remote cluster clients.
    pub clients: Arc<ClusterClients>,
    /// Settings.
    pub config: ControllerConfig,
    /// Who records Events (events.k8s.io/v1).
    pub reporter: Reporter,
    /// The one watch and store of each kind.
    pub reflectors: Arc<Reflectors>,
    /// The catalogue as last prepared, and the versions of the type and provider stores it
    /// was prepared from ([`catalogue::catalogue`]).
    pub catalogue: std::sync::Mutex<Option<PreparedCatalogue>>,
    /// All NodeClaims (the claim controller's reflector).
    pub claims: Store<NodeClaim>,
    /// All NodeTypes.
    pub types: Store<NodeType>,
    /// All NodeProviders.
    pub providers: Store<NodeProvider>,
    /// All NodeQuotas.
    pub quotas: Store<NodeQuota>,
    /// Serializes scheduling decisions so capacity is never exceeded (held only while a
    /// decision is made in memory, never across an API call).
    pub scheduling: Mutex<nodeclaim::Reservations>,
    /// The claimed capacity per NodeType, kept up to date by the claim store's watch
    /// (before [`Context::wait_synced`] resolves) and by this process's scheduling
    /// decisions and releases. Locked only briefly, never across an await.
    pub claimed: Arc<std::sync::Mutex<crate::ledger::ClaimedLedger>>,
    /// Per vCluster (`<namespace>/<name>`) and imported pool name, why its configuration
    /// could not be imported for that pool ([`vcluster_import`]); read by the pool
    /// controller for the pools' `VClusterConfig` condition.
    pub import_problems: std::sync::Mutex<
        std::collections::HashMap<String, std::collections::BTreeMap<String, String>>,
    >,
    /// Wakes a NodePool's reconcile.
    pub wake_pools: mpsc::UnboundedSender<ObjectRef<NodePool>>,
    /// Each tenant's published join address and version, and when they were read
    /// ([`tenant::Tenant::join_info`]).
    pub published_joins:
        std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, tenant::JoinInfo)>>,
    /// Claims this process created, deleted or annotated that the claim store does not show
    /// yet ([`Context::claims_in`]).
    pub expected_claims: std::sync::Mutex<ClaimExpectations>,
    /// Claims as this process last wrote them, until the store catches up ([`Context::fresher`]).
    pub written: std::sync::Mutex<std::collections::HashMap<String, Written<NodeClaim>>>,
    /// UIDs of deleted claims whose finalizer this process saw released
    /// ([`Context::finalized`]).
    pub finalized: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Since when each claim has had progress this process has not written yet, by UID
    /// ([`nodeclaim::status::STATUS_WRITE_GAP`]).
    pub status_pending: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// When each NodeType's status was last written, by name
    /// ([`nodetype::COUNT_WRITE_GAP`]).
    pub type_status_written: status::WriteGap,
    /// When each NodeQuota's status was last written, by name
    /// ([`nodequota::USE_WRITE_GAP`]).
    pub quota_status_written: status::WriteGap,
    /// Each NodeType's instance type as last read from its host, and when
    /// ([`nodetype::INSTANCETYPE_READ_GAP`]).
    pub instancetypes_read: std::sync::Mutex<std::collections::HashMap<String, InstancetypeRead>>,
    /// Wakes claims (remote changes, freed capacity).
    pub wake_claims: mpsc::UnboundedSender<ObjectRef<NodeClaim>>,
    /// Wakes node types (capacity changes).
    pub wake_types: mpsc::UnboundedSender<ObjectRef<NodeType>>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// True once the claim, type and provider stores hold their first full list.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// Where watches send objects they cannot decode ([`lenient::report`]).
    pub reports: lenient::Reports,
}

/// An instance type as read from a host, and when: its cpu and memory, or why not.
pub type InstancetypeRead = (std::time::Instant, Result<crate::api::ResourceList, String>);

/// A prepared catalogue and the versions of the type and provider stores it came from.
pub type PreparedCatalogue = ((u64, u64), Arc<crate::scheduling::Catalogue>);

/// An object as a status write returned it, and the version that write replaced.
pub struct Written<K> {
    /// The `resourceVersion` the write was conditional on.
    pub replaced: String,
    /// The object the API server returned.
    pub object: Arc<K>,
}

impl Context {
    /// Runs `f` on the capacity ledger (a poisoned lock still holds a consistent ledger:
    /// every change is one call).
    pub fn ledger<T>(&self, f: impl FnOnce(&mut crate::ledger::ClaimedLedger) -> T) -> T {
        f(&mut ledger_guard(&self.claimed))
    }

    /// The newer of `claim` (from the store) and the claim as this process last wrote it.
    ///
    /// The store lags behind our own writes by a watch event; a reconcile that ran on the
    /// store's copy would write on a stale version and get a conflict. While the store
    /// still shows the version a write replaced, the written object is the current one.
    pub fn fresher(&self, claim: Arc<NodeClaim>) -> Arc<NodeClaim> {
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

    /// The claims of `namespace` as they are: the claim store's copies, with the claims
    /// this process created, deleted or annotated that the store does not show yet
    /// ([`ClaimExpectations::view`]), sorted by name. No request to the API server.
    pub fn claims_in(&self, namespace: &str) -> Vec<Arc<NodeClaim>> {
        let stored = self
            .claims
            .state_filter(|c| c.metadata.namespace.as_deref() == Some(namespace));
        self.expected_claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .view(namespace, stored, std::time::Instant::now())
    }

    /// Records a write to claims that [`Context::claims_in`] shows until the store does.
    pub fn expect_claims(&self, record: impl FnOnce(&mut ClaimExpectations, std::time::Instant)) {
        let mut expected = self
            .expected_claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        record(&mut expected, std::time::Instant::now());
    }

    /// Remembers a claim as a status write returned it (see [`Context::fresher`]).
    pub fn remember_written(
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

    /// Forgets what [`Context::remember_written`] kept of a claim (its cleanup finished).
    pub fn forget_written(&self, uid: &str) {
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
    pub fn finalized(&self, uid: &str, release: bool) -> bool {
        let Ok(mut finalized) = self.finalized.lock() else {
            return false;
        };
        if !release {
            return finalized.contains(uid);
        }
        finalized.insert(uid.to_string());
        // Now and then, forget claims the store no longer holds.
        if finalized.len() % 256 == 0 {
            let live: std::collections::HashSet<String> =
                self.claims.state().iter().filter_map(|c| c.uid()).collect();
            finalized.retain(|u| live.contains(u));
        }
        true
    }

    /// Since when the claim with `uid` has had progress not written yet (from now on, if
    /// it had none); `done` forgets it (the status needs no write).
    pub fn progress_pending(&self, uid: &str, done: bool) -> Option<std::time::Instant> {
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

    /// Waits until the claim, type and provider stores hold their first full list.
    ///
    /// Use this rather than `Store::wait_until_ready`: kube-runtime's readiness future keeps
    /// a single waker, so of several tasks waiting on one store only the last one to poll
    /// is woken and the others hang.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Records an Event (events.k8s.io/v1) about `obj`; failures to record are logged,
    /// never fatal. Events about cluster-scoped objects go to `kube-system`, the namespace
    /// every API server version accepts for them.
    pub async fn event<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.event_about(obj.object_ref(&()), type_, reason, action, note)
            .await;
    }

    /// Records an Event about the object `regarding` refers to (see [`Context::event`]).
    pub async fn event_about(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "kube-system".into());
        let now = now();
        let name = crate::names::event_name(
            regarding.name.as_deref().unwrap_or("autonodes"),
            now.as_nanosecond(),
        );
        let event = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(crate::conditions::cut(action, 128)),
            reason: Some(crate::conditions::cut(reason, 128)),
            note: Some(crate::conditions::cut(&note, 1000)),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                now,
            )),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&kube::api::PostParams::default(), &event).await {
            tracing::warn!(object = %regarding.name.unwrap_or_default(), error = %e, "recording an event failed");
        }
    }

    /// Wakes the live claims scheduled to NodeType `name` (its definition changed: they
    /// may have drifted).
    pub fn wake_claims_of_type(&self, name: &str) {
        let mut woken = 0;
        for claim in self.claims.state() {
            let of_type = claim.status.as_ref().and_then(|s| s.type_ref.as_deref()) == Some(name);
            if of_type && claim.meta().deletion_timestamp.is_none() {
                let _ = self
                    .wake_claims
                    .unbounded_send(ObjectRef::from_obj(&*claim));
                woken += 1;
            }
        }
        tracing::debug!(nodetype = %name, woken, "woke the claims of a changed node type");
    }

    /// Wakes every claim that is not scheduled yet (capacity or types changed).
    pub fn wake_pending_claims(&self) {
        let mut woken = 0;
        for claim in self.claims.state() {
            if unscheduled(&claim) && claim.meta().deletion_timestamp.is_none() {
                let _ = self
                    .wake_claims
                    .unbounded_send(ObjectRef::from_obj(&*claim));
                woken += 1;
            }
        }
        tracing::debug!(woken, "woke pending claims");
    }
}

/// Whether a claim has no node type yet (`status.typeRef` unset).
fn unscheduled(c: &NodeClaim) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.type_ref.as_ref())
        .is_none()
}

/// The current time.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// Writes `status` of `obj` with server-side apply on the status subresource; returns the
/// object as written.
pub async fn apply_status<K, S>(api: &Api<K>, obj: &K, status: &S) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    apply_status_as(api, obj, status, FIELD_MANAGER).await
}

/// [`apply_status`] with another field manager (a controller whose status fields must not
/// be taken over by the others').
pub async fn apply_status_as<K, S>(
    api: &Api<K>,
    obj: &K,
    status: &S,
    manager: &str,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let name = obj.name_any();
    // The object's resourceVersion makes the write conditional: a reconcile that worked on
    // a stale copy (the cache lags behind our own writes) gets a conflict instead of
    // overwriting newer status, and runs again on the current object.
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"resourceVersion": obj.resource_version()},
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| match e {
        // Expected: the cache was behind our own last write. Not a failure.
        kube::Error::Api(s) if s.code == 409 => Error::Conflict(format!("{} {name}", K::kind(&()))),
        e => Error::kube(format!("writing status of {} {name}", K::kind(&())))(e),
    })
}

/// The watcher configuration of every controller.
fn watch_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// The one watch and store of each of autonodes' kinds ([`reflectors`]).
pub struct Reflectors {
    /// NodeClaims.
    pub claims: Reflector<NodeClaim>,
    /// NodeTypes.
    pub types: Reflector<NodeType>,
    /// NodeProviders.
    pub providers: Reflector<NodeProvider>,
    /// NodePools.
    pub pools: Reflector<NodePool>,
    /// `capi.autonodes.io` MachinePools.
    pub machine_pools: Reflector<MachinePool>,
    /// `capi.autonodes.io` Machines.
    pub machines: Reflector<Machine>,
    /// NodeQuotas.
    pub quotas: Reflector<NodeQuota>,
}

impl Reflectors {
    fn new() -> Self {
        Reflectors {
            claims: Reflector::new(),
            types: Reflector::new(),
            providers: Reflector::new(),
            pools: Reflector::new(),
            machine_pools: Reflector::new(),
            machines: Reflector::new(),
            quotas: Reflector::new(),
        }
    }

    /// Runs every watch. Undecodable objects are reported (a Machine is only ever written
    /// by autonodes and gets no condition).
    async fn run(&self, client: Client, reports: lenient::Reports) {
        tokio::join!(
            self.claims.run(client.clone(), Some(reports.clone())),
            self.types.run(client.clone(), Some(reports.clone())),
            self.providers.run(client.clone(), Some(reports.clone())),
            self.pools.run(client.clone(), Some(reports.clone())),
            self.machine_pools
                .run(client.clone(), Some(reports.clone())),
            self.machines.run(client.clone(), None),
            self.quotas.run(client, Some(reports)),
        );
    }
}

/// How many claims are reconciled at once. Each reconcile mostly waits on API servers; a
/// bound keeps a burst of thousands of new claims from opening thousands of requests at
/// once (which slows every one of them) and bounds the memory they hold.
const CLAIM_CONCURRENCY: u16 = 64;

/// The ledger behind its lock; a poisoned lock still holds a consistent ledger (every
/// change is one call), so the watch keeps feeding it and scheduling keeps reading it.
fn ledger_guard(
    lock: &std::sync::Mutex<crate::ledger::ClaimedLedger>,
) -> std::sync::MutexGuard<'_, crate::ledger::ClaimedLedger> {
    lock.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the controllers until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
    ready: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let mut config = config;
    if config.installation.is_empty() {
        config.installation = installation_of_namespace(&client, &config.namespace).await?;
    }
    tracing::info!(installation = %config.installation, "installation id (label autonodes.io/installation)");
    let protected = management_api_server(&client, config.management_server.as_deref()).await;
    tracing::info!(addresses = ?protected, "host and tenant clients never connect to the management API server");
    config.egress = config.egress.protecting(&protected);
    let reflectors = Arc::new(Reflectors::new());
    let r = &reflectors;
    let claimed = Arc::new(std::sync::Mutex::new(crate::ledger::ClaimedLedger::new()));
    {
        let claimed = claimed.clone();
        r.claims.observe(move |change| {
            let mut ledger = ledger_guard(&claimed);
            match change {
                reflectors::Observed::Applied(c) => ledger.observe(c),
                reflectors::Observed::Deleted(c) => {
                    if let Some(uid) = c.metadata.uid.as_deref() {
                        ledger.forget(uid)
                    }
                }
                reflectors::Observed::Listed(all) => ledger.resync(all.iter().map(|c| &**c)),
            }
        });
    }
    let (reports, reported) = mpsc::unbounded();

    let (wake_claims, claim_wakeups) = mpsc::unbounded();
    let (wake_types, type_wakeups) = mpsc::unbounded();
    let (wake_pools, pool_wakeups) = mpsc::unbounded();
    let clients = Arc::new(ClusterClients::new(
        client.clone(),
        config.namespace.clone(),
        config.kubeconfig_policy,
        config.egress.clone(),
    ));
    clients.set_on_connect(remote::watch_hook(
        wake_claims.clone(),
        r.claims.store(),
        &config.installation,
    ));

    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let reporter = Reporter {
        controller: "autonodes".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        clients,
        config,
        reporter,
        reflectors: reflectors.clone(),
        catalogue: Default::default(),
        claims: r.claims.store(),
        types: r.types.store(),
        providers: r.providers.store(),
        quotas: r.quotas.store(),
        scheduling: Mutex::new(nodeclaim::Reservations::default()),
        claimed,
        published_joins: Default::default(),
        import_problems: Default::default(),
        wake_pools,
        expected_claims: Default::default(),
        written: Default::default(),
        finalized: Default::default(),
        status_pending: Default::default(),
        type_status_written: Default::default(),
        instancetypes_read: Default::default(),
        quota_status_written: Default::default(),
        wake_claims,
        wake_types,
        metrics,
        synced: synced_rx,
        reports: reports.clone(),
    });
    tokio::spawn(lenient::report(ctx.clone(), reported));
    {
        let reflectors = reflectors.clone();
        let client = client.clone();
        tokio::spawn(async move { reflectors.run(client, reports).await });
    }

    // Readiness: the claim, type and provider stores hold their first full list.
    {
        let reflectors = reflectors.clone();
        tokio::spawn(async move {
            reflectors.claims.wait_synced().await;
            reflectors.types.wait_synced().await;
            reflectors.providers.wait_synced().await;
            let _ = synced_tx.send(true);
            ready.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!("caches synced; controllers ready");
        });
    }

    tokio::spawn(gauges::run(ctx.clone(), shutdown.clone()));
    tokio::spawn(sweep::run(
        ctx.clone(),
        ctx.config.orphan_sweep_interval,
        shutdown.clone(),
    ));

    let claims_for_types = ctx.claims.clone();
    let type_states = std::sync::Mutex::new(std::collections::HashMap::new());
    let claims = Controller::for_shared_stream(r.claims.applied(), r.claims.store())
        .watches_shared_stream(r.types.touched_objects(), move |t: Arc<NodeType>| {
            // A type that appeared, went, or changed its spec or phase may let pending
            // claims schedule; its claimed count changing (every scheduling decision) may
            // not: that would wake every pending claim once per claim scheduled.
            let state = (
                t.metadata.generation,
                t.metadata.deletion_timestamp.is_some(),
                t.status.as_ref().and_then(|s| s.phase),
            );
            let changed = type_states
                .lock()
                .map(|mut m| m.insert(t.name_any(), state) != Some(state))
                .unwrap_or(true);
            if !changed {
                return Vec::new();
            }
            claims_for_types
                .state()
                .into_iter()
                .filter(|c| unscheduled(c))
                .map(|c| ObjectRef::from_obj(&*c))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(r.quotas.touched_objects(), {
            // A quota that appeared, went or changed may let pending claims of the
            // namespaces it covers schedule (or tell them why not).
            let claims = ctx.claims.clone();
            move |q: Arc<NodeQuota>| {
                claims
                    .state()
                    .into_iter()
                    .filter(|c| {
                        unscheduled(c)
                            && crate::quota::covers(&q.spec, &c.namespace().unwrap_or_default())
                    })
                    .map(|c| ObjectRef::from_obj(&*c))
                    .collect::<Vec<_>>()
            }
        })
        .reconcile_on(claim_wakeups)
        .with_config(RunConfig::default().concurrency(CLAIM_CONCURRENCY))
        .graceful_shutdown_on(shutdown.clone())
        .run(nodeclaim::reconcile, nodeclaim::error_policy, ctx.clone())
        .for_each(log_run_error);

    let types_store = ctx.types.clone();
    let types = Controller::for_shared_stream(r.types.applied(), r.types.store())
        .watches_shared_stream(r.claims.touched_objects(), move |c: Arc<NodeClaim>| {
            c.status
                .as_ref()
                .and_then(|s| s.type_ref.as_ref())
                .map(|t| ObjectRef::<NodeType>::new(t))
        })
        .watches_shared_stream(
            r.providers.touched_objects(),
            move |p: Arc<NodeProvider>| {
                let name = p.name_any();
                types_store
                    .state()
                    .into_iter()
                    .filter(|t| t.spec.provider_ref == name)
                    .map(|t| ObjectRef::from_obj(&*t))
                    .collect::<Vec<_>>()
            },
        )
        .reconcile_on(type_wakeups)
        .graceful_shutdown_on(shutdown.clone())
        .run(nodetype::reconcile, nodetype::error_policy, ctx.clone())
        .for_each(log_run_error);

    let pools = nodepool::run(ctx.clone(), r, pool_wakeups, shutdown.clone());
    let imports = vcluster_import::run(ctx.clone(), shutdown.clone());
    let machine_pools = capi::run(ctx.clone(), r, shutdown.clone());

    let types_of_claims = ctx.types.clone();
    let providers_of_claims = ctx.providers.clone();
    let providers = Controller::for_shared_stream(r.providers.applied(), r.providers.store())
        .owns_shared_stream(r.types.spec_touched())
        .reconcile_on(r.claims.touched().filter_map(move |t| {
            // A claim going away may unblock a provider's deletion or the removal of a type
            // gone from its spec; nothing else a claim does concerns its provider (and
            // deleting a thousand claims must not check the host a thousand times).
            let c = match t {
                Touched::Deleted(c) => Some(c),
                Touched::Applied(c) if c.metadata.deletion_timestamp.is_some() => Some(c),
                Touched::Applied(_) => None,
            };
            let provider = c
                .and_then(|c| c.status.clone())
                .and_then(|s| s.type_ref)
                .and_then(|t| {
                    let nt = types_of_claims.get(&ObjectRef::new(&t))?;
                    let key = ObjectRef::<NodeProvider>::new(&nt.spec.provider_ref);
                    let waits = providers_of_claims
                        .get(&key)
                        .is_none_or(|p| provider::waits_for_claims_of(&p, &t));
                    waits.then_some(key)
                });
            futures::future::ready(provider)
        }))
        .graceful_shutdown_on(shutdown.clone())
        .run(provider::reconcile, provider::error_policy, ctx.clone())
        .for_each(log_run_error);

    let quotas_of_claims = ctx.quotas.clone();
    let quotas = Controller::for_shared_stream(r.quotas.applied(), r.quotas.store())
        .watches_shared_stream(r.claims.touched_objects(), move |c: Arc<NodeClaim>| {
            let namespace = c.namespace().unwrap_or_default();
            quotas_of_claims
                .state()
                .into_iter()
                .filter(|q| crate::quota::covers(&q.spec, &namespace))
                .map(|q| ObjectRef::from_obj(&*q))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(nodequota::reconcile, nodequota::error_policy, ctx.clone())
        .for_each(log_run_error);

    tokio::join!(
        claims,
        types,
        providers,
        pools,
        machine_pools,
        imports,
        quotas
    );
    Ok(())
}

/// Logs what the controller runtime reports besides reconcile results (queue errors,
/// objects missing from the cache).
async fn log_run_error<K: Resource, E: std::fmt::Debug, Q: std::fmt::Debug>(
    result: Result<
        (ObjectRef<K>, kube::runtime::controller::Action),
        kube::runtime::controller::Error<E, Q>,
    >,
) where
    K::DynamicType: std::fmt::Debug,
{
    if let Err(e) = result {
        tracing::debug!(error = ?e, "controller runtime");
    }
}

impl Error {
    /// The error a reconcile returned, unwrapped from the finalizer helper's error.
    pub fn inner(&self) -> &Error {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e,
                _ => self,
            },
            e => e,
        }
    }

    /// The claim reason of an error reaching a host or tenant cluster or reading its
    /// kubeconfig Secret: `{Host,Tenant}Forbidden` for a 401/403, else
    /// `{Host,Tenant}Unreachable`; `None` for other errors.
    pub fn cluster_reason(&self) -> Option<crate::api::reasons::ClaimReason> {
        use crate::api::reasons::ClaimReason as R;
        Some(match self {
            Error::Client(c) => c.reason().into(),
            Error::Remote {
                on_host, source, ..
            } => match (on_host, calls::forbidden(source)) {
                (true, true) => R::HostForbidden,
                (true, false) => R::HostUnreachable,
                (false, true) => R::TenantForbidden,
                (false, false) => R::TenantUnreachable,
            },
            _ => return None,
        })
    }

    /// True for a failed call to a tenant cluster.
    pub fn is_tenant_error(&self) -> bool {
        matches!(self, Error::Remote { on_host: false, .. })
    }

    /// True for a 409 from a host or tenant cluster (the object exists, or changed).
    pub fn is_remote_conflict(&self) -> bool {
        matches!(self, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// True when removing the finalizer found the object deleted already (a reconcile that
    /// ran on a cached copy from before the finalizer was released).
    pub fn is_gone(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Finalizer(f) => {
                matches!(f.as_ref(), F::RemoveFinalizer(kube::Error::Api(s)) if s.code == 404)
            }
            _ => false,
        }
    }

    /// True for a write conflict (stale read) or a cleanup that is waiting, wrapped or
    /// not: expected states, retried soon and not logged as failures.
    pub fn is_conflict(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        let expected = |e: &Error| matches!(e, Error::Conflict(_) | Error::Waiting(_));
        match self {
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => expected(e),
                // The finalizer is added and removed with a JSON patch that tests the
                // object's version: a changed object fails the test (422) or conflicts (409).
                F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s)) => {
                    s.code == 409 || s.code == 422
                }
                _ => false,
            },
            e => expected(e),
        }
    }
}

/// How soon a blocked cleanup is tried again: 5 s at first, then a tenth of the time the
/// object has been waiting for deletion, at most 60 s — quick after a blip, and no storm
/// of retries against a cluster that stays away.
pub fn cleanup_backoff(deletion_requested: Option<&Time>) -> Duration {
    let waited = deletion_requested
        .map(|t| {
            let secs = Timestamp::now().as_second() - t.0.as_second();
            Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        })
        .unwrap_or_default();
    (waited / 10).clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// Requeue delay after an error: at once for a conflict (a stale cache catches up within
/// milliseconds), after a few seconds for a cleanup that waits (the watch on what it waits
/// for — a VM going, a Node draining — usually wakes it sooner), else with a pause.
pub fn error_requeue(error: &Error) -> kube::runtime::controller::Action {
    use kube::runtime::controller::Action;
    match error.inner() {
        Error::Conflict(_) => Action::requeue(Duration::from_millis(200)),
        Error::Waiting(_) => Action::requeue(Duration::from_secs(3)),
        _ if error.is_conflict() => Action::requeue(Duration::from_millis(1000)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}
