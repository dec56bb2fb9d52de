//! NodeClaim controller: a claim's lifecycle (schedule, launch, register, initialize,
//! terminate), one stage a file.
//!
//! A claim that is not being deleted is [`schedule`](mod@schedule)d (type and VM name stored in its
//! status before anything remote exists) and then walks its stages in order, each a
//! sub-reconciler that reads what it needs (from watch caches), acts, and sets its
//! condition on the one in-memory status of this reconcile ([`status::StatusWriter`]):
//!
//! 1. [`launch`]: a ready warm VM of the claim's type ([`take_warm`]: taken, and its binding
//!    written), else the tenant's bootstrap token, the host's user-data Secret and
//!    VirtualMachine; `Provisioned` once the VM runs (launch timeout);
//! 2. [`register`]: the tenant Node with the VM's provider ID, its labels and the
//!    registration taint; `Joined`, the token deleted (registration timeout) — and a warm
//!    VM's binding and own credential;
//! 3. [`initialize`]: `Initialized` and `Ready` once the Node is Ready and no startup taint
//!    is left (initialization timeout); afterwards `Ready` follows the Node.
//!
//! A claim powered off (`spec.power: Off`) walks no stage: [`power`] drains its Node and
//! halts its VM instead; powered on again, its VM starts before the launch stage looks.
//!
//! Once the VM runs, [`host_maintenance`] follows the host node it runs on: when that node
//! is drained, the VM is live-migrated off it, or its pool is asked to replace the node
//! (`HostMaintenance`).
//!
//! Before the stages, [`drift`] compares the node type's definition with the one the claim
//! was scheduled with (`Drifted`), and [`restart`] restarts the VM when the claim's
//! `autonodes.io/restart` annotation has a new value (node repair's first step). Once
//! initialized, the claim keeps the Node's conditions in `status.nodeConditions` for node
//! repair.
//!
//! A stage either lets the next one run, or stops the walk (the status is written once,
//! and the claim comes back on a change or after a while), or fails the claim. A remote
//! call that fails stops the walk with the cluster's reason on the current stage's
//! condition. [`terminate`] (finalizer `autonodes.io/cleanup`) drains the Node and removes
//! the VM, the Node, the Secret, the DataVolumes and the token, in that order.

pub(crate) mod context;
pub(crate) mod provisioning;
pub(crate) mod schedule;
pub(crate) mod status;

mod drift;
mod host_maintenance;
mod initialize;
mod join;
mod launch;
mod power;
mod register;
mod restart;
mod take_warm;
mod terminate;
mod tokens;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::UnboundedReceiver;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as RunConfig};
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use kube::ResourceExt;

use crate::controller::context::{unscheduled, Context};
use crate::controller::error::{cleanup_backoff, Error};
use crate::controller::reconciler::{self, Reconciler};
use crate::controller::reflectors::Reflectors;
use crate::remote::api::{HostApi, TenantApi};
use crate::remote::clients::Remote;
use crate::remote::error::Error as RemoteError;
use autonodes_api::conditions;
use autonodes_api::reasons::ClaimReason;
use autonodes_api::{NodeClaim, NodeClaimPhase, NodeQuota, NodeType, FINALIZER};
use autonodes_core::catalogue::PreparedType;
use context::ClaimContext;
use provisioning::{uid, Provisioning, StageContext, Step};
use schedule::{schedule, Schedule};
pub(crate) use status::refresh_claim_gauges;
use status::{StatusWriter, JOINED, PROVISIONED, READY, SCHEDULED};
use terminate::{cleanup, remove_remote_objects, Removal};

/// How many claims are reconciled at once. Each reconcile mostly waits on API servers; a
/// bound keeps a burst of thousands of new claims from opening thousands of requests at
/// once (which slows every one of them) and bounds the memory they hold.
const CLAIM_CONCURRENCY: u16 = 64;

