//! NodeClaim controller: the lifecycle of DESIGN §4–§6.
//!
//! apply: schedule (type + VM name stored in status before anything remote exists) →
//! tenant bootstrap token → host Secret `<vm>-userdata` → VirtualMachine → readiness
//! ladder (`Scheduled`, `Provisioned`, `Joined`, `Ready`) with label/taint sync on the
//! joined Node → launch and registration timeouts.
//!
//! cleanup (finalizer `autonodes.io/cleanup`): cordon and drain the Node, delete it,
//! delete the VM and wait until it is gone, delete the Secret and the token.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde_json::json;

use super::{apply_status, now, Context, Error};
use crate::api::{
    NodeClaim, NodeClaimPhase, NodeClaimStatus, FINALIZER, LABEL_MANAGED_BY, LABEL_NODECLAIM_UID,
    MANAGED_BY,
};
use crate::clients::{status_message, ClientError, ClusterKey, Remote, REMOTE_TIMEOUT};
use crate::conditions::{self, status_of, TRUE};
use crate::kubevirt;
use crate::render::{self, RenderError, RenderedNode};
use crate::scheduling::{
    self, Catalogue, ClaimRequest, PreparedType, ProviderContext, REGISTRATION_TAINT_KEY,
};
use crate::template;
use crate::userdata::{self, BootstrapToken, JoinParams, UserDataError};

/// Condition: a node type was chosen.
pub const SCHEDULED: &str = "Scheduled";
/// Condition: the VM runs.
pub const PROVISIONED: &str = "Provisioned";
/// Condition: the VM's Node registered in the tenant.
pub const JOINED: &str = "Joined";
/// Condition: the Node is Ready and no startup taint is left.
pub const READY: &str = "Ready";

/// Namespace of bootstrap-token Secrets in the tenant.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// Group a bootstrap token authenticates as (kubeadm's default node token group).
pub const TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// Scheduling decisions this process made, so capacity holds even before the claim store
/// shows them (and after a claim is released, before the store drops it).
#[derive(Debug, Default)]
pub struct Reservations {
    /// Claim UID → NodeType it was scheduled to.
    pub scheduled: HashMap<String, String>,
    /// UIDs of claims whose cleanup finished (their capacity is free).
    pub released: HashSet<String>,
}

/// Reconciles one NodeClaim.
pub async fn reconcile(claim: Arc<NodeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let claim = ctx.fresher(claim);
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
    ctx.metrics.observe_reconcile("nodeclaim", started, &result);
    result
}

/// Logs the error; the claim is retried with backoff.
pub fn error_policy(claim: Arc<NodeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::CleanupBlocked { .. } = error.inner() {
        // Already reported by the condition, an Event and a log line.
        let delay = super::cleanup_backoff(claim.metadata.deletion_timestamp.as_ref());
        tracing::debug!(nodeclaim = %claim.name_any(), ?delay, "cleanup blocked; retrying");
        return Action::requeue(delay);
    }
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; reconciling again");
        return super::error_requeue(error);
    }
    tracing::warn!(
        nodeclaim = %claim.name_any(),
        namespace = %claim.namespace().unwrap_or_default(),
        %error,
        "reconciling NodeClaim failed"
    );
    super::error_requeue(error)
}

fn uid(claim: &NodeClaim) -> Result<String, Error> {
    claim
        .uid()
        .ok_or_else(|| Error::Missing(format!("NodeClaim {}", claim.name_any()), "metadata.uid"))
}

/// The labels of every object autonodes creates for `claim`.
pub fn claim_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    template::managed_labels(
        &claim.name_any(),
        &claim.namespace().unwrap_or_default(),
        claim.uid().as_deref().unwrap_or_default(),
    )
}

fn uid_selector(uid: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_NODECLAIM_UID}={uid}")
}

/// Builds the catalogue of every NodeType, with types whose provider cannot be used
/// marked as problems.
pub fn catalogue(ctx: &Context) -> Catalogue {
    let types = ctx.types.state();
    Catalogue::new(
        types
            .iter()
            .filter(|t| t.metadata.deletion_timestamp.is_none())
            .map(|t| {
                let provider = super::nodetype::provider_of(ctx, t);
                let pctx = provider.as_deref().map(ProviderContext::from_provider);
                let mut prepared = scheduling::prepare_type(&t.name_any(), &t.spec, pctx.as_ref());
                if prepared.problem.is_none() {
                    if let Some((_, message)) = super::nodetype::unusable(t, provider.as_deref()) {
                        prepared.problem = Some(scheduling::TypeProblem::ProviderNotReady {
                            node_type: t.name_any(),
                            message,
                        });
                    }
                }
                prepared
            })
            .collect(),
    )
}

/// Claims per NodeType that hold capacity: scheduled, not Failed, not released; plus
/// this process's reservations.
pub fn claimed_counts(ctx: &Context, r: &Reservations) -> BTreeMap<String, i64> {
    let mut by_uid: HashMap<String, String> = HashMap::new();
    for c in ctx.claims.state() {
        let Some(uid) = c.uid() else { continue };
        let s = c.status.as_ref();
        if s.and_then(|s| s.phase) == Some(NodeClaimPhase::Failed) || r.released.contains(&uid) {
            continue;
        }
        if let Some(t) = s.and_then(|s| s.type_ref.clone()) {
            by_uid.insert(uid, t);
        }
    }
    for (uid, t) in &r.scheduled {
        if !r.released.contains(uid) {
            by_uid.insert(uid.clone(), t.clone());
        }
    }
    let mut counts = BTreeMap::new();
    for t in by_uid.into_values() {
        *counts.entry(t).or_insert(0) += 1;
    }
    counts
}

/// Sets the phase from the readiness ladder: the first condition that is not True.
fn set_phase(status: &mut NodeClaimStatus) {
    let c = &status.conditions;
    status.phase = Some(if !conditions::is_true(c, SCHEDULED) {
        NodeClaimPhase::Pending
    } else if !conditions::is_true(c, PROVISIONED) {
        NodeClaimPhase::Provisioning
    } else if !conditions::is_true(c, JOINED) || !conditions::is_true(c, READY) {
        NodeClaimPhase::Joining
    } else {
        NodeClaimPhase::Available
    });
}

