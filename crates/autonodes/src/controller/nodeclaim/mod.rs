//! NodeClaim controller: the lifecycle of DESIGN §4–§6, one stage a file.
//!
//! A claim that is not being deleted is [`schedule`]d (type and VM name stored in its
//! status before anything remote exists) and then walks its stages in order, each a
//! sub-reconciler that reads what it needs (from watch caches), acts, and sets its
//! condition on the one in-memory status of this reconcile ([`status::StatusWriter`]):
//!
//! 1. [`launch`]: the tenant's bootstrap token, the host's user-data Secret and
//!    VirtualMachine; `Provisioned` once the VM runs (launch timeout);
//! 2. [`register`]: the tenant Node with the VM's provider ID, its labels and the
//!    registration taint; `Joined`, the token deleted (registration timeout);
//! 3. [`initialize`]: `Initialized` and `Ready` once the Node is Ready and no startup taint
//!    is left (initialization timeout); afterwards `Ready` follows the Node.
//!
//! Before the stages, [`drift`] compares the node type's definition with the one the claim
//! was scheduled with (`Drifted`).
//!
//! A stage either lets the next one run, or stops the walk (the status is written once,
//! and the claim comes back on a change or after a while), or fails the claim. A remote
//! call that fails stops the walk with the cluster's reason on the current stage's
//! condition. [`terminate`] (finalizer `autonodes.io/cleanup`) drains the Node and removes
//! the VM, the Node, the Secret, the DataVolumes and the token, in that order.

pub mod schedule;
pub mod status;

mod drift;
mod initialize;
mod launch;
mod register;
mod terminate;
mod tokens;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::api::reasons::{ClaimCondition, ClaimReason};
use crate::api::{NodeClaim, NodeClaimPhase, FINALIZER};
use crate::conditions;
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::remote::clients::Remote;
use crate::remote::host::Host;
use crate::remote::tenant::Tenant;
use crate::scheduling::PreparedType;
use crate::template;
use schedule::{schedule, Schedule};
pub use status::refresh_claim_gauges;
use status::StatusWriter;
use terminate::{cleanup, remove_remote_objects, Removal};

/// Condition: a node type was chosen.
pub const SCHEDULED: ClaimCondition = ClaimCondition::Scheduled;
/// Condition: the VM runs.
pub const PROVISIONED: ClaimCondition = ClaimCondition::Provisioned;
/// Condition: the VM's Node registered in the tenant.
pub const JOINED: ClaimCondition = ClaimCondition::Joined;
/// Condition: the Node was Ready without startup taints once (stays True).
pub const INITIALIZED: ClaimCondition = ClaimCondition::Initialized;
/// Condition: the Node is Ready and no startup taint is left.
pub const READY: ClaimCondition = ClaimCondition::Ready;
/// Condition (only while True): the node type changed since the claim was scheduled.
pub const DRIFTED: ClaimCondition = ClaimCondition::Drifted;

/// Namespace of bootstrap-token Secrets in the tenant.
pub use crate::remote::watched::TOKEN_NAMESPACE;
/// Group a bootstrap token authenticates as (kubeadm's default node token group).
pub const TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// Claims whose cleanup this process finished, so a reconcile of a cached copy from before
/// does not clean up again (the capacity they held is the ledger's: [`Context::ledger`]).
#[derive(Debug, Default)]
pub struct Reservations {
    /// UIDs of claims whose cleanup finished (their capacity is free).
    pub released: HashSet<String>,
}

/// Reconciles one NodeClaim.
pub async fn reconcile(claim: Arc<NodeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
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
        ctx.metrics.observe_reconcile(
            "nodeclaim",
            started,
            &Ok::<_, Error>(Action::await_change()),
        );
        return Ok(Action::await_change());
    }
    let ns = claim.namespace().unwrap_or_default();
    let api: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, claim, |event| async {
        match event {
            Finalizer::Apply(c) => apply(&c, &ctx).await,
            Finalizer::Cleanup(c) => cleanup(&c, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    // A reconcile that ran on a cached copy older than the release of the finalizer finds
    // the claim gone when it removes the finalizer again: nothing is left to do.
    let result = match result {
        Err(e) if e.is_gone() => Ok(Action::await_change()),
        r => r,
    };
    // A deleted claim's reconcile that ended well leaves no finalizer of ours: the helper
    // released it after the cleanup, or found it released.
    if let (Ok(_), Some(uid)) = (&result, &deleted) {
        ctx.finalized(uid, true);
    }
    ctx.metrics.observe_reconcile("nodeclaim", started, &result);
    result
}

/// Logs the error; the claim is retried with backoff.
pub fn error_policy(claim: Arc<NodeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::CleanupBlocked { .. } = error.inner() {
        // Already reported by the condition, an Event and a log line.
        let delay =
            crate::controller::error::cleanup_backoff(claim.metadata.deletion_timestamp.as_ref());
        tracing::debug!(nodeclaim = %claim.name_any(), ?delay, "cleanup blocked; retrying");
        return Action::requeue(delay);
    }
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; reconciling again");
        return crate::controller::error::error_requeue(error);
    }
    tracing::warn!(
        nodeclaim = %claim.name_any(),
        namespace = %claim.namespace().unwrap_or_default(),
        %error,
        "reconciling NodeClaim failed"
    );
    crate::controller::error::error_requeue(error)
}

/// The claim's UID (the API server always sets it).
fn uid(claim: &NodeClaim) -> Result<String, Error> {
    claim
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodeClaim {}", claim.name_any()), "metadata.uid"))
}

/// The labels of every object autonodes creates for `claim`, as `installation` makes it.
pub fn claim_labels(claim: &NodeClaim, installation: &str) -> BTreeMap<String, String> {
    template::managed_labels(
        &claim.name_any(),
        &claim.namespace().unwrap_or_default(),
        claim.uid().as_deref().unwrap_or_default(),
        installation,
    )
}

/// A claim that is not being deleted: schedule it, then walk its stages.
async fn apply(claim: &NodeClaim, ctx: &Context) -> Result<Action, Error> {
    let status = claim.status.clone().unwrap_or_default();
    if status.phase == Some(NodeClaimPhase::Failed) {
        // Terminal: make sure its remote objects are gone.
        return match remove_remote_objects(claim, ctx, false).await? {
            Removal::Done => Ok(Action::await_change()),
            Removal::Waiting(why) => {
                tracing::debug!(nodeclaim = %claim.name_any(), %why, "removing objects of a failed claim");
                Ok(Action::requeue(Duration::from_secs(3)))
            }
        };
    }
    let ns = claim.namespace().unwrap_or_default();

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

    let scheduled = match schedule(claim, ctx).await? {
        Schedule::Chosen(s) => s,
        Schedule::Waiting(wait) => return Ok(Action::requeue(wait)),
    };
    provision(&scheduled.claim, ctx, &scheduled.node_type, &tenant).await
}

/// One reconcile of a scheduled claim: what its stages read, and the status they change.
pub(super) struct Provisioning<'a> {
    /// The claim as this reconcile saw it.
    claim: &'a NodeClaim,
    /// The controllers' context.
    ctx: &'a Context,
    /// The node type the claim was scheduled to.
    node_type: &'a PreparedType,
    /// The tenant cluster.
    tenant: &'a Remote,
    /// The host cluster.
    host: Arc<Remote>,
    /// The host cluster's name.
    host_cluster: String,
    /// The VM's namespace on the host.
    vm_ns: String,
    /// The VM's name.
    vm_name: String,
    /// The claim's status as this reconcile changes it.
    status: StatusWriter<'a>,
    /// The claim's Node, once [`register`] found it.
    node: Option<Arc<Node>>,
}

