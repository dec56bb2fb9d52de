//! Schedule: choose the cheapest node type that fits, has capacity, is allowed by the
//! tenant's quotas and whose VM the host has room for (and its zone, when the type lists
//! zones: one with room), and store it with the VM's name in the claim's status before
//! anything remote is created.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use autonodes_core::access::{self, TenantNamespace};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::context::ClaimContext;
use super::provisioning::uid;
use super::status::StatusWriter;
use super::status::{PROVISIONED, SCHEDULED};
use crate::controller::catalogue::catalogue;
use crate::controller::error::Error;
use crate::remote::host_room::{self, ClaimRoom, HostRoom, HostSnapshot};
use autonodes_api::conditions;
use autonodes_api::reasons::ClaimReason;
use autonodes_api::{NodeClaim, NodeClaimSpec};
use autonodes_core::catalogue::PreparedType;
use autonodes_core::ledger::ClaimedLedger;
use autonodes_core::quota::{self, PreparedQuota, Usage};
use autonodes_core::scheduling::{self, ClaimRequest, NoFit};

/// The outcome of scheduling: the chosen type, prepared.
pub(crate) struct Scheduled {
    /// The chosen type.
    pub node_type: PreparedType,
    /// The claim after scheduling (as written, when scheduling wrote it).
    pub claim: Arc<NodeClaim>,
}

/// What scheduling came to.
pub(crate) enum Schedule {
    /// A type is chosen (now, or before).
    Chosen(Box<Scheduled>),
    /// None yet (the claim's status says why): look again after this long, or when the
    /// types change.
    Waiting(Duration),
}

/// How long a claim no type fits waits before it is looked at again (types changing wake
/// it sooner).
const RETRY: Duration = Duration::from_secs(60);
/// How long a claim waiting for room on the host waits before it is looked at again.
const HOST_CAPACITY_RETRY: Duration = Duration::from_secs(10);