/// Runs the NodeClaim controller until `shutdown` resolves. Besides its own changes, a
/// claim is woken by `wakeups` (remote watches, freed capacity), and a pending claim by a
/// NodeType that appeared, went or changed, and by a NodeQuota of its namespace.
pub(crate) async fn run(
    ctx: Arc<Context>,
    r: &Reflectors,
    wakeups: UnboundedReceiver<ObjectRef<NodeClaim>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let claims_for_types = ctx.claims().clone();
    let type_states = std::sync::Mutex::new(std::collections::HashMap::new());
    let claims_for_quotas = ctx.claims().clone();
    let controller = Controller::for_shared_stream(r.claims.applied(), r.claims.store())
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
        .watches_shared_stream(r.quotas.touched_objects(), move |q: Arc<NodeQuota>| {
            // A quota that appeared, went or changed may let pending claims of the
            // namespaces it covers schedule (or tell them why not).
            claims_for_quotas
                .state()
                .into_iter()
                .filter(|c| {
                    unscheduled(c)
                        && autonodes_core::quota::covers(
                            &q.spec,
                            &c.namespace().unwrap_or_default(),
                        )
                })
                .map(|c| ObjectRef::from_obj(&*c))
                .collect::<Vec<_>>()
        })
        .reconcile_on(wakeups)
        .with_config(RunConfig::default().concurrency(CLAIM_CONCURRENCY))
        .graceful_shutdown_on(shutdown);
    reconciler::run(controller, Arc::new(ClaimContext::new(ctx))).await;
}

impl Reconciler for ClaimContext {
    type Object = NodeClaim;
    const NAME: &'static str = "nodeclaim";
    const DOING: &'static str = "reconciling NodeClaim";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, claim: Arc<NodeClaim>) -> Result<Action, Error> {
        let ctx = self;
        let claim = ctx.fresher(claim);
        let deleted = claim
            .metadata
            .deletion_timestamp
            .is_some()
            .then(|| claim.uid())
            .flatten();
        if deleted
            .as_deref()
            .is_some_and(|uid| ctx.finalized(uid, false))
        {
            // Released already; the store still shows the claim from before.
            return Ok(Action::await_change());
        }
        let ns = claim.namespace().unwrap_or_default();
        if !ctx.shards.acts_for(&ns) {
            return schedule_for_another_replica(&claim, ctx).await;
        }
        let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let result = finalizer(&api, FINALIZER, claim, |event| async {
            match event {
                Finalizer::Apply(c) => apply(&c, ctx).await,
                Finalizer::Cleanup(c) => cleanup(&c, ctx).await,
            }
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)));
        // A reconcile that ran on a cached copy older than the release of the finalizer
        // finds the claim gone when it removes the finalizer again: nothing is left to do.
        let result = match result {
            Err(e) if e.is_gone() => Ok(Action::await_change()),
            r => r,
        };
        // A deleted claim's reconcile that ended well leaves no finalizer of ours: the
        // helper released it after the cleanup, or found it released.
        if let (Ok(_), Some(uid)) = (&result, &deleted) {
            ctx.finalized(uid, true);
        }
        result
    }

    /// A blocked cleanup (already reported by the condition, an Event and a log line) is
    /// retried with [`cleanup_backoff`].
    fn retry(&self, claim: &NodeClaim, error: &Error) -> Option<Action> {
        let Error::CleanupBlocked { .. } = error.inner() else {
            return None;
        };
        let delay = cleanup_backoff(claim.metadata.deletion_timestamp.as_ref());
        tracing::debug!(nodeclaim = %claim.name_any(), ?delay, "cleanup blocked; retrying");
        Some(Action::requeue(delay))
    }
}