/// Collects the changes of one reconcile to a claim's status and writes them at once.
struct StatusWriter<'a> {
    claim: &'a NodeClaim,
    ctx: &'a Context,
    old: NodeClaimStatus,
    new: NodeClaimStatus,
}

impl<'a> StatusWriter<'a> {
    fn new(claim: &'a NodeClaim, ctx: &'a Context) -> Self {
        let old = claim.status.clone().unwrap_or_default();
        StatusWriter {
            claim,
            ctx,
            new: old.clone(),
            old,
        }
    }

    fn set(&mut self, type_: &str, ok: bool, reason: &str, message: impl Into<String>) {
        conditions::set(
            &mut self.new.conditions,
            type_,
            status_of(ok),
            reason,
            message,
            self.claim.metadata.generation,
            now(),
        );
    }

    /// True when the new status differs from the old one by more than progress detail (a
    /// condition that stays not-True and goes from one progress reason or message to another).
    fn worth_writing(&self) -> bool {
        let mut compared = self.new.clone();
        for c in compared.conditions.iter_mut() {
            if let Some(before) = conditions::get(&self.old.conditions, &c.type_) {
                if c.status != TRUE
                    && before.status == c.status
                    && conditions::is_progress(&before.reason)
                    && conditions::is_progress(&c.reason)
                {
                    *c = before.clone();
                }
            }
        }
        compared != self.old
    }

    /// Writes the status if it changed by more than progress detail (one conditional
    /// server-side apply), then records Events and stage durations for what changed.
    /// Returns the claim as it now is.
    async fn write(mut self) -> Result<Arc<NodeClaim>, Error> {
        if self.new.phase != Some(NodeClaimPhase::Failed)
            && self.new.phase != Some(NodeClaimPhase::Terminating)
        {
            set_phase(&mut self.new);
        }
        self.new.observed_generation = self.claim.metadata.generation;
        if !self.worth_writing() {
            return Ok(Arc::new(self.claim.clone()));
        }
        let api: Api<NodeClaim> = Api::namespaced(
            self.ctx.client.clone(),
            &self.claim.namespace().unwrap_or_default(),
        );
        let written = apply_status(&api, self.claim, &self.new).await?;
        let written = self
            .ctx
            .remember_written(self.claim.resource_version(), written);
        // Events and stage durations only once the write succeeded: a reconcile that worked
        // on a stale copy gets a conflict above and must not report the change a second time.
        self.record_events().await;
        self.observe_stages();
        Ok(written)
    }

    /// One Event per condition that changed: Normal when it turned True (Joined is left to
    /// Ready's Event when both turned True at once), Warning when it turned to a problem;
    /// progress reasons get none.
    async fn record_events(&self) {
        let became_true = |type_: &str| {
            conditions::is_true(&self.new.conditions, type_)
                && !conditions::is_true(&self.old.conditions, type_)
        };
        for c in &self.new.conditions {
            let before = conditions::get(&self.old.conditions, &c.type_);
            if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
                continue;
            }
            let type_ = if c.status == TRUE {
                if c.type_ == JOINED && became_true(READY) {
                    continue;
                }
                EventType::Normal
            } else if conditions::is_progress(&c.reason) {
                tracing::debug!(
                    nodeclaim = %self.claim.name_any(),
                    condition = %c.type_, reason = %c.reason, message = %c.message,
                    "claim in progress"
                );
                continue;
            } else {
                tracing::info!(
                    nodeclaim = %self.claim.name_any(),
                    namespace = %self.claim.namespace().unwrap_or_default(),
                    condition = %c.type_, reason = %c.reason, message = %c.message,
                    "claim condition not true"
                );
                EventType::Warning
            };
            self.ctx
                .event(self.claim, type_, &c.reason, &c.type_, c.message.clone())
                .await;
        }
    }

    fn observe_stages(&self) {
        let Some(created) = self.claim.metadata.creation_timestamp.as_ref() else {
            return;
        };
        for (type_, stage) in [
            (SCHEDULED, "scheduled"),
            (PROVISIONED, "provisioned"),
            (JOINED, "joined"),
            (READY, "ready"),
        ] {
            let was = conditions::is_true(&self.old.conditions, type_);
            if let (false, Some(since)) = (was, conditions::true_since(&self.new.conditions, type_))
            {
                let secs = (since.as_millisecond() - created.0.as_millisecond()) as f64 / 1000.0;
                self.ctx
                    .metrics
                    .nodeclaim_duration
                    .with_label_values(&[stage])
                    .observe(secs.max(0.0));
            }
        }
    }
}

/// Recomputes `autonodes_nodeclaims` and `autonodes_nodeclaims_cost` from the claim store.
pub fn refresh_claim_gauges(ctx: &Context) {
    let m = &ctx.metrics;
    let mut by_phase: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    let mut cost: BTreeMap<(String, String), i64> = BTreeMap::new();
    for c in ctx.claims.state() {
        let s = c.status.clone().unwrap_or_default();
        let phase = s
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "Pending".into());
        let nodetype = s.type_ref.clone().unwrap_or_default();
        let provider = nodetype.split('.').next().unwrap_or_default().to_string();
        *by_phase
            .entry((phase.clone(), nodetype, provider.clone()))
            .or_default() += 1;
        if phase != "Failed" {
            *cost
                .entry((c.spec.v_cluster_ref.name.clone(), provider))
                .or_default() += s.cost.unwrap_or(0);
        }
    }
    m.nodeclaims.reset();
    for ((phase, nodetype, provider), n) in by_phase {
        m.nodeclaims
            .with_label_values(&[&phase, &nodetype, &provider])
            .set(n);
    }
    m.nodeclaims_cost.reset();
    for ((vcluster, provider), n) in cost {
        m.nodeclaims_cost
            .with_label_values(&[&vcluster, &provider])
            .set(n);
    }
}

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

    let Some(scheduled) = schedule(claim, ctx).await? else {
        return Ok(Action::requeue(Duration::from_secs(60)));
    };
    provision(&scheduled.claim, ctx, &scheduled.node_type, &tenant).await
}

/// The outcome of scheduling: the chosen type, prepared.
pub struct Scheduled {
    /// The chosen type.
    pub node_type: PreparedType,
    /// The claim after scheduling (as written, when scheduling wrote it).
    pub claim: Arc<NodeClaim>,
}

