//! Keeps the object gauges (`autonodes_nodeclaims*`, `autonodes_nodetype_*`,
//! `autonodes_warm_*`) true to the stores between reconciles: a deleted claim or node type
//! leaves no series behind.

use std::collections::HashSet;
use std::time::Duration;

use kube::ResourceExt;
use prometheus::core::Collector;

use crate::controller::context::Context;

/// How often the gauges are swept.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Recomputes the claim gauges and drops node-type series of types that are gone.
///
/// The claim gauges count every claim in the store, which every replica holds: with
/// `--shard-tenants` only the leader exports them (as it does the node types'), so a sum
/// across replicas counts each claim once.
pub(crate) fn sweep(ctx: &Context) {
    if ctx.shards.leads() {
        super::nodeclaim::refresh_claim_gauges(ctx);
    } else {
        let m = &ctx.metrics;
        m.nodeclaims.reset();
        m.nodeclaims_oldest.reset();
        m.nodeclaims_cost.reset();
    }
    let live: HashSet<String> = ctx
        .types()
        .state()
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| t.name_any())
        .collect();
    let m = &ctx.metrics;
    for vec in [
        &m.nodetype_capacity,
        &m.nodetype_claimed,
        &m.nodetype_available,
        &m.nodetype_cost,
        &m.nodetype_host_headroom,
        &m.nodetype_addresses_free,
        &m.warm_vms,
    ] {
        drop_gone_types(vec, &live);
    }
    for vec in [&m.warm_bindings, &m.warm_vms_removed] {
        drop_gone_types(vec, &live);
    }
}

/// Removes the series of `vec` whose `nodetype` is not in `live`.
fn drop_gone_types<T: prometheus::core::MetricVecBuilder>(
    vec: &prometheus::core::MetricVec<T>,
    live: &HashSet<String>,
) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            let gone = labels.get("nodetype").is_some_and(|t| !live.contains(*t));
            if gone {
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// Sweeps every [`SWEEP_INTERVAL`] until `stop` resolves.
pub(crate) async fn run(ctx: std::sync::Arc<Context>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(SWEEP_INTERVAL) => sweep(&ctx),
        }
    }
}
