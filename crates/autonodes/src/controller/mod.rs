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
pub mod capi;
pub mod catalogue;
pub mod config;
pub mod context;
pub mod error;
pub mod gauges;
pub mod lenient;
pub mod nodeclaim;
pub mod nodepool;
pub mod nodequota;
pub mod nodetype;
pub mod provider;
pub mod reconciler;
pub mod reflectors;
pub mod startup;
pub mod status;
pub mod sweep;
pub mod vcluster_import;

use std::sync::Arc;

use futures::channel::mpsc;
use futures::StreamExt;
use kube::runtime::controller::Config as RunConfig;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;

use crate::api::{NodeClaim, NodeProvider, NodeQuota, NodeType};
use crate::metrics::Metrics;
use crate::remote::clients::ClusterClients;
use crate::remote::watches;
use config::ControllerConfig;
use context::{ledger_guard, unscheduled, Context};
use reconciler::log_run_error;
use reflectors::{Reflectors, Touched};
use startup::{installation_of_namespace, management_api_server};

/// How many claims are reconciled at once. Each reconcile mostly waits on API servers; a
/// bound keeps a burst of thousands of new claims from opening thousands of requests at
/// once (which slows every one of them) and bounds the memory they hold.
const CLAIM_CONCURRENCY: u16 = 64;

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
    clients.set_on_connect(watches::watch_hook(
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
