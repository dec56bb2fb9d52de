//! Host capacity as the controller reads it: a host cluster's Nodes and bound pods from its
//! watch caches ([`crate::remote::caches::HostCache`]), and which claims' VMs have a bound launcher
//! pod, handed to the pure model ([`autonodes_core::host_capacity`]). Scheduling asks it whether a
//! type's VM fits (reason `HostCapacityExhausted` when not); the NodeType controller shows
//! the headroom in the type's status and metrics.
//!
//! While the host's Nodes or pods cannot be watched (the host is unreachable, or autonodes
//! may not list them), host capacity is unknown: claims are scheduled as before, and the
//! NodeType says why in `status.host.message`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::remote::clients::ClusterClients;
use autonodes_api::NodeClaim;
use autonodes_api::NodeTypeHost;
use autonodes_core::catalogue::{Catalogue, PreparedType};
use autonodes_core::host_capacity::{self, Apart, Bound, HostModel, VmShape};
use autonodes_core::ledger::ClaimedLedger;
use autonodes_core::properties::PROP_ZONE;
use autonodes_core::template::placement;
use autonodes_core::zones;
use kube::runtime::reflector::Store;

/// The most characters of a message shown in a NodeType's `status.host`.
const MESSAGE_MAX: usize = 300;

/// What the watch caches of one host cluster show now.
pub(crate) struct HostSnapshot {
    cluster: String,
    nodes: Vec<Arc<Node>>,
    pods: Vec<Arc<Pod>>,
}

/// The Nodes and bound pods of host `cluster`, or why they are not known.
pub(crate) async fn snapshot(
    clients: &ClusterClients,
    cluster: &str,
) -> Result<HostSnapshot, String> {
    let remote = clients
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

/// A host's room for one decision: its model, and which claims' launcher pods are bound.
pub(crate) struct HostRoom {
    /// The nodes and the room left on each.
    pub model: HostModel,
    /// The claims counted by their bound launcher pods.
    pub bound: Bound,
    /// The catalogue's types on this host.
    pub types: HashSet<String>,
}

impl HostSnapshot {
    /// The host's room: its nodes less their bound pods, less the VMs on their way (claims
    /// of the host's types in `ledger` whose launcher pod is not bound yet).
    pub(crate) fn room(&self, catalogue: &Catalogue, ledger: &ClaimedLedger) -> HostRoom {
        let mut model = HostModel::new(
            self.nodes.iter().map(|n| &**n),
            self.pods.iter().map(|p| &**p),
        );
        let types: Vec<&PreparedType> = catalogue
            .types()
            .iter()
            .filter(|t| t.host_cluster == self.cluster)
            .collect();
        let bound = Bound::of(self.pods.iter().map(|p| &**p), ledger);
        host_capacity::place_in_flight(&mut model, &types, ledger, &bound);
        HostRoom {
            model,
            bound,
            types: types.iter().map(|t| t.name.clone()).collect(),
        }
    }
}

/// Whether the host has room for one claim's VM of one type: the type's VM shape on the
/// host's room and, for a type with hard VM anti-affinity, the claim's group.
pub(crate) struct ClaimRoom<'a> {
    room: &'a HostRoom,
    shape: VmShape,
    /// The claim's group and how they are grouped, when its VM must keep apart from it.
    apart: Option<(placement::Scope, BTreeMap<String, String>)>,
}

impl<'a> ClaimRoom<'a> {
    /// The room for `claim`'s VM of type `t` on `room` (`None` when the type's VM shape
    /// cannot be read; the type is Failed then).
    pub(crate) fn new(room: &'a HostRoom, t: &PreparedType, claim: &NodeClaim) -> Option<Self> {
        let shape = VmShape::of(t).ok()?;
        let presets = placement::parse_placement(&t.properties).ok()?;
        let apart = match presets.vm_affinity {
            Some((true, placement::Strength::Hard)) => {
                Some((presets.scope, placement::claim_group(presets.scope, claim)))
            }
            _ => None,
        };
        Some(ClaimRoom { room, shape, apart })
    }

    /// The group to keep apart from in `zone`, with its VMs on their way.
    fn apart(
        &self,
        claims: &Store<NodeClaim>,
        ledger: &ClaimedLedger,
        zone: Option<&str>,
    ) -> Option<Apart> {
        let (scope, group) = self.apart.as_ref()?;
        let types: HashSet<&str> = self.room.types.iter().map(String::as_str).collect();
        let claims = claims.state();
        let on_the_way = host_capacity::group_on_the_way(
            claims.iter().map(|c| &**c),
            &types,
            ledger,
            &self.room.bound,
            group,
            *scope,
            zone,
        );
        Some(Apart {
            group: group.clone(),
            on_the_way,
        })
    }

    /// Whether the VM fits in `zone` (anywhere when `None`).
    pub(crate) fn fits(
        &self,
        claims: &Store<NodeClaim>,
        ledger: &ClaimedLedger,
        zone: Option<&str>,
    ) -> bool {
        match self.apart(claims, ledger, zone) {
            Some(a) => self.room.model.fits_apart(&self.shape, zone, &a),
            None => self.room.model.fits(&self.shape, zone),
        }
    }

    /// Why the VM does not fit in `zone`.
    pub(crate) fn refusal(
        &self,
        claims: &Store<NodeClaim>,
        ledger: &ClaimedLedger,
        zone: Option<&str>,
    ) -> String {
        let apart = self.apart(claims, ledger, zone);
        self.room.model.refusal(&self.shape, zone, apart.as_ref())
    }
}

/// A NodeType's `status.host`: the headroom of its VM on `model` (over the zones it
/// offers), or why it is not known.
pub(crate) fn type_host_status(t: &PreparedType, model: Result<&HostModel, &str>) -> NodeTypeHost {
    let bounded = |m: String| autonodes_api::conditions::cut(&m, MESSAGE_MAX);
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
        status.message = Some(bounded(model.refusal(&shape, zone, None)));
    }
    status
}

/// The zones a type lists (none for a type without zones or one offering any, `*`).
fn type_zones(t: &PreparedType) -> Vec<String> {
    t.properties
        .get(PROP_ZONE)
        .and_then(|value| zones::listed(value))
        .map(|zones| zones.into_iter().map(str::to_string).collect())
        .unwrap_or_default()
}
