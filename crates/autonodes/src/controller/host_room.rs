//! Host capacity as the controller reads it: a host cluster's Nodes and bound pods from its
//! watch caches ([`super::remote::HostCache`]), and which claims' VMs have a bound launcher
//! pod, handed to the pure model ([`crate::host_capacity`]). Scheduling asks it whether a
//! type's VM fits (reason `HostCapacityExhausted` when not); the NodeType controller shows
//! the headroom in the type's status and metrics.
//!
//! While the host's Nodes or pods cannot be watched (the host is unreachable, or autonodes
//! may not list them), host capacity is unknown: claims are scheduled as before, and the
//! NodeType says why in `status.host.message`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::Context;
use crate::api::NodeTypeHost;
use crate::host_capacity::{self, Bound, HostModel, VmShape, LABEL_LAUNCHER_VM};
use crate::ledger::ClaimedLedger;
use crate::requirements::Offer;
use crate::scheduling::{Catalogue, PreparedType};
use crate::zones::PROP_ZONE;

/// The most characters of a message shown in a NodeType's `status.host`.
const MESSAGE_MAX: usize = 300;

/// What the watch caches of one host cluster show now.
pub struct HostSnapshot {
    cluster: String,
    nodes: Vec<Arc<Node>>,
    pods: Vec<Arc<Pod>>,
}

/// The Nodes and bound pods of host `cluster`, or why they are not known.
pub async fn snapshot(ctx: &Context, cluster: &str) -> Result<HostSnapshot, String> {
    let remote = ctx
        .clients
        .host(cluster)
        .await
        .map_err(|e| format!("host cluster {cluster}: {e}"))?;
    let cache = remote
        .host_cache()
        .ok_or_else(|| format!("host cluster {cluster} is not watched"))?;
    let nodes = cache.nodes.filter(|_| true).ok_or_else(|| {
        format!("the Nodes of host cluster {cluster} are not watched yet (or may not be listed)")
    })?;
    let pods = cache.pods.filter(|_| true).ok_or_else(|| {
        format!("the pods of host cluster {cluster} are not watched yet (or may not be listed)")
    })?;
    Ok(HostSnapshot {
        cluster: cluster.to_string(),
        nodes,
        pods,
    })
}

impl HostSnapshot {
    /// The host's room: its nodes less their bound pods, less the VMs on their way (claims
    /// of the host's types in `ledger` whose launcher pod is not bound yet).
    pub fn model(&self, ctx: &Context, catalogue: &Catalogue, ledger: &ClaimedLedger) -> HostModel {
        let mut model = HostModel::new(
            self.nodes.iter().map(|n| &**n),
            self.pods.iter().map(|p| &**p),
        );
        let types: Vec<&PreparedType> = catalogue
            .types()
            .iter()
            .filter(|t| t.host_cluster == self.cluster)
            .collect();
        host_capacity::place_in_flight(&mut model, &types, ledger, &self.bound(ctx, ledger));
        model
    }

    /// Claims of this host whose VM's launcher pod is bound, per type and zone.
    fn bound(&self, ctx: &Context, ledger: &ClaimedLedger) -> Bound {
        let launched: HashSet<(&str, &str)> = self
            .pods
            .iter()
            .filter_map(|p| {
                let vm = p.labels().get(LABEL_LAUNCHER_VM)?;
                Some((p.metadata.namespace.as_deref()?, vm.as_str()))
            })
            .collect();
        let mut bound = Bound::new();
        if launched.is_empty() {
            return bound;
        }
        for claim in ctx.claims.state() {
            let Some(s) = claim.status.as_ref() else {
                continue;
            };
            let (Some(ns), Some(vm)) = (s.vm_namespace.as_deref(), s.vm_name.as_deref()) else {
                continue;
            };
            if s.host_cluster.as_deref() != Some(self.cluster.as_str())
                || !launched.contains(&(ns, vm))
            {
                continue;
            }
            let Some((node_type, zone)) = claim.uid().and_then(|u| {
                ledger
                    .holding(&u)
                    .map(|(t, z)| (t.to_string(), z.map(str::to_string)))
            }) else {
                continue;
            };
            *bound.entry((node_type, zone)).or_default() += 1;
        }
        bound
    }
}

/// A NodeType's `status.host`: the headroom of its VM on `model` (over the zones it
/// offers), or why it is not known.
pub fn type_host_status(t: &PreparedType, model: Result<&HostModel, &str>) -> NodeTypeHost {
    let bounded = |m: String| m.chars().take(MESSAGE_MAX).collect::<String>();
    let model = match model {
        Ok(m) => m,
        Err(why) => {
            return NodeTypeHost {
                message: Some(bounded(format!("host capacity unknown: {why}"))),
                ..Default::default()
            }
        }
    };
    let shape = match VmShape::of(t) {
        Ok(s) => s,
        Err(why) => {
            return NodeTypeHost {
                message: Some(bounded(why)),
                ..Default::default()
            }
        }
    };
    let offered = type_zones(t);
    let mut status = NodeTypeHost::default();
    let (vms, nodes) = if offered.is_empty() {
        let h = model.headroom(&shape, None);
        (h.vms, h.nodes)
    } else {
        let mut zones = BTreeMap::new();
        let (mut vms, mut nodes) = (0i64, 0i64);
        for z in &offered {
            let h = model.headroom(&shape, Some(z));
            zones.insert(z.clone(), h.vms);
            vms = vms.saturating_add(h.vms);
            nodes += h.nodes;
        }
        status.zones = zones;
        (vms, nodes)
    };
    status.headroom = Some(vms);
    status.eligible_nodes = Some(nodes);
    if vms == 0 {
        let zone = offered.first().map(String::as_str);
        status.message = Some(bounded(model.refusal(&shape, zone)));
    }
    status
}

/// The zones a type lists (none for a type without zones or one offering any, `*`).
fn type_zones(t: &PreparedType) -> Vec<String> {
    let Some(value) = t.properties.get(PROP_ZONE) else {
        return Vec::new();
    };
    match Offer::parse(value) {
        Offer::One => vec![value.trim().to_string()],
        Offer::Several(zones) => zones.into_iter().map(str::to_string).collect(),
        Offer::Any => Vec::new(),
    }
}
