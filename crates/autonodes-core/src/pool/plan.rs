//! The claims of a pool to delete and create: Failed claims go, a static pool is scaled to
//! `replicas` (least valuable claims first, within the disruption budget), and outdated
//! claims are rolled by surge.

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::time::Duration;

use autonodes_api::conditions;
use autonodes_api::reasons::{ClaimCondition, ClaimReason};
use autonodes_api::{NodeClaim, NodeClaimPhase};

use super::{ANNOTATION_DELETE_FIRST, ANNOTATION_REPLACES, LABEL_TEMPLATE_HASH};
use autonodes_api::reasons::PoolReason;
use autonodes_api::{NodeClaimSpec, NodePoolSpec};
use k8s_openapi::jiff::Timestamp;

/// What the planner knows about one claim of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    /// The claim's name.
    pub name: String,
    /// Creation time, milliseconds since the epoch.
    pub created_ms: i64,
    /// Phase Available (its node is Ready).
    pub available: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Phase Failed.
    pub failed: bool,
    /// It has (had) a node in the tenant: deleting it drains a node (not once its VM is
    /// only kept for debugging).
    pub has_node: bool,
    /// Made from an older template, drifted from its node type (condition `Drifted`), or
    /// older than `expireAfter`.
    pub outdated: bool,
    /// Older than `expireAfter`.
    pub expired: bool,
    /// Marked `do-not-disrupt` (itself, its node or a pod on it, [`super::do_not_disrupt`]):
    /// a roll-out leaves it alone while it is Available; expiry does not.
    pub held: bool,
    /// The claim this one replaces (annotation [`ANNOTATION_REPLACES`]).
    pub replaces: Option<String>,
    /// Marked to go first on scale-down (annotation [`ANNOTATION_DELETE_FIRST`]).
    pub delete_first: bool,
    /// Its node has not been Ready for the repair time: it is replaced ([`super::repair`]).
    pub repair: bool,
    /// Its VM must leave a host node being drained and cannot live-migrate
    /// (`HostMaintenance=True`, [`crate::host_maintenance::needs_replacement`]): it is
    /// replaced by surge within the budgets for `HostMaintenance`.
    pub host_maintenance: bool,
    /// Powered off (`spec.power: Off`): never rolled; a scale-down takes it first.
    pub powered_off: bool,
}

/// The planner's view of a pool's claims at `now_ms` (milliseconds since the epoch): a
/// claim is outdated when its [`LABEL_TEMPLATE_HASH`] is not `hash`, it has drifted
/// (`Drifted=True`: from its node type, or — unless `version_drift` is false — from the
/// tenant's Kubernetes version), or it is older than `expire` (`expireAfter`); a claim
/// without a creation time counts as made now.
pub(crate) fn claim_views<C: Borrow<NodeClaim>>(
    claims: &[C],
    hash: &str,
    expire: Option<Duration>,
    version_drift: bool,
    now_ms: i64,
) -> Vec<ClaimView> {
    claims
        .iter()
        .map(|c| {
            let c: &NodeClaim = c.borrow();
            let s = c.status.clone().unwrap_or_default();
            let created_ms = c
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(now_ms, |t| t.0.as_millisecond());
            let expired = expire.is_some_and(|e| {
                now_ms - created_ms >= i64::try_from(e.as_millis()).unwrap_or(i64::MAX)
            });
            let label = |key: &str| c.metadata.labels.as_ref().and_then(|l| l.get(key));
            let annotation = |key: &str| c.metadata.annotations.as_ref().and_then(|a| a.get(key));
            ClaimView {
                name: c
                    .metadata
                    .name
                    .clone()
                    .or_else(|| c.metadata.generate_name.clone())
                    .unwrap_or_default(),
                created_ms,
                available: s.phase == Some(NodeClaimPhase::Available),
                terminating: c.metadata.deletion_timestamp.is_some(),
                failed: s.phase == Some(NodeClaimPhase::Failed),
                has_node: drains_a_node(&s),
                outdated: label(LABEL_TEMPLATE_HASH).map(String::as_str) != Some(hash)
                    || drifted(&s.conditions, version_drift)
                    || expired,
                expired,
                held: false,
                replaces: annotation(ANNOTATION_REPLACES).cloned(),
                delete_first: annotation(ANNOTATION_DELETE_FIRST).is_some(),
                repair: false,
                powered_off: crate::claim::powered_off(c),
                host_maintenance: conditions::get(&s.conditions, ClaimCondition::HostMaintenance)
                    .is_some_and(|c| {
                        crate::host_maintenance::needs_replacement(
                            c.status == conditions::TRUE,
                            &c.reason,
                        )
                    }),
            }
        })
        .collect()
}

