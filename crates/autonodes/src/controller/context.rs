//! What every controller shares: the management client, the remote clients, the stores,
//! the capacity ledger, the claims this process expects, wake-up channels, metrics and
//! Events.

use std::sync::Arc;

use autonodes_core::pool::expectations::ClaimExpectations;
use futures::channel::mpsc;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};

use super::config::ControllerConfig;
use super::lenient;
use super::reflectors::Reflectors;
use crate::metrics::Metrics;
use crate::remote::calls::Caller;
use crate::remote::clients::ClusterClients;
use crate::remote::clients::Remote;
use crate::remote::host::Host;
use crate::remote::tenant::{PublishedJoins, Tenant};
use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};

/// Field manager of every write autonodes makes.
pub const FIELD_MANAGER: &str = "autonodes";

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
    /// Where Events about cluster-scoped objects go: `default` (as client-go's and
    /// kube-runtime's recorders put them) until the management API server refuses one
    /// there, as 1.20 servers do; then `kube-system` for the rest of the process.
    pub cluster_events_in_default: std::sync::atomic::AtomicBool,
    /// The one watch and store of each kind.
    pub reflectors: Arc<Reflectors>,
    /// The catalogue as last prepared, and the versions of the type and provider stores it
    /// was prepared from ([`crate::controller::catalogue::catalogue`]).
    pub catalogue: std::sync::Mutex<Option<PreparedCatalogue>>,
    /// All NodeClaims (the claim controller's reflector).
    pub claims: Store<NodeClaim>,
    /// All NodeTypes.
    pub types: Store<NodeType>,
    /// All NodeProviders.
    pub providers: Store<NodeProvider>,
    /// All NodeQuotas.
    pub quotas: Store<NodeQuota>,
    /// The claimed capacity per NodeType, kept up to date by the claim store's watch
    /// (before [`Context::wait_synced`] resolves) and by this process's scheduling
    /// decisions and releases. Locked only briefly, never across an await.
    pub claimed: Arc<std::sync::Mutex<autonodes_core::ledger::ClaimedLedger>>,
    /// Per vCluster (`<namespace>/<name>`) and imported pool name, why its configuration
    /// could not be imported for that pool ([`crate::controller::vcluster_import`]); read by the pool
    /// controller for the pools' `VClusterConfig` condition.
    pub import_problems: std::sync::Mutex<
        std::collections::HashMap<String, std::collections::BTreeMap<String, String>>,
    >,
    /// Wakes a NodePool's reconcile.
    pub wake_pools: mpsc::UnboundedSender<ObjectRef<NodePool>>,
    /// Each tenant's published join address and version, and when they were read.
    pub published_joins: PublishedJoins,
    /// Claims this process created, deleted or annotated that the claim store does not show
    /// yet ([`Context::claims_in`]).
    pub expected_claims: std::sync::Mutex<ClaimExpectations>,
    /// Wakes claims (remote changes, freed capacity).
    pub wake_claims: mpsc::UnboundedSender<ObjectRef<NodeClaim>>,
    /// Wakes node types (capacity changes).
    pub wake_types: mpsc::UnboundedSender<ObjectRef<NodeType>>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// True once the claim, type and provider stores hold their first full list.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// Where watches send objects they cannot decode ([`super::invalid::report`]).
    pub reports: lenient::Reports,
    /// Each node type's warm VMs as last seen ([`super::warm`]).
    pub warm: super::warm_index::WarmIndex,
}

/// A prepared catalogue and the versions of the type and provider stores it came from.
pub type PreparedCatalogue = ((u64, u64), Arc<autonodes_core::catalogue::Catalogue>);

