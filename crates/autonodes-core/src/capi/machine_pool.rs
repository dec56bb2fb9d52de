//! The MachinePool of a NodePool: its spec, labels and annotations (bounds, replica marker,
//! scale-from-zero capacity), whether the one that exists needs a write, and its status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::machines::{is_available, is_live, node_ref};
use super::ownership::machine_selector;
use crate::catalogue::{Catalogue, PreparedType};
use crate::names::label_value;
use crate::resources::{self, ResourceAmounts};
use crate::scheduling::{self, ClaimRequest};
use autonodes_api::capi::*;
use autonodes_api::conditions::{self, status_of};
use autonodes_api::{
    NodeClaim, NodeClaimSpec, NodePool, Overhead, GROUP, LABEL_MANAGED_BY, LABEL_NODEPOOL,
    MANAGED_BY, VERSION,
};

/// A taint as the provider's `taints` annotation writes it: `key=value:Effect`, or
/// `key:Effect` without a value.
pub fn format_taint(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// The scale-from-zero annotations of a pool whose new claims get node type `t`:
/// allocatable cpu and memory (resources less `reserved`), `max_pods`, GPUs (the first
/// extended resource whose name contains `gpu`), and the labels and taints (without
/// startup taints, which go once the node is ready) a node of the pool carries.
pub(crate) fn capacity_annotations(
    t: &PreparedType,
    reserved: &ResourceAmounts,
    template: &NodeClaimSpec,
    max_pods: i128,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let cpu = (t.amounts.cpu_millis() - reserved.cpu_millis()).max(0);
    let memory = (t.amounts.memory_bytes() - reserved.memory_bytes()).max(0);
    out.insert(CAPACITY_CPU.to_string(), resources::format_cpu(cpu));
    out.insert(
        CAPACITY_MEMORY.to_string(),
        resources::format_memory(memory),
    );
    out.insert(CAPACITY_MAX_PODS.to_string(), max_pods.to_string());
    if let Some((name, milli)) = t.amounts.extended().find(|(n, _)| n.contains("gpu")) {
        let count = (milli - reserved.milli(name)).max(0) / 1000;
        out.insert(CAPACITY_GPU_COUNT.to_string(), count.to_string());
        out.insert(CAPACITY_GPU_TYPE.to_string(), name.to_string());
    }
    let properties = crate::node_config::node_properties(t, None, template);
    if let Ok(labels) =
        crate::node_config::node_labels(&properties, None, &template.labels, &BTreeMap::new())
    {
        let text: Vec<String> = labels
            .all()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.insert(CAPACITY_LABELS.to_string(), text.join(","));
    }
    if let Ok(taints) = crate::node_config::node_taints(t, None, template) {
        if !taints.taints.is_empty() {
            let text: Vec<String> = taints.taints.iter().map(format_taint).collect();
            out.insert(CAPACITY_TAINTS.to_string(), text.join(","));
        }
    }
    out
}

/// The scale-from-zero annotations for the node type a new claim made from `template`
/// would get now: the cheapest fitting type with capacity (given the claims per type,
/// `claimed`), else the cheapest fitting type; none when no type fits. `overhead` gives the
/// `spec.overhead` of a NodeType by name (its `kubeReserved` is not allocatable).
pub fn scale_from_zero(
    catalogue: &Catalogue,
    template: &NodeClaimSpec,
    claimed: &BTreeMap<String, i64>,
    overhead: impl Fn(&str) -> Option<Overhead>,
    max_pods: i128,
) -> BTreeMap<String, String> {
    let Ok(request) = ClaimRequest::new(template, None) else {
        return BTreeMap::new();
    };
    let chosen = scheduling::choose(catalogue, &request, claimed)
        .or_else(|_| scheduling::choose(catalogue, &request, &BTreeMap::new()));
    let Ok(t) = chosen else {
        return BTreeMap::new();
    };
    let reserved = overhead(&t.name)
        .and_then(|o| ResourceAmounts::from_list(&o.kube_reserved).ok())
        .unwrap_or_default();
    capacity_annotations(t, &reserved, template, max_pods)
}

/// Every annotation key the mirror may set on a MachinePool (those it does not set this
/// time are removed).
const OWNED_POOL_ANNOTATIONS: &[&str] = &[
    ANNOTATION_MIN_SIZE,
    ANNOTATION_MAX_SIZE,
    ANNOTATION_SYNCED_REPLICAS,
    CAPACITY_CPU,
    CAPACITY_MEMORY,
    CAPACITY_MAX_PODS,
    CAPACITY_GPU_COUNT,
    CAPACITY_GPU_TYPE,
    CAPACITY_LABELS,
    CAPACITY_TAINTS,
];

/// The providerIDs of the claims' joined nodes (live claims only), sorted.
pub fn provider_id_list(claims: &[NodeClaim]) -> Vec<String> {
    let mut ids: Vec<String> = claims
        .iter()
        .filter(|c| is_live(c))
        .filter_map(|c| {
            let s = c.status.as_ref()?;
            s.node_name.as_ref()?;
            s.provider_id.clone()
        })
        .collect();
    ids.sort();
    ids
}

/// The MachinePool mirroring `pool` (uid `pool_uid`) with its `claims`: `replicas`, the
/// bounds annotations when the bounds are valid (`bounds_ok`), the replica marker, the
/// scale-from-zero annotations `capacity` ([`scale_from_zero`]) and the providerIDs.
pub fn desired_machine_pool(
    pool: &NodePool,
    pool_uid: &str,
    claims: &[NodeClaim],
    bounds_ok: bool,
    replicas: i32,
    capacity: BTreeMap<String, String>,
) -> MachinePool {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let cluster = pool.spec.v_cluster_ref.name.clone();
    let mut annotations = BTreeMap::new();
    if let (true, Some(a)) = (bounds_ok, pool.spec.autoscaling.as_ref()) {
        annotations.insert(ANNOTATION_MIN_SIZE.to_string(), a.min_replicas.to_string());
        annotations.insert(ANNOTATION_MAX_SIZE.to_string(), a.max_replicas.to_string());
    }
    annotations.insert(ANNOTATION_SYNCED_REPLICAS.to_string(), replicas.to_string());
    annotations.extend(capacity);
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_NODEPOOL.to_string(), label_value(&name)),
        (LABEL_CLUSTER_NAME.to_string(), label_value(&cluster)),
    ]);
    let mut mp = MachinePool::new(
        &name,
        MachinePoolSpec {
            cluster_name: cluster.clone(),
            replicas: Some(replicas),
            template: MachineTemplateSpec {
                metadata: MachineTemplateMetadata {
                    labels: BTreeMap::from([
                        (LABEL_POOL_NAME.to_string(), label_value(&name)),
                        (LABEL_CLUSTER_NAME.to_string(), label_value(&cluster)),
                    ]),
                    annotations: BTreeMap::new(),
                },
                spec: MachineTemplateMachineSpec {
                    cluster_name: cluster,
                    bootstrap: Bootstrap::default(),
                    version: None,
                },
            },
            provider_id_list: provider_id_list(claims),
        },
    );
    mp.metadata.namespace = pool.metadata.namespace.clone();
    mp.metadata.labels = Some(labels);
    mp.metadata.annotations = Some(annotations);
    mp.metadata.owner_references = Some(vec![OwnerReference {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "NodePool".into(),
        name,
        uid: pool_uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    mp
}

/// Whether `existing` lacks anything of `desired` (labels, the mirror's annotations,
/// owner, spec).
pub fn needs_update(existing: &MachinePool, desired: &MachinePool) -> bool {
    let have_labels = existing.metadata.labels.clone().unwrap_or_default();
    let labels_ok = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have_labels.get(k) == Some(v));
    let have = existing.metadata.annotations.clone().unwrap_or_default();
    let want = desired.metadata.annotations.clone().unwrap_or_default();
    let annotations_ok = OWNED_POOL_ANNOTATIONS
        .iter()
        .all(|k| have.get(*k) == want.get(*k));
    let owner_ok = desired.metadata.owner_references.iter().flatten().all(|o| {
        existing
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|e| e.uid == o.uid)
    });
    !(labels_ok && annotations_ok && owner_ok && existing.spec == desired.spec)
}

