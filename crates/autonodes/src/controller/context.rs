//! What every controller shares: the management client, the remote clients, the stores,
//! the capacity ledger, the claims this process expects, wake-up channels, metrics and
//! Events.

use std::sync::Arc;

use autonodes_core::pool::expectations::ClaimExpectations;
use futures::channel::mpsc;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
#[cfg(test)]
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};

use super::config::ControllerConfig;
use super::events::Events;
use super::index::Indexes;
use super::reflectors::Reflectors;
use super::shards::Shards;
use crate::metrics::Metrics;
use crate::remote::calls::Caller;
use crate::remote::clients::ClusterClients;
use crate::remote::clients::Remote;
use crate::remote::host::Host;
use crate::remote::tenant::Tenant;
use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};

/// Field manager of every write autonodes makes.
pub(crate) const FIELD_MANAGER: &str = "autonodes";

/// Wakes reconciles of other controllers.
pub(crate) struct Wakes {
    /// Wakes a NodePool's reconcile.
    pub pools: mpsc::UnboundedSender<ObjectRef<NodePool>>,
    /// Wakes claims (remote changes, freed capacity).
    pub claims: mpsc::UnboundedSender<ObjectRef<NodeClaim>>,
    /// Wakes node types (capacity changes).
    pub types: mpsc::UnboundedSender<ObjectRef<NodeType>>,
}

/// Shared state of the controllers. Nine fields, kept so (the unit test
/// `the_context_has_nine_fields` names each): what is kept in memory lives in
/// [`Indexes`], the stores in [`Reflectors`].
pub(crate) struct Context {
    /// Management-cluster client.
    pub client: Client,
    /// Remote cluster clients.
    pub clients: Arc<ClusterClients>,
    /// Settings.
    pub config: ControllerConfig,
    /// The Event recorder.
    pub events: Events,
    /// The one watch and store of each kind.
    pub reflectors: Arc<Reflectors>,
    /// The in-memory indexes (ledger, expected claims, catalogue, warm VMs, imports'
    /// problems, published joins).
    pub index: Indexes,
    /// Wakes reconciles of other controllers.
    pub wakes: Wakes,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Which tenant namespaces this replica acts for, and whether it leads.
    pub shards: Arc<Shards>,
}