/// Whether a claim's conditions say it drifted in a way the pool rolls: any `Drifted=True`,
/// but one for the Kubernetes version only when `version_drift`.
pub(crate) fn drifted(
    cs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    version_drift: bool,
) -> bool {
    let by_version =
        |reason: &str| ClaimReason::parse(reason).is_some_and(ClaimReason::is_version_drift);
    conditions::get(cs, ClaimCondition::Drifted)
        .is_some_and(|c| c.status == conditions::TRUE && (version_drift || !by_version(&c.reason)))
}

/// Whether the pool rolls claims drifted from the tenant's version now: unless
/// `disruption.kubernetesVersionDrift: Disabled` ([`super::rolls_version_drift`]), or a
/// node that came up drifted holds the roll (`held`, [`version_drift_hold`]). What the
/// plan rolls and what the status counts as outdated both read it.
pub(crate) fn rolls_version_drift_now(spec: &NodePoolSpec, held: Option<&Verdict>) -> bool {
    super::rolls_version_drift(spec) && held.is_none()
}

/// Whether the pool's roll for the tenant's Kubernetes version is held: a live claim's node
/// came up with a kubelet of another minor release (`Drifted=True`, reason
/// `KubeletVersionMismatch`), so a replacement would come up the same (a prepared image
/// with a baked kubelet, a pinned download URL) and replacing would only churn. A node that
/// drifted later (`KubernetesVersionChanged`: the tenant was upgraded under it) does not
/// hold the roll. The verdict names the claim, the versions and what to change; `None`
/// when nothing holds the roll.
pub fn version_drift_hold<C: Borrow<NodeClaim>>(claims: &[C]) -> Option<Verdict> {
    claims.iter().map(Borrow::borrow).find_map(|c: &NodeClaim| {
        if !is_live(c) {
            return None;
        }
        let cs = &c.status.as_ref()?.conditions;
        let drift = conditions::get(cs, ClaimCondition::Drifted).filter(|d| {
            d.status == conditions::TRUE
                && d.reason == ClaimReason::KubeletVersionMismatch.as_str()
        })?;
        Some(Verdict::new(
            true,
            PoolReason::ReplacementWouldDrift,
            format!(
                "the node of claim {} came up drifted from the tenant's version ({}), so a replacement would too; the pool replaces no nodes for the tenant's version until its nodes get a kubelet of the tenant's minor release: change the image or the autonodes.io/kubernetes-download-url property, or set disruption.kubernetesVersionDrift: Disabled",
                c.metadata.name.as_deref().unwrap_or_default(),
                drift.message
            ),
        ))
    })
}

/// Whether a claim is live: not being deleted and not Failed.
pub fn is_live(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed)
}

/// Whether the claim is being deleted and has (had) a node: deleting it drains that node,
/// which counts against the disruption budget — until its VM is only kept for debugging
/// (`Ready` reason `KeptForDebugging`: drained, halted, its Node gone).
pub(crate) fn is_draining(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_some() && c.status.as_ref().is_some_and(drains_a_node)
}

/// Whether a claim with this status has (had) a node that its deletion drains: not one
/// whose VM is only kept for debugging (`Ready` reason `KeptForDebugging`: drained, halted,
/// its Node gone).
fn drains_a_node(s: &autonodes_api::NodeClaimStatus) -> bool {
    let kept = conditions::get(&s.conditions, ClaimCondition::Ready.as_str())
        .is_some_and(|r| r.reason == ClaimReason::KeptForDebugging.as_str());
    s.node_name.is_some() && !kept
}

/// Why the planner deletes a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// The claim Failed; the pool replaces it.
    Failed,
    /// The claim is outdated and not serving yet: it goes, an up-to-date one takes its place.
    Outdated,
    /// The claim drifted (it is outdated) and its replacement is Available.
    Replaced,
    /// The claim is older than `expireAfter` and its replacement is Available.
    Expired,
    /// The pool has more claims than `replicas`.
    ScaleDown,
    /// Its node ran no non-DaemonSet pod for `consolidateAfter`.
    Empty,
    /// Its node's pods fitted the room of the tenant's other nodes for `consolidateAfter`.
    Underutilized,
    /// Its node stopped being Ready and its replacement is Available ([`super::repair`]).
    Repaired,
    /// It has not joined (no pod runs there), and pods that must share a node with the
    /// pod it was made for arrived since: a claim of a type that holds them all takes its
    /// place.
    Outgrown,
    /// Its VM had to leave a host node being drained and could not live-migrate; its
    /// replacement is Available.
    HostMaintenance,
}

