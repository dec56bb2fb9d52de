//! The claim's status as one reconcile changes it: conditions set in memory, the phase
//! derived from them, one conditional write at the end, Events and stage durations only
//! after that write succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::context::ClaimContext;
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::status::apply_status;
use crate::controller::status::report_changes;
use autonodes_api::conditions::{self, status_of, TRUE};
use autonodes_api::reasons::{ClaimCondition, ClaimReason};
use autonodes_api::{NodeClaim, NodeClaimPhase, NodeClaimStatus};

/// Condition: a node type was chosen.
pub(crate) const SCHEDULED: ClaimCondition = ClaimCondition::Scheduled;
/// Condition: the VM runs.
pub(crate) const PROVISIONED: ClaimCondition = ClaimCondition::Provisioned;
/// Condition: the VM's Node registered in the tenant.
pub(crate) const JOINED: ClaimCondition = ClaimCondition::Joined;
/// Condition: the Node was Ready without startup taints once (stays True).
pub(crate) const INITIALIZED: ClaimCondition = ClaimCondition::Initialized;
/// Condition: the Node is Ready and no startup taint is left.
pub(crate) const READY: ClaimCondition = ClaimCondition::Ready;
/// Condition (only while True): the node type changed since the claim was scheduled.
pub(crate) const DRIFTED: ClaimCondition = ClaimCondition::Drifted;
/// Condition (while, and after, the VM must leave a drained host node).
pub(crate) const HOST_MAINTENANCE: ClaimCondition = ClaimCondition::HostMaintenance;

/// How long a stage reached before the last one (the VM running, the Node joined but not
/// Ready yet) waits before it is written: stages reached meanwhile go out with it (a VM
/// that runs at once and whose Node joins Ready a moment later costs one write instead of
/// three). The last stage (`Ready`), problems and failures are written at once; so is the
/// first write (the chosen type and VM name).
pub(crate) const STATUS_WRITE_GAP: Duration = Duration::from_secs(5);

/// Collects the changes of one reconcile to a claim's status and writes them at once.
pub(crate) struct StatusWriter<'a> {
    claim: &'a NodeClaim,
    ctx: &'a ClaimContext,
    old: NodeClaimStatus,
    pub(super) new: NodeClaimStatus,
}

impl<'a> StatusWriter<'a> {
    pub(super) fn new(claim: &'a NodeClaim, ctx: &'a ClaimContext) -> Self {
        let old = claim.status.clone().unwrap_or_default();
        StatusWriter {
            claim,
            ctx,
            new: old.clone(),
            old,
        }
    }

    /// True when the condition was True before this reconcile.
    pub(super) fn was_true(&self, type_: ClaimCondition) -> bool {
        conditions::is_true(&self.old.conditions, type_)
    }

    /// True when the condition is True in the status as changed so far.
    pub(super) fn is_true(&self, type_: ClaimCondition) -> bool {
        conditions::is_true(&self.new.conditions, type_)
    }

    /// Since when the condition is True in the status as changed so far.
    pub(super) fn true_since(&self, type_: ClaimCondition) -> Option<k8s_openapi::jiff::Timestamp> {
        conditions::true_since(&self.new.conditions, type_)
    }

    /// Since when the condition has had its present status, in the status as changed so
    /// far; None when the claim does not have it.
    pub(super) fn since(&self, type_: ClaimCondition) -> Option<k8s_openapi::jiff::Timestamp> {
        conditions::get(&self.new.conditions, type_).map(|c| c.last_transition_time.0)
    }

    /// Sets a condition of the claim.
    pub(super) fn set(
        &mut self,
        type_: ClaimCondition,
        ok: bool,
        reason: impl Into<ClaimReason>,
        message: impl Into<String>,
    ) {
        conditions::set(
            &mut self.new.conditions,
            type_,
            status_of(ok),
            reason.into(),
            message,
            self.claim.metadata.generation,
            now(),
        );
    }

    /// The reason of a condition in the status as changed so far, if it has one autonodes
    /// knows.
    pub(super) fn reason(&self, type_: ClaimCondition) -> Option<ClaimReason> {
        conditions::get(&self.new.conditions, type_).and_then(|c| ClaimReason::parse(&c.reason))
    }

    /// Removes a condition (one that is only present while True, as `Drifted`).
    pub(super) fn remove(&mut self, type_: ClaimCondition) {
        self.new.conditions.retain(|c| c.type_ != type_.as_str());
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
        // The reason column follows the conditions, so progress alone changes it no more.
        compared.reason = autonodes_core::claim::reason(&compared.conditions);
        compared != self.old
    }

    /// True when every condition that changed is True or a progress reason: nothing a user
    /// must look at, and no failure.
    fn only_progress(&self) -> bool {
        let phase = self.new.phase;
        phase != Some(NodeClaimPhase::Failed)
            && phase != Some(NodeClaimPhase::Terminating)
            && self.new.conditions.iter().all(|c| {
                let unchanged = conditions::get(&self.old.conditions, &c.type_) == Some(c);
                // A VM leaving its host node is told at once.
                unchanged
                    || (c.type_ != HOST_MAINTENANCE.as_str()
                        && (c.status == TRUE || conditions::is_progress(&c.reason)))
            })
    }

