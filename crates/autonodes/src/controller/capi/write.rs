//! The mirror's writes: the NodePool's replicas and marker, status through server-side
//! apply, Machine deletions, the claims' delete-first marks and the pool's `Autoscaling`
//! condition. Each write is conditional where the decision depended on what was read.

use autonodes_core::capi::{self, Mark};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::{FIELD_MANAGER, STATUS_FIELD_MANAGER};
use crate::controller::context::Context;
use crate::controller::error::Error;
use autonodes_api::capi::{Machine, ANNOTATION_SYNCED_REPLICAS};
use autonodes_api::{NodeClaim, NodePool};
use autonodes_core::capi::AUTOSCALING;
use autonodes_core::pool::ANNOTATION_DELETE_FIRST;

/// Parameters of the mirror's merge patches (its own field manager).
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

pub(super) fn conflict_or(e: kube::Error, context: String) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 409 => Error::Conflict(context),
        source => Error::Kube { context, source },
    }
}

/// Writes the replica marker `target` onto the NodePool `ns/name`, and `spec.replicas` with
/// it when `scale`, conditional on the resourceVersion `rv`; returns the new one.
pub(super) async fn write_node_pool_replicas(
    api: &Api<NodePool>,
    ns: &str,
    name: &str,
    rv: Option<String>,
    target: i32,
    scale: bool,
) -> Result<Option<String>, Error> {
    let mut patch = json!({
        "metadata": {"resourceVersion": rv,
                     "annotations": {ANNOTATION_SYNCED_REPLICAS: target.to_string()}},
    });
    if scale {
        patch["spec"] = json!({"replicas": target});
    }
    let what = if scale { "scaling" } else { "marking" };
    let p = api
        .patch(name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(e, format!("{what} NodePool {ns}/{name}")))?;
    Ok(p.resource_version())
}

/// Writes `status` of `obj` as the mirror's status field manager ([`crate::controller::status::apply_status_as`]).
pub(super) async fn write_status<K, S>(api: &Api<K>, obj: &K, status: &S) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    crate::controller::status::apply_status_as(api, obj, status, STATUS_FIELD_MANAGER).await
}

/// Deletes the Machine `ns/name`; false when it was gone already.
pub(super) async fn delete_machine(
    api: &Api<Machine>,
    ns: &str,
    name: &str,
) -> Result<bool, Error> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube {
            context: format!("deleting Machine {ns}/{name}"),
            source: e,
        }),
    }
}

/// Writes a claim's delete-first mark, or removes it; false when the claim is gone.
pub(super) async fn write_mark(api: &Api<NodeClaim>, ns: &str, mark: &Mark) -> Result<bool, Error> {
    let patch = json!({"metadata": {"annotations": {ANNOTATION_DELETE_FIRST: mark.value}}});
    match api
        .patch(&mark.claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => {
            let what = if mark.value.is_some() {
                "marking"
            } else {
                "unmarking"
            };
            Err(Error::Kube {
                context: format!("{what} NodeClaim {ns}/{}", mark.claim),
                source: e,
            })
        }
    }
}

/// The pool's conditions.
fn conditions_of(pool: &NodePool) -> &[Condition] {
    pool.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

/// Sets the pool's `Autoscaling` condition (and records an Event when it turns False or
/// its reason changes), conditional on the pool's resourceVersion.
pub(super) async fn set_condition(
    ctx: &Context,
    pool: &NodePool,
    condition: capi::AutoscalingCondition,
) -> Result<(), Error> {
    let Some(change) = capi::set_autoscaling(
        conditions_of(pool),
        &condition,
        pool.metadata.generation,
        crate::controller::context::now(),
    ) else {
        return Ok(());
    };
    write_conditions(ctx, pool, &change.conditions).await?;
    if change.transition {
        let type_ = if condition.ok {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let (reason, message) = (condition.reason, condition.message);
        tracing::info!(nodepool = %pool.name_any(), namespace = %pool.namespace().unwrap_or_default(), %reason, %message, "autoscaling condition");
        ctx.event(pool, type_, reason, AUTOSCALING, message).await;
    }
    Ok(())
}

/// Removes the `Autoscaling` condition from a pool that is no longer autoscaled.
pub(super) async fn clear_condition(ctx: &Context, pool: &NodePool) -> Result<(), Error> {
    match capi::clear_autoscaling(conditions_of(pool)) {
        Some(list) => write_conditions(ctx, pool, &list).await,
        None => Ok(()),
    }
}

/// Writes the pool's whole list of conditions, conditional on its resourceVersion.
async fn write_conditions(ctx: &Context, pool: &NodePool, list: &[Condition]) -> Result<(), Error> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let api: Api<NodePool> = Api::namespaced(ctx.client.clone(), &ns);
    // A merge patch replaces the whole list; the resourceVersion makes it conditional, so
    // a condition another controller set in the meantime is never lost.
    let patch = json!({
        "metadata": {"resourceVersion": pool.resource_version()},
        "status": {"conditions": list},
    });
    api.patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(e, format!("writing conditions of NodePool {ns}/{name}")))?;
    Ok(())
}
