//! NodeProvider controller: checks the host cluster, validates every node type's template,
//! and keeps one NodeType `<provider>.<type>` per `spec.kubeVirt.nodeTypes[]` entry.
//!
//! Deleting a provider whose node types still have live claims waits (finalizer, condition
//! `Ready=False` reason `InUse`) until those claims are gone; then its NodeTypes are deleted.

use crate::controller::reconciler::{self, Reconciler};
use crate::controller::reflectors::{Reflectors, Touched};
use autonodes_api::reasons::{ProviderCondition, ProviderReason};
use futures::StreamExt;
use kube::runtime::Controller;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::status::apply_status;
use crate::remote::clients::{remote_error_text, REMOTE_TIMEOUT};
use autonodes_api::conditions::{self, status_of, FALSE};
use autonodes_api::kubevirt;
use autonodes_api::{
    NodeProvider, NodeProviderStatus, NodeType, ProviderPhase, FINALIZER, LABEL_MANAGED_BY,
    LABEL_PROVIDER, MANAGED_BY,
};
use autonodes_core::catalogue::ProviderContext;

/// Condition: the host cluster answers and serves KubeVirt.
pub(crate) const HOST_REACHABLE: ProviderCondition = ProviderCondition::HostReachable;
/// Condition: every node type's template composes.
pub(crate) const TEMPLATES_VALID: ProviderCondition = ProviderCondition::TemplatesValid;
/// Condition: the provider can be used.
pub(crate) const READY: ProviderCondition = ProviderCondition::Ready;

/// Checks that every node type of the provider composes and has discoverable resources.
/// Returns one message per broken type (empty when all are valid).
pub(crate) fn validate_templates(p: &NodeProvider) -> Vec<String> {
    let ctx = ProviderContext::from_provider(p);
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in &p.spec.kube_virt.node_types {
        if !seen.insert(entry.name.as_str()) {
            errors.push(format!("node type {} is listed twice", entry.name));
        }
    }
    for nt in autonodes_core::catalogue::node_types_from_provider(p) {
        let prepared =
            autonodes_core::catalogue::prepare_type(&nt.name_any(), &nt.spec, Some(&ctx));
        match prepared.problem {
            // An instance type is read from the host by the type's own controller: not a
            // template error.
            Some(autonodes_core::catalogue::TypeProblem::Instancetype { .. }) | None => {}
            Some(problem) => errors.push(problem.to_string()),
        }
    }
    errors
}

/// True when a claim of the NodeType `node_type` going away may let the provider move on:
/// the provider is being deleted (it waits until no claim uses its types), or the type is
/// no longer in its spec (the NodeType is kept until its last claim is gone).
pub(crate) fn waits_for_claims_of(p: &NodeProvider, node_type: &str) -> bool {
    let provider = p.name_any();
    p.metadata.deletion_timestamp.is_some()
        || !p
            .spec
            .kube_virt
            .node_types
            .iter()
            .any(|e| autonodes_core::catalogue::node_type_name(&provider, &e.name) == node_type)
}

/// The NodeProvider controller: it keeps no state of its own beside the shared context.
pub(crate) struct ProviderController {
    /// The context every controller shares.
    pub ctx: Arc<Context>,
}

/// Runs the NodeProvider controller until `shutdown` resolves: a provider is woken by its
/// NodeTypes and by a claim of one of its types going away.
pub(crate) async fn run(
    ctx: Arc<Context>,
    r: &Reflectors,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let types_of_claims = ctx.types().clone();
    let providers_of_claims = ctx.providers().clone();
    let controller = Controller::for_shared_stream(r.providers.applied(), r.providers.store())
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
                        .is_none_or(|p| waits_for_claims_of(&p, &t));
                    waits.then_some(key)
                });
            futures::future::ready(provider)
        }))
        .graceful_shutdown_on(shutdown);
    reconciler::run(controller, Arc::new(ProviderController { ctx })).await;
}