/// Chooses a type for the claim (or returns the one already chosen).
async fn schedule(claim: &NodeClaim, ctx: &Context) -> Result<Option<Scheduled>, Error> {
    let status = claim.status.clone().unwrap_or_default();
    if let Some(type_ref) = status.type_ref.clone() {
        let catalogue = catalogue(ctx);
        // A claim whose VM already runs keeps it when its type turns unusable (its provider
        // not ready or being deleted, its template changed): nothing is created from the
        // type any more, and the claim goes on watching its VM and Node.
        let provisioned = conditions::is_true(&status.conditions, PROVISIONED);
        return match catalogue.get(&type_ref).filter(|t| t.name == type_ref) {
            Some(t) if t.problem.is_none() || provisioned => Ok(Some(Scheduled {
                node_type: t.clone(),
                claim: Arc::new(claim.clone()),
            })),
            found => {
                // Already scheduled, but the type is gone or unusable: wait, keep capacity.
                let mut w = StatusWriter::new(claim, ctx);
                let message = match found.and_then(|t| t.problem.as_ref()) {
                    Some(p) => p.to_string(),
                    None => {
                        format!("node type {type_ref} the claim was scheduled to no longer exists")
                    }
                };
                w.set(PROVISIONED, false, "NodeTypeUnavailable", message);
                w.write().await?;
                Ok(None)
            }
        };
    }

    let uid = uid(claim)?;
    let request = match ClaimRequest::new(&claim.spec, None) {
        Ok(r) => r,
        Err(e) => {
            let mut w = StatusWriter::new(claim, ctx);
            w.set(SCHEDULED, false, "InvalidRequest", e.to_string());
            w.write().await?;
            return Ok(None);
        }
    };
    // Labels no node could carry (invalid, or owned by the kubelet or autonodes) keep the
    // claim from being scheduled at all.
    if let Err(e) = scheduling::node_labels(
        &Default::default(),
        None,
        &claim.spec.labels,
        &BTreeMap::new(),
    ) {
        let mut w = StatusWriter::new(claim, ctx);
        w.set(SCHEDULED, false, "InvalidLabels", e.to_string());
        w.write().await?;
        return Ok(None);
    }
    // One decision at a time, on complete caches, so maxCapacity holds under concurrency.
    // The decision is reserved in memory before the lock is released; the status write
    // happens outside it and gives the reservation back if it fails.
    ctx.wait_synced().await;
    let decision = {
        let mut reservations = ctx.scheduling.lock().await;
        if reservations.scheduled.contains_key(&uid) {
            // This process scheduled the claim already; the cache has not caught up yet.
            return Err(Error::Conflict(format!(
                "NodeClaim {} (cache behind)",
                claim.name_any()
            )));
        }
        let catalogue = catalogue(ctx);
        let claimed = claimed_counts(ctx, &reservations);
        let decision = scheduling::choose(&catalogue, &request, &claimed).cloned();
        if let Ok(t) = &decision {
            reservations.scheduled.insert(uid.clone(), t.name.clone());
        }
        decision
    };
    let chosen = match decision {
        Ok(t) => t,
        Err(nofit) => {
            let mut w = StatusWriter::new(claim, ctx);
            w.set(SCHEDULED, false, nofit.reason, nofit.message);
            w.write().await?;
            return Ok(None);
        }
    };
    let vm_name = template::vm_name_for_claim(
        &claim.namespace().unwrap_or_default(),
        &claim.name_any(),
        &uid,
    );
    let mut w = StatusWriter::new(claim, ctx);
    w.new.type_ref = Some(chosen.name.clone());
    w.new.cost = Some(chosen.cost);
    w.new.host_cluster = Some(chosen.host_cluster.clone());
    w.new.vm_namespace = Some(chosen.vm_namespace.clone());
    w.new.vm_name = Some(vm_name.clone());
    w.new.provider_id = Some(format!("kubevirt://{vm_name}"));
    w.set(
        SCHEDULED,
        true,
        "Scheduled",
        format!(
            "scheduled to node type {} (cost {}) as VM {}/{}",
            chosen.name, chosen.cost, chosen.vm_namespace, vm_name
        ),
    );
    w.set(
        PROVISIONED,
        false,
        "Creating",
        "creating the VirtualMachine",
    );
    let written = match w.write().await {
        Ok(c) => c,
        Err(e) => {
            ctx.scheduling.lock().await.scheduled.remove(&uid);
            return Err(e);
        }
    };
    let _ = ctx.wake_types.unbounded_send(ObjectRef::new(&chosen.name));
    Ok(Some(Scheduled {
        node_type: chosen,
        claim: written,
    }))
}

fn remote_err(
    remote: &Remote,
    context: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error + '_ {
    let context = context.into();
    move |source| Error::Remote {
        cluster: remote.key.to_string(),
        on_host: matches!(remote.key, ClusterKey::Host(_)),
        context,
        source,
    }
}

/// Runs a remote call with a timeout, counting it in `autonodes_cluster_requests_total`.
pub(super) async fn remote_call<T>(
    ctx: &Context,
    remote: &Remote,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    let result = match tokio::time::timeout(REMOTE_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {}s", REMOTE_TIMEOUT.as_secs()).into(),
        )),
    };
    ctx.metrics
        .remote_request(&remote.key.metric_label(), &result);
    result.map_err(remote_err(remote, what))
}

/// A 401 or 403 from a cluster.
fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 401 || s.code == 403)
}

pub(super) fn not_found(e: &Error) -> bool {
    matches!(e, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 404)
}

async fn get_opt<K>(
    ctx: &Context,
    remote: &Remote,
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<K>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    remote_call(ctx, remote, what, api.get_opt(name)).await
}

/// An object from a remote watch cache when the cache is live (`cached` is `Some`), else
/// from the API server.
async fn read<K>(
    ctx: &Context,
    remote: &Remote,
    cached: Option<Option<Arc<K>>>,
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<Arc<K>>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match cached {
        Some(found) => Ok(found),
        None => Ok(get_opt(ctx, remote, api, name, what).await?.map(Arc::new)),
    }
}

