//! The Machines of a pool: one per NodeClaim, what each shows, and the delete-first marks
//! that go from the Machines to their claims.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{json, Value};

use super::ownership::{labelled_for, ClaimNames};
use crate::names::label_value;
use autonodes_api::capi::{
    Bootstrap, Machine, MachineSpec, MachineStatus, ANNOTATION_DELETE_MACHINE, CAPI_GROUP,
    CAPI_VERSION, LABEL_CLUSTER_NAME, LABEL_POOL_NAME,
};
use autonodes_api::conditions;
use autonodes_api::{
    NodeClaim, NodeClaimPhase, NodePool, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_NODEPOOL,
    MANAGED_BY,
};

/// The Cluster API phase of a Machine for its claim.
pub(crate) fn machine_phase(claim: &NodeClaim) -> &'static str {
    if claim.metadata.deletion_timestamp.is_some() {
        return "Deleting";
    }
    match claim.status.as_ref().and_then(|s| s.phase) {
        None | Some(NodeClaimPhase::Pending) => "Pending",
        Some(NodeClaimPhase::Provisioning) => "Provisioning",
        // Cluster API has no stopped phase: the machine exists, its node does not serve.
        Some(NodeClaimPhase::Joining | NodeClaimPhase::PoweredOff) => "Provisioned",
        Some(NodeClaimPhase::Available) => "Running",
        Some(NodeClaimPhase::Failed) => "Failed",
        Some(NodeClaimPhase::Terminating) => "Deleting",
    }
}

/// A reference to the tenant Node `name`.
pub(super) fn node_ref(name: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name),
        ..ObjectReference::default()
    }
}

/// The Machine status mirroring `claim`.
pub(crate) fn machine_status(claim: &NodeClaim, names: &ClaimNames) -> MachineStatus {
    let s = claim.status.clone().unwrap_or_default();
    let failed = s.phase == Some(NodeClaimPhase::Failed);
    let failure = failed
        .then(|| {
            conditions::get(&s.conditions, names.ready)
                .filter(|c| c.status != conditions::TRUE)
                .or_else(|| s.conditions.iter().find(|c| c.status != conditions::TRUE))
                .map(|c| (c.reason.clone(), c.message.clone()))
        })
        .flatten();
    MachineStatus {
        phase: Some(machine_phase(claim).to_string()),
        node_ref: s.node_name.clone().map(node_ref),
        bootstrap_ready: s.vm_name.is_some(),
        infrastructure_ready: conditions::is_true(&s.conditions, names.provisioned),
        failure_reason: failure.as_ref().map(|f| f.0.clone()),
        failure_message: failure
            .map(|f| f.1)
            .or_else(|| failed.then(|| "the NodeClaim Failed".to_string())),
    }
}

/// Whether the claim counts towards the pool: neither being deleted nor Failed.
pub fn is_live(c: &NodeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.status.as_ref().and_then(|s| s.phase) != Some(NodeClaimPhase::Failed)
}

/// Whether the claim is live and Available.
pub(crate) fn is_available(c: &NodeClaim) -> bool {
    is_live(c) && c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Available)
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// What to write of one claim's Machine.
#[derive(Clone, Debug)]
pub enum MachineWrite<'a> {
    /// The existing Machine has all it should.
    Keep(&'a Machine),
    /// No Machine yet: create it with this server-side apply body.
    Create(Value),
    /// The existing Machine lacks something: update it with this server-side apply body
    /// (conditional on its resourceVersion).
    Update(Value),
}

/// One claim's Machine: how to write it and the status it should then show.
#[derive(Clone, Debug)]
pub struct PlannedMachine<'a> {
    /// The Machine's name (the claim's).
    pub name: String,
    /// How to write it.
    pub write: MachineWrite<'a>,
    /// The status it should show.
    pub status: MachineStatus,
}

/// The plan for the Machines of a pool.
#[derive(Clone, Debug, Default)]
pub struct MachinePlan<'a> {
    /// Machines whose claim is gone: to delete, by name.
    pub delete: Vec<String>,
    /// One entry per claim that has or gets a Machine (a claim on its way out gets no new
    /// Machine).
    pub machines: Vec<PlannedMachine<'a>>,
}