impl Reconciler for ProviderController {
    type Object = NodeProvider;
    const NAME: &'static str = "nodeprovider";
    const DOING: &'static str = "reconciling NodeProvider";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, obj: Arc<NodeProvider>) -> Result<Action, Error> {
        let ctx = &*self.ctx;
        let api: Api<NodeProvider> = Api::all(ctx.client.clone());
        finalizer(&api, FINALIZER, obj, |event| async {
            match event {
                Finalizer::Apply(p) => apply(&p, ctx).await,
                Finalizer::Cleanup(p) => cleanup(&p, ctx).await,
            }
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)))
    }
}

async fn host_check(p: &NodeProvider, ctx: &Context) -> (bool, ProviderReason, String) {
    let cluster = &p.spec.kube_virt.cluster_ref.cluster;
    let namespace = &p.spec.kube_virt.cluster_ref.namespace;
    let remote = match ctx.clients.host(cluster).await {
        Ok(r) => r,
        Err(e) => return (false, e.reason().into(), e.to_string()),
    };
    let vms: Api<DynamicObject> = Api::namespaced_with(
        remote.client.clone(),
        namespace,
        &kubevirt::virtual_machine(),
    );
    let listed = tokio::time::timeout(
        REMOTE_TIMEOUT,
        vms.list_metadata(&ListParams::default().limit(1)),
    )
    .await;
    match listed {
        Err(_) => (
            false,
            ProviderReason::HostUnreachable,
            format!(
                "host cluster {cluster} did not answer within {}s",
                REMOTE_TIMEOUT.as_secs()
            ),
        ),
        Ok(result) => {
            ctx.metrics.cluster_requests.count(&remote.key, &result);
            match result {
                Ok(_) => (
                    true,
                    ProviderReason::HostReachable,
                    format!("host cluster {cluster} serves KubeVirt VirtualMachines"),
                ),
                Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => (
                    false,
                    ProviderReason::KubeVirtNotInstalled,
                    format!(
                        "host cluster {cluster} does not serve kubevirt.io/v1 VirtualMachines: {}",
                        remote_error_text(&e)
                    ),
                ),
                Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 401 || s.code == 403) => (
                    false,
                    ProviderReason::HostForbidden,
                    format!(
                        "host cluster {cluster} refused to list VirtualMachines in {namespace}: {}",
                        remote_error_text(&e)
                    ),
                ),
                Err(e) => {
                    ctx.clients.forget(&remote.key).await;
                    (
                        false,
                        ProviderReason::HostUnreachable,
                        format!("host cluster {cluster}: {}", remote_error_text(&e)),
                    )
                }
            }
        }
    }
}

/// Wakes this provider's NodeTypes and the pending claims. Called with the provider as the
/// provider cache holds it *now*: whoever wakes reads the same cache, so nobody looks at a
/// provider status older than the one that woke them (a wake-up from another watch could
/// arrive before this cache caught up, and the claim would wait for its next resync).
fn wake_dependents(p: &NodeProvider, ctx: &Context) {
    let name = p.name_any();
    for t in ctx.types().state() {
        if t.spec.provider_ref == name {
            let _ = ctx.wakes.types.unbounded_send(ObjectRef::from_obj(&*t));
        }
    }
    ctx.wake_pending_claims();
}

