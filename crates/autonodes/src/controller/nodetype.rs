//! NodeType controller: effective resources, cost, capacity, phase and host room of each
//! node type.

pub(crate) mod warm_pool;

use autonodes_api::reasons::{TypeCondition, TypeReason};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::catalogue::{catalogue, provider_of, unusable};
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::reconciler::{self, Reconciler};
use crate::controller::reflectors::Reflectors;
use crate::controller::status::apply_status;
use crate::controller::status::WriteGap;
use crate::remote::clients::{remote_error_text, REMOTE_TIMEOUT};
use crate::remote::host_room;
use autonodes_api::conditions::{self, status_of};
use autonodes_api::ResourceList;
use autonodes_api::{NodeClaim, NodeProvider};
use autonodes_api::{NodeType, NodeTypeHost, NodeTypePhase};
use autonodes_core::catalogue::{ProviderContext, TypeProblem};
use autonodes_core::template::instancetype::{instancetype_resources, Matcher};
use futures::channel::mpsc::UnboundedReceiver;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use std::ops::Deref;

/// Condition: the type can take claims.
pub(crate) const READY: TypeCondition = TypeCondition::Ready;

/// How long a change of the claimed count alone (a claim more or less on a type whose phase
/// and conditions stay) waits after the type's last status write: a burst of claims costs a
/// status write per second, not one per claim. Scheduling never reads this status (it counts
/// claims itself), so the count shown lags by at most this much.
pub(crate) const COUNT_WRITE_GAP: Duration = Duration::from_secs(1);

/// How long an instance type read from the host is used before it is read again (a
/// type is reconciled once per claim change; its instance type is not read each time).
pub(crate) const INSTANCETYPE_READ_GAP: Duration = Duration::from_secs(60);

/// The cpu and memory of the type's instance type, read from the provider's host (once per
/// [`INSTANCETYPE_READ_GAP`] and generation), or why they are unknown.
async fn read_instancetype(
    t: &NodeType,
    it: &Matcher,
    p: &autonodes_api::NodeProvider,
    ctx: &TypeContext,
) -> Result<ResourceList, String> {
    let key = format!(
        "{}@{}",
        t.name_any(),
        t.metadata.generation.unwrap_or_default()
    );
    if let Some((at, read)) = ctx
        .instancetypes_read
        .lock()
        .ok()
        .and_then(|m| m.get(&key).cloned())
    {
        if at.elapsed() < INSTANCETYPE_READ_GAP {
            return read;
        }
    }
    let cluster = &p.spec.kube_virt.cluster_ref.cluster;
    let read = async {
        let remote = ctx.clients.host(cluster).await.map_err(|e| e.to_string())?;
        let resource = autonodes_api::kubevirt::instancetype(&it.kind);
        let api: Api<DynamicObject> = if it.is_cluster_scoped() {
            Api::all_with(remote.client.clone(), &resource)
        } else {
            Api::namespaced_with(
                remote.client.clone(),
                &p.spec.kube_virt.cluster_ref.namespace,
                &resource,
            )
        };
        let got = tokio::time::timeout(REMOTE_TIMEOUT, api.get_opt(&it.name))
            .await
            .map_err(|_| format!("host cluster {cluster} did not answer"))?;
        ctx.metrics.cluster_requests.count(&remote.key, &got);
        match got {
            Ok(Some(obj)) => instancetype_resources(&obj.data),
            Ok(None) => Err(format!("not found on host cluster {cluster}")),
            Err(e) => Err(format!(
                "reading it from host cluster {cluster}: {}",
                remote_error_text(&e)
            )),
        }
    }
    .await;
    if let Ok(mut m) = ctx.instancetypes_read.lock() {
        m.retain(|k, _| !k.starts_with(&format!("{}@", t.name_any())));
        m.insert(key, (Instant::now(), read.clone()));
    }
    read
}

/// The NodeType controller's context: the shared one ([`Deref`]) and the types' own state.
pub(crate) struct TypeContext {
    /// The context every controller shares.
    pub ctx: Arc<Context>,
    /// When each NodeType's status was last written, by name ([`COUNT_WRITE_GAP`]).
    pub status_written: WriteGap,
    /// Each NodeType's instance type as last read from its host, and when
    /// ([`INSTANCETYPE_READ_GAP`]).
    pub instancetypes_read: std::sync::Mutex<std::collections::HashMap<String, InstancetypeRead>>,
}

/// An instance type as read from a host, and when: its cpu and memory, or why not.
pub(crate) type InstancetypeRead = (Instant, Result<ResourceList, String>);

