//! NodeQuota controller: what the claims of each namespace a quota covers hold, in the
//! quota's status. Scheduling enforces quotas itself ([`crate::quota`], in the schedule
//! stage, from the capacity ledger); this status is what users read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::catalogue::catalogue;
use crate::api::reasons::QuotaReason;
use crate::api::{NamespaceUsage, NodeQuota, NodeQuotaStatus};
use crate::conditions::{self, status_of};
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::status::apply_status;
use crate::quota::{PreparedQuota, Usage};

/// Condition: the quota can be applied.
pub const READY: &str = "Ready";

/// How long a change of the use alone (a claim more or less in a covered namespace) waits
/// after the quota's last status write: a burst of claims costs a status write per second,
/// not one per claim. Scheduling never reads this status (it counts from the ledger).
pub const USE_WRITE_GAP: Duration = Duration::from_secs(1);

/// Reconciles one NodeQuota.
pub async fn reconcile(q: Arc<NodeQuota>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = apply(&q, &ctx).await;
    ctx.metrics.observe_reconcile("nodequota", started, &result);
    result
}

/// Logs the error; the quota is retried with backoff.
pub fn error_policy(q: Arc<NodeQuota>, error: &Error, _ctx: Arc<Context>) -> Action {
    if error.is_conflict() {
        tracing::debug!(%error, "stale read; reconciling again");
        return crate::controller::error::error_requeue(error);
    }
    tracing::warn!(nodequota = %q.name_any(), %error, "reconciling NodeQuota failed");
    crate::controller::error::error_requeue(error)
}

async fn apply(q: &NodeQuota, ctx: &Context) -> Result<Action, Error> {
    if q.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    ctx.wait_synced().await;
    let name = q.name_any();
    let prepared = PreparedQuota::new(&name, &q.spec);
    let catalogue = catalogue(ctx);
    let type_named = |n: &str| catalogue.named(n);
    let namespaces: Vec<String> = if q.spec.namespaces.is_empty() {
        ctx.ledger(|l| l.namespaces().map(str::to_string).collect())
    } else {
        let mut listed = q.spec.namespaces.clone();
        listed.sort();
        listed.dedup();
        listed
    };
    let mut used = Vec::new();
    for namespace in namespaces {
        let counts = ctx.ledger(|l| l.namespace_counts(&namespace).clone());
        if counts.is_empty() {
            continue;
        }
        let usage = Usage::of_counts(&counts, type_named);
        used.push(NamespaceUsage {
            namespace,
            used: usage.report(&prepared.limits),
        });
    }
    let old = q.status.clone().unwrap_or_default();
    let mut status = NodeQuotaStatus {
        observed_generation: q.metadata.generation,
        namespaces: used,
        conditions: old.conditions.clone(),
    };
    let (reason, message) = match &prepared.problem {
        Some(problem) => (QuotaReason::InvalidQuota, problem.clone()),
        None => (
            QuotaReason::Enforced,
            "claims of the namespaces it covers are scheduled within it".to_string(),
        ),
    };
    conditions::set(
        &mut status.conditions,
        READY,
        status_of(prepared.problem.is_none()),
        reason.as_str(),
        message,
        q.metadata.generation,
        now(),
    );
    if status != old {
        let only_use = NodeQuotaStatus {
            namespaces: old.namespaces.clone(),
            ..status.clone()
        } == old;
        if let Some(wait) = ctx
            .quota_status_written
            .wait(&name, USE_WRITE_GAP, only_use)
        {
            return Ok(Action::requeue(wait));
        }
        apply_status(&Api::<NodeQuota>::all(ctx.client.clone()), q, &status).await?;
        ctx.quota_status_written.wrote(&name);
        super::status::report_changes(
            ctx,
            q,
            "Enforce",
            &old.conditions,
            &status.conditions,
            |c, _| (c.status != conditions::TRUE).then_some(EventType::Warning),
        )
        .await;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}