/// The Machines of `pool` (whose MachinePool has the uid `mp_uid`): one per claim of any
/// phase, the ones without a claim deleted.
pub fn plan_machines<'a>(
    pool: &NodePool,
    mp_uid: &str,
    claims: &[NodeClaim],
    machines: &'a [Machine],
    names: &ClaimNames,
) -> MachinePlan<'a> {
    let ns = pool.metadata.namespace.clone().unwrap_or_default();
    let pool_name = name_of(&pool.metadata);
    let cluster = &pool.spec.v_cluster_ref.name;
    let claim_names: BTreeSet<&str> = claims.iter().map(|c| name_of(&c.metadata)).collect();
    let delete = machines
        .iter()
        .map(|m| name_of(&m.metadata))
        .filter(|m| !claim_names.contains(m))
        .map(str::to_string)
        .collect();
    let mut planned = Vec::new();
    for claim in claims {
        let name = name_of(&claim.metadata);
        let existing = machines.iter().find(|m| name_of(&m.metadata) == name);
        let s = claim.status.clone().unwrap_or_default();
        let spec = MachineSpec {
            cluster_name: cluster.clone(),
            bootstrap: Bootstrap {
                data_secret_name: s.vm_name.as_ref().map(|vm| format!("{vm}-userdata")),
            },
            provider_id: s.provider_id.clone(),
            version: claim.spec.kubernetes_version.clone(),
        };
        let labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            (LABEL_POOL_NAME.to_string(), label_value(pool_name)),
            (LABEL_CLUSTER_NAME.to_string(), label_value(cluster)),
            (LABEL_NODEPOOL.to_string(), label_value(pool_name)),
            (LABEL_NODECLAIM.to_string(), label_value(name)),
        ]);
        let current = existing.is_some_and(|m| {
            let have = m.metadata.labels.clone().unwrap_or_default();
            m.spec == spec
                && labels.iter().all(|(k, v)| have.get(k) == Some(v))
                && m.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == mp_uid)
        });
        let write = match existing {
            Some(m) if current => MachineWrite::Keep(m),
            // A claim on its way out gets no new Machine.
            None if claim.metadata.deletion_timestamp.is_some() => continue,
            _ => {
                let owner = OwnerReference {
                    api_version: format!("{CAPI_GROUP}/{CAPI_VERSION}"),
                    kind: "MachinePool".into(),
                    name: pool_name.to_string(),
                    uid: mp_uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: None,
                };
                let mut body = json!({
                    "apiVersion": format!("{CAPI_GROUP}/{CAPI_VERSION}"),
                    "kind": "Machine",
                    "metadata": {"name": name, "namespace": ns, "labels": labels,
                                 "ownerReferences": [owner]},
                    "spec": spec,
                });
                match existing {
                    Some(m) => {
                        body["metadata"]["resourceVersion"] = json!(m.metadata.resource_version);
                        MachineWrite::Update(body)
                    }
                    None => MachineWrite::Create(body),
                }
            }
        };
        planned.push(PlannedMachine {
            name: name.to_string(),
            write,
            status: machine_status(claim, names),
        });
    }
    MachinePlan {
        delete,
        machines: planned,
    }
}

/// A claim's delete-first mark (annotation [`ClaimNames::delete_first`]) to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The claim's name.
    pub claim: String,
    /// The mark's value (the Machine's `delete-machine` annotation), or `None` to remove it.
    pub value: Option<String>,
}

/// The marks to write so that each claim carries its Machine's `delete-machine`
/// annotation as its delete-first mark (claims without a Machine are left alone).
pub fn delete_first_marks(
    claims: &[NodeClaim],
    machines: &[Machine],
    names: &ClaimNames,
) -> Vec<Mark> {
    let annotation =
        |meta: &ObjectMeta, key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    claims
        .iter()
        .filter_map(|claim| {
            let name = name_of(&claim.metadata);
            let machine = machines.iter().find(|m| name_of(&m.metadata) == name)?;
            let want = annotation(&machine.metadata, ANNOTATION_DELETE_MACHINE);
            let have = annotation(&claim.metadata, names.delete_first);
            (want != have).then(|| Mark {
                claim: name.to_string(),
                value: want,
            })
        })
        .collect()
}

/// The marks that remove the delete-first mark from the claims of the pool `pool` in `ns`
/// (when its mirror goes).
pub fn claims_to_unmark<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    ns: &str,
    pool: &str,
    names: &ClaimNames,
) -> Vec<Mark> {
    claims
        .into_iter()
        .filter(|c| {
            labelled_for(&c.metadata, ns, LABEL_NODEPOOL, pool)
                && c.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(names.delete_first))
        })
        .map(|c| Mark {
            claim: name_of(&c.metadata).to_string(),
            value: None,
        })
        .collect()
}