impl DeleteReason {
    /// The Event reason for this deletion.
    pub fn event_reason(self) -> &'static str {
        match self {
            DeleteReason::Failed => "ReplacingFailedClaim",
            DeleteReason::Outdated => "RemovingOutdatedClaim",
            DeleteReason::Replaced => "ClaimReplaced",
            DeleteReason::Expired => "ClaimExpired",
            DeleteReason::ScaleDown => "ScaledDown",
            DeleteReason::Empty => "Consolidated",
            DeleteReason::Underutilized => "ConsolidatedUnderutilized",
            DeleteReason::Repaired => "NodeRepaired",
            DeleteReason::Outgrown => "ReplacingOutgrownClaim",
            DeleteReason::HostMaintenance => "ReplacedForHostMaintenance",
        }
    }

    /// Why the deletion disrupted a serving node, as `autonodes_nodeclaims_disrupted_total`
    /// counts it (Karpenter's reasons, and `Repaired` and `ScaledDown`); `None` when the
    /// claim served no node (it failed, was outdated before it was Available, or was
    /// outgrown before it joined).
    pub fn disruption(self) -> Option<&'static str> {
        match self {
            DeleteReason::Empty => Some("Empty"),
            DeleteReason::Underutilized => Some("Underutilized"),
            DeleteReason::Replaced => Some("Drifted"),
            DeleteReason::Expired => Some("Expired"),
            DeleteReason::Repaired => Some("Repaired"),
            DeleteReason::ScaleDown => Some("ScaledDown"),
            DeleteReason::HostMaintenance => Some("HostMaintenance"),
            DeleteReason::Failed | DeleteReason::Outdated | DeleteReason::Outgrown => None,
        }
    }
}

/// Every value [`DeleteReason::disruption`] gives, in the order the metrics page lists them.
pub const DISRUPTION_REASONS: [&str; 7] = [
    "Empty",
    "Underutilized",
    "Drifted",
    "Expired",
    "Repaired",
    "ScaledDown",
    "HostMaintenance",
];

/// How many of a pool's nodes a plan may drain at once ([`super::budget`]), before the
/// nodes draining already are subtracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// For a roll-out of drifted claims (a changed template, `Drifted`): what the active
    /// budgets for `Drifted` allow.
    pub disrupt: usize,
    /// For a roll-out of expired claims: what the active budgets without reasons allow.
    pub expire: usize,
    /// For a scale-down: what the budgets allow, but at least one.
    pub scale_down: usize,
    /// For replacing nodes whose VM must leave a drained host node: what the active
    /// budgets for `HostMaintenance` allow.
    pub host_maintenance: usize,
    /// How many claims the plan may create at all ([`super::limits::claim_room`]):
    /// replacements first, then new replicas.
    pub create: usize,
}

impl Allowance {
    /// The same `n` for both disruptions (a scale-down at least one), creations unbounded.
    pub fn uniform(n: usize) -> Self {
        Allowance {
            disrupt: n,
            expire: n,
            scale_down: n.max(1),
            host_maintenance: n,
            create: usize::MAX,
        }
    }
}

/// Claims to create and delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One entry per claim to create: `Some(old)` for the replacement of `old`.
    pub create: Vec<Option<String>>,
    /// Claims to delete, with why.
    pub delete: Vec<(String, DeleteReason)>,
    /// Claims wanted beyond [`Allowance::create`], not planned.
    pub short: usize,
    /// Claims that must leave a drained host node whose replacement (or, once it serves,
    /// whose removal) the budgets for `HostMaintenance` hold back now.
    pub host_maintenance_held: Vec<String>,
}