    /// Like [`StatusWriter::write`], but a change that is only progress on the way to
    /// `Ready` (stages reached, nothing wrong, not Ready yet) is written once it has waited
    /// [`STATUS_WRITE_GAP`]: until then this returns how long to wait, and the reconcile
    /// after that (or the change that wakes the claim first) writes it together with
    /// whatever else was reached meanwhile.
    pub(super) async fn write_or_defer(mut self) -> Result<Option<Duration>, Error> {
        self.finish();
        let uid = self.claim.uid().unwrap_or_default();
        if !self.worth_writing() {
            self.ctx.progress_pending(&uid, true);
            return Ok(None);
        }
        let ready_now = conditions::is_true(&self.new.conditions, READY)
            && !conditions::is_true(&self.old.conditions, READY);
        if self.only_progress() && !ready_now {
            if let Some(since) = self.ctx.progress_pending(&uid, false) {
                let waited = since.elapsed();
                if waited < STATUS_WRITE_GAP {
                    return Ok(Some(STATUS_WRITE_GAP - waited));
                }
            }
        }
        self.write().await?;
        Ok(None)
    }

    /// Derives the phase and the observed generation.
    fn finish(&mut self) {
        if self.new.phase != Some(NodeClaimPhase::Failed)
            && self.new.phase != Some(NodeClaimPhase::Terminating)
        {
            self.new.phase = Some(if autonodes_core::claim::powered_off(self.claim) {
                NodeClaimPhase::PoweredOff
            } else {
                autonodes_core::claim::phase(&self.new.conditions)
            });
        }
        self.new.reason = autonodes_core::claim::reason(&self.new.conditions);
        self.new.observed_generation = self.claim.metadata.generation;
    }

    /// Writes the status if it changed by more than progress detail (one conditional
    /// server-side apply), then records Events and stage durations for what changed.
    /// Returns the claim as it now is.
    pub(super) async fn write(mut self) -> Result<Arc<NodeClaim>, Error> {
        self.finish();
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

    /// One Event per condition that changed: Normal when it turned True (stages reached in
    /// the same write as Ready are told by Ready's Event), Warning when it turned to a
    /// problem; progress reasons get none.
    async fn record_events(&self) {
        let ready_now = conditions::is_true(&self.new.conditions, READY)
            && !conditions::is_true(&self.old.conditions, READY);
        let classify = |c: &Condition, _: Option<&Condition>| {
            if c.type_ == HOST_MAINTENANCE.as_str() {
                // A move off a drained host node is news, not a problem; a failed one is.
                let failed = c.reason == ClaimReason::MigrationFailed.as_str();
                return Some(if failed {
                    EventType::Warning
                } else {
                    EventType::Normal
                });
            }
            if c.reason == ClaimReason::PoweredOff.as_str() {
                // Asked for, not a problem.
                return Some(EventType::Normal);
            }
            if c.status == TRUE {
                let folded = ready_now && c.type_ != READY.as_str();
                (!folded).then_some(EventType::Normal)
            } else if conditions::is_progress(&c.reason) {
                None
            } else {
                Some(EventType::Warning)
            }
        };
        report_changes(
            self.ctx,
            self.claim,
            "",
            &self.old.conditions,
            &self.new.conditions,
            classify,
        )
        .await;
    }

    fn observe_stages(&self) {
        let Some(created) = self.claim.metadata.creation_timestamp.as_ref() else {
            return;
        };
        let start = if self.new.warm.is_some() {
            "warm"
        } else {
            "cold"
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
                    .with_label_values(&[stage, start])
                    .observe(secs.max(0.0));
            }
        }
    }
}

/// Recomputes `autonodes_nodeclaims`, `autonodes_nodeclaims_cost` and `autonodes_nodeclaims_oldest_seconds` from
/// the claim store.
pub(crate) fn refresh_claim_gauges(ctx: &Context) {
    let m = &ctx.metrics;
    let mut by_phase: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    let mut cost: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    let mut oldest: BTreeMap<String, i64> = BTreeMap::new();
    let now = k8s_openapi::jiff::Timestamp::now();
    for c in ctx.claims().state() {
        let s = c.status.clone().unwrap_or_default();
        let phase = s
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "Pending".into());
        let since = match (&c.metadata.deletion_timestamp, phase.as_str()) {
            (Some(deleted), _) => Some(deleted),
            (None, "Pending" | "Provisioning" | "Joining") => {
                c.metadata.creation_timestamp.as_ref()
            }
            _ => None,
        };
        if let Some(since) = since {
            let secs = (now.as_second() - since.0.as_second()).max(0);
            let phase = if c.metadata.deletion_timestamp.is_some() {
                "Terminating".to_string()
            } else {
                phase.clone()
            };
            let entry = oldest.entry(phase).or_default();
            *entry = (*entry).max(secs);
        }
        let nodetype = s.type_ref.clone().unwrap_or_default();
        let provider = s
            .provider_ref
            .clone()
            .unwrap_or_else(|| nodetype.split('.').next().unwrap_or_default().to_string());
        *by_phase
            .entry((phase.clone(), nodetype, provider.clone()))
            .or_default() += 1;
        if phase != "Failed" {
            *cost
                .entry((
                    c.namespace().unwrap_or_default(),
                    c.spec.v_cluster_ref.name.clone(),
                    provider,
                ))
                .or_default() += s.cost.unwrap_or(0);
        }
    }
    m.nodeclaims.reset();
    for ((phase, nodetype, provider), n) in by_phase {
        m.nodeclaims
            .with_label_values(&[&phase, &nodetype, &provider])
            .set(n);
    }
    m.nodeclaims_oldest.reset();
    for (phase, secs) in oldest {
        m.nodeclaims_oldest.with_label_values(&[&phase]).set(secs);
    }
    m.nodeclaims_cost.reset();
    for ((namespace, vcluster, provider), n) in cost {
        m.nodeclaims_cost
            .with_label_values(&[&namespace, &vcluster, &provider])
            .set(n);
    }
}