impl Deref for TypeContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.ctx
    }
}

/// Runs the NodeType controller until `shutdown` resolves: a type is woken by its claims
/// (their count changes its capacity), by its provider, and by `wakeups`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    r: &Reflectors,
    wakeups: UnboundedReceiver<ObjectRef<NodeType>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let types_store = ctx.types().clone();
    let controller = Controller::for_shared_stream(r.types.applied(), r.types.store())
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
        .reconcile_on(wakeups)
        .graceful_shutdown_on(shutdown);
    reconciler::run(
        controller,
        Arc::new(TypeContext {
            ctx,
            status_written: WriteGap::default(),
            instancetypes_read: Default::default(),
        }),
    )
    .await;
}

impl Reconciler for TypeContext {
    type Object = NodeType;
    const NAME: &'static str = "nodetype";
    const DOING: &'static str = "reconciling NodeType";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, obj: Arc<NodeType>) -> Result<Action, Error> {
        apply(&obj, self).await
    }
}

async fn apply(t: &NodeType, ctx: &TypeContext) -> Result<Action, Error> {
    if t.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = t.name_any();
    let provider = provider_of(ctx, t);
    let evaluated = t.status.as_ref().and_then(|s| s.observed_generation);
    if unusable(t, provider.as_deref()).is_none() && evaluated != t.metadata.generation {
        // A new or changed type, as the type cache (the one claims schedule from) holds it
        // now: pending claims may fit it (see provider::wake_dependents). Reconciles for
        // its claims' changes (one per claim scheduled) wake nobody.
        ctx.wake_pending_claims();
    }
    let pctx = provider.as_deref().map(ProviderContext::from_provider);
    let mut prepared = autonodes_core::catalogue::prepare_type(&name, &t.spec, pctx.as_ref());
    if let (Some(it), Some(p)) = (prepared.instancetype.clone(), provider.as_deref()) {
        let read = read_instancetype(t, &it, p, ctx).await;
        prepared = autonodes_core::catalogue::prepare_type_with(
            &name,
            &t.spec,
            pctx.as_ref(),
            read.as_ref().map_err(String::as_str),
        );
    }
    if prepared.problem.is_none() {
        if let Some(message) = unusable(t, provider.as_deref()) {
            prepared.problem = Some(TypeProblem::ProviderNotReady {
                node_type: name.clone(),
                message,
            });
        }
    }
    let claimed = ctx.ledger(|l| l.count(&name));
    let old = t.status.clone().unwrap_or_default();
    // (Unusable types record their hash too, so a type fixed with a new definition wakes
    // them.)
    if old
        .definition_hash
        .as_ref()
        .is_some_and(|h| prepared.is_usable() && *h != prepared.definition)
    {
        // The type (or its provider) changed what its VMs are made from: its claims look
        // at their drift.
        ctx.wake_claims_of_type(&name);
    }
    let mut status = prepared.status(claimed);
    status.observed_generation = t.metadata.generation;
    if prepared.is_usable() {
        status.host = Some(host_room(ctx, &prepared).await);
    }
    status.conditions = old.conditions.clone();
    let phase = prepared.phase(claimed);
    let (reason, message) = match (&prepared.problem, phase) {
        (Some(p), _) => (p.reason(), p.to_string()),
        (None, NodeTypePhase::Exhausted) => (
            TypeReason::Exhausted,
            format!(
                "all {} node(s) of {name} are claimed",
                t.spec.max_capacity.unwrap_or_default()
            ),
        ),
        (None, _) => (
            TypeReason::Available,
            "claims can be scheduled to this type".to_string(),
        ),
    };
    let ok = prepared.problem.is_none();
    conditions::set(
        &mut status.conditions,
        READY,
        status_of(ok),
        reason,
        message.clone(),
        t.metadata.generation,
        now(),
    );
    // The type's warm VMs: kept, replaced, removed (also for a type that turned unusable).
    let warm = warm_pool::reconcile(
        ctx,
        &prepared,
        provider.as_deref(),
        claimed,
        old.warm.is_some(),
    )
    .await;
    // A type that had warm VMs shows zeros rather than nothing: a field left out of the
    // status is not always removed (the spec and the status are applied by one field
    // manager, which API servers before 1.22 do not tell apart).
    status.warm = match (warm.status, warm.unknown) {
        (Some(w), _) => Some(w),
        (None, true) => old.warm.clone(),
        (None, false) => old.warm.as_ref().map(|w| autonodes_api::NodeTypeWarm {
            bound: w.bound,
            ..Default::default()
        }),
    };
    match &warm.condition {
        Some((ok, reason, message)) => {
            conditions::set(
                &mut status.conditions,
                warm_pool::WARM_READY,
                status_of(*ok),
                *reason,
                message.clone(),
                t.metadata.generation,
                now(),
            );
        }
        None if warm.unknown => {}
        None => status
            .conditions
            .retain(|c| c.type_ != warm_pool::WARM_READY.as_str()),
    }

    let provider_name = t.spec.provider_ref.clone();
    let m = &ctx.metrics;
    let capacity = status.capacity.clone().unwrap_or_default();
    for (gauge, value) in [
        (&m.nodetype_capacity, capacity.total),
        (&m.nodetype_claimed, Some(capacity.claimed)),
        (&m.nodetype_available, capacity.available),
    ] {
        match value {
            Some(v) => gauge.with_label_values(&[&name, &provider_name]).set(v),
            None => {
                let _ = gauge.remove_label_values(&[&name, &provider_name]);
            }
        }
    }
    if let Some(cost) = status.cost {
        m.nodetype_cost
            .with_label_values(&[&name, &provider_name])
            .set(cost);
    }
    let headroom = status.host.as_ref().and_then(|h| h.headroom);
    match headroom {
        Some(h) => m
            .nodetype_host_headroom
            .with_label_values(&[&name, &provider_name])
            .set(h),
        None => {
            let _ = m
                .nodetype_host_headroom
                .remove_label_values(&[&name, &provider_name]);
        }
    }

    match &prepared.address_pool {
        Some(pool) => {
            let free = ctx.ledger(|l| pool.free(l.addresses()));
            m.nodetype_addresses_free
                .with_label_values(&[&name, &provider_name])
                .set(i64::try_from(free).unwrap_or(i64::MAX));
        }
        None => {
            let _ = m
                .nodetype_addresses_free
                .remove_label_values(&[&name, &provider_name]);
        }
    }

    if status != old {
        // Equal to the old status but for the capacity (only the claimed count moved), or
        // equal but for the host's room, which moves with every claim and host pod too.
        let only_count = {
            let mut same = status.clone();
            same.capacity = old.capacity.clone();
            same.host = old.host.clone();
            same == old
        };
        if let Some(wait) = ctx.status_written.wait(&name, COUNT_WRITE_GAP, only_count) {
            return Ok(Action::requeue(wait));
        }
        apply_status(&Api::<NodeType>::all(ctx.client.clone()), t, &status).await?;
        ctx.status_written.wrote(&name);
        // A type that turns unusable is a Warning; one that is usable needs no Event.
        super::status::report_changes(
            ctx,
            t,
            "Evaluate",
            &old.conditions,
            &status.conditions,
            |c, _| {
                // Warm VMs taken and refilled are routine; warm VMs that cannot be kept are not.
                let routine = c.type_ == warm_pool::WARM_READY.as_str()
                    && c.reason == TypeReason::WarmStarting.as_str();
                (c.status != conditions::TRUE && !routine).then_some(EventType::Warning)
            },
        )
        .await;
        // Pending claims may now fit (or learn why they cannot) when the type turned
        // usable, unusable, full or free again; a claim more or less on a type that has
        // room changes nothing for them (and happens once per claim scheduled).
        // Claims waiting for room on the host may go once the type has room again.
        let room_back = old.host.as_ref().and_then(|h| h.headroom) == Some(0)
            && headroom.is_some_and(|h| h > 0);
        if old.phase != status.phase || room_back {
            ctx.wake_pending_claims();
        }
    }
    // The host's room changes without the type changing: look again now and then (soon
    // while warm VMs are being made or booting).
    Ok(Action::requeue(
        warm.requeue
            .map_or(HOST_ROOM_RECHECK, |w| w.min(HOST_ROOM_RECHECK)),
    ))
}

/// How often a NodeType's host room is recomputed without any change of the type.
pub(crate) const HOST_ROOM_RECHECK: Duration = Duration::from_secs(30);

/// The type's `status.host`: its room on its host cluster now.
async fn host_room(ctx: &TypeContext, t: &autonodes_core::catalogue::PreparedType) -> NodeTypeHost {
    let snapshot = host_room::snapshot(&ctx.clients, &t.host_cluster).await;
    let catalogue = catalogue(ctx);
    let room = snapshot.map(|s| ctx.ledger(|l| s.room(&catalogue, l)));
    let model = room.as_ref().map(|r| &r.model).map_err(String::as_str);
    host_room::type_host_status(t, model)
}
