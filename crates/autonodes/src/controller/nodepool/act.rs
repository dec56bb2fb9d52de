//! What one reconcile of a pool writes, as [`autonodes_core::pool::reconcile`] planned it:
//! claims deleted and created, `autonodes.io/empty-since` and `underutilized-since` marks, the pool's status (with a
//! Warning Event per new problem) and its gauges. Each claim write is remembered
//! ([`Context::expect_claims`]) until the claim store shows it.

use std::collections::BTreeSet;
use std::sync::Arc;

use autonodes_core::pool::plan::{DeleteReason, DISRUPTION_REASONS};
use autonodes_core::pool::plan::{NewClaim, PoolPlan};
use autonodes_core::pool::status::{is_problem, pool_status};
use autonodes_core::pool::{
    self, claim_object, ANNOTATION_EMPTY_SINCE, ANNOTATION_UNDERUTILIZED_SINCE,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::ResourceExt;
use serde_json::json;

use super::context::PoolContext;
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::status::apply_status;
use crate::controller::status::report_changes;
use autonodes_api::{
    NodeClaim, NodePool, NodePoolStatus, ANNOTATION_KEEP_UNTIL, ANNOTATION_RESTART,
};
use autonodes_core::catalogue::Catalogue;

/// `<pool>-<5 random [a-z0-9]>`.
fn claim_name(pool: &str) -> Result<String, Error> {
    let random = crate::random::bytes::<16>().map_err(|e| {
        Error::Internal(format!(
            "the operating system gave no random bytes for a claim name: {e}"
        ))
    })?;
    Ok(pool::claim_name(pool, &random))
}

/// Carries out `plan` on the pool's claims `mine`: deletions that scale, replace or roll,
/// then creations, then empty-since marks, then deletions of empty nodes.
pub(super) async fn carry_out(
    pctx: &PoolContext,
    pool: &NodePool,
    mine: &[Arc<NodeClaim>],
    plan: &PoolPlan,
) -> Result<(), Error> {
    let find = |name: &str| mine.iter().find(|c| c.name_any() == name);
    let (empty, others): (Vec<_>, Vec<_>) = plan.delete.iter().partition(|(_, reason)| {
        matches!(reason, DeleteReason::Empty | DeleteReason::Underutilized)
    });
    // Repair: a VM to keep is marked before its claim goes; a VM to restart is asked for.
    for (name, until) in &plan.keep {
        if let Some(c) = find(name) {
            annotate(&pctx.ctx, c, ANNOTATION_KEEP_UNTIL, Some(until.to_string())).await?;
        }
    }
    for (name, value) in &plan.restart {
        if let Some(c) = find(name) {
            annotate(&pctx.ctx, c, ANNOTATION_RESTART, Some(value.clone())).await?;
            tracing::info!(nodepool = %pool.name_any(), claim = %name, "restarting the VM of an unhealthy node");
            pctx.ctx
                .event(
                    pool,
                    EventType::Normal,
                    "RestartingUnhealthyNode",
                    "Repair",
                    format!("restarting the VM of NodeClaim {name}: its node is unhealthy"),
                )
                .await;
        }
    }
    for (name, reason) in others {
        if let Some(c) = find(name) {
            delete_claim(pctx, pool, c, *reason).await?;
        }
    }
    for new in &plan.create {
        create_claim(pctx, pool, new).await?;
    }
    for (key, marks) in [
        (ANNOTATION_EMPTY_SINCE, &plan.empty_since),
        (ANNOTATION_UNDERUTILIZED_SINCE, &plan.underutilized_since),
    ] {
        for (name, since) in marks {
            if let Some(c) = find(name) {
                annotate(&pctx.ctx, c, key, since.map(|t| t.to_string())).await?;
            }
        }
    }
    for (name, reason) in empty {
        if let Some(c) = find(name) {
            delete_claim(pctx, pool, c, *reason).await?;
        }
    }
    Ok(())
}

async fn create_claim(pctx: &PoolContext, pool: &NodePool, new: &NewClaim) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let ns = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let replaces = new.replaces.as_deref();
    // A name collision (1 in 36^5) gets another name.
    for attempt in 0..3 {
        let claim = claim_object(pool, &claim_name(&pool_name)?, new.spec.clone(), replaces);
        match api.create(&PostParams::default(), &claim).await {
            Ok(c) => {
                let name = c.name_any();
                ctx.expect_claims(|e, at| e.created(c, at));
                let what = match replaces {
                    Some(o) => format!("created NodeClaim {name} to replace {o}"),
                    None => format!("created NodeClaim {name}"),
                };
                tracing::info!(nodepool = %pool_name, namespace = %ns, claim = %name, replaces = ?replaces, "claim created");
                if let Some(t) = new
                    .spec
                    .type_ref
                    .as_deref()
                    .filter(|_| !new.pods.is_empty())
                {
                    tracing::info!(nodepool = %pool_name, claim = %name, node_type = %t, pods = new.pods.len(), "new node for pending pods");
                }
                ctx.event(pool, EventType::Normal, "ClaimCreated", "Scale", what)
                    .await;
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 2 => continue,
            Err(e) => {
                return Err(Error::Kube {
                    context: format!("creating a NodeClaim for NodePool {ns}/{pool_name}"),
                    source: e,
                })
            }
        }
    }
    Err(Error::Internal(format!(
        "no free claim name for NodePool {ns}/{pool_name}"
    )))
}

async fn delete_claim(
    pctx: &PoolContext,
    pool: &NodePool,
    claim: &NodeClaim,
    reason: DeleteReason,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let result = api.delete(&name, &params).await;
    // Gone already (404), or another claim has the name (409): this one is gone too.
    let gone = match &result {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code == 404 || s.code == 409,
        Err(_) => false,
    };
    if gone {
        ctx.expect_claims(|e, at| e.deleted(claim, now(), at));
    }
    match result {
        Ok(_) => {}
        Err(_) if gone => return Ok(()),
        Err(e) => {
            return Err(Error::Kube {
                context: format!("deleting NodeClaim {ns}/{name}"),
                source: e,
            })
        }
    }
    tracing::info!(nodepool = %pool.name_any(), namespace = %ns, claim = %name, ?reason, "claim deleted");
    if let Some(disruption) = reason.disruption() {
        ctx.metrics
            .nodeclaims_disrupted
            .with_label_values(&[&ns, &pool.name_any(), disruption])
            .inc();
    }
    let note = match reason {
        DeleteReason::Failed => format!("deleted Failed NodeClaim {name}; a new one replaces it"),
        DeleteReason::Outdated => {
            format!("deleted NodeClaim {name}: made from an older template and not Available")
        }
        DeleteReason::Replaced => format!("deleted NodeClaim {name}: its replacement is Available"),
        DeleteReason::Expired => format!(
            "deleted NodeClaim {name}: older than the pool's expireAfter, and its replacement is Available"
        ),
        DeleteReason::ScaleDown => format!("deleted NodeClaim {name}: more claims than replicas"),
        DeleteReason::Empty => {
            format!("deleted NodeClaim {name}: its node ran no pods for the consolidation delay")
        }
        DeleteReason::Underutilized => format!(
            "deleted NodeClaim {name}: its node's pods fitted the room of the tenant's other nodes for the consolidation delay"
        ),
        DeleteReason::Outgrown => format!(
            "deleted NodeClaim {name} before it joined: pods that must share a node with the pod it was made for arrived since, and a claim of a type that holds them all takes its place"
        ),
        DeleteReason::Repaired => format!(
            "deleted NodeClaim {name}: its node was unhealthy for its toleration after a restart (or restarts are off) and its replacement is Available"
        ),
        DeleteReason::HostMaintenance => format!(
            "deleted NodeClaim {name}: its VM had to leave a host node being drained and could not live-migrate, and its replacement is Available"
        ),
    };
    ctx.event(
        pool,
        EventType::Normal,
        reason.event_reason(),
        "Scale",
        note,
    )
    .await;
    Ok(())
}

/// Sets (or with `None` removes) the claim's annotation `key`: [`ANNOTATION_EMPTY_SINCE`],
/// [`ANNOTATION_UNDERUTILIZED_SINCE`], [`ANNOTATION_RESTART`] or [`ANNOTATION_KEEP_UNTIL`].
async fn annotate(
    ctx: &Context,
    c: &NodeClaim,
    key: &'static str,
    value: Option<String>,
) -> Result<(), Error> {
    let api: Api<NodeClaim> =
        Api::namespaced(ctx.client.clone(), &c.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"annotations": {key: value}}});
    match api
        .patch(
            &c.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => {
            return Err(Error::Kube {
                context: format!("annotating NodeClaim {}", c.name_any()),
                source: e,
            })
        }
    }
    ctx.expect_claims(|e, at| e.annotated(c, key, value.as_deref(), at));
    Ok(())
}

