//! Schedule: choose the cheapest node type that fits and has capacity (and its zone, when
//! the type lists zones), and store it with the VM's name in the claim's status before
//! anything remote is created.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::status::StatusWriter;
use super::{uid, PROVISIONED, SCHEDULED};
use crate::api::reasons::ClaimReason;
use crate::api::NodeClaim;
use crate::conditions;
use crate::controller::catalogue::catalogue;
use crate::controller::{Context, Error};
use crate::quota::{self, PreparedQuota, Usage};
use crate::scheduling::{self, ClaimRequest, PreparedType};
use crate::template;

/// The outcome of scheduling: the chosen type, prepared.
pub struct Scheduled {
    /// The chosen type.
    pub node_type: PreparedType,
    /// The claim after scheduling (as written, when scheduling wrote it).
    pub claim: Arc<NodeClaim>,
}

/// Chooses a type for the claim (or returns the one already chosen).
pub(super) async fn schedule(claim: &NodeClaim, ctx: &Context) -> Result<Option<Scheduled>, Error> {
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
                w.set(
                    PROVISIONED,
                    false,
                    ClaimReason::NodeTypeUnavailable,
                    message,
                );
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
            w.set(SCHEDULED, false, ClaimReason::InvalidRequest, e.to_string());
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
        w.set(SCHEDULED, false, ClaimReason::InvalidLabels, e.to_string());
        w.write().await?;
        return Ok(None);
    }
    // One decision at a time, on complete caches, so maxCapacity holds under concurrency.
    // The decision is reserved in memory before the lock is released; the status write
    // happens outside it and gives the reservation back if it fails.
    ctx.wait_synced().await;
    let decision = {
        let _one_at_a_time = ctx.scheduling.lock().await;
        if ctx.ledger(|l| l.is_reserved(&uid)) {
            // This process scheduled the claim already; the cache has not caught up yet.
            return Err(Error::Conflict(format!(
                "NodeClaim {} (cache behind)",
                claim.name_any()
            )));
        }
        let catalogue = catalogue(ctx);
        let namespace = claim.namespace().unwrap_or_default();
        let quotas: Vec<PreparedQuota> = ctx
            .quotas
            .state()
            .iter()
            .map(|q| PreparedQuota::new(&q.name_any(), &q.spec))
            .filter(|q| q.covers(&namespace))
            .collect();
        ctx.ledger(|ledger| {
            // What the namespace's claims hold, this process's decisions included (only
            // when a quota covers it: without quotas nothing is counted).
            let used = if quotas.is_empty() {
                Usage::default()
            } else {
                Usage::of_counts(ledger.namespace_counts(&namespace), |n| catalogue.named(n))
            };
            let admit = |t: &PreparedType| quota::admits(&quotas, &namespace, &used, t);
            let decision = scheduling::choose_within(&catalogue, &request, ledger.counts(), admit)
                .cloned()
                .map(|t| {
                    let zone = scheduling::zone_for(
                        &t,
                        &claim.spec,
                        &request,
                        ledger.zone_counts(&t.name),
                    );
                    (t, zone)
                });
            if let Ok((t, zone)) = &decision {
                ledger.reserve(&uid, &namespace, &t.name, zone.as_deref());
            }
            decision
        })
    };
    let (chosen, zone) = match decision {
        Ok(t) => t,
        Err(nofit) => {
            let mut w = StatusWriter::new(claim, ctx);
            w.set(SCHEDULED, false, nofit_reason(nofit.reason), nofit.message);
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
    w.new.provider_ref = Some(chosen.provider.clone());
    w.new.node_type_hash = Some(chosen.definition.clone());
    w.new.cost = Some(chosen.cost);
    w.new.host_cluster = Some(chosen.host_cluster.clone());
    w.new.vm_namespace = Some(chosen.vm_namespace.clone());
    w.new.vm_name = Some(vm_name.clone());
    w.new.provider_id = Some(format!("kubevirt://{vm_name}"));
    let in_zone = zone
        .as_deref()
        .map(|z| format!(" in zone {z}"))
        .unwrap_or_default();
    w.new.zone = zone;
    w.set(
        SCHEDULED,
        true,
        ClaimReason::Scheduled,
        format!(
            "scheduled to node type {} (cost {}) as VM {}/{}{in_zone}",
            chosen.name, chosen.cost, chosen.vm_namespace, vm_name
        ),
    );
    w.set(
        PROVISIONED,
        false,
        ClaimReason::Creating,
        "creating the VirtualMachine",
    );
    let written = match w.write().await {
        Ok(c) => c,
        Err(e) => {
            ctx.ledger(|l| l.unreserve(&uid));
            return Err(e);
        }
    };
    let _ = ctx.wake_types.unbounded_send(ObjectRef::new(&chosen.name));
    Ok(Some(Scheduled {
        node_type: chosen,
        claim: written,
    }))
}

/// The claim reason for a scheduling failure ([`scheduling::NoFit::reason`]).
pub(super) fn nofit_reason(reason: &str) -> ClaimReason {
    match reason {
        scheduling::REASON_INSUFFICIENT_CAPACITY => ClaimReason::InsufficientCapacity,
        scheduling::REASON_QUOTA_EXCEEDED => ClaimReason::QuotaExceeded,
        _ => ClaimReason::NoMatchingNodeType,
    }
}