/// A claim in the provisioning stages: host objects, token, readiness ladder, timeouts.
async fn provision(
    claim: &NodeClaim,
    ctx: &Context,
    t: &PreparedType,
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
        .unwrap_or_else(|| t.vm_namespace.clone());
    let host_cluster = status
        .host_cluster
        .clone()
        .unwrap_or_else(|| t.host_cluster.clone());
    let mut w = StatusWriter::new(claim, ctx);

    let host = match ctx.clients.host(&host_cluster).await {
        Ok(h) => h,
        Err(e) => {
            w.set(PROVISIONED, false, e.reason(), e.to_string());
            w.write().await?;
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    };
    let vms: Api<DynamicObject> =
        Api::namespaced_with(host.client.clone(), &vm_ns, &kubevirt::virtual_machine());
    let vmis: Api<DynamicObject> = Api::namespaced_with(
        host.client.clone(),
        &vm_ns,
        &kubevirt::virtual_machine_instance(),
    );
    let secrets: Api<Secret> = Api::namespaced(host.client.clone(), &vm_ns);
    let secret_name = template::user_data_secret_name(&vm_name);

    // 1. Host objects: the Secret first, then the VM (both only created, never rewritten).
    let cached_vm = host
        .host_cache()
        .and_then(|c| c.vms.get(Some(&vm_ns), &vm_name));
    let vm = match read(
        ctx,
        &host,
        cached_vm,
        &vms,
        &vm_name,
        "reading the VirtualMachine",
    )
    .await
    {
        Ok(vm) => vm,
        Err(e) => return remote_failure(claim, w, e, Side::Host).await,
    };
    let vm = match vm {
        Some(vm) => vm,
        None => {
            if conditions::is_true(&status.conditions, PROVISIONED) {
                // The VM vanished after it ran: the claim failed.
                return fail(
                    claim,
                    ctx,
                    w,
                    "VirtualMachineLost",
                    format!("VirtualMachine {vm_ns}/{vm_name} disappeared from {host_cluster}"),
                )
                .await;
            }
            let secret = match get_opt(
                ctx,
                &host,
                &secrets,
                &secret_name,
                "reading the user-data Secret",
            )
            .await
            {
                Ok(s) => s,
                Err(e) => return remote_failure(claim, w, e, Side::Host).await,
            };
            let join = if secret.is_none() {
                let token = match ensure_token(claim, ctx, tenant).await {
                    Ok(token) => token,
                    Err(e) => return remote_failure(claim, w, e, Side::Tenant).await,
                };
                match join_params(tenant, &token) {
                    Ok(j) => j,
                    Err((reason, message)) => {
                        w.set(PROVISIONED, false, reason, message);
                        w.write().await?;
                        return Ok(Action::requeue(Duration::from_secs(30)));
                    }
                }
            } else {
                // The Secret exists from an earlier attempt: only the VM is missing, and the
                // VM does not depend on the join parameters.
                JoinParams::placeholder()
            };
            let rendered = match render_for(claim, t, &vm_name, &vm_ns, &join) {
                Ok(r) => r,
                Err(e) => {
                    w.set(PROVISIONED, false, render_reason(&e), e.to_string());
                    w.write().await?;
                    return Ok(Action::requeue(Duration::from_secs(60)));
                }
            };
            if secret.is_none() {
                let created = remote_call(
                    ctx,
                    &host,
                    "creating the user-data Secret",
                    secrets.create(&PostParams::default(), &rendered.secret),
                )
                .await;
                match created {
                    Ok(_) => {}
                    Err(e) if matches!(&e, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 409) =>
                        {}
                    Err(e) => return remote_failure(claim, w, e, Side::Host).await,
                }
            }
            let vm_obj: DynamicObject = serde_json::from_value(rendered.vm)
                .map_err(|e| Error::Internal(format!("rendered VM is not an object: {e}")))?;
            let created = remote_call(
                ctx,
                &host,
                "creating the VirtualMachine",
                vms.create(&PostParams::default(), &vm_obj),
            )
            .await;
            let vm = match created {
                Ok(vm) => {
                    let vm = Arc::new(vm);
                    ctx.metrics
                        .nodeclaims_created
                        .with_label_values::<&str>(&[])
                        .inc();
                    tracing::info!(nodeclaim = %claim.name_any(), vm = %format!("{vm_ns}/{vm_name}"), cluster = %host_cluster, "created VirtualMachine");
                    vm
                }
                Err(e) if matches!(&e, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 409) => {
                    match get_opt(ctx, &host, &vms, &vm_name, "reading the VirtualMachine").await {
                        Ok(Some(vm)) => Arc::new(vm),
                        Ok(None) => return Ok(Action::requeue(Duration::from_secs(1))),
                        Err(e) => return remote_failure(claim, w, e, Side::Host).await,
                    }
                }
                Err(e) => {
                    // The API server refused the VM (e.g. an invalid template for this host).
                    if let Error::Remote {
                        source: kube::Error::Api(s),
                        ..
                    } = &e
                    {
                        if s.code == 422 || s.code == 400 {
                            w.set(
                                PROVISIONED,
                                false,
                                "VirtualMachineRejected",
                                format!(
                                    "{host_cluster} rejected the VirtualMachine: {}",
                                    status_message(s)
                                ),
                            );
                            w.write().await?;
                            return Ok(Action::requeue(Duration::from_secs(60)));
                        }
                    }
                    return remote_failure(claim, w, e, Side::Host).await;
                }
            };
            vm
        }
    };

    // 2. Provisioned: the VM runs.
    let cached_vmi = host
        .host_cache()
        .and_then(|c| c.vmis.get(Some(&vm_ns), &vm_name));
    let vmi = match read(
        ctx,
        &host,
        cached_vmi,
        &vmis,
        &vm_name,
        "reading the VirtualMachineInstance",
    )
    .await
    {
        Ok(v) => v,
        Err(e) => return remote_failure(claim, w, e, Side::Host).await,
    };
    let running =
        kubevirt::vm_ready(&vm) || vmi.as_deref().and_then(kubevirt::vmi_phase) == Some("Running");
    if !running {
        let since = conditions::true_since(&status.conditions, SCHEDULED).unwrap_or_else(now);
        let waited = elapsed_since(since);
        if waited > ctx.config.launch_timeout {
            return fail(
                claim,
                ctx,
                w,
                "LaunchTimeout",
                format!(
                    "VirtualMachine {vm_ns}/{vm_name} did not run within {}s",
                    ctx.config.launch_timeout.as_secs()
                ),
            )
            .await;
        }
        let phase = vmi
            .as_deref()
            .and_then(kubevirt::vmi_phase)
            .unwrap_or("none yet")
            .to_string();
        w.set(
            PROVISIONED,
            false,
            "Booting",
            format!(
                "VirtualMachine {vm_ns}/{vm_name} is not running yet (instance phase: {phase})"
            ),
        );
        w.write().await?;
        return Ok(Action::requeue(remaining(
            ctx.config.launch_timeout,
            waited,
            Duration::from_secs(30),
        )));
    }
    if !conditions::is_true(&w.new.conditions, PROVISIONED) {
        let ip = vmi
            .as_deref()
            .and_then(kubevirt::vmi_ip)
            .map(|ip| format!(" at {ip}"))
            .unwrap_or_default();
        w.set(
            PROVISIONED,
            true,
            "Running",
            format!("VirtualMachine {vm_ns}/{vm_name} runs{ip}"),
        );
    }

    // 3. Joined: a Node with our provider ID.
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let cached_node = tenant
        .tenant_cache()
        .and_then(|c| c.nodes.get(None, &vm_name));
    let node = match read(
        ctx,
        tenant,
        cached_node,
        &nodes,
        &vm_name,
        "reading the Node",
    )
    .await
    {
        Ok(n) => n,
        Err(e) => return remote_failure(claim, w, e, Side::Tenant).await,
    };
    let provider_id = format!("kubevirt://{vm_name}");
    let node = node.filter(|n| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
    });
    let Some(node) = node else {
        let since = conditions::true_since(&w.new.conditions, PROVISIONED).unwrap_or_else(now);
        let waited = elapsed_since(since);
        if waited > ctx.config.registration_timeout {
            return fail(
                claim,
                ctx,
                w,
                "RegistrationTimeout",
                format!(
                    "no Node with providerID {provider_id} joined within {}s",
                    ctx.config.registration_timeout.as_secs()
                ),
            )
            .await;
        }
        w.set(
            JOINED,
            false,
            "WaitingForNode",
            format!("waiting for a Node with providerID {provider_id} in the tenant"),
        );
        w.write().await?;
        return Ok(Action::requeue(remaining(
            ctx.config.registration_timeout,
            waited,
            Duration::from_secs(30),
        )));
    };
    let node_name = node.name_any();
    w.new.node_name = Some(node_name.clone());
    let node = match sync_node(claim, ctx, tenant, t, &node).await {
        Ok(Some(patched)) => Arc::new(patched),
        Ok(None) => node,
        Err(e) => return remote_failure(claim, w, e, Side::Tenant).await,
    };
    if !conditions::is_true(&w.new.conditions, JOINED) {
        w.set(
            JOINED,
            true,
            "NodeJoined",
            format!("Node {node_name} joined the tenant"),
        );
        // The token has done its job.
        if let Err(e) = delete_tokens(ctx, tenant, &uid(claim)?).await {
            return remote_failure(claim, w, e, Side::Tenant).await;
        }
    }

    // 4. Ready: the Node is Ready and no startup taint is left.
    let ready = node_ready(&node);
    let startup_left: Vec<String> = startup_taints(claim)
        .iter()
        .filter(|st| {
            node_taints(&node)
                .iter()
                .any(|nt| nt.key == st.key && nt.effect == st.effect)
        })
        .map(|t| t.key.clone())
        .collect();
    if ready && startup_left.is_empty() {
        w.set(
            READY,
            true,
            "NodeReady",
            format!("Node {node_name} is Ready"),
        );
        w.write().await?;
        Ok(Action::requeue(Duration::from_secs(300)))
    } else {
        let message = if !ready {
            format!("Node {node_name} is not Ready yet")
        } else {
            format!(
                "Node {node_name} still has startup taints: {}",
                startup_left.join(", ")
            )
        };
        w.set(READY, false, "NodeNotReady", message);
        w.write().await?;
        Ok(Action::requeue(Duration::from_secs(30)))
    }
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

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn startup_taints(claim: &NodeClaim) -> Vec<Taint> {
    claim.spec.startup_taints.clone()
}

/// Sets the labels the kubelet could not, and removes the registration taint. Returns the
/// Node as patched, or None when it needed nothing.
async fn sync_node(
    claim: &NodeClaim,
    ctx: &Context,
    tenant: &Remote,
    t: &PreparedType,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let properties = scheduling::node_properties(t, None, &claim.spec);
    let labels = scheduling::node_labels(&properties, None, &claim.spec.labels, &BTreeMap::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let current = node.labels();
    let missing: BTreeMap<&String, &String> = labels
        .after_join
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .collect();
    let taints = node_taints(node);
    let has_registration = taints.iter().any(|t| t.key == REGISTRATION_TAINT_KEY);
    if missing.is_empty() && !has_registration {
        return Ok(None);
    }
    let kept: Vec<&Taint> = taints
        .iter()
        .filter(|t| t.key != REGISTRATION_TAINT_KEY)
        .collect();
    // A JSON patch: labels are added one by one; the taints are replaced only if they are
    // still the ones read (a `test` op), so the kubelet's status heartbeats, which change
    // the Node's resourceVersion, do not make the patch conflict.
    let mut ops: Vec<serde_json::Value> = Vec::new();
    if current.is_empty() && !missing.is_empty() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    for (k, v) in &missing {
        ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", json_pointer_escape(k)), "value": v}));
    }
    if has_registration {
        ops.push(json!({"op": "test", "path": "/spec/taints", "value": taints}));
        if kept.is_empty() {
            ops.push(json!({"op": "remove", "path": "/spec/taints"}));
        } else {
            ops.push(json!({"op": "replace", "path": "/spec/taints", "value": kept}));
        }
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Internal(format!("building the Node patch: {e}")))?;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let patched = remote_call(
        ctx,
        tenant,
        "updating the Node's labels and taints",
        nodes.patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        ),
    )
    .await;
    match patched {
        Ok(n) => Ok(Some(n)),
        // The taints changed since they were read (`test` failed): look again.
        Err(Error::Remote {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 422 && has_registration => Err(Error::Conflict(format!(
            "Node {} (taints changed)",
            node.name_any()
        ))),
        Err(e) => Err(e),
    }
}

/// A JSON pointer segment for `key` (`~` → `~0`, `/` → `~1`).
fn json_pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A fresh random bootstrap token.
fn new_token() -> BootstrapToken {
    let mut bytes = Vec::new();
    BootstrapToken::from_random(|| {
        if bytes.is_empty() {
            bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        bytes.pop().unwrap_or(0)
    })
}

/// Join parameters for the tenant: its endpoint, the token, and its CA's hash.
fn join_params(
    tenant: &Remote,
    token: &BootstrapToken,
) -> Result<JoinParams, (&'static str, String)> {
    let ca = tenant.ca_pem.as_deref().ok_or((
        "TenantCANotFound",
        format!(
            "the kubeconfig of the {} has no certificate-authority-data, so nodes cannot verify it",
            tenant.key
        ),
    ))?;
    let hash = userdata::ca_cert_hash(ca).map_err(|e| {
        (
            "InvalidTenantCA",
            format!("the CA of the {}: {e}", tenant.key),
        )
    })?;
    let endpoint = tenant.endpoint().map_err(|e| {
        (
            "InvalidKubeconfig",
            format!("the kubeconfig of the {}: {e}", tenant.key),
        )
    })?;
    Ok(JoinParams {
        api_server_endpoint: endpoint,
        token: token.token(),
        ca_cert_hashes: vec![hash],
    })
}

/// Renders the claim's Secret and VM for its type (the Node gets the claim's identity
/// labels, so tenant Node events find the claim).
fn render_for(
    claim: &NodeClaim,
    t: &PreparedType,
    vm_name: &str,
    vm_ns: &str,
    join: &JoinParams,
) -> Result<RenderedNode, RenderError> {
    let mut t = t.clone();
    t.vm_namespace = vm_ns.to_string();
    render::render_node(&t, claim, None, vm_name, join)
}

/// The condition reason for a render error.
fn render_reason(e: &RenderError) -> &'static str {
    match e {
        RenderError::UserData {
            source: UserDataError::TooLarge { .. },
            ..
        } => "UserDataTooLarge",
        RenderError::UserData { .. } => "InvalidUserData",
        RenderError::Labels { .. } => "InvalidLabels",
        RenderError::Taints { .. } => "InvalidTaints",
        RenderError::Template { .. } => "InvalidTemplate",
        RenderError::TypeUnusable { .. } => "NodeTypeUnavailable",
        RenderError::Request { .. } => "InvalidRequest",
        RenderError::NoFit { source, .. } => source.reason,
        RenderError::MissingField { .. } => "InvalidClaim",
    }
}

fn secret_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// Returns the claim's live bootstrap token in the tenant, creating one if needed, and
/// deleting any other (at most one live token per claim).
async fn ensure_token(
    claim: &NodeClaim,
    ctx: &Context,
    tenant: &Remote,
) -> Result<BootstrapToken, Error> {
    let uid = uid(claim)?;
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let existing = tokens_of(ctx, tenant, &uid).await?;
    let min_left = now().as_second() + 60;
    let mut found = None;
    for s in existing {
        let expires = secret_text(&s, "expiration")
            .and_then(|e| e.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_second())
            .unwrap_or(0);
        match (
            &found,
            secret_text(&s, "token-id"),
            secret_text(&s, "token-secret"),
        ) {
            (None, Some(id), Some(secret)) if expires > min_left => {
                found = BootstrapToken::parse(&format!("{id}.{secret}"))
            }
            _ => {
                let _ = remote_call(
                    ctx,
                    tenant,
                    "deleting a stale bootstrap token",
                    secrets.delete(&s.name_any(), &DeleteParams::default()),
                )
                .await;
            }
        }
    }
    if let Some(token) = found {
        return Ok(token);
    }
    let token = new_token();
    let expiration = now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            ctx.config.registration_timeout.as_secs() as i64,
        ))
        .map_err(|e| Error::Internal(e.to_string()))?;
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id().to_string()),
        ("token-secret", token.secret().to_string()),
        ("expiration", expiration.to_string()),
        ("usage-bootstrap-authentication", "true".into()),
        ("usage-bootstrap-signing", "true".into()),
        ("auth-extra-groups", TOKEN_GROUP.into()),
        (
            "description",
            format!(
                "autonodes join token for NodeClaim {}/{}",
                claim.namespace().unwrap_or_default(),
                claim.name_any()
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(claim_labels(claim)),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        data: Some(data),
        ..Default::default()
    };
    remote_call(
        ctx,
        tenant,
        "creating a bootstrap token",
        secrets.create(&PostParams::default(), &secret),
    )
    .await?;
    tracing::info!(nodeclaim = %claim.name_any(), token_id = %token.id(), "created bootstrap token");
    Ok(token)
}

/// The claim's bootstrap-token Secrets: from the tenant's token cache when it is live, else
/// listed by the claim's UID label.
async fn tokens_of(ctx: &Context, tenant: &Remote, uid: &str) -> Result<Vec<Arc<Secret>>, Error> {
    let ours = |s: &Secret| s.labels().get(LABEL_NODECLAIM_UID).map(String::as_str) == Some(uid);
    if let Some(found) = tenant.tenant_cache().and_then(|c| c.tokens.filter(ours)) {
        return Ok(found);
    }
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let listed = remote_call(
        ctx,
        tenant,
        "listing bootstrap tokens",
        secrets.list(&ListParams::default().labels(&uid_selector(uid))),
    )
    .await?;
    Ok(listed.items.into_iter().map(Arc::new).collect())
}

async fn delete_tokens(ctx: &Context, tenant: &Remote, uid: &str) -> Result<usize, Error> {
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let existing = tokens_of(ctx, tenant, uid).await?;
    let n = existing.len();
    for s in existing {
        match remote_call(
            ctx,
            tenant,
            "deleting a bootstrap token",
            secrets.delete(&s.name_any(), &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Which cluster a failed remote call went to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Host,
    Tenant,
}

/// Records a failed host or tenant call on the condition of the stage the claim is in
/// (reason `{Host,Tenant}Forbidden` for 401/403, else `{Host,Tenant}Unreachable`) and
/// retries later.
async fn remote_failure(
    claim: &NodeClaim,
    mut w: StatusWriter<'_>,
    e: Error,
    side: Side,
) -> Result<Action, Error> {
    if matches!(&e, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 409) {
        // A remote object changed under us (e.g. the kubelet updated the Node): not a
        // failure of the cluster; look again at once.
        return Err(Error::Conflict(e.to_string()));
    }
    let c = &w.new.conditions;
    let stage = match side {
        Side::Host if conditions::is_true(c, PROVISIONED) => READY,
        Side::Host => PROVISIONED,
        Side::Tenant if conditions::is_true(c, JOINED) => READY,
        Side::Tenant if conditions::is_true(c, PROVISIONED) => JOINED,
        Side::Tenant => PROVISIONED,
    };
    let refused = matches!(&e, Error::Remote { source, .. } if forbidden(source));
    let reason = match (side, refused) {
        (Side::Host, true) => "HostForbidden",
        (Side::Host, false) => "HostUnreachable",
        (Side::Tenant, true) => "TenantForbidden",
        (Side::Tenant, false) => "TenantUnreachable",
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
    reason: &str,
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
        let mut r = ctx.scheduling.lock().await;
        r.scheduled.remove(&uid);
    }
    ctx.wake_pending_claims();
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        let _ = ctx.wake_types.unbounded_send(ObjectRef::new(t));
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Progress of removing a claim's remote objects.
enum Removal {
    /// Everything is gone.
    Done,
    /// Still waiting (the reason says for what).
    Waiting(String),
}

/// Removes everything the claim has in other clusters, in this order: drain the Node
/// (with `drain`), delete the VM and wait until it is gone, then delete the Node (deleting
/// it earlier would let a still-running kubelet register it again), the user-data Secret,
/// the DataVolumes and the bootstrap tokens.
async fn remove_remote_objects(
    claim: &NodeClaim,
    ctx: &Context,
    drain: bool,
) -> Result<Removal, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let Some(vm_name) = status.vm_name.clone() else {
        return Ok(Removal::Done);
    };
    let uid = uid(claim)?;
    let ns = claim.namespace().unwrap_or_default();
    let provider_id = format!("kubevirt://{vm_name}");
    let node_name = status.node_name.clone().unwrap_or_else(|| vm_name.clone());

    // The tenant. A vCluster whose kubeconfig Secret is gone has been deleted with its
    // nodes: nothing is left there to clean.
    let tenant = match ctx
        .clients
        .tenant(&ns, &claim.spec.v_cluster_ref.name)
        .await
    {
        Ok(t) => Some(t),
        Err(ClientError::SecretNotFound { .. }) => {
            tracing::info!(nodeclaim = %claim.name_any(), "tenant kubeconfig Secret is gone; skipping tenant cleanup");
            None
        }
        Err(e) => return Err(e.into()),
    };
    let our_node = |n: &Node| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
    };
    if let (Some(tenant), true) = (&tenant, drain) {
        let nodes: Api<Node> = Api::all(tenant.client.clone());
        let cached = tenant
            .tenant_cache()
            .and_then(|c| c.nodes.get(None, &node_name));
        if let Some(node) =
            read(ctx, tenant, cached, &nodes, &node_name, "reading the Node").await?
        {
            if our_node(&node) {
                if let Some(waiting) = drain_node(claim, ctx, tenant, &node).await? {
                    return Ok(Removal::Waiting(waiting));
                }
            }
        }
    }

    // The host: delete the VM and wait until it is gone, then its Secret and DataVolumes.
    let host_cluster = status.host_cluster.clone().unwrap_or_default();
    let vm_ns = status.vm_namespace.clone().unwrap_or_default();
    let host = ctx.clients.host(&host_cluster).await?;
    let vms: Api<DynamicObject> =
        Api::namespaced_with(host.client.clone(), &vm_ns, &kubevirt::virtual_machine());
    let cached = host
        .host_cache()
        .and_then(|c| c.vms.get(Some(&vm_ns), &vm_name));
    if let Some(vm) = read(
        ctx,
        &host,
        cached,
        &vms,
        &vm_name,
        "reading the VirtualMachine",
    )
    .await?
    {
        if vm.metadata.deletion_timestamp.is_none() {
            match remote_call(
                ctx,
                &host,
                "deleting the VirtualMachine",
                vms.delete(&vm_name, &DeleteParams::background()),
            )
            .await
            {
                Ok(_) => {}
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
            ctx.event(
                claim,
                EventType::Normal,
                "VirtualMachineDeleting",
                "Delete",
                format!("deleting VirtualMachine {vm_ns}/{vm_name}"),
            )
            .await;
        }
        return Ok(Removal::Waiting(format!(
            "VirtualMachine {vm_ns}/{vm_name} is being deleted"
        )));
    }
    let secrets: Api<Secret> = Api::namespaced(host.client.clone(), &vm_ns);
    // The user-data Secret by its name (no list), then any other the claim's UID labels.
    // The lists are served from the API server's watch cache: deleting 1,000 claims must
    // not read every Secret of the namespace from etcd 1,000 times. The Secret was created
    // before the VM, which is gone by now, so the cache has seen it; anything it still
    // missed is the orphan sweep's.
    match remote_call(
        ctx,
        &host,
        "deleting the user-data Secret",
        secrets.delete(
            &template::user_data_secret_name(&vm_name),
            &DeleteParams::default(),
        ),
    )
    .await
    {
        Ok(_) => {}
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(e),
    }
    let selector = ListParams::default()
        .labels(&uid_selector(&uid))
        .match_any();
    for s in remote_call(
        ctx,
        &host,
        "listing user-data Secrets",
        secrets.list_metadata(&selector),
    )
    .await?
    .items
    {
        match remote_call(
            ctx,
            &host,
            "deleting the user-data Secret",
            secrets.delete(&s.name_any(), &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let dvs: Api<DynamicObject> =
        Api::namespaced_with(host.client.clone(), &vm_ns, &kubevirt::data_volume());
    match remote_call(
        ctx,
        &host,
        "listing DataVolumes",
        dvs.list_metadata(&selector),
    )
    .await
    {
        Ok(list) => {
            for dv in list.items {
                match remote_call(
                    ctx,
                    &host,
                    "deleting a DataVolume",
                    dvs.delete(&dv.name_any(), &DeleteParams::default()),
                )
                .await
                {
                    Ok(_) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // A host without CDI has no DataVolumes to delete.
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(e),
    }

    // The tenant again: the Node (its VM is gone, nothing re-registers it) and the tokens.
    if let Some(tenant) = &tenant {
        let nodes: Api<Node> = Api::all(tenant.client.clone());
        let cached = tenant
            .tenant_cache()
            .and_then(|c| c.nodes.get(None, &node_name));
        if let Some(node) =
            read(ctx, tenant, cached, &nodes, &node_name, "reading the Node").await?
        {
            if our_node(&node) {
                match remote_call(
                    ctx,
                    tenant,
                    "deleting the Node",
                    nodes.delete(&node_name, &DeleteParams::default()),
                )
                .await
                {
                    Ok(_) => {
                        ctx.event(
                            claim,
                            EventType::Normal,
                            "NodeDeleted",
                            "Delete",
                            format!("deleted Node {node_name} from the tenant"),
                        )
                        .await
                    }
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        delete_tokens(ctx, tenant, &uid).await?;
    }
    Ok(Removal::Done)
}

/// Cordons the Node and evicts its pods (DaemonSet and mirror pods stay). Returns what it
/// waits for, or None when the Node may be deleted (drained, or the drain timed out).
async fn drain_node(
    claim: &NodeClaim,
    ctx: &Context,
    tenant: &Remote,
    node: &Node,
) -> Result<Option<String>, Error> {
    let name = node.name_any();
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    if !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        remote_call(
            ctx,
            tenant,
            "cordoning the Node",
            nodes.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
            ),
        )
        .await?;
        ctx.event(
            claim,
            EventType::Normal,
            "NodeCordoned",
            "Delete",
            format!("cordoned Node {name}"),
        )
        .await;
    }
    let pods: Api<Pod> = Api::all(tenant.client.clone());
    let on_node = remote_call(
        ctx,
        tenant,
        "listing the Node's pods",
        pods.list(&ListParams::default().fields(&format!("spec.nodeName={name}"))),
    )
    .await?;
    let evictable: Vec<&Pod> = on_node
        .items
        .iter()
        .filter(|p| {
            let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
            let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
            let done = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded") | Some("Failed")
            );
            !daemon && !mirror && !done
        })
        .collect();
    if evictable.is_empty() {
        return Ok(None);
    }
    let deleting_since = claim
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(now);
    if elapsed_since(deleting_since) > ctx.config.drain_timeout {
        ctx.event(
            claim,
            EventType::Warning,
            "DrainTimeout",
            "Delete",
            format!(
                "{} pod(s) still on Node {name} after {}s; deleting the Node anyway",
                evictable.len(),
                ctx.config.drain_timeout.as_secs()
            ),
        )
        .await;
        return Ok(None);
    }
    for p in &evictable {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let api: Api<Pod> =
            Api::namespaced(tenant.client.clone(), &p.namespace().unwrap_or_default());
        match remote_call(
            ctx,
            tenant,
            "evicting a pod",
            api.evict(&p.name_any(), &EvictParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            // 429: a PodDisruptionBudget forbids it now; retry later.
            Err(Error::Remote {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 429 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(format!(
        "draining Node {name}: {} pod(s) left",
        evictable.len()
    )))
}

async fn cleanup(claim: &NodeClaim, ctx: &Context) -> Result<Action, Error> {
    if let Some(uid) = claim.uid() {
        if ctx.scheduling.lock().await.released.contains(&uid) {
            // Cleaned up already; this run saw a cached copy from before the finalizer was
            // released (a remote watch woke the claim meanwhile). Counting or deleting again
            // would be wrong; Ok lets the finalizer helper release the finalizer if it holds.
            return Ok(Action::await_change());
        }
    }
    let mut w = StatusWriter::new(claim, ctx);
    w.new.phase = Some(NodeClaimPhase::Terminating);
    let result = remove_remote_objects(claim, ctx, true).await;
    match result {
        Ok(Removal::Done) => {}
        Ok(Removal::Waiting(why)) => {
            w.set(READY, false, "Terminating", why.clone());
            w.write().await?;
            // An error keeps the finalizer (Ok would release it).
            return Err(Error::Waiting(why));
        }
        Err(e) => {
            let reason = match &e {
                Error::Client(c) => c.reason(),
                Error::Remote {
                    on_host: true,
                    source,
                    ..
                } if forbidden(source) => "HostForbidden",
                Error::Remote { on_host: true, .. } => "HostUnreachable",
                Error::Remote { source, .. } if forbidden(source) => "TenantForbidden",
                Error::Remote { .. } => "TenantUnreachable",
                _ => "CleanupFailed",
            };
            w.set(
                READY,
                false,
                reason,
                format!("cannot remove the claim's objects yet: {e}"),
            );
            tracing::warn!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %reason, error = %e, "cleanup blocked; the finalizer stays");
            w.write().await?;
            // An error keeps the finalizer: kube-runtime's finalizer helper releases it on
            // Ok, and the VM, Secret or token this step guards may still exist.
            return Err(Error::CleanupBlocked {
                reason,
                message: e.to_string(),
            });
        }
    }
    let uid = uid(claim)?;
    {
        let mut r = ctx.scheduling.lock().await;
        r.scheduled.remove(&uid);
        r.released.insert(uid.clone());
        // Now and then, forget releases whose claims the store no longer holds.
        if r.released.len() % 256 == 0 {
            let live: HashSet<String> = ctx.claims.state().iter().filter_map(|c| c.uid()).collect();
            r.released.retain(|u| live.contains(u));
        }
    }
    ctx.forget_written(&uid);
    if claim.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed) {
        ctx.metrics
            .nodeclaims_terminated
            .with_label_values(&["deleted"])
            .inc();
    }
    ctx.wake_pending_claims();
    if let Some(t) = claim.status.as_ref().and_then(|s| s.type_ref.as_ref()) {
        let _ = ctx.wake_types.unbounded_send(ObjectRef::new(t));
    }
    tracing::info!(nodeclaim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), "claim cleaned up");
    Ok(Action::await_change())
}