async fn apply(p: &NodeProvider, ctx: &Context) -> Result<Action, Error> {
    let name = p.name_any();
    if p.status.as_ref().and_then(|s| s.phase) == Some(ProviderPhase::Available) {
        wake_dependents(p, ctx);
    }
    let (reachable, host_reason, host_message) = host_check(p, ctx).await;
    let template_errors = validate_templates(p);
    let synced = sync_node_types(p, ctx).await?;
    if reachable {
        let wanted = golden_volumes_wanted(p, ctx);
        if let Err(e) = remove_golden_volumes(p, ctx, |ns, name| {
            !wanted.contains(&(ns.to_string(), name.to_string()))
        })
        .await
        {
            tracing::warn!(provider = %name, error = %e, "removing unused golden DataVolumes failed; retried at the next reconcile");
        }
    }

    let old = p.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let gen = p.metadata.generation;
    let t = now();
    conditions::set(
        &mut status.conditions,
        HOST_REACHABLE,
        status_of(reachable),
        host_reason,
        host_message.clone(),
        gen,
        t,
    );
    let templates_ok = template_errors.is_empty();
    let (tr, tm) = if templates_ok {
        (
            ProviderReason::TemplatesValid,
            format!(
                "{} node type template(s) compose",
                p.spec.kube_virt.node_types.len()
            ),
        )
    } else {
        (
            ProviderReason::InvalidTemplate,
            conditions::summarize(
                &template_errors,
                p.spec.kube_virt.node_types.len(),
                "node types",
            ),
        )
    };
    conditions::set(
        &mut status.conditions,
        TEMPLATES_VALID,
        status_of(templates_ok),
        tr,
        tm.clone(),
        gen,
        t,
    );
    // A broken node type fails itself (its NodeType is Failed and never chosen), never
    // its siblings: the provider is ready when its host is.
    let ready = reachable;
    let (rr, rm) = if !ready {
        (host_reason, host_message.clone())
    } else if templates_ok {
        (
            ProviderReason::Ready,
            "host reachable and templates valid".to_string(),
        )
    } else {
        (
            ProviderReason::Ready,
            format!("host reachable; the other node types are served ({tm})"),
        )
    };
    let rm = match &synced.kept_in_use {
        kept if kept.is_empty() => rm,
        kept => format!(
            "{rm}; node types removed from the spec but still in use: {}",
            kept.join(", ")
        ),
    };
    conditions::set(
        &mut status.conditions,
        READY,
        status_of(ready),
        rr,
        rm,
        gen,
        t,
    );
    status.phase = Some(if ready {
        ProviderPhase::Available
    } else {
        ProviderPhase::Failed
    });
    status.observed_generation = gen;
    status.node_types = Some(synced.count);

    if status != old {
        apply_status(&Api::<NodeProvider>::all(ctx.client.clone()), p, &status).await?;
        // Only after the write succeeded: a reconcile on a stale copy gets a conflict above
        // and must not report the same transition a second time.
        emit_transitions(p, ctx, &old, &status).await;
    }
    tracing::debug!(provider = %name, ready, "reconciled NodeProvider");
    Ok(if ready {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(30))
    })
}

async fn emit_transitions(
    p: &NodeProvider,
    ctx: &Context,
    old: &NodeProviderStatus,
    new: &NodeProviderStatus,
) {
    super::status::report_changes(
        ctx,
        p,
        "",
        &old.conditions,
        &new.conditions,
        super::status::true_is_normal,
    )
    .await;
}

/// What syncing the NodeTypes did.
struct Synced {
    /// NodeTypes the provider now has.
    count: i64,
    /// NodeTypes removed from the spec that live claims still use (kept until they are gone).
    kept_in_use: Vec<String>,
}

/// Names of NodeTypes that live (not Failed, not gone) claims are scheduled to.
pub(crate) fn types_in_use(ctx: &Context) -> BTreeMap<String, Vec<String>> {
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in ctx.claims().state() {
        if let Some(t) = c.status.as_ref().and_then(|s| s.type_ref.clone()) {
            used.entry(t).or_default().push(format!(
                "{}/{}",
                c.namespace().unwrap_or_default(),
                c.name_any()
            ));
        }
    }
    used
}

/// The field manager of a generated NodeType's spec: apart from the status writer's
/// (`autonodes`), because API servers before 1.22 keep one set of fields per manager
/// for an object and its status alike, so a status write would take the spec's fields out
/// of the set and a field later dropped from the provider entry would stay.
const TYPE_SPEC_MANAGER: &str = "autonodes-provider";