impl Provisioning<'_> {
    /// The host cluster, as the stages use it.
    fn host(&self) -> Host<'_> {
        Host::new(self.ctx, &self.host)
    }

    /// The tenant cluster, as the stages use it.
    fn tenant(&self) -> Tenant<'_> {
        Tenant::new(self.ctx, self.tenant)
    }

    /// The provider ID the claim's Node carries.
    fn provider_id(&self) -> String {
        format!("kubevirt://{}", self.vm_name)
    }
}

/// What a stage decided.
pub(super) enum Step {
    /// The stage is done: the next one runs.
    Next,
    /// The walk stops here: the status is written and the claim comes back as `Action` says
    /// (or sooner, when a watch sees a change).
    Stop(Action),
    /// The claim failed for good (a timeout, its VM gone): it is marked Failed and its
    /// remote objects are removed.
    Fail {
        /// The condition reason.
        reason: ClaimReason,
        /// What happened.
        message: String,
    },
}

/// Walks the stages of a scheduled claim and writes its status once.
async fn provision(
    claim: &NodeClaim,
    ctx: &Context,
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
        ctx,
        node_type,
        tenant,
        host,
        host_cluster,
        vm_ns,
        vm_name,
        status: w,
        node: None,
    };
    drift::drift(&mut p);
    let mut step = launch::launch(&mut p).await;
    if let Ok(Step::Next) = step {
        step = register::register(&mut p).await;
    }
    if let Ok(Step::Next) = step {
        step = initialize::initialize(&mut p).await;
    }
    match step {
        Ok(Step::Next) => match p.status.write_or_defer().await? {
            Some(wait) => Ok(Action::requeue(wait)),
            None => Ok(Action::await_change()),
        },
        Ok(Step::Stop(action)) => match p.status.write_or_defer().await? {
            Some(wait) => Ok(Action::requeue(wait)),
            None => Ok(action),
        },
        Ok(Step::Fail { reason, message }) => fail(claim, ctx, p.status, reason, message).await,
        Err(e @ Error::Remote { .. }) => remote_failure(claim, p.status, e).await,
        Err(e) => Err(e),
    }
}

/// Records a failed host or tenant call on the condition of the stage the claim is in
/// (reason `{Host,Tenant}Forbidden` for 401/403, else `{Host,Tenant}Unreachable`) and
/// retries later.
async fn remote_failure(
    claim: &NodeClaim,
    mut w: StatusWriter<'_>,
    e: Error,
) -> Result<Action, Error> {
    let (Error::Remote { on_host, .. }, Some(reason)) = (&e, e.cluster_reason()) else {
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
    ctx: &Context,
    mut w: StatusWriter<'_>,
    reason: ClaimReason,
    message: String,
) -> Result<Action, Error> {
    tracing::warn!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %reason, %message, "claim failed");
    w.set(READY, false, reason, message.clone());
    w.new.phase = Some(NodeClaimPhase::Failed);
    w.write().await?;
    ctx.metrics
        .nodeclaims_terminated
        .with_label_values(&["failed"])
        .inc();
    if let Ok(uid) = uid(claim) {
        ctx.ledger(|l| l.unreserve(&uid));
    }
    ctx.wake_pending_claims();
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        let _ = ctx.wake_types.unbounded_send(ObjectRef::new(t));
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}
fn elapsed_since(since: k8s_openapi::jiff::Timestamp) -> Duration {
    let ms = now().as_millisecond() - since.as_millisecond();
    Duration::from_millis(ms.max(0) as u64)
}

fn remaining(limit: Duration, waited: Duration, cap: Duration) -> Duration {
    limit
        .saturating_sub(waited)
        .min(cap)
        .max(Duration::from_millis(500))
}
