//! Warm VMs kept for one NodePool (`spec.warm` of the pool): booted with the pool's
//! properties (but the type's SSH keys and user data, which the pool's claims get with
//! their binding) on the cheapest type its template accepts ([`pool_type`], [`plan_pool`]),
//! reserved for the pool's claims, and counted against the pool's namespace.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::catalogue::{Catalogue, PreparedType};
use crate::pool::limits::NamespaceClaims;
use crate::properties::{AT_BINDING_PROPERTIES, CONFIG_PROPERTIES, PROP_IMAGE_URL};
use crate::scheduling::{self, ClaimRequest, NoFit};
use autonodes_api::reasons::PoolReason;
use autonodes_api::{NodePoolSpec, NodePoolWarm, MAX_POOL_WARM_REPLICAS};

/// The type `t` as a warm VM of `pool` is made from it: the type's properties with the
/// pool's over them (its image settings, disks, networks and placement shape the VM), but
/// the type's own user data and SSH keys, so that no tenant can log in to a VM that holds a
/// host credential: the pool's come with the binding ([`crate::warm::binding`]). Its
/// definition hash covers the pool's properties that boot the VM, so a pool whose image
/// settings changed has its warm VMs replaced (one whose user data changed does not: its
/// claims get the new one with their binding).
pub fn pool_type(t: &PreparedType, pool: &NodePoolSpec) -> PreparedType {
    let mut out = t.clone();
    let mut properties =
        crate::node_config::node_properties(t, Some(pool), &crate::pool::template_spec(pool));
    for key in AT_BINDING_PROPERTIES {
        match t.properties.get(*key) {
            Some(v) => properties.insert((*key).to_string(), v.clone()),
            None => properties.remove(*key),
        };
    }
    out.properties = properties;
    let config: BTreeMap<&str, &String> = CONFIG_PROPERTIES
        .iter()
        .filter(|k| !AT_BINDING_PROPERTIES.contains(k))
        .filter_map(|k| pool.properties.get(*k).map(|v| (*k, v)))
        .collect();
    let described = serde_json::json!({"type": t.definition, "pool": config});
    let digest = Sha256::digest(described.to_string().as_bytes());
    out.definition = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    out.warm_replicas = replicas(pool);
    out
}

/// Why `pool` can keep no warm VMs of `t` (a warm VM of [`pool_type`]): what the type
/// cannot keep ([`super::type_problem`]), user data of the pool's that only a VM's first
/// boot applies, or an image of the pool's own
/// (`kubevirt.vcluster.com/image-url`), which whoever made it could log in to while the VM
/// holds its host credential.
pub fn pool_problem(t: &PreparedType, pool: &NodePoolSpec) -> Option<String> {
    let pt = pool_type(t, pool);
    if let Some(problem) = super::type_problem(&pt) {
        return Some(problem);
    }
    let user_data = crate::node_config::user_cloud_config(&pool.properties);
    if user_data != crate::node_config::user_cloud_config(&t.properties) {
        if let Some(problem) = crate::userdata::binding::at_binding_problem(user_data) {
            return Some(format!(
                "the pool's claims get their user data with their binding, but {problem}"
            ));
        }
    }
    let image = pool.properties.get(PROP_IMAGE_URL)?;
    (t.properties.get(PROP_IMAGE_URL) != Some(image)).then(|| {
        format!(
            "the pool boots an image of its own ({PROP_IMAGE_URL}), and a warm VM holds a host credential until it is bound: it boots only its type's image"
        )
    })
}

/// `spec.warm.replicas` of a pool, within 0 and [`MAX_POOL_WARM_REPLICAS`].
pub fn replicas(pool: &NodePoolSpec) -> i64 {
    pool.warm.as_ref().map_or(0, |w| {
        i64::from(w.replicas.clamp(0, MAX_POOL_WARM_REPLICAS))
    })
}

/// The key a pool's warm VMs of type `node_type` are kept under (beside the type's own,
/// which are kept under the type's name).
pub fn group_key(node_type: &str, pool_uid: &str) -> String {
    format!("{node_type}/pool/{pool_uid}")
}

/// How many more nodes a namespace may hold besides its live claims and its other pools'
/// warm VMs, and what says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceRoom {
    /// Nodes it may still hold.
    pub nodes: i64,
    /// What bounds it, said as "the controller allows namespace X N claims" or "NodeQuota Q
    /// limits namespace X to N nodes".
    pub bound: String,
}

/// The room a namespace (`ns`: its live claims, the controller's cap, its quotas' `nodes`)
/// has for a pool's warm VMs besides `other_warm`, the warm VMs its other pools keep.
pub fn namespace_room(ns: &NamespaceClaims, other_warm: i64) -> NamespaceRoom {
    let held = i64::try_from(ns.live).unwrap_or(i64::MAX) + other_warm;
    if ns.quota_missing {
        return NamespaceRoom {
            nodes: 0,
            bound: format!(
                "no NodeQuota covers namespace {}, and the controller requires one (--require-quota)",
                ns.namespace
            ),
        };
    }
    let max = i64::try_from(ns.max).unwrap_or(i64::MAX);
    let mut room = NamespaceRoom {
        nodes: max.saturating_sub(held),
        bound: format!(
            "the controller allows namespace {} {max} nodes (--max-claims-per-namespace)",
            ns.namespace
        ),
    };
    if let Some((quota, nodes)) = ns.quota_nodes {
        let nodes = i64::try_from(nodes).unwrap_or(i64::MAX);
        if nodes.saturating_sub(held) < room.nodes {
            room = NamespaceRoom {
                nodes: nodes.saturating_sub(held),
                bound: format!(
                    "NodeQuota {quota} limits namespace {} to {nodes} nodes",
                    ns.namespace
                ),
            };
        }
    }
    room
}