/// Removes what an apply left in a generated NodeType's spec that its provider entry no
/// longer has (fields another manager still owns: an earlier version of the controller, or
/// somebody's edit), with a JSON patch against the version the apply returned.
async fn remove_stale_fields(
    api: &Api<NodeType>,
    applied: &NodeType,
    desired: &NodeType,
) -> Result<(), Error> {
    let name = applied.name_any();
    // Both specs under `spec`, so the diff's paths are the object's.
    let wrapped = |spec: &autonodes_api::NodeTypeSpec| {
        serde_json::to_value(spec)
            .map(|v| serde_json::json!({ "spec": v }))
            .map_err(|e| Error::Internal(e.to_string()))
    };
    let diff = json_patch::diff(&wrapped(&applied.spec)?, &wrapped(&desired.spec)?);
    let mut ops = vec![json_patch::PatchOperation::Test(
        json_patch::TestOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            value: applied.resource_version().unwrap_or_default().into(),
        },
    )];
    ops.extend(diff.0);
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Json::<()>(json_patch::Patch(ops)),
    )
    .await
    .map_err(Error::kube(format!(
        "removing fields of NodeType {name} its provider entry no longer has"
    )))?;
    tracing::info!(nodetype = %name, "removed fields its provider entry no longer has");
    Ok(())
}

async fn sync_node_types(p: &NodeProvider, ctx: &Context) -> Result<Synced, Error> {
    let provider = p.name_any();
    let api: Api<NodeType> = Api::all(ctx.client.clone());
    let mut wanted = BTreeSet::new();
    for mut desired in autonodes_core::catalogue::node_types_from_provider(p) {
        let name = desired.name_any();
        wanted.insert(name.clone());
        desired
            .labels_mut()
            .insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        let unchanged = ctx.types().get(&ObjectRef::new(&name)).is_some_and(|cur| {
            cur.spec == desired.spec
                && cur.metadata.owner_references == desired.metadata.owner_references
                && desired
                    .labels()
                    .iter()
                    .all(|(k, v)| cur.labels().get(k) == Some(v))
        });
        if unchanged {
            continue;
        }
        let mut body =
            serde_json::to_value(&desired).map_err(|e| Error::Internal(e.to_string()))?;
        if let Some(obj) = body.as_object_mut() {
            obj.insert("apiVersion".into(), "autonodes.io/v1alpha1".into());
            obj.insert("kind".into(), "NodeType".into());
            obj.remove("status");
        }
        let applied = api
            .patch(
                &name,
                &PatchParams::apply(TYPE_SPEC_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(Error::kube(format!("applying NodeType {name}")))?;
        if applied.spec != desired.spec {
            remove_stale_fields(&api, &applied, &desired).await?;
        }
    }

    let in_use = types_in_use(ctx);
    let mut kept_in_use = Vec::new();
    // The provider's NodeTypes from the store (no LIST per reconcile): one this reconcile
    // just applied is wanted anyway, and one the store does not show yet is removed on the
    // reconcile its watch event brings.
    let existing = ctx
        .types()
        .state()
        .into_iter()
        .filter(|t| t.labels().get(LABEL_PROVIDER) == Some(&provider));
    for t in existing {
        let name = t.name_any();
        if wanted.contains(&name) {
            continue;
        }
        if in_use.contains_key(&name) {
            kept_in_use.push(name);
            continue;
        }
        delete_node_type(&api, &name).await?;
        tracing::info!(provider = %provider, nodetype = %name, "deleted NodeType removed from the provider");
    }
    Ok(Synced {
        count: (wanted.len() + kept_in_use.len()) as i64,
        kept_in_use,
    })
}

/// The golden volumes the provider's node types use now, as `(namespace, name)`: its
/// entries' and those of NodeTypes created directly with `spec.providerRef` naming it.
fn golden_volumes_wanted(p: &NodeProvider, ctx: &Context) -> BTreeSet<(String, String)> {
    let pctx = ProviderContext::from_provider(p);
    let provider = p.name_any();
    let direct: Vec<NodeType> = ctx
        .types()
        .state()
        .iter()
        .filter(|t| t.spec.provider_ref == provider && t.metadata.deletion_timestamp.is_none())
        .map(|t| (**t).clone())
        .collect();
    autonodes_core::catalogue::node_types_from_provider(p)
        .iter()
        .chain(direct.iter())
        .flat_map(|nt| {
            autonodes_core::catalogue::prepare_type(&nt.name_any(), &nt.spec, Some(&pctx)).golden
        })
        .map(|g| (g.namespace, g.name))
        .collect()
}

/// Deletes the provider's golden volumes on its host for which `unused` holds; returns
/// how many it deleted (zero once none is left to delete).
async fn remove_golden_volumes(
    p: &NodeProvider,
    ctx: &Context,
    unused: impl Fn(&str, &str) -> bool,
) -> Result<usize, Error> {
    let provider = p.name_any();
    let remote = ctx
        .clients
        .host(&p.spec.kube_virt.cluster_ref.cluster)
        .await?;
    let host = ctx.host(&remote);
    let found = host.golden_volumes(&provider).await?;
    let mut removed = 0;
    for (ns, name) in found.iter().filter(|(ns, name)| unused(ns, name)) {
        host.delete_data_volume(ns, name).await?;
        removed += 1;
        tracing::info!(provider = %provider, datavolume = %format!("{ns}/{name}"), "deleted a golden DataVolume no node type uses");
    }
    Ok(removed)
}

async fn delete_node_type(api: &Api<NodeType>, name: &str) -> Result<(), Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting NodeType {name}"))(e)),
    }
}