/// A claim of a namespace another replica acts for (`--shard-tenants`): the leader chooses
/// its type, since every scheduling decision is the leader's (the capacity ledger is exact
/// only when one replica decides); nothing else is done here. The status written wakes the
/// claim in the replica that acts for it.
async fn schedule_for_another_replica(
    claim: &NodeClaim,
    ctx: &ClaimContext,
) -> Result<Action, Error> {
    let pending = unscheduled(claim)
        && claim.metadata.deletion_timestamp.is_none()
        && claim.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed);
    if !(pending && ctx.shards.leads()) {
        return Ok(Action::await_change());
    }
    let admitted = match schedule::admit_before_tenant(claim, ctx).await? {
        schedule::Admission::Refused(wait) => return Ok(Action::requeue(wait)),
        schedule::Admission::Scheduled => return Ok(Action::await_change()),
        schedule::Admission::Admitted(admitted) => Some(admitted),
    };
    match schedule(claim, ctx, admitted).await? {
        Schedule::Chosen(_) => Ok(Action::await_change()),
        Schedule::Waiting(wait) => Ok(Action::requeue(wait)),
    }
}

/// A claim that is not being deleted: schedule it, then walk its stages.
async fn apply(claim: &NodeClaim, ctx: &ClaimContext) -> Result<Action, Error> {
    let status = claim.status.clone().unwrap_or_default();
    if status.phase == Some(NodeClaimPhase::Failed) {
        // Terminal: make sure its remote objects are gone.
        return match remove_remote_objects(claim, ctx, false).await? {
            Removal::Done => Ok(Action::await_change()),
            Removal::Waiting(why) | Removal::Kept(why, _) => {
                tracing::debug!(nodeclaim = %claim.name_any(), %why, "removing objects of a failed claim");
                Ok(Action::requeue(Duration::from_secs(3)))
            }
        };
    }
    let ns = claim.namespace().unwrap_or_default();
    if status.type_ref.is_none() && !ctx.shards.leads() {
        // Another replica leads and schedules it; its status write wakes this claim.
        return Ok(Action::await_change());
    }

    // What needs nothing of the tenant is checked before its cluster is connected: a claim
    // its provider or quotas refuse opens no connection.
    let admitted = match schedule::admit_before_tenant(claim, ctx).await? {
        schedule::Admission::Refused(wait) => return Ok(Action::requeue(wait)),
        schedule::Admission::Scheduled => None,
        schedule::Admission::Admitted(admitted) => Some(admitted),
    };
    // The tenant must be reachable before capacity is reserved for the claim.
    let tenant = match ctx
        .clients
        .tenant(&ns, &claim.spec.v_cluster_ref.name)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            let mut w = StatusWriter::new(claim, ctx);
            let stage = if status.type_ref.is_none() {
                SCHEDULED
            } else {
                PROVISIONED
            };
            w.set(stage, false, e.reason(), e.to_string());
            w.write().await?;
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    };

    let scheduled = match schedule(claim, ctx, admitted).await? {
        Schedule::Chosen(s) => s,
        Schedule::Waiting(wait) => return Ok(Action::requeue(wait)),
    };
    provision(&scheduled.claim, ctx, &scheduled.node_type, &tenant).await
}

/// Walks the stages of a scheduled claim and writes its status once.
async fn provision(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    node_type: &PreparedType,
    tenant: &Remote,
) -> Result<Action, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let vm_name = status
        .vm_name
        .clone()
        .ok_or_else(|| Error::Missing("NodeClaim status".into(), "vmName"))?;
    let vm_ns = status
        .vm_namespace
        .clone()
        .unwrap_or_else(|| node_type.vm_namespace.clone());
    let host_cluster = status
        .host_cluster
        .clone()
        .unwrap_or_else(|| node_type.host_cluster.clone());
    let mut w = StatusWriter::new(claim, ctx);
    let host = match ctx.clients.host(&host_cluster).await {
        Ok(h) => h,
        Err(e) => {
            w.set(PROVISIONED, false, e.reason(), e.to_string());
            w.write().await?;
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    };
    let mut p = Provisioning {
        claim,
        ctx: StageContext::of(ctx),
        node_type,
        tenant: ctx.tenant(tenant),
        host: ctx.host(&host),
        host_cluster,
        vm_ns,
        vm_name,
        status: w,
        node: None,
        soon: None,
    };
    let walked = if autonodes_core::claim::powered_off(claim) {
        drift::drift(&mut p);
        power::power_off(&mut p, ctx).await
    } else {
        walk(&mut p).await
    };
    match walked {
        Ok(Step::Next) => match p.status.write_or_defer().await? {
            Some(wait) => Ok(Action::requeue(wait)),
            None => Ok(Action::await_change()),
        },
        Ok(Step::Stop(action)) => {
            let soon = p.soon;
            match p.status.write_or_defer().await? {
                Some(wait) => Ok(Action::requeue(soon.map_or(wait, |s| s.min(wait)))),
                None => Ok(soon.map_or(action, Action::requeue)),
            }
        }
        Ok(Step::Fail { reason, message }) => fail(claim, ctx, p.status, reason, message).await,
        Err(e @ Error::Remote(RemoteError::Call { .. })) => {
            remote_failure(claim, p.status, e).await
        }
        Err(e) => Err(e),
    }
}

