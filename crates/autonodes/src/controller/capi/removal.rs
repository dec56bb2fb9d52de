//! Removing mirrors: of a pool that is no longer mirrored (on its reconcile) and of pools
//! that are gone (the sweep).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use autonodes_core::capi;
use futures::channel::mpsc;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::{CapiContext, CLAIM_NAMES};
use super::write::{delete_machine, write_mark};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::lenient::{self, Lenient};
use autonodes_api::capi::{Machine, MachinePool, LABEL_POOL_NAME};
use autonodes_api::{NodeClaim, NodePool};

/// Deletes the MachinePool `name` and its Machines in `ns` (when the stores show any) and
/// clears the claims' delete-first marks.
pub(super) async fn remove_mirror(cctx: &CapiContext, ns: &str, name: &str) -> Result<(), Error> {
    let has_pool = cctx
        .machine_pools
        .get(&ObjectRef::new(name).within(ns))
        .is_some();
    let has_machines = cctx
        .machines
        .state()
        .iter()
        .any(|m| capi::is_machine_of(&m.metadata, ns, name));
    if !has_pool && !has_machines {
        return Ok(());
    }
    delete_mirror(&cctx.ctx, ns, name).await?;
    let claims_api: Api<NodeClaim> = Api::namespaced(cctx.ctx.client.clone(), ns);
    let claims = cctx.ctx.claims().state();
    for mark in capi::claims_to_unmark(claims.iter().map(AsRef::as_ref), ns, name, &CLAIM_NAMES) {
        write_mark(&claims_api, ns, &mark).await?;
    }
    Ok(())
}

/// Deletes the Machines labelled for pool `name` and the MachinePool `name` in `ns`.
async fn delete_mirror(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let m_api: Api<Machine> = Api::namespaced(ctx.client.clone(), ns);
    let mp_api: Api<MachinePool> = Api::namespaced(ctx.client.clone(), ns);
    let machines: Vec<Machine> = lenient::list(
        &ctx.client,
        ns,
        &ListParams::default().labels(&capi::machine_selector(name)),
    )
    .await
    .map_err(Error::kube(format!("listing Machines of {ns}/{name}")))?;
    for m in machines {
        delete_machine(&m_api, ns, &m.name_any()).await?;
    }
    match mp_api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!(nodepool = %name, namespace = %ns, "MachinePool and its Machines deleted");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube {
            context: format!("deleting MachinePool {ns}/{name}"),
            source: e,
        }),
    }
}

/// Removes the mirrors whose NodePool is gone (or no longer mirrored): on every NodePool
/// deletion (for its namespace) and every 30 seconds (for the namespaces that hold
/// MachinePools or Machines).
pub(super) async fn sweep_loop(cctx: Arc<CapiContext>, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        let namespaces: BTreeSet<String> = tokio::select! {
            ns = rx.next() => match ns {
                Some(ns) => BTreeSet::from([ns]),
                None => return,
            },
            _ = tick.tick() => cctx
                .machine_pools
                .state()
                .iter()
                .filter_map(|m| m.namespace())
                .chain(cctx.machines.state().iter().filter_map(|m| m.namespace()))
                .collect(),
        };
        for ns in namespaces {
            if !cctx.ctx.shards.acts_for(&ns) {
                continue;
            }
            if let Err(e) = sweep_namespace(&cctx.ctx, &ns).await {
                tracing::warn!(namespace = %ns, error = %e, "sweeping MachinePools of deleted NodePools failed");
            }
        }
    }
}

async fn sweep_namespace(ctx: &Context, ns: &str) -> Result<(), Error> {
    // Listed by metadata: an undecodable mirror is still a mirror.
    let mp_api: Api<MachinePool> = Api::namespaced(ctx.client.clone(), ns);
    let m_api: Api<Machine> = Api::namespaced(ctx.client.clone(), ns);
    let mut names: BTreeSet<String> = mp_api
        .list_metadata(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing MachinePools in {ns}")))?
        .items
        .iter()
        .map(|m| m.name_any())
        .collect();
    names.extend(
        m_api
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::kube(format!("listing Machines in {ns}")))?
            .items
            .iter()
            .filter_map(|m| m.labels().get(LABEL_POOL_NAME).cloned()),
    );
    for name in names {
        let pool = match lenient::get::<NodePool>(&ctx.client, ns, &name)
            .await
            .map_err(Error::kube(format!("reading NodePool {ns}/{name}")))?
        {
            // Its own watch reports it; its mirror stays until it can be read.
            Some(Lenient::Invalid(_)) => continue,
            Some(Lenient::Valid(p)) => Some(p),
            None => None,
        };
        let mirrored = pool.is_some_and(|p| capi::pool_mirror(&p).is_mirrored());
        if !mirrored {
            delete_mirror(ctx, ns, &name).await?;
        }
    }
    Ok(())
}