async fn cleanup(p: &NodeProvider, ctx: &Context) -> Result<Action, Error> {
    let provider = p.name_any();
    let prefix = format!("{provider}.");
    let in_use: Vec<String> = types_in_use(ctx)
        .into_iter()
        .filter(|(t, _)| {
            t.starts_with(&prefix)
                || ctx
                    .types()
                    .get(&ObjectRef::new(t))
                    .is_some_and(|nt| nt.spec.provider_ref == provider)
        })
        .flat_map(|(_, claims)| claims)
        .collect();
    if !in_use.is_empty() {
        let message = format!(
            "deletion waits until no claim uses this provider's node types; live claims: {}",
            in_use.join(", ")
        );
        let mut status = p.status.clone().unwrap_or_default();
        let changed = conditions::set(
            &mut status.conditions,
            READY,
            FALSE,
            ProviderReason::InUse,
            message.clone(),
            p.metadata.generation,
            now(),
        );
        if changed {
            apply_status(&Api::<NodeProvider>::all(ctx.client.clone()), p, &status).await?;
            ctx.event(
                p,
                EventType::Warning,
                ProviderReason::InUse.as_str(),
                "Delete",
                message.clone(),
            )
            .await;
        }
        // An error keeps the finalizer (Ok would release it).
        return Err(Error::Waiting(message));
    }
    // The golden volumes of a provider that uses them go with it; the finalizer stays
    // until the host shows none left to delete (a host that cannot be reached keeps such a
    // provider waiting). Those of types it no longer has were removed while it lived.
    let deleted = if golden_volumes_wanted(p, ctx).is_empty() {
        0
    } else {
        remove_golden_volumes(p, ctx, |_, _| true).await?
    };
    if deleted > 0 {
        return Err(Error::Waiting(format!(
            "deletion waits until the provider's {deleted} golden DataVolume(s) are gone"
        )));
    }
    let api: Api<NodeType> = Api::all(ctx.client.clone());
    let existing = api
        .list_metadata(&ListParams::default().labels(&format!("{LABEL_PROVIDER}={provider}")))
        .await
        .map_err(Error::kube(format!("listing NodeTypes of {provider}")))?;
    for t in existing.items {
        delete_node_type(&api, &t.name_any()).await?;
    }
    ctx.event(
        p,
        EventType::Normal,
        "Deleted",
        "Delete",
        format!("deleted the node types of {provider}"),
    )
    .await;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(deleting: bool) -> NodeProvider {
        let mut p: NodeProvider = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeProvider",
            "metadata": {"name": "kv"},
            "spec": {"kubeVirt": {
                "clusterRef": {"cluster": "host", "namespace": "vms"},
                "virtualMachineTemplate": {"spec": {}},
                "nodeTypes": [{"name": "small"}],
            }},
        }))
        .expect("provider");
        if deleting {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        p
    }

    #[test]
    fn a_claim_going_away_concerns_its_provider_only_when_the_provider_or_the_type_is_being_removed(
    ) {
        assert!(!waits_for_claims_of(&provider(false), "kv.small"));
        assert!(waits_for_claims_of(&provider(false), "kv.removed"));
        assert!(waits_for_claims_of(&provider(true), "kv.small"));
    }
}