/// What a pool's warm VMs should be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolWarmPlan {
    /// The type they are of (none when the pool keeps none, or none can be made).
    pub node_type: Option<String>,
    /// How many to keep.
    pub wanted: i64,
    /// `spec.warm.replicas`, as asked.
    pub asked: i64,
    /// Why fewer than asked are kept (the namespace's room or its quota).
    pub limited: Option<String>,
    /// Why none can be made although some are asked for.
    pub unavailable: Option<String>,
}

/// Plans a pool's warm VMs: of the cheapest type of `catalogue` (the types the pool's
/// namespace may use) that a claim of the pool's template fits with room under its
/// `maxCapacity` (`claimed`: claims per type) and whose warm VM could be made with the
/// pool's properties; as many as `spec.warm.replicas` asks, within `room` and as far as
/// `quota(t, k)` admits a `k+1`-th warm VM of `t` besides the namespace's claims.
pub fn plan_pool(
    pool: &NodePoolSpec,
    catalogue: &Catalogue,
    claimed: &BTreeMap<String, i64>,
    room: &NamespaceRoom,
    mut quota: impl FnMut(&PreparedType, i64) -> Result<(), String>,
) -> PoolWarmPlan {
    let asked = replicas(pool);
    let mut out = PoolWarmPlan {
        asked,
        ..PoolWarmPlan::default()
    };
    if asked == 0 {
        return out;
    }
    let request = match ClaimRequest::new(&crate::pool::template_spec(pool), Some(pool)) {
        Ok(r) => r,
        Err(e) => {
            out.unavailable = Some(format!("the pool's template cannot be used: {e}"));
            return out;
        }
    };
    let chosen = scheduling::choose_within(catalogue, &request, claimed, |t| {
        match pool_problem(t, pool) {
            None => Ok(()),
            Some(problem) => Err(NoFit {
                reason: "WarmUnavailable",
                message: format!("node type {} keeps no warm VMs: {problem}", t.name),
            }),
        }
    });
    let t = match chosen {
        Ok(t) => t,
        Err(e) => {
            out.unavailable = Some(e.message);
            return out;
        }
    };
    out.node_type = Some(t.name.clone());
    let mut wanted = asked.min(room.nodes.max(0));
    if wanted < asked {
        out.limited = Some(format!(
            "{wanted} of {asked} warm VM(s): {}, with its claims and other pools' warm VMs",
            room.bound
        ));
    }
    for k in 0..wanted {
        if let Err(why) = quota(t, k) {
            out.limited = Some(format!("{k} of {asked} warm VM(s): {why}"));
            wanted = k;
            break;
        }
    }
    out.wanted = wanted;
    out
}

/// A group of warm VMs as the type's controller last kept it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Warm VMs kept.
    pub current: i64,
    /// Of those, the ready ones.
    pub ready: i64,
    /// How many the type's `maxCapacity` let the group keep.
    pub granted: i64,
    /// Whether the type's controller has kept the group yet (else all counts are 0 because
    /// nothing was looked at).
    pub kept: bool,
}

/// A pool's `status.warm` and its `WarmReady` condition (status, reason, message), from its
/// plan, its group on the planned type (`here`) and the warm VMs it still has on a type it
/// left (`left`). A pool that asks for none shows what it still has, and no condition.
pub fn pool_status(
    plan: &PoolWarmPlan,
    here: GroupCounts,
    left: i64,
) -> (Option<NodePoolWarm>, Option<(bool, PoolReason, String)>) {
    if plan.asked == 0 {
        let current = here.current + left;
        let status = (current > 0).then(|| NodePoolWarm {
            current,
            ..NodePoolWarm::default()
        });
        return (status, None);
    }
    let type_name = plan.node_type.clone().unwrap_or_default();
    let granted = here.granted.min(plan.wanted);
    let status = NodePoolWarm {
        node_type: plan.node_type.clone(),
        replicas: granted,
        current: here.current + left,
        ready: here.ready,
    };
    let condition = if let Some(why) = &plan.unavailable {
        (false, PoolReason::WarmUnavailable, why.clone())
    } else if let Some(why) = &plan.limited {
        (false, PoolReason::WarmLimited, why.clone())
    } else if here.kept && here.granted < plan.wanted && here.current >= here.granted {
        (
            false,
            PoolReason::WarmLimited,
            format!(
                "{granted} of {} warm VM(s): node type {type_name}'s maxCapacity leaves no more room besides its claims and warm VMs",
                plan.asked
            ),
        )
    } else if here.ready >= plan.wanted && left == 0 {
        (
            true,
            PoolReason::WarmReady,
            format!(
                "{} warm VM(s) of node type {type_name} ready for the pool's claims",
                here.ready
            ),
        )
    } else {
        (
            false,
            PoolReason::WarmStarting,
            format!(
                "{} of {} warm VM(s) of node type {type_name} ready; the others are being made or are booting",
                here.ready, plan.wanted
            ),
        )
    };
    (Some(status), Some(condition))
}

#[cfg(test)]
mod tests;