/// Plans the claims of a pool: Failed claims go; `desired` (static pools) is met by
/// creating claims or by deleting the least valuable ones (those marked
/// [`ANNOTATION_DELETE_FIRST`] first, then not Available, then outdated, then newest), never
/// more Available ones draining than `allowed.scale_down`; outdated claims are rolled by
/// surge, at most `allowed.disrupt` (drifted) or `allowed.expire` (expired) replacements in
/// flight and old claims draining, each old
/// claim deleted only once its replacement is Available. At most `allowed.create` claims
/// are created; the rest is counted in [`Plan::short`] (never allocated: a pool asking for
/// two billion replicas costs what `allowed.create` does).
pub fn plan_claims(claims: &[ClaimView], desired: Option<usize>, allowed: Allowance) -> Plan {
    let mut plan = Plan::default();
    for c in claims.iter().filter(|c| c.failed && !c.terminating) {
        plan.delete.push((c.name.clone(), DeleteReason::Failed));
    }
    let live: Vec<&ClaimView> = claims
        .iter()
        .filter(|c| !c.terminating && !c.failed)
        .collect();
    let draining = claims
        .iter()
        .filter(|c| c.terminating && c.has_node)
        .count();
    let mut scale_down = allowed.scale_down.saturating_sub(draining);
    // What each kind of roll-out may still drain: expired claims by the budgets for every
    // disruption, drifted ones by those for `Drifted`.
    let mut disrupt = allowed.disrupt.saturating_sub(draining);
    let mut expire = allowed.expire.saturating_sub(draining);
    let mut host = allowed.host_maintenance.saturating_sub(draining);
    let replacement_of = |o: &ClaimView| -> Option<&ClaimView> {
        live.iter()
            .find(|r| r.replaces.as_deref() == Some(o.name.as_str()) && !r.outdated)
            .copied()
    };
    // A surge claim replaces a live outdated (or broken) claim and does not take a slot of
    // its own.
    let is_surge = |r: &ClaimView| {
        r.replaces.as_deref().is_some_and(|o| {
            live.iter()
                .any(|x| x.name == o && (x.outdated || x.repair || x.host_maintenance))
        })
    };
    let counted: Vec<&ClaimView> = live.iter().filter(|c| !is_surge(c)).copied().collect();
    let mut slots = counted.len();

    if let Some(desired) = desired {
        if slots > desired {
            let mut order = counted.clone();
            order.sort_by_key(|c| {
                (
                    !c.delete_first,
                    c.available,
                    !c.outdated,
                    Reverse(c.created_ms),
                )
            });
            for c in order {
                if slots <= desired {
                    break;
                }
                if c.available {
                    if scale_down == 0 {
                        break;
                    }
                    scale_down -= 1;
                }
                plan.delete.push((c.name.clone(), DeleteReason::ScaleDown));
                if let Some(r) = replacement_of(c) {
                    plan.delete.push((r.name.clone(), DeleteReason::ScaleDown));
                }
                slots -= 1;
            }
            return plan;
        }
    }

    // Broken nodes: a replacement first, whatever the budgets; the broken claim goes once
    // its replacement is Available.
    for c in counted.iter().filter(|c| c.repair) {
        match replacement_of(c) {
            Some(r) if r.available => plan.delete.push((c.name.clone(), DeleteReason::Repaired)),
            Some(_) => {}
            None => plan.create.push(Some(c.name.clone())),
        }
    }
    let mut surging = live
        .iter()
        .filter(|r| is_surge(r) && !r.available)
        .filter(|r| {
            !r.replaces
                .as_deref()
                .is_some_and(|o| live.iter().any(|x| x.name == o && x.repair))
        })
        .count();
    // Outdated claims, and those whose VM must leave a drained host node, are rolled,
    // except Available ones marked do-not-disrupt that have not expired.
    let mut outdated: Vec<&ClaimView> = counted
        .iter()
        .filter(|c| {
            (c.outdated || c.host_maintenance)
                && !c.repair
                && !c.powered_off
                && !(c.held && c.available && !c.expired)
        })
        .copied()
        .collect();
    outdated.sort_by_key(|c| (c.available, c.created_ms));
    for o in outdated {
        let replacement = replacement_of(o);
        if !o.available {
            plan.delete.push((o.name.clone(), DeleteReason::Outdated));
            if replacement.is_none() {
                slots -= 1;
            }
            continue;
        }
        // A VM leaving a drained host node goes first, by the budgets for
        // `HostMaintenance`; then expiry and drift, each by its own.
        let (left, in_flight, reason) = if o.host_maintenance {
            (
                &mut host,
                allowed.host_maintenance,
                DeleteReason::HostMaintenance,
            )
        } else if o.expired {
            (&mut expire, allowed.expire, DeleteReason::Expired)
        } else {
            (&mut disrupt, allowed.disrupt, DeleteReason::Replaced)
        };
        let held = match replacement {
            Some(r) if r.available => {
                let go = *left > 0;
                if go {
                    *left -= 1;
                    plan.delete.push((o.name.clone(), reason));
                }
                !go
            }
            Some(_) => false,
            None => {
                let go = surging < in_flight;
                if go {
                    surging += 1;
                    plan.create.push(Some(o.name.clone()));
                }
                !go
            }
        };
        if held && o.host_maintenance {
            plan.host_maintenance_held.push(o.name.clone());
        }
    }
    if plan.create.len() > allowed.create {
        plan.short += plan.create.len() - allowed.create;
        plan.create.truncate(allowed.create);
    }
    if let Some(desired) = desired {
        let wanted = desired.saturating_sub(slots);
        let room = allowed.create.saturating_sub(plan.create.len());
        let n = wanted.min(room);
        plan.create.extend(std::iter::repeat_n(None, n));
        plan.short += wanted - n;
    }
    plan
}

/// A claim to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewClaim {
    /// Its spec: the pool's template, with `typeRef` and `desiredCapacity` when chosen.
    pub spec: NodeClaimSpec,
    /// The claim it replaces (rolling update, expiry).
    pub replaces: Option<String>,
    /// The pending pods it is for (dynamic pools).
    pub pods: Vec<String>,
}