/// Chooses a type for the claim (or returns the one already chosen); a claim not scheduled
/// yet comes with what [`admit_before_tenant`] admitted.
pub(super) async fn schedule(
    claim: &NodeClaim,
    ctx: &ClaimContext,
    admitted: Option<Admitted>,
) -> Result<Schedule, Error> {
    let status = claim.status.clone().unwrap_or_default();
    if let Some(type_ref) = status.type_ref.clone() {
        let catalogue = catalogue(ctx);
        // A claim whose VM already runs keeps it when its type turns unusable (its provider
        // not ready or being deleted, its template changed): nothing is created from the
        // type any more, and the claim goes on watching its VM and Node.
        let provisioned = conditions::is_true(&status.conditions, PROVISIONED);
        return match catalogue.get(&type_ref).filter(|t| t.name == type_ref) {
            Some(t) if t.problem.is_none() || provisioned => {
                Ok(Schedule::Chosen(Box::new(Scheduled {
                    node_type: t.clone(),
                    claim: Arc::new(claim.clone()),
                })))
            }
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
                Ok(Schedule::Waiting(RETRY))
            }
        };
    }

    let uid = uid(claim)?;
    // What the claim asks for, `--require-quota` and the namespace's labels were checked
    // and read before its tenant was connected ([`admit_before_tenant`]).
    let Some(Admitted { request, labels }) = admitted else {
        return Err(Error::Missing(
            format!("NodeClaim {}", claim.name_any()),
            "its admission before the tenant",
        ));
    };
    // One decision at a time, on complete caches, so maxCapacity holds under concurrency.
    // The decision is reserved in memory before the lock is released; the status write
    // happens outside it and gives the reservation back if it fails.
    ctx.wait_synced().await;
    let namespace = claim.namespace().unwrap_or_default();
    let all_quotas = crate::controller::catalogue::prepared_quotas(ctx);
    let tenant = TenantNamespace {
        name: &namespace,
        labels: labels.as_ref(),
    };
    let hosts = host_snapshots(ctx, &request).await;
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
        let quotas = covering(all_quotas, &namespace);
        ctx.ledger(|ledger| {
            let used = namespace_usage(&quotas, ledger, &namespace, &catalogue);
            // The room of each host (unknown ones are not checked).
            let rooms: HashMap<&str, HostRoom> = hosts
                .iter()
                .filter_map(|(cluster, snapshot)| {
                    let room = snapshot.as_ref().ok()?.room(&catalogue, ledger);
                    Some((cluster.as_str(), room))
                })
                .collect();
            // The zone of each admitted type, as its admission found it.
            let mut zones: HashMap<String, Option<String>> = HashMap::new();
            // The free address of each admitted type with an address pool.
            let mut addresses: HashMap<String, IpAddr> = HashMap::new();
            let admit = |t: &PreparedType| -> Result<(), NoFit> {
                provider_and_quotas_admit(t, &tenant, &quotas, &used)?;
                if let Some(ip) = free_address(t, ledger)? {
                    addresses.insert(t.name.clone(), ip);
                }
                let in_use = ledger.zone_counts(&t.name);
                let room = rooms
                    .get(t.host_cluster.as_str())
                    .and_then(|r| ClaimRoom::new(r, t, claim));
                let zone = match room {
                    Some(r) => host_zone(ctx, t, &claim.spec, &request, ledger, &r)?,
                    None => scheduling::zone_for(t, &claim.spec, &request, in_use),
                };
                zones.insert(t.name.clone(), zone);
                Ok(())
            };
            let decision = scheduling::choose_within(&catalogue, &request, ledger.counts(), admit)
                .cloned()
                .map(|t| {
                    // A chosen type is one `admit` let through.
                    let zone = zones.remove(&t.name).flatten();
                    (t, zone)
                });
            decision.map(|(t, zone)| {
                ledger.reserve(&uid, &namespace, &t.name, zone.as_deref());
                // The address the type was admitted with is this claim's now.
                let address =
                    addresses
                        .remove(&t.name)
                        .zip(t.address_pool.as_ref())
                        .map(|(ip, pool)| {
                            ledger.reserve_address(&uid, ip);
                            pool.with_prefix(ip)
                        });
                (t, zone, address)
            })
        })
    };
    let (chosen, zone, address) = match decision {
        Ok(t) => t,
        Err(nofit) => {
            let mut w = StatusWriter::new(claim, ctx);
            w.set(SCHEDULED, false, nofit_reason(nofit.reason), nofit.message);
            w.write().await?;
            // Room on the host comes back without any change autonodes watches for.
            let retry = match nofit.reason {
                scheduling::REASON_HOST_CAPACITY_EXHAUSTED => HOST_CAPACITY_RETRY,
                _ => RETRY,
            };
            return Ok(Schedule::Waiting(retry));
        }
    };
    let vm_name = autonodes_core::template::names::vm_name_for_claim(
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
    w.new.vm_namespace = Some(chosen.vm_namespace_for(&claim.namespace().unwrap_or_default()));
    w.new.vm_name = Some(vm_name.clone());
    w.new.provider_id = Some(format!("kubevirt://{vm_name}"));
    let in_zone = zone
        .as_deref()
        .map(|z| format!(" in zone {z}"))
        .unwrap_or_default();
    w.new.zone = zone;
    let with_address = address
        .as_deref()
        .map(|a| format!(", address {a}"))
        .unwrap_or_default();
    w.new.address = address;
    w.set(
        SCHEDULED,
        true,
        ClaimReason::Scheduled,
        format!(
            "scheduled to node type {} (cost {}){in_zone}{with_address}",
            chosen.name, chosen.cost
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
    let _ = ctx.wakes.types.unbounded_send(ObjectRef::new(&chosen.name));
    Ok(Schedule::Chosen(Box::new(Scheduled {
        node_type: chosen,
        claim: written,
    })))
}

/// The lowest free address of `t`'s address pool (none when `t` has no pool), or why `t`
/// cannot be chosen: every address of its pool is held.
fn free_address(t: &PreparedType, ledger: &ClaimedLedger) -> Result<Option<IpAddr>, NoFit> {
    let Some(pool) = &t.address_pool else {
        return Ok(None);
    };
    pool.allocate(|a| ledger.address_taken(a))
        .map(Some)
        .ok_or_else(|| NoFit {
            reason: scheduling::REASON_ADDRESS_POOL_EXHAUSTED,
            message: format!(
                "node type {}: all {} addresses of its address pool are held by claims",
                t.name,
                pool.usable()
            ),
        })
}

/// The quotas of `all` that cover `namespace`.
fn covering(all: Vec<PreparedQuota>, namespace: &str) -> Vec<PreparedQuota> {
    all.into_iter().filter(|q| q.covers(namespace)).collect()
}

/// What the claims of `namespace` hold, this process's decisions included (only when a
/// quota covers it: without quotas nothing is counted).
fn namespace_usage(
    quotas: &[PreparedQuota],
    ledger: &ClaimedLedger,
    namespace: &str,
    catalogue: &autonodes_core::catalogue::Catalogue,
) -> Usage {
    if quotas.is_empty() {
        Usage::default()
    } else {
        Usage::of_counts(ledger.namespace_counts(namespace), |n| catalogue.named(n))
    }
}

/// Whether type `t`'s provider serves the tenant's namespace and its quotas (`quotas`,
/// with `used` held) allow one more of it.
fn provider_and_quotas_admit(
    t: &PreparedType,
    tenant: &TenantNamespace<'_>,
    quotas: &[PreparedQuota],
    used: &Usage,
) -> Result<(), NoFit> {
    access::provider_admits(t, tenant)?;
    quota::admits(quotas, tenant.name, used, t).map_err(|message| NoFit {
        reason: scheduling::REASON_QUOTA_EXCEEDED,
        message,
    })
}

/// The claim's request, when what it asks for can be given at all: its resources and
/// requirements read, its labels ones a Node may carry (not the kubelet's or autonodes'),
/// its kubelet arguments ones autonodes passes. Else the reason and message.
fn valid_request(claim: &NodeClaim) -> Result<ClaimRequest, (ClaimReason, String)> {
    let request = ClaimRequest::new(&claim.spec, None)
        .map_err(|e| (ClaimReason::InvalidRequest, e.to_string()))?;
    autonodes_core::node_config::node_labels(
        &Default::default(),
        None,
        &claim.spec.labels,
        &BTreeMap::new(),
    )
    .map_err(|e| (ClaimReason::InvalidLabels, e.to_string()))?;
    autonodes_core::kubelet_args::checked(&claim.spec.kubelet_args)
        .map_err(|e| (ClaimReason::InvalidKubeletArgs, e.to_string()))?;
    Ok(request)
}

/// What a claim not scheduled yet was admitted with before its tenant was connected.
pub(super) struct Admitted {
    /// Its request.
    request: ClaimRequest,
    /// Its namespace's labels, when some provider serves only some namespaces.
    labels: Option<BTreeMap<String, String>>,
}

/// What [`admit_before_tenant`] came to.
pub(super) enum Admission {
    /// The claim is scheduled already: nothing to admit.
    Scheduled,
    /// It may be scheduled, as far as nothing of its tenant is needed to tell.
    Admitted(Admitted),
    /// It may not (its status says why): look again after this long.
    Refused(Duration),
}

/// Whether a claim not scheduled yet could be scheduled as far as nothing of its tenant is
/// needed to tell: what it asks for is valid ([`valid_request`]), `--require-quota` finds a
/// NodeQuota for its namespace, and some node type fits it that a provider serving its
/// namespace offers and its quotas allow (host room aside). Checked before the tenant's
/// cluster is connected, so a claim refused for these opens no connection.
pub(super) async fn admit_before_tenant(
    claim: &NodeClaim,
    ctx: &ClaimContext,
) -> Result<Admission, Error> {
    if claim.status.as_ref().is_some_and(|s| s.type_ref.is_some()) {
        return Ok(Admission::Scheduled);
    }
    let namespace = claim.namespace().unwrap_or_default();
    let decided: Result<Admitted, (ClaimReason, String)> = async {
        let request = valid_request(claim)?;
        ctx.wait_synced().await;
        let all_quotas = crate::controller::catalogue::prepared_quotas(ctx);
        access::quota_admits(ctx.config.require_quota, &all_quotas, &namespace)
            .map_err(|message| (ClaimReason::NoQuota, message))?;
        let catalogue = catalogue(ctx);
        let labels = crate::controller::access::namespace_labels(ctx, &catalogue, &namespace).await;
        let tenant = TenantNamespace {
            name: &namespace,
            labels: labels.as_ref(),
        };
        let quotas = covering(all_quotas, &namespace);
        let refused = ctx.ledger(|ledger| {
            let used = namespace_usage(&quotas, ledger, &namespace, &catalogue);
            let admit = |t: &PreparedType| provider_and_quotas_admit(t, &tenant, &quotas, &used);
            scheduling::choose_within(&catalogue, &request, ledger.counts(), admit)
                .err()
                .filter(|nofit| {
                    // Only what no host can change: the rest is for scheduling.
                    matches!(
                        nofit.reason,
                        scheduling::REASON_QUOTA_EXCEEDED | access::REASON_PROVIDER_NOT_ALLOWED
                    )
                })
                .map(|nofit| (nofit_reason(nofit.reason), nofit.message))
        });
        match refused {
            Some(refusal) => Err(refusal),
            None => Ok(Admitted { request, labels }),
        }
    }
    .await;
    match decided {
        Ok(admitted) => Ok(Admission::Admitted(admitted)),
        Err((reason, message)) => {
            let mut w = StatusWriter::new(claim, ctx);
            w.set(SCHEDULED, false, reason, message);
            w.write().await?;
            Ok(Admission::Refused(RETRY))
        }
    }
}

/// The watch caches of the host clusters the claim's candidate types use (each read once
/// per decision; an unknown host is not checked).
async fn host_snapshots(
    ctx: &ClaimContext,
    request: &ClaimRequest,
) -> HashMap<String, Result<HostSnapshot, String>> {
    let clusters: BTreeSet<String> = catalogue(ctx)
        .types()
        .iter()
        .filter(|t| t.is_usable() && request.considers(t))
        .map(|t| t.host_cluster.clone())
        .collect();
    let mut hosts = HashMap::new();
    for cluster in clusters {
        let snapshot = host_room::snapshot(&ctx.clients, &cluster).await;
        hosts.insert(cluster, snapshot);
    }
    hosts
}

/// The zone a VM of `t` goes to when the host has room for it (`None` for a type without
/// zones): the claim's own zone, or the least-used one the type offers it that has room;
/// else `HostCapacityExhausted` saying what is missing.
fn host_zone(
    ctx: &ClaimContext,
    t: &PreparedType,
    claim: &NodeClaimSpec,
    request: &ClaimRequest,
    ledger: &ClaimedLedger,
    room: &ClaimRoom<'_>,
) -> Result<Option<String>, NoFit> {
    let in_use = ledger.zone_counts(&t.name);
    let refused = |zone: Option<&str>| NoFit {
        reason: scheduling::REASON_HOST_CAPACITY_EXHAUSTED,
        message: format!(
            "node type {} on host cluster {}: {}",
            t.name,
            t.host_cluster,
            room.refusal(ctx.claims(), ledger, zone)
        ),
    };
    match scheduling::zone_for(t, claim, request, in_use) {
        // A type without zones: any host node.
        None if room.fits(ctx.claims(), ledger, None) => Ok(None),
        None => Err(refused(None)),
        // A zone: the claim's, or one the type offers it that has room.
        Some(first) => scheduling::zone_for_where(t, claim, request, in_use, |z| {
            room.fits(ctx.claims(), ledger, Some(z))
        })
        .map(Some)
        .ok_or_else(|| refused(Some(&first))),
    }
}

/// The claim reason for a scheduling failure ([`scheduling::NoFit::reason`]).
pub(super) fn nofit_reason(reason: &str) -> ClaimReason {
    match reason {
        scheduling::REASON_INSUFFICIENT_CAPACITY => ClaimReason::InsufficientCapacity,
        scheduling::REASON_QUOTA_EXCEEDED => ClaimReason::QuotaExceeded,
        access::REASON_PROVIDER_NOT_ALLOWED => ClaimReason::ProviderNotAllowed,
        scheduling::REASON_HOST_CAPACITY_EXHAUSTED => ClaimReason::HostCapacityExhausted,
        scheduling::REASON_ADDRESS_POOL_EXHAUSTED => ClaimReason::AddressPoolExhausted,
        _ => ClaimReason::NoMatchingNodeType,
    }
}
