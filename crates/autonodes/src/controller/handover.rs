//! Handover: every second, which namespaces with claims or pools this replica acts for
//! ([`super::shards::Shards::acts_for`]). A namespace it gained wakes its claims and pools
//! (nothing else would: their reconciles of before returned without acting); for one it
//! lost, the clients and watches of its tenant clusters are dropped. A replica that
//! starts to lead wakes every claim waiting to be scheduled, and the leader wakes them
//! again when claims gave capacity back (the claims' own controllers may run in other
//! replicas). The gauges `autonodes_tenant_namespaces*` follow.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::Context;
use crate::remote::clients::ClusterKey;

/// How often ownership is looked at.
const EVERY: Duration = Duration::from_secs(1);

/// Follows ownership until `stop` resolves.
pub(crate) async fn run(ctx: Arc<Context>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    tokio::select! {
        _ = &mut stop => return,
        _ = ctx.wait_synced() => {}
    }
    let mut acting: BTreeSet<String> = BTreeSet::new();
    let mut leading = false;
    let mut held = 0usize;
    loop {
        let known = namespaces(&ctx);
        let now: BTreeSet<String> = known
            .iter()
            .filter(|ns| ctx.shards.acts_for(ns))
            .cloned()
            .collect();
        let sharded = ctx.shards.sharded();
        let member = ctx.shards.me().unwrap_or_default();
        for ns in now.difference(&acting) {
            if sharded {
                tracing::info!(namespace = %ns, %member, "acting for the namespace");
                wake_namespace(&ctx, ns);
            }
            ctx.metrics
                .tenant_namespace_owner
                .with_label_values(&[ns.as_str(), member.as_str()])
                .set(1);
        }
        let lost: Vec<&String> = acting.difference(&now).collect();
        for ns in &lost {
            if known.contains(*ns) {
                tracing::info!(namespace = %ns, %member, owner = ?ctx.shards.owner_of(ns), "no longer acting for the namespace");
            }
            let _ = ctx
                .metrics
                .tenant_namespace_owner
                .remove_label_values(&[ns.as_str(), member.as_str()]);
        }
        if !lost.is_empty() {
            let dropped = ctx
                .clients
                .retain_tenants(|k| match k {
                    ClusterKey::Tenant { namespace, .. } => ctx.shards.acts_for(namespace),
                    ClusterKey::Host(_) => true,
                })
                .await;
            tracing::debug!(
                dropped,
                "dropped the clients of tenants this replica no longer acts for"
            );
        }
        ctx.metrics
            .tenant_namespaces
            .set(i64::try_from(known.len()).unwrap_or(i64::MAX));
        ctx.metrics
            .tenant_namespaces_owned
            .set(i64::try_from(now.len()).unwrap_or(i64::MAX));
        acting = now;

        // The leader schedules every namespace's claims: wake the pending ones when it
        // starts to lead, and when claims gave capacity back.
        let leads = ctx.shards.leads();
        let holding: usize = ctx.ledger(|l| l.counts().values().map(|n| *n as usize).sum());
        if sharded && leads && (!leading || holding < held) {
            ctx.wake_pending_claims();
        }
        leading = leads;
        held = holding;
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
    // Stopping (or no longer a member): this replica acts for nothing now, and its
    // metrics say so while the process finishes.
    ctx.metrics.tenant_namespace_owner.reset();
    ctx.metrics.tenant_namespaces_owned.set(0);
}

/// The namespaces with claims or pools.
fn namespaces(ctx: &Context) -> BTreeSet<String> {
    let claims = ctx.claims().state();
    let pools = ctx.reflectors.pools.store().state();
    claims
        .iter()
        .filter_map(|c| c.namespace())
        .chain(pools.iter().filter_map(|p| p.namespace()))
        .collect()
}

/// Wakes the claims and pools of `ns`.
fn wake_namespace(ctx: &Context, ns: &str) {
    for c in ctx
        .claims()
        .state_filter(|c| c.metadata.namespace.as_deref() == Some(ns))
    {
        let _ = ctx.wakes.claims.unbounded_send(ObjectRef::from_obj(&*c));
    }
    for p in ctx
        .reflectors
        .pools
        .store()
        .state_filter(|p| p.metadata.namespace.as_deref() == Some(ns))
    {
        let _ = ctx.wakes.pools.unbounded_send(ObjectRef::from_obj(&*p));
    }
}