/// What one reconcile of a pool does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolPlan {
    /// Claims to delete (by name), with why.
    pub delete: Vec<(String, DeleteReason)>,
    /// Claims to create.
    pub create: Vec<NewClaim>,
    /// `autonodes.io/empty-since` to set (`Some`) or remove (`None`), by claim name.
    pub empty_since: Vec<(String, Option<Timestamp>)>,
    /// `autonodes.io/underutilized-since` to set or remove, by claim name.
    pub underutilized_since: Vec<(String, Option<Timestamp>)>,
    /// `Ready`, when decided here (else the status works it out from the claims).
    pub ready: Option<Verdict>,
    /// `LimitReached`, when decided here.
    pub limit: Option<Verdict>,
    /// Unschedulable pods the pool would take (dynamic pools).
    pub pending_pods: Option<i32>,
    /// `VClusterConfig`, for a pool made from a vCluster's configuration.
    pub imported: Option<Verdict>,
    /// The pool's warm VMs, as the controller found them: `status.warm` and the
    /// `WarmReady` condition (`None`: left out of the status).
    pub warm: (Option<autonodes_api::NodePoolWarm>, Option<Verdict>),
    /// `NodeRepair`.
    pub repair: Option<Verdict>,
    /// Claims whose VM to restart, with the `autonodes.io/restart` value to set
    /// ([`super::repair`]).
    pub restart: Vec<(String, String)>,
    /// Claims deleted for repair whose VM is kept halted until the time given
    /// (`autonodes.io/keep-failed-until`, set before the deletion).
    pub keep: Vec<(String, Timestamp)>,
    /// `status.registration` and `NodeRegistrationHealthy`, as the pool's registration
    /// health was assessed (`pool::registration`).
    pub registration: Option<(autonodes_api::RegistrationStatus, Verdict)>,
    /// `VersionDriftHeld=True` when the roll for the tenant's version is held
    /// ([`version_drift_hold`]); `None`: the condition is left out.
    pub version_drift_held: Option<Verdict>,
    /// `HostMaintenanceHeld=True` when claims that must leave a drained host node wait on
    /// the budgets for `HostMaintenance`; `None`: the condition is left out.
    pub host_maintenance_held: Option<Verdict>,
    /// When to look again.
    pub requeue: Duration,
}

/// A pool condition as a reconcile decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The condition's status: `True` when set.
    pub status: bool,
    /// Why.
    pub reason: PoolReason,
    /// For people.
    pub message: String,
}

impl Verdict {
    /// A condition with `status`, `reason` and `message`.
    pub fn new(status: bool, reason: PoolReason, message: impl Into<String>) -> Verdict {
        Verdict {
            status,
            reason,
            message: message.into(),
        }
    }