/// Walks the stages of a scheduled claim: drift, then launch, register and initialize as
/// long as each lets the next one run.
pub(crate) async fn walk<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Step, Error> {
    drift::drift(p);
    restart::restart(p).await?;
    if let Some(step) = power::power_on(p).await? {
        return Ok(step);
    }
    let mut step = launch::launch(p).await;
    if let Ok(Step::Next) = step {
        host_maintenance::host_maintenance(p).await?;
        step = register::register(p).await;
    }
    if step.is_ok() {
        take_warm::release(p).await?;
    }
    if step.is_ok() && p.node.is_some() {
        drift::version(p).await?;
    }
    if let Ok(Step::Next) = step {
        step = initialize::initialize(p).await;
    }
    step
}

/// Records a failed host or tenant call on the condition of the stage the claim is in
/// (reason `{Host,Tenant}Forbidden` for 401/403, else `{Host,Tenant}Unreachable`) and
/// retries later.
async fn remote_failure(
    claim: &NodeClaim,
    mut w: StatusWriter<'_>,
    e: Error,
) -> Result<Action, Error> {
    let (Error::Remote(RemoteError::Call { on_host, .. }), Some(reason)) = (&e, e.cluster_reason())
    else {
        return Err(e);
    };
    if e.is_remote_conflict() {
        // A remote object changed under us (e.g. the kubelet updated the Node): not a
        // failure of the cluster; look again at once.
        return Err(Error::Conflict(e.to_string()));
    }
    let c = &w.new.conditions;
    let stage = match on_host {
        true if conditions::is_true(c, PROVISIONED) => READY,
        true => PROVISIONED,
        false if conditions::is_true(c, JOINED) => READY,
        false if conditions::is_true(c, PROVISIONED) => JOINED,
        false => PROVISIONED,
    };
    w.set(stage, false, reason, e.to_string());
    tracing::warn!(nodeclaim = %claim.name_any(), %reason, error = %e, "remote cluster call failed");
    w.write().await?;
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Marks the claim Failed and removes its VM, Secret and token.
async fn fail(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    mut w: StatusWriter<'_>,
    reason: ClaimReason,
    message: String,
) -> Result<Action, Error> {
    tracing::warn!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %reason, %message, "claim failed");
    w.set(READY, false, reason, message.clone());
    w.new.phase = Some(NodeClaimPhase::Failed);
    w.write().await?;
    let [ns, pool, node_type] = crate::metrics::claim_labels(claim);
    ctx.metrics
        .nodeclaims_terminated
        .with_label_values(&[&ns, &pool, &node_type, "failed"])
        .inc();
    if let Ok(uid) = uid(claim) {
        // Its static address stays held until the claim is gone.
        ctx.ledger(|l| l.unreserve_capacity(&uid));
    }
    ctx.wake_pending_claims();
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        let _ = ctx.wakes.types.unbounded_send(ObjectRef::new(t));
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}