/// Writes the status `plan` leaves the pool with (if it changed), a Warning Event per new
/// problem, and the pool's gauges.
pub(super) async fn write_status(
    pctx: &PoolContext,
    pool: &NodePool,
    mine: &[Arc<NodeClaim>],
    plan: &PoolPlan,
    catalogue: &Catalogue,
) -> Result<(), Error> {
    let ctx = &pctx.ctx;
    let old = pool.status.clone().unwrap_or_default();
    let new = pool_status(pool, mine, plan, catalogue, now());
    set_gauges(pctx, pool, &new);
    if new == old {
        return Ok(());
    }
    let api: Api<NodePool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    apply_status(&api, pool, &new).await.map_err(conflict_or)?;
    // Events only once the write succeeded: a reconcile on a stale copy loses its write to
    // a conflict and reports nothing.
    report_changes(ctx, pool, "", &old.conditions, &new.conditions, |c, _| {
        is_problem(c).then_some(EventType::Warning)
    })
    .await;
    Ok(())
}

fn conflict_or(e: Error) -> Error {
    match e {
        Error::Kube {
            source: kube::Error::Api(s),
            context,
        } if s.code == 409 => Error::Conflict(context),
        e => e,
    }
}

fn set_gauges(pctx: &PoolContext, pool: &NodePool, status: &NodePoolStatus) {
    let m = &pctx.ctx.metrics;
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let desired = pool.spec.replicas.unwrap_or(status.replicas);
    m.nodepool_desired
        .with_label_values(&[&namespace, &name])
        .set(i64::from(desired));
    m.nodepool_ready
        .with_label_values(&[&namespace, &name])
        .set(i64::from(status.ready_replicas));
    m.nodepool_registration_failures
        .with_label_values(&[&namespace, &name])
        .set(i64::from(
            status
                .registration
                .as_ref()
                .map_or(0, |r| r.consecutive_failures),
        ));
    let live: BTreeSet<(String, String)> = pctx
        .pools
        .state()
        .iter()
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    for reason in DISRUPTION_REASONS {
        m.nodeclaims_disrupted
            .with_label_values(&[&namespace, &name, reason]);
    }
    if let Ok(mut known) = pctx.gauges.lock() {
        known.insert((namespace, name));
        let gone: Vec<(String, String)> = known
            .iter()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for (ns, n) in gone {
            let _ = m.nodepool_desired.remove_label_values(&[&ns, &n]);
            let _ = m.nodepool_ready.remove_label_values(&[&ns, &n]);
            let _ = m
                .nodepool_registration_failures
                .remove_label_values(&[&ns, &n]);
            m.forget_pool(&ns, &n);
            known.remove(&(ns, n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_the_pool_name_and_five_random_characters() {
        let n = claim_name("workers").expect("a name");
        let suffix = n.strip_prefix("workers-").expect("prefix");
        assert_eq!(suffix.len(), 5);
        assert!(suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(
            claim_name("workers").expect("a name"),
            claim_name("workers").expect("a name")
        );
    }
}
