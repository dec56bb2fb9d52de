//! The controllers: the only code that writes to clusters.
//!
//! - [`provider`]: NodeProvider → host reachability, template validation, one NodeType per entry.
//! - [`nodetype`]: NodeType → effective resources, cost, capacity, phase.
//! - [`nodeclaim`]: NodeClaim → scheduling, host Secret + VM, tenant token, readiness, cleanup.
//! - [`nodepool`]: NodePool → claims kept alive, scaled by `replicas` or by pending pods
//!   (planned by `autonodes_core::pool`).
//! - [`capi`]: NodePool with `spec.autoscaling` → `capi.autonodes.io` MachinePool + Machines.
//! - [`nodequota`]: NodeQuota → its use in its status.
//! - [`vcluster_import`]: a vCluster's configuration → NodePools.
//!
//! Each wires itself (`run`: its watches, its own state, [`reconciler::run`]); this module
//! builds the [`context::Context`] they share and starts them. Each reconcile reads,
//! validates, builds (pure code in `autonodes_core`), applies (through [`crate::remote`]
//! for host and tenant clusters), and writes status with server-side apply.

pub(crate) mod access;
pub(crate) mod capi;
pub(crate) mod catalogue;
pub mod config;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod gauges;
pub(crate) mod handover;
pub(crate) mod index;
pub(crate) mod invalid;
pub(crate) mod lenient;
pub mod management_api;
pub(crate) mod nodeclaim;
pub(crate) mod nodepool;
pub(crate) mod nodequota;
pub(crate) mod nodetype;
pub(crate) mod provider;
pub(crate) mod reconciler;
pub(crate) mod reflectors;
pub(crate) mod shards;
pub(crate) mod startup;
pub(crate) mod status;
pub(crate) mod sweep;
pub(crate) mod vcluster_import;

use std::sync::Arc;

use futures::channel::mpsc;
use futures::FutureExt;
use kube::runtime::events::Reporter;
use kube::Client;

use crate::metrics::Metrics;
use crate::remote::clients::ClusterClients;
use crate::remote::watches;
use config::ControllerConfig;
use context::{ledger_guard, Context, Wakes};
use events::Events;
use index::Indexes;
use reflectors::Reflectors;
use startup::installation_of_namespace;

/// Runs the controllers until `shutdown` resolves.
pub(crate) async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
    ready: Arc<std::sync::atomic::AtomicBool>,
    shards: Arc<shards::Shards>,
) -> anyhow::Result<()> {
    let mut config = config;
    if config.installation.is_empty() {
        config.installation = installation_of_namespace(&client, &config.namespace).await?;
    }
    tracing::info!(installation = %config.installation, "installation id (label autonodes.io/installation)");
    // Nothing connects to a host or tenant before the management API server's addresses
    // are known.
    if !management_api::read_before_start(
        &client,
        config.management_server.as_deref(),
        &config.egress.management,
        shutdown.clone(),
    )
    .await
    {
        return Ok(());
    }
    let reflectors = Arc::new(Reflectors::new());
    let r = &reflectors;
    let claimed = Arc::new(std::sync::Mutex::new(
        autonodes_core::ledger::ClaimedLedger::new(),
    ));
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
    let clients = Arc::new(
        ClusterClients::new(
            client.clone(),
            config.namespace.clone(),
            config.kubeconfig_policy,
            config.egress.clone(),
            config.tenant_limits,
        )
        .with_local_host(config.local_host.clone()),
    );
    clients.set_on_connect(watches::watch_hook(
        wake_claims.clone(),
        r.claims.store(),
        &config.installation,
    ));

    let reporter = Reporter {
        controller: "autonodes".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        clients,
        config,
        events: Events::new(client.clone(), reporter),
        reflectors: reflectors.clone(),
        index: Indexes::with_ledger(claimed),
        wakes: Wakes {
            pools: wake_pools,
            claims: wake_claims,
            types: wake_types,
        },
        metrics,
        shards,
    });
    tokio::spawn(invalid::report(ctx.clone(), reported));
    {
        let reflectors = reflectors.clone();
        let client = client.clone();
        let capi_mirror = ctx.config.capi_mirror;
        tokio::spawn(async move { reflectors.run(client, reports, capi_mirror).await });
    }

    // Readiness: the stores scheduling reads hold their first full list.
    {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            ctx.wait_synced().await;
            ready.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!("caches synced; controllers ready");
        });
    }

    tokio::spawn(management_api::keep_reading(
        client.clone(),
        ctx.config.management_server.clone(),
        ctx.config.egress.management.clone(),
        ctx.clients.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(gauges::run(ctx.clone(), shutdown.clone()));
    tokio::spawn(handover::run(ctx.clone(), shutdown.clone()));
    tokio::spawn(sweep::run(
        ctx.clone(),
        ctx.config.orphan_sweep_interval,
        shutdown.clone(),
    ));

    let pools = nodepool::run(ctx.clone(), r, pool_wakeups, shutdown.clone());
    let imports = vcluster_import::run(ctx.clone(), shutdown.clone());
    let machine_pools = {
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        async move {
            if ctx.config.capi_mirror {
                capi::run(ctx, r, shutdown).await;
            }
        }
    };

    let claims = nodeclaim::run(ctx.clone(), r, claim_wakeups, shutdown.clone());
    // What is cluster-wide runs on the leader only (every replica without
    // `--shard-tenants`): it starts once this replica leads.
    let leading = {
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        async move {
            tokio::select! {
                _ = ctx.shards.wait_leading() => true,
                _ = shutdown => false,
            }
        }
        .shared()
    };
    let types = {
        let (ctx, shutdown, leading) = (ctx.clone(), shutdown.clone(), leading.clone());
        async move {
            if leading.await {
                nodetype::run(ctx, r, type_wakeups, shutdown).await;
            }
        }
    };
    let providers = {
        let (ctx, shutdown, leading) = (ctx.clone(), shutdown.clone(), leading.clone());
        async move {
            if leading.await {
                provider::run(ctx, r, shutdown).await;
            }
        }
    };
    let quotas = {
        let ctx = ctx.clone();
        async move {
            if leading.await {
                nodequota::run(ctx, r, shutdown).await;
            }
        }
    };
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