    /// `Ready=False` for `reason`: something keeps the pool from working.
    pub fn problem(reason: impl Into<PoolReason>, message: impl Into<String>) -> Verdict {
        Verdict::new(false, reason.into(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonodes_api::NodeClaimStatus;
    use k8s_openapi::jiff::Timestamp;

    fn view(name: &str, created: i64, available: bool) -> ClaimView {
        ClaimView {
            name: name.into(),
            created_ms: created,
            available,
            terminating: false,
            failed: false,
            has_node: available,
            outdated: false,
            expired: false,
            held: false,
            replaces: None,
            delete_first: false,
            repair: false,
            host_maintenance: false,
            powered_off: false,
        }
    }

    fn deleted(plan: &Plan) -> Vec<&str> {
        plan.delete.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn a_static_pool_creates_the_missing_claims() {
        let plan = plan_claims(&[view("a", 1, true)], Some(3), Allowance::uniform(1));
        assert_eq!(plan.create, vec![None, None]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn scale_down_removes_claims_that_are_not_available_first_then_the_newest() {
        let claims = vec![
            view("old", 1, true),
            view("new", 3, true),
            view("booting", 2, false),
            view("mid", 2, true),
        ];
        let plan = plan_claims(&claims, Some(2), Allowance::uniform(1));
        assert_eq!(deleted(&plan), vec!["booting", "new"]);
        let plan = plan_claims(&claims, Some(0), Allowance::uniform(2));
        assert_eq!(deleted(&plan), vec!["booting", "new", "mid"]);
    }

    #[test]
    fn scale_down_removes_the_claim_marked_delete_first_even_when_it_is_the_oldest_available_one() {
        let mut marked = view("old", 1, true);
        marked.delete_first = true;
        let claims = vec![
            marked,
            view("new", 3, true),
            view("booting", 2, false),
            view("mid", 2, true),
        ];
        let plan = plan_claims(&claims, Some(3), Allowance::uniform(1));
        assert_eq!(
            plan.delete,
            vec![("old".to_string(), DeleteReason::ScaleDown)]
        );
        assert!(plan.create.is_empty());
        // Unmarked, the same scale-down takes the claim that is not Available.
        let unmarked: Vec<ClaimView> = claims
            .into_iter()
            .map(|mut c| {
                c.delete_first = false;
                c
            })
            .collect();
        assert_eq!(
            deleted(&plan_claims(&unmarked, Some(3), Allowance::uniform(1))),
            vec!["booting"]
        );
    }

    #[test]
    fn scale_down_waits_while_the_budget_is_used_by_draining_nodes() {
        let mut draining = view("going", 0, true);
        draining.terminating = true;
        let claims = vec![draining, view("a", 1, true), view("b", 2, true)];
        assert!(plan_claims(&claims, Some(0), Allowance::uniform(1))
            .delete
            .is_empty());
        assert_eq!(
            deleted(&plan_claims(&claims, Some(0), Allowance::uniform(2))),
            vec!["b"]
        );
    }

    #[test]
    fn a_failed_claim_is_deleted_and_replaced() {
        let mut failed = view("f", 1, false);
        failed.failed = true;
        let plan = plan_claims(
            &[failed, view("a", 2, true)],
            Some(2),
            Allowance::uniform(1),
        );
        assert_eq!(plan.delete, vec![("f".to_string(), DeleteReason::Failed)]);
        assert_eq!(plan.create, vec![None]);
    }

    #[test]
    fn an_outdated_available_claim_gets_a_replacement_before_it_goes() {
        let mut a = view("a", 1, true);
        a.outdated = true;
        let mut b = view("b", 2, true);
        b.outdated = true;
        let plan = plan_claims(&[a.clone(), b.clone()], Some(2), Allowance::uniform(1));
        assert_eq!(
            plan.create,
            vec![Some("a".to_string())],
            "one surge at a time"
        );
        assert!(plan.delete.is_empty());

        // The replacement is on its way: nothing else happens.
        let mut r = view("r", 3, false);
        r.replaces = Some("a".into());
        let plan = plan_claims(
            &[a.clone(), b.clone(), r.clone()],
            Some(2),
            Allowance::uniform(1),
        );
        assert_eq!(plan, Plan::default());

        // The replacement is Available: the old claim goes, the next surge starts.
        r.available = true;
        let plan = plan_claims(&[a, b, r], Some(2), Allowance::uniform(1));
        assert_eq!(plan.delete, vec![("a".to_string(), DeleteReason::Replaced)]);
        assert_eq!(plan.create, vec![Some("b".to_string())]);
    }

    #[test]
    fn a_roll_out_passes_over_a_claim_marked_do_not_disrupt_until_it_expires() {
        let mut held = view("held", 1, true);
        held.outdated = true;
        held.held = true;
        let mut other = view("other", 2, true);
        other.outdated = true;
        let plan = plan_claims(
            &[held.clone(), other.clone()],
            Some(2),
            Allowance::uniform(2),
        );
        assert_eq!(plan.create, vec![Some("other".to_string())]);
        held.expired = true;
        let plan = plan_claims(&[held, other], Some(2), Allowance::uniform(2));
        assert_eq!(
            plan.create,
            vec![Some("held".to_string()), Some("other".to_string())],
            "expiry is not held"
        );
    }

    #[test]
    fn drifted_and_expired_claims_roll_within_their_own_allowances() {
        let mut drifted = view("drifted", 1, true);
        drifted.outdated = true;
        let mut expired = view("expired", 2, true);
        expired.outdated = true;
        expired.expired = true;
        let claims = [drifted.clone(), expired.clone()];
        let drift_closed = Allowance {
            disrupt: 0,
            ..Allowance::uniform(2)
        };
        assert_eq!(
            plan_claims(&claims, Some(2), drift_closed).create,
            vec![Some("expired".to_string())]
        );
        let expiry_closed = Allowance {
            expire: 0,
            ..Allowance::uniform(2)
        };
        assert_eq!(
            plan_claims(&claims, Some(2), expiry_closed).create,
            vec![Some("drifted".to_string())]
        );
    }

    #[test]
    fn an_expired_claim_goes_as_expired_and_a_drifted_one_as_replaced_once_their_replacements_serve(
    ) {
        let mut drifted = view("drifted", 1, true);
        drifted.outdated = true;
        let mut expired = view("expired", 2, true);
        expired.outdated = true;
        expired.expired = true;
        let mut r1 = view("r1", 3, true);
        r1.replaces = Some("drifted".into());
        let mut r2 = view("r2", 4, true);
        r2.replaces = Some("expired".into());
        let plan = plan_claims(&[drifted, expired, r1, r2], Some(2), Allowance::uniform(2));
        assert_eq!(
            plan.delete,
            vec![
                ("drifted".to_string(), DeleteReason::Replaced),
                ("expired".to_string(), DeleteReason::Expired)
            ]
        );
        let reasons: Vec<_> = plan.delete.iter().map(|(_, r)| r.disruption()).collect();
        assert_eq!(reasons, vec![Some("Drifted"), Some("Expired")]);
    }

    #[test]
    fn every_disruption_reason_is_listed_once_and_a_claim_that_served_no_node_is_no_disruption() {
        use DeleteReason::*;
        let all = [
            Failed,
            Outdated,
            Replaced,
            Expired,
            ScaleDown,
            Empty,
            Underutilized,
            Repaired,
            Outgrown,
            HostMaintenance,
        ];
        let given: std::collections::BTreeSet<_> =
            all.iter().filter_map(|r| r.disruption()).collect();
        let listed: std::collections::BTreeSet<_> = DISRUPTION_REASONS.into_iter().collect();
        assert_eq!(given, listed);
        for r in [Failed, Outdated, Outgrown] {
            assert_eq!(r.disruption(), None, "{r:?}");
        }
    }

    #[test]
    fn a_pool_asking_for_two_billion_replicas_plans_only_the_claims_it_may_create() {
        let allowed = Allowance {
            create: 20,
            ..Allowance::uniform(1)
        };
        let plan = plan_claims(&[view("a", 1, true)], Some(i32::MAX as usize), allowed);
        assert_eq!(plan.create.len(), 20);
        assert_eq!(plan.short, i32::MAX as usize - 21);
        let none = Allowance {
            create: 0,
            ..allowed
        };
        let plan = plan_claims(&[view("a", 1, true)], Some(3), none);
        assert!(plan.create.is_empty());
        assert_eq!(plan.short, 2);
    }

    #[test]
    fn replacements_take_the_room_for_creations_before_new_replicas() {
        let mut broken = view("broken", 1, false);
        broken.repair = true;
        let allowed = Allowance {
            create: 1,
            ..Allowance::uniform(1)
        };
        let plan = plan_claims(&[broken], Some(3), allowed);
        assert_eq!(plan.create, vec![Some("broken".to_string())]);
        assert_eq!(plan.short, 2);
    }

    #[test]
    fn a_budget_of_zero_holds_a_roll_out_but_a_scale_down_still_goes_one_node_at_a_time() {
        let mut a = view("a", 1, true);
        a.outdated = true;
        let closed = Allowance {
            disrupt: 0,
            expire: 0,
            scale_down: 1,
            host_maintenance: 0,
            create: usize::MAX,
        };
        assert_eq!(
            plan_claims(&[a.clone(), view("b", 2, true)], Some(2), closed),
            Plan::default()
        );
        let plan = plan_claims(
            &[a, view("b", 2, true), view("c", 3, true)],
            Some(1),
            closed,
        );
        assert_eq!(plan.delete.len(), 1, "{plan:?}");
        assert!(plan.create.is_empty());
    }

    #[test]
    fn a_node_leaving_a_drained_host_is_replaced_by_surge_within_the_host_maintenance_budget_and_held_by_zero(
    ) {
        let mut leaving = view("leaving", 1, true);
        leaving.host_maintenance = true;
        let other = view("b", 2, true);
        let one = Allowance {
            disrupt: 0,
            expire: 0,
            ..Allowance::uniform(1)
        };
        // A replacement first, by the HostMaintenance budget alone (drift's is closed).
        let plan = plan_claims(&[leaving.clone(), other.clone()], Some(2), one);
        assert_eq!(plan.create, vec![Some("leaving".to_string())]);
        assert!(plan.delete.is_empty() && plan.host_maintenance_held.is_empty());
        // The replacement does not take a slot of its own while it comes up.
        let mut r = view("r", 3, false);
        r.replaces = Some("leaving".into());
        let waiting = [leaving.clone(), other.clone(), r.clone()];
        assert_eq!(plan_claims(&waiting, Some(2), one), Plan::default());
        // Once it serves, the old node goes, for HostMaintenance.
        r.available = true;
        let plan = plan_claims(&[leaving.clone(), other.clone(), r.clone()], Some(2), one);
        assert_eq!(
            plan.delete,
            vec![("leaving".to_string(), DeleteReason::HostMaintenance)]
        );
        assert_eq!(
            DeleteReason::HostMaintenance.disruption(),
            Some("HostMaintenance")
        );
        // A budget of 0 for HostMaintenance holds the replacement, and says which claim waits.
        let zero = Allowance {
            host_maintenance: 0,
            ..Allowance::uniform(1)
        };
        let plan = plan_claims(&[leaving.clone(), other.clone()], Some(2), zero);
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        assert_eq!(plan.host_maintenance_held, vec!["leaving".to_string()]);
        // A replacement made before the budget closed serves: the old node still waits.
        let plan = plan_claims(&[leaving, other, r], Some(2), zero);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.host_maintenance_held, vec!["leaving".to_string()]);
    }

    #[test]
    fn a_powered_off_claim_is_never_rolled_and_goes_first_on_a_scale_down() {
        let mut off = view("off", 1, false);
        off.powered_off = true;
        off.outdated = true;
        off.host_maintenance = true;
        let claims = [off.clone(), view("b", 2, true), view("c", 3, true)];
        assert_eq!(
            plan_claims(&claims, Some(3), Allowance::uniform(3)),
            Plan::default()
        );
        let plan = plan_claims(&claims, Some(2), Allowance::uniform(1));
        assert_eq!(
            plan.delete,
            vec![("off".to_string(), DeleteReason::ScaleDown)]
        );
    }

    #[test]
    fn a_broken_node_is_replaced_first_and_removed_once_its_replacement_is_available_whatever_the_budget(
    ) {
        let mut broken = view("broken", 1, false);
        broken.repair = true;
        let closed = Allowance {
            disrupt: 0,
            expire: 0,
            scale_down: 1,
            host_maintenance: 0,
            create: usize::MAX,
        };
        let plan = plan_claims(&[broken.clone(), view("b", 2, true)], Some(2), closed);
        assert_eq!(plan.create, vec![Some("broken".to_string())]);
        assert!(plan.delete.is_empty());
        let mut r = view("r", 3, false);
        r.replaces = Some("broken".into());
        let waiting = [broken.clone(), view("b", 2, true), r.clone()];
        assert_eq!(plan_claims(&waiting, Some(2), closed), Plan::default());
        r.available = true;
        let plan = plan_claims(&[broken, view("b", 2, true), r], Some(2), closed);
        assert_eq!(
            plan.delete,
            vec![("broken".to_string(), DeleteReason::Repaired)]
        );
        assert!(plan.create.is_empty());
    }

    #[test]
    fn an_outdated_claim_that_is_not_available_is_replaced_at_once() {
        let mut a = view("a", 1, false);
        a.outdated = true;
        let plan = plan_claims(&[a, view("b", 2, true)], Some(2), Allowance::uniform(1));
        assert_eq!(plan.delete, vec![("a".to_string(), DeleteReason::Outdated)]);
        assert_eq!(plan.create, vec![None]);
    }

    fn claim(name: &str, hash: &str, created_ms: i64) -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {LABEL_TEMPLATE_HASH: hash},
                "creationTimestamp": Timestamp::from_millisecond(created_ms).expect("time").to_string(),
            },
            "spec": {"vClusterRef": {"name": "t"}},
        }))
        .expect("claim")
    }