impl Context {
    /// Who calls host and tenant clusters: this process's request counter and installation.
    pub fn caller(&self) -> Caller<'_> {
        Caller {
            requests: &self.metrics.cluster_requests,
            installation: &self.config.installation,
        }
    }

    /// The host cluster behind `remote`, called as this process.
    pub fn host<'a>(&'a self, remote: &'a Remote) -> Host<'a> {
        Host::new(self.caller(), remote)
    }

    /// The tenant cluster behind `remote`, called as this process.
    pub fn tenant<'a>(&'a self, remote: &'a Remote) -> Tenant<'a> {
        Tenant::new(self.caller(), &self.published_joins, remote)
    }

    /// Runs `f` on the capacity ledger (a poisoned lock still holds a consistent ledger:
    /// every change is one call).
    pub fn ledger<T>(&self, f: impl FnOnce(&mut autonodes_core::ledger::ClaimedLedger) -> T) -> T {
        f(&mut ledger_guard(&self.claimed))
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
    /// never fatal. Events about cluster-scoped objects go to `default`, where client-go's
    /// and kube-runtime's recorders put them; an API server that refuses them there (1.20
    /// answers 422, `involvedObject.namespace: does not match event.namespace`) gets them
    /// in `kube-system` from then on (see [`Context::cluster_events_in_default`]).
    ///
    /// Written here rather than with kube-runtime's `Recorder`, which on a real API server
    /// (tried with kube 5.0) loses Events autonodes must record: it names an Event
    /// `<object name>.<hex time>`, which passes the 253 characters a name may have for
    /// claims with long names (refused, 422); it sends the note uncut (a note over 1,024
    /// characters is refused); it folds a repeated reason into a series that keeps the
    /// first note, so a second failure's text never shows; and it puts Events about
    /// cluster-scoped objects in `default` only, which a 1.20 API server refuses. Here the
    /// name is shortened
    /// with a hash ([`autonodes_core::names::event_name`]), reason, action and note are
    /// cut to what the API accepts, and each Event carries its own note.
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
        use std::sync::atomic::Ordering;
        let cluster_scoped = regarding.namespace.is_none();
        let namespace = match &regarding.namespace {
            Some(ns) => ns.clone(),
            None if self.cluster_events_in_default.load(Ordering::Relaxed) => "default".into(),
            None => "kube-system".into(),
        };
        let now = now();
        let name = autonodes_core::names::event_name(
            regarding.name.as_deref().unwrap_or("autonodes"),
            now.as_nanosecond(),
        );
        let event = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(autonodes_api::conditions::cut(action, 128)),
            reason: Some(autonodes_api::conditions::cut(reason, 128)),
            note: Some(autonodes_api::conditions::cut(&note, 1000)),
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
        let mut result = api.create(&kube::api::PostParams::default(), &event).await;
        let refused_in_default = matches!(&result, Err(kube::Error::Api(s)) if s.code == 422);
        if cluster_scoped && namespace == "default" && refused_in_default {
            self.cluster_events_in_default
                .store(false, Ordering::Relaxed);
            tracing::info!(
                "the management API server refuses Events about cluster-scoped objects in \
                 namespace default (as Kubernetes 1.20 does); recording them in kube-system"
            );
            let mut event = event;
            event.metadata.namespace = Some("kube-system".into());
            let api: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(self.client.clone(), "kube-system");
            result = api.create(&kube::api::PostParams::default(), &event).await;
        }
        if let Err(e) = result {
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

impl Context {
    /// A context for unit tests: no store is filled and its management client reaches
    /// nothing (a status write or an Event fails at once and is logged), so code given
    /// in-memory clusters ([`crate::remote::memory`]) runs without an API server. The
    /// channels' receivers are dropped: wake-ups go nowhere.
    #[cfg(test)]
    pub fn for_unit_tests(config: ControllerConfig) -> Arc<Context> {
        let client = crate::remote::clients::unreachable_client();
        let reflectors = Arc::new(Reflectors::new());
        let clients = Arc::new(ClusterClients::new(
            client.clone(),
            config.namespace.clone(),
            config.kubeconfig_policy,
            config.egress.clone(),
            config.tenant_limits,
        ));
        let (reports, _) = mpsc::unbounded();
        let (wake_claims, _) = mpsc::unbounded();
        let (wake_types, _) = mpsc::unbounded();
        let (wake_pools, _) = mpsc::unbounded();
        let (_, synced) = tokio::sync::watch::channel(true);
        Arc::new(Context {
            client,
            clients,
            config,
            reporter: Reporter {
                controller: "autonodes".into(),
                instance: None,
            },
            cluster_events_in_default: true.into(),
            claims: reflectors.claims.store(),
            types: reflectors.types.store(),
            providers: reflectors.providers.store(),
            quotas: reflectors.quotas.store(),
            reflectors,
            catalogue: Default::default(),
            claimed: Default::default(),
            import_problems: Default::default(),
            wake_pools,
            published_joins: Default::default(),
            expected_claims: Default::default(),
            wake_claims,
            wake_types,
            metrics: Arc::new(Metrics::new().expect("metrics register")),
            synced,
            reports,
            warm: Default::default(),
        })
    }
}

/// Whether a claim has no node type yet (`status.typeRef` unset).
pub fn unscheduled(c: &NodeClaim) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.type_ref.as_ref())
        .is_none()
}

/// The current time.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// The ledger behind its lock; a poisoned lock still holds a consistent ledger (every
/// change is one call), so the watch keeps feeding it and scheduling keeps reading it.
pub fn ledger_guard(
    lock: &std::sync::Mutex<autonodes_core::ledger::ClaimedLedger>,
) -> std::sync::MutexGuard<'_, autonodes_core::ledger::ClaimedLedger> {
    lock.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
