//! NodeQuota controller: what the claims of each namespace a quota covers hold, in the
//! quota's status. Scheduling enforces quotas itself ([`autonodes_core::quota`], in the schedule
//! stage, from the capacity ledger); this status is what users read.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::catalogue::catalogue;
use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::reconciler::{self, Reconciler};
use crate::controller::reflectors::Reflectors;
use crate::controller::status::apply_status;
use crate::controller::status::WriteGap;
use autonodes_api::conditions::{self, status_of};
use autonodes_api::reasons::QuotaReason;
use autonodes_api::NodeClaim;
use autonodes_api::{NamespaceUsage, NodeQuota, NodeQuotaStatus};
use autonodes_core::quota::{PreparedQuota, Usage};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use std::ops::Deref;

/// Condition: the quota can be applied.
pub(crate) const READY: &str = "Ready";

/// How long a change of the use alone (a claim more or less in a covered namespace) waits
/// after the quota's last status write: a burst of claims costs a status write per second,
/// not one per claim. Scheduling never reads this status (it counts from the ledger).
pub(crate) const USE_WRITE_GAP: Duration = Duration::from_secs(1);

/// The NodeQuota controller's context: the shared one ([`Deref`]) and when each quota's
/// status was last written.
pub(crate) struct QuotaContext {
    /// The context every controller shares.
    pub ctx: Arc<Context>,
    /// When each NodeQuota's status was last written, by name ([`USE_WRITE_GAP`]).
    pub status_written: WriteGap,
}

impl Deref for QuotaContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.ctx
    }
}

/// Runs the NodeQuota controller until `shutdown` resolves: a quota is woken by the claims
/// of the namespaces it covers.
pub(crate) async fn run(
    ctx: Arc<Context>,
    r: &Reflectors,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let quotas_of_claims = ctx.quotas().clone();
    let controller = Controller::for_shared_stream(r.quotas.applied(), r.quotas.store())
        .watches_shared_stream(r.claims.touched_objects(), move |c: Arc<NodeClaim>| {
            let namespace = c.namespace().unwrap_or_default();
            quotas_of_claims
                .state()
                .into_iter()
                .filter(|q| autonodes_core::quota::covers(&q.spec, &namespace))
                .map(|q| ObjectRef::from_obj(&*q))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown);
    reconciler::run(
        controller,
        Arc::new(QuotaContext {
            ctx,
            status_written: WriteGap::default(),
        }),
    )
    .await;
}

impl Reconciler for QuotaContext {
    type Object = NodeQuota;
    const NAME: &'static str = "nodequota";
    const DOING: &'static str = "reconciling NodeQuota";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, obj: Arc<NodeQuota>) -> Result<Action, Error> {
        apply(&obj, self).await
    }
}

async fn apply(q: &NodeQuota, ctx: &QuotaContext) -> Result<Action, Error> {
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
        if let Some(wait) = ctx.status_written.wait(&name, USE_WRITE_GAP, only_use) {
            return Ok(Action::requeue(wait));
        }
        apply_status(&Api::<NodeQuota>::all(ctx.client.clone()), q, &status).await?;
        ctx.status_written.wrote(&name);
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