    /// A claim status with `Drifted=True` for `reason`.
    fn drifted_status(reason: &str) -> Option<NodeClaimStatus> {
        Some(NodeClaimStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Drifted".into(),
                status: "True".into(),
                reason: reason.into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..NodeClaimStatus::default()
        })
    }

    #[test]
    fn a_claim_is_outdated_when_made_from_another_template_drifted_or_older_than_expire_after() {
        let mut drifted = claim("drifted", "h1", 1_000);
        drifted.status = drifted_status("NodeTypeChanged");
        let views = claim_views(&[drifted], "h1", None, true, 100_000);
        assert!(views[0].outdated && !views[0].expired);
        let claims = vec![claim("current", "h1", 1_000), claim("old", "h0", 1_000)];
        let outdated = |expire, now_ms| -> Vec<bool> {
            claim_views(&claims, "h1", expire, true, now_ms)
                .iter()
                .map(|v| v.outdated)
                .collect()
        };
        assert_eq!(outdated(None, 100_000), vec![false, true]);
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(outdated(hour, 3_600_999), vec![false, true]);
        assert_eq!(outdated(hour, 3_601_000), vec![true, true]);
    }

    #[test]
    fn a_claim_drifted_from_the_tenant_s_version_is_outdated_unless_the_pool_disables_it() {
        let mut c = claim("old-kubelet", "h", 0);
        c.status = drifted_status("KubernetesVersionChanged");
        let claims = [c];
        assert!(claim_views(&claims, "h", None, true, 0)[0].outdated);
        assert!(!claim_views(&claims, "h", None, false, 0)[0].outdated);
    }

    #[test]
    fn a_claim_view_reads_phase_node_deletion_and_annotations() {
        let mut c = claim("c", "h", 0);
        c.status = Some(NodeClaimStatus {
            phase: Some(NodeClaimPhase::Available),
            node_name: Some("n".into()),
            ..NodeClaimStatus::default()
        });
        c.metadata.annotations = Some(
            [
                (ANNOTATION_REPLACES.to_string(), "old".to_string()),
                (ANNOTATION_DELETE_FIRST.to_string(), String::new()),
            ]
            .into(),
        );
        let v = &claim_views(&[c.clone()], "h", None, true, 0)[0];
        assert!(v.available && v.has_node && !v.failed && !v.terminating && v.delete_first);
        assert_eq!(v.replaces.as_deref(), Some("old"));
        assert!(is_live(&c));
        c.status = Some(NodeClaimStatus {
            phase: Some(NodeClaimPhase::Failed),
            ..NodeClaimStatus::default()
        });
        assert!(claim_views(&[c.clone()], "h", None, true, 0)[0].failed);
        assert!(!is_live(&c));
    }
}