impl Context {
    /// Who calls host and tenant clusters: this process's request counter and installation.
    pub(crate) fn caller(&self) -> Caller<'_> {
        Caller {
            requests: &self.metrics.cluster_requests,
            installation: &self.config.installation,
        }
    }

    /// The host cluster behind `remote`, called as this process.
    pub(crate) fn host<'a>(&'a self, remote: &'a Remote) -> Host<'a> {
        Host::new(self.caller(), remote)
    }

    /// The tenant cluster behind `remote`, called as this process.
    pub(crate) fn tenant<'a>(&'a self, remote: &'a Remote) -> Tenant<'a> {
        Tenant::new(self.caller(), &self.index.published_joins, remote)
    }

    /// All NodeClaims (the claim reflector's store).
    pub(crate) fn claims(&self) -> &Store<NodeClaim> {
        self.reflectors.claims.cache()
    }

    /// All NodeTypes.
    pub(crate) fn types(&self) -> &Store<NodeType> {
        self.reflectors.types.cache()
    }

    /// All NodeProviders.
    pub(crate) fn providers(&self) -> &Store<NodeProvider> {
        self.reflectors.providers.cache()
    }

    /// All NodeQuotas.
    pub(crate) fn quotas(&self) -> &Store<NodeQuota> {
        self.reflectors.quotas.cache()
    }

    /// Runs `f` on the capacity ledger (a poisoned lock still holds a consistent ledger:
    /// every change is one call).
    pub(crate) fn ledger<T>(
        &self,
        f: impl FnOnce(&mut autonodes_core::ledger::ClaimedLedger) -> T,
    ) -> T {
        f(&mut ledger_guard(&self.index.claimed))
    }

    /// The claims of `namespace` as they are: the claim store's copies, with the claims
    /// this process created, deleted or annotated that the store does not show yet
    /// ([`ClaimExpectations::view`]), sorted by name. No request to the API server.
    pub(crate) fn claims_in(&self, namespace: &str) -> Vec<Arc<NodeClaim>> {
        let stored = self
            .claims()
            .state_filter(|c| c.metadata.namespace.as_deref() == Some(namespace));
        self.index
            .expected_claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .view(namespace, stored, std::time::Instant::now())
    }

    /// Records a write to claims that [`Context::claims_in`] shows until the store does.
    pub(crate) fn expect_claims(
        &self,
        record: impl FnOnce(&mut ClaimExpectations, std::time::Instant),
    ) {
        let mut expected = self
            .index
            .expected_claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        record(&mut expected, std::time::Instant::now());
    }

    /// Waits until the claim, type, provider and quota stores hold their first full list.
    /// (A claim scheduled before the quotas are listed would be counted against none.)
    ///
    /// Use this rather than `Store::wait_until_ready`: kube-runtime's readiness future keeps
    /// a single waker, so of several tasks waiting on one store only the last one to poll
    /// is woken and the others hang.
    pub(crate) async fn wait_synced(&self) {
        self.reflectors.claims.wait_synced().await;
        self.reflectors.types.wait_synced().await;
        self.reflectors.providers.wait_synced().await;
        self.reflectors.quotas.wait_synced().await;
    }

    /// Records an Event about `obj` ([`Events::record`]).
    pub(crate) async fn event<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.events.record(obj, type_, reason, action, note).await;
    }

    /// Records an Event about the object `regarding` refers to ([`Events::record_about`]).
    pub(crate) async fn event_about(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.events
            .record_about(regarding, type_, reason, action, note)
            .await;
    }

    /// Wakes the live claims scheduled to NodeType `name` (its definition changed: they
    /// may have drifted).
    pub(crate) fn wake_claims_of_type(&self, name: &str) {
        let mut woken = 0;
        for claim in self.claims().state() {
            let of_type = claim.status.as_ref().and_then(|s| s.type_ref.as_deref()) == Some(name);
            if of_type && claim.meta().deletion_timestamp.is_none() {
                let _ = self
                    .wakes
                    .claims
                    .unbounded_send(ObjectRef::from_obj(&*claim));
                woken += 1;
            }
        }
        tracing::debug!(nodetype = %name, woken, "woke the claims of a changed node type");
    }

    /// Wakes every claim that is not scheduled yet (capacity or types changed).
    pub(crate) fn wake_pending_claims(&self) {
        let mut woken = 0;
        for claim in self.claims().state() {
            if unscheduled(&claim) && claim.meta().deletion_timestamp.is_none() {
                let _ = self
                    .wakes
                    .claims
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
    pub(crate) fn for_unit_tests(config: ControllerConfig) -> Arc<Context> {
        let client = crate::remote::clients::unreachable_client();
        let reflectors = Arc::new(Reflectors::new());
        let clients = Arc::new(ClusterClients::new(
            client.clone(),
            config.namespace.clone(),
            config.kubeconfig_policy,
            config.egress.clone(),
            config.tenant_limits,
        ));
        for synced in [
            reflectors.claims.synced_sender(),
            reflectors.types.synced_sender(),
            reflectors.providers.synced_sender(),
            reflectors.quotas.synced_sender(),
        ] {
            let _ = synced.send(true);
        }
        let (claims, _) = mpsc::unbounded();
        let (types, _) = mpsc::unbounded();
        let (pools, _) = mpsc::unbounded();
        Arc::new(Context {
            events: Events::new(
                client.clone(),
                Reporter {
                    controller: "autonodes".into(),
                    instance: None,
                },
            ),
            client,
            clients,
            config,
            reflectors,
            index: Indexes::default(),
            wakes: Wakes {
                pools,
                claims,
                types,
            },
            metrics: Arc::new(Metrics::new().expect("metrics register")),
            shards: Arc::new(Shards::single()),
        })
    }
}

/// Whether a claim has no node type yet (`status.typeRef` unset).
pub(crate) fn unscheduled(c: &NodeClaim) -> bool {
    c.status
        .as_ref()
        .and_then(|s| s.type_ref.as_ref())
        .is_none()
}

/// The current time.
pub(crate) fn now() -> Timestamp {
    Timestamp::now()
}

/// The ledger behind its lock; a poisoned lock still holds a consistent ledger (every
/// change is one call), so the watch keeps feeding it and scheduling keeps reading it.
pub(crate) fn ledger_guard(
    lock: &std::sync::Mutex<autonodes_core::ledger::ClaimedLedger>,
) -> std::sync::MutexGuard<'_, autonodes_core::ledger::ClaimedLedger> {
    lock.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names every field of [`Context`] with no `..`: a tenth field fails to compile here.
    /// The stores are the reflectors' own, so marking those synced is what readiness waits
    /// for.
    #[tokio::test]
    async fn the_context_has_nine_fields_and_reads_the_stores_of_the_reflectors() {
        let ctx = Context::for_unit_tests(ControllerConfig::default());
        tokio::time::timeout(std::time::Duration::from_secs(5), ctx.wait_synced())
            .await
            .expect("the reflectors' stores are marked synced");
        assert!(std::ptr::eq(ctx.claims(), ctx.reflectors.claims.cache()));
        let Context {
            client: _,
            clients: _,
            config: _,
            events: _,
            reflectors: _,
            index: _,
            wakes: _,
            metrics: _,
            shards: _,
        } = &*ctx;
    }

    /// Until the NodeQuotas are listed a claim is not scheduled: counted against no quota, it
    /// could pass one that exists.
    #[tokio::test]
    async fn scheduling_waits_for_the_first_list_of_node_quotas() {
        let ctx = Context::for_unit_tests(ControllerConfig::default());
        let _ = ctx.reflectors.quotas.synced_sender().send(false);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(200), ctx.wait_synced());
        assert!(waited.await.is_err(), "synced without the quotas");
        let _ = ctx.reflectors.quotas.synced_sender().send(true);
        tokio::time::timeout(std::time::Duration::from_secs(5), ctx.wait_synced())
            .await
            .expect("synced once the quotas are listed");
    }
}