/// The server-side apply body that makes the MachinePool `desired` (without status),
/// conditional on the resourceVersion of the one that exists, if one does.
pub fn machine_pool_body(
    desired: &MachinePool,
    existing: Option<&MachinePool>,
) -> Result<Value, serde_json::Error> {
    let mut body = serde_json::to_value(desired)?;
    if let Some(mp) = existing {
        body["metadata"]["resourceVersion"] = json!(mp.metadata.resource_version);
    }
    if let Some(o) = body.as_object_mut() {
        o.remove("status");
    }
    Ok(body)
}

/// The status of the MachinePool `mp` with the pool's `claims` and `desired` replicas: live
/// and ready counts, the phase (ScalingUp, ScalingDown or Running), the joined nodes, and
/// its `Ready` condition (set at `now` when it changes).
pub fn machine_pool_status(
    mp: &MachinePool,
    claims: &[NodeClaim],
    desired: i32,
    now: Timestamp,
) -> MachinePoolStatus {
    let live = claims.iter().filter(|c| is_live(c)).count();
    let ready = claims.iter().filter(|c| is_available(c)).count();
    let live = i32::try_from(live).unwrap_or(i32::MAX);
    let ready = i32::try_from(ready).unwrap_or(i32::MAX);
    let mut node_refs: Vec<ObjectReference> = claims
        .iter()
        .filter(|c| is_live(c))
        .filter_map(|c| c.status.as_ref()?.node_name.clone())
        .map(node_ref)
        .collect();
    node_refs.sort_by(|a, b| a.name.cmp(&b.name));
    let phase = if live < desired || ready < live.min(desired) {
        "ScalingUp"
    } else if live > desired {
        "ScalingDown"
    } else {
        "Running"
    };
    let old = mp.status.clone().unwrap_or_default();
    let mut conditions_list: Vec<Condition> = old.conditions.clone();
    let ok = ready == desired && live == desired;
    conditions::set(
        &mut conditions_list,
        "Ready",
        status_of(ok),
        if ok { "AllMachinesReady" } else { phase },
        format!("{ready} of {desired} machines Ready, {live} live"),
        mp.metadata.generation,
        now,
    );
    MachinePoolStatus {
        observed_generation: mp.metadata.generation,
        replicas: live,
        ready_replicas: ready,
        available_replicas: ready,
        unavailable_replicas: (live - ready).max(0),
        selector: Some(machine_selector(
            mp.metadata.name.as_deref().unwrap_or_default(),
        )),
        phase: Some(phase.to_string()),
        node_refs,
        conditions: conditions_list,
    }
}
