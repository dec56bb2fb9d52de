//! Warm VMs, as pure functions: which warm VMs a node type keeps, makes and removes
//! ([`plan`]); whether a claim can take one ([`servable`]); the names and labels of what is
//! made for one; and the binding a claim writes for the VM it takes ([`binding`]).
//!
//! A warm VM boots from its type's template with user data that joins nothing
//! ([`crate::userdata::warm`]): it starts an agent that, with a credential of its own
//! (a ServiceAccount token whose Role reads only this VM's binding Secret, renews only
//! this VM's Lease and deletes only its own ServiceAccount), renews the Lease as a heartbeat
//! and polls for its binding. A claim that takes the VM writes the binding (the
//! JoinConfiguration and prepare script the claim's own user data would carry, and the
//! claim's SSH keys and user data where they are not the type's); the agent revokes its
//! credential, has cloud-init apply that user data, and joins; once the Node joined, what
//! is left of the credential and the binding is deleted.
//!
//! A NodePool may keep warm VMs of its own, booted with its properties (but its type's
//! user data and SSH keys) and taken only by its claims ([`pool`]).

pub mod pool;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::catalogue::PreparedType;
use crate::node_config::user_cloud_config;
use crate::properties::{
    AT_BINDING_PROPERTIES, CONFIG_PROPERTIES, PROP_USER_DATA_TEMPLATE, PROP_VM_AFFINITY,
    PROP_VM_ANTI_AFFINITY, PROP_ZONE,
};
use crate::render::{self, RenderError};
use crate::userdata::binding::{at_binding_problem, render_binding_user_data};
use crate::userdata::{JoinParams, JOIN_CONFIG_PATH, PREPARE_SCRIPT_PATH};
use autonodes_api::{
    NodeClaim, NodePoolSpec, ANNOTATION_WARM_CREDENTIAL_EXPIRES, LABEL_INSTALLATION,
    LABEL_MANAGED_BY, LABEL_WARM_DEFINITION, LABEL_WARM_NODEPOOL, LABEL_WARM_NODETYPE,
    LABEL_WARM_VM, MANAGED_BY,
};

/// How often a warm VM's agent renews its Lease.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How often a warm VM's agent looks for its binding.
pub const BINDING_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// A warm VM whose Lease was renewed within this is ready: a claim may take it.
pub const READY_WITHIN: Duration = Duration::from_secs(30);
/// A warm VM that ran this long without its agent ever renewing the Lease (its guest never
/// reached the host API server), or whose Lease went stale for this long, is replaced.
pub const REPORT_WITHIN: Duration = Duration::from_secs(600);
/// Life of a warm VM's credential (its ServiceAccount token).
pub const CREDENTIAL_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// A warm VM is replaced this long before its credential expires.
pub const REPLACE_BEFORE_EXPIRY: Duration = Duration::from_secs(3600);
/// Key of the JoinConfiguration in a binding Secret.
pub const BINDING_JOIN_KEY: &str = "kubeadm-join.yaml";
/// Key of the prepare script in a binding Secret.
pub const BINDING_PREPARE_KEY: &str = "prepare-node.sh";
/// Key of the claim's SSH keys and user data in a binding Secret (when the VM did not boot
/// with them; [`Binding::user_data`]).
pub const BINDING_USER_DATA_KEY: &str = "user-data.json";

/// Reads a provider's `guestApiServer`: `https://host[:port][/path]` of letters, digits
/// and `.-[]:` in the host and `._~/-` in the path (no credentials, query or fragment).
pub fn parse_guest_server(s: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "{:?} is not https://host[:port][/path]",
            s.chars().take(100).collect::<String>()
        )
    };
    let rest = s.strip_prefix("https://").ok_or_else(bad)?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'[' | b']' | b':' | b'-'));
    let path_ok = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'/' | b'-'));
    if host_ok && path_ok {
        Ok(s.to_string())
    } else {
        Err(bad())
    }
}

/// Name of a warm VM of the type `short_type` (its short name): `warm-<type>-<suffix>`,
/// cut to a DNS-1123 label of at most 63 characters.
pub fn vm_name(short_type: &str, suffix: &str) -> String {
    let mut base: String = short_type
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    base.truncate(63usize.saturating_sub(6 + suffix.len()));
    let base = base.trim_matches('-');
    if base.is_empty() {
        format!("warm-{suffix}")
    } else {
        format!("warm-{base}-{suffix}")
    }
}

/// Name of the Secret a claim writes for the warm VM `vm` it takes.
pub fn binding_name(vm: &str) -> String {
    format!("{vm}-binding")
}

/// Name of the ServiceAccount, Role, RoleBinding and Lease of the warm VM `vm`.
pub fn credential_name(vm: &str) -> String {
    format!("{vm}-warm")
}

/// The warm VM whose heartbeat the Lease `lease` is, by the Lease's name alone
/// ([`credential_name`]): a warm VM may write its own Lease, labels included, but only the
/// Lease of its own name.
pub fn vm_of_lease(lease: &str) -> Option<&str> {
    lease.strip_suffix("-warm").filter(|vm| !vm.is_empty())
}

/// A warm VM's heartbeat as the controller saw it: its Lease's `renewTime`, and when the
/// controller first saw that value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The Lease's `renewTime`, as the VM wrote it.
    pub renewed: Timestamp,
    /// When that value was first seen: the heartbeat's time.
    pub seen: Timestamp,
}

/// The heartbeat of a warm VM whose Lease shows `renewed` at `now`, after `before`. The VM
/// writes `renewTime` itself, so a renewal counts from when it is first seen, as Kubernetes'
/// node lifecycle counts a kubelet's Lease: a VM that stops renewing goes stale whatever
/// time it wrote last. A value first seen (a controller that just started) counts from its
/// own time, never from later than `now`.
pub fn observe_beat(
    before: Option<Beat>,
    renewed: Option<Timestamp>,
    now: Timestamp,
) -> Option<Beat> {
    let renewed = renewed?;
    Some(match before {
        Some(b) if b.renewed == renewed => b,
        Some(_) => Beat { renewed, seen: now },
        None => Beat {
            renewed,
            seen: renewed.min(now),
        },
    })
}

/// When a warm VM whose credential was issued at `issued` and expires at `expires` (as the
/// host answered the token request) is replaced: [`REPLACE_BEFORE_EXPIRY`] before it
/// expires, or a quarter of its life before, if that is shorter (a host that caps tokens'
/// lifetime below two hours still keeps its warm VMs most of it).
pub fn replace_at(issued: Timestamp, expires: Timestamp) -> Timestamp {
    let life = Duration::try_from(expires.duration_since(issued)).unwrap_or_default();
    let early = REPLACE_BEFORE_EXPIRY.min(life / 4);
    let early = k8s_openapi::jiff::SignedDuration::try_from(early).unwrap_or_default();
    expires.checked_sub(early).unwrap_or(expires)
}

/// Labels of a warm VM (and its user-data Secret) of the type `node_type`.
pub fn vm_labels(node_type: &str, installation: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (
            LABEL_INSTALLATION.to_string(),
            crate::names::label_value(installation),
        ),
        (
            LABEL_WARM_NODETYPE.to_string(),
            crate::names::label_value(node_type),
        ),
    ])
}

/// Labels of what is made for the warm VM `vm` (credential, Lease, binding).
pub fn credential_labels(
    node_type: &str,
    vm: &str,
    installation: &str,
) -> BTreeMap<String, String> {
    let mut labels = vm_labels(node_type, installation);
    labels.insert(LABEL_WARM_VM.to_string(), vm.to_string());
    labels
}

/// The Role of the warm VM `vm`: `get` on its own binding Secret, `get` and `patch` on its
/// own Lease, `delete` on its own ServiceAccount (the agent revokes its token once it read
/// its binding), nothing else.
pub fn role_rules(vm: &str) -> Value {
    serde_json::json!([
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [binding_name(vm)], "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [credential_name(vm)], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [credential_name(vm)], "verbs": ["delete"]},
    ])
}

/// Why a type keeps no warm VMs although it asks for some: what a warm VM could not be.
pub fn type_problem(t: &PreparedType) -> Option<String> {
    let template = t
        .properties
        .get(PROP_USER_DATA_TEMPLATE)
        .map(|v| v.trim())
        .unwrap_or("");
    if !template.is_empty() && template != "kubeadm" {
        return Some(format!(
            "property {PROP_USER_DATA_TEMPLATE} is {template:?}: warm VMs join with the kubeadm template only"
        ));
    }
    for p in [PROP_VM_AFFINITY, PROP_VM_ANTI_AFFINITY] {
        if t.properties.contains_key(p) {
            return Some(format!(
                "property {p} places each claim's VM by its tenant or pool, which a warm VM made before its claim cannot follow"
            ));
        }
    }
    if t.properties.contains_key(PROP_ZONE) {
        return Some(format!(
            "property {PROP_ZONE}: claims of a type offering zones get one, and a warm VM's zone is not chosen"
        ));
    }
    if t.address_pool.is_some() {
        return Some(
            "spec.addressPool: each claim of the type gets its own address, which a warm VM booted before its claim does not have"
                .to_string(),
        );
    }
    if t.per_tenant.is_some() {
        return Some(
            "its provider's vmNamespacePerTenant: a claim's VM goes to its tenant's host namespace, where no warm VM booted before the claim is"
                .to_string(),
        );
    }
    if let Some(problem) = &t.problem {
        return Some(problem.to_string());
    }
    None
}

/// Whether a warm VM of type `t` can serve `claim` (of `pool`): labels, taints and
/// kubelet arguments are given when a claim binds a warm VM, and so are the claim's SSH
/// keys and user data where they are not the type's, when its user data holds only what
/// cloud-init applies to a running VM ([`crate::userdata::binding::AT_BINDING_KEYS`]); every
/// other property that shapes the VM or its boot (image, disks, networks, placement) must
/// be the type's own, and the claim must not ask for a zone. `Err` says why it is served
/// cold.
pub fn servable(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaim,
) -> Result<(), String> {
    if let Some(problem) = type_problem(t) {
        return Err(problem);
    }
    let properties = crate::node_config::claim_node_properties(t, pool, claim);
    if let Some(zone) = properties.get(PROP_ZONE) {
        return Err(format!(
            "the claim asks for zone {zone:?}; a warm VM's zone is not chosen"
        ));
    }
    for key in CONFIG_PROPERTIES
        .iter()
        .filter(|k| !AT_BINDING_PROPERTIES.contains(k))
    {
        if properties.get(*key) != t.properties.get(*key) {
            return Err(format!(
                "property {key} of the claim differs from its type's, and a warm VM booted with the type's"
            ));
        }
    }
    if let Some((user_data, _)) = not_booted_with(t, &properties) {
        if let Some(problem) = at_binding_problem(user_data) {
            return Err(problem);
        }
    }
    Ok(())
}

/// What a node of `properties` has that a warm VM of `t` did not boot with, and so gets
/// with its binding: its user data where it is not the type's, its SSH keys where they are
/// not the type's. `None` when there is nothing of the kind (what the type's user data did
/// at boot cannot be undone, so a node without user data of its own gets none).
fn not_booted_with<'p>(
    t: &PreparedType,
    properties: &'p autonodes_api::Properties,
) -> Option<(Option<&'p str>, Vec<String>)> {
    let user_data = user_cloud_config(properties);
    let user_data = user_data.filter(|u| Some(*u) != user_cloud_config(&t.properties));
    let keys = crate::node_config::ssh_keys(properties);
    let keys = if keys == crate::node_config::ssh_keys(&t.properties) {
        Vec::new()
    } else {
        keys
    };
    (user_data.is_some() || !keys.is_empty()).then_some((user_data, keys))
}

/// What the binding Secret of a warm VM carries: the JoinConfiguration and the prepare
/// script the claim's own user data would write, for the warm VM's name, and the claim's
/// SSH keys and user data where the VM did not boot with them.
#[derive(Clone, PartialEq, Eq)]
pub struct Binding {
    /// The kubeadm JoinConfiguration (it holds the bootstrap token).
    pub join_configuration: String,
    /// The script that prepares the node for `kubeadm join` (installs the tenant's kubelet
    /// and kubeadm on a stock image).
    pub prepare_script: String,
    /// The cloud-config the agent has cloud-init apply once the VM's credential is revoked
    /// and before the join ([`crate::userdata::binding::render_binding_user_data`]); `None`
    /// when the claim's SSH keys and user data are those the VM booted with.
    pub user_data: Option<String>,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field(
                "join_configuration",
                &format!("<{} bytes>", self.join_configuration.len()),
            )
            .field(
                "prepare_script",
                &format!("<{} bytes>", self.prepare_script.len()),
            )
            .field(
                "user_data",
                &self
                    .user_data
                    .as_ref()
                    .map(|u| format!("<{} bytes>", u.len())),
            )
            .finish()
    }
}

/// The binding `claim` writes for the warm VM `vm_name` of type `t`: rendered exactly as
/// the claim's own user data (same labels, taints, kubelet arguments, join), then the two
/// files the join needs taken out of it; with the claim's SSH keys and user data where they
/// are not the type's (those a warm VM of `t` booted with).
// The core's render functions return this error as it is; it is rare and ends in a
// condition at once.
#[allow(clippy::result_large_err)]
pub fn binding(
    t: &PreparedType,
    pool: Option<&NodePoolSpec>,
    claim: &NodeClaim,
    vm_name: &str,
    join: &JoinParams,
    installation: &str,
) -> Result<Binding, RenderError> {
    let rendered = render::render_node(t, claim, pool, vm_name, join, installation)?;
    let file = |path: &'static str| {
        crate::userdata::written_file(&rendered.user_data, path).ok_or(RenderError::MissingField {
            claim: claim_id(claim),
            field: path,
        })
    };
    let properties = crate::node_config::claim_node_properties(t, pool, claim);
    let user_data = match not_booted_with(t, &properties) {
        Some((user_data, keys)) => Some(render_binding_user_data(user_data, &keys).map_err(
            |source| RenderError::UserData {
                claim: claim_id(claim),
                source,
            },
        )?),
        None => None,
    };
    Ok(Binding {
        join_configuration: file(JOIN_CONFIG_PATH)?,
        prepare_script: file(PREPARE_SCRIPT_PATH)?,
        user_data,
    })
}

fn claim_id(claim: &NodeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The user-data Secret and VirtualMachine of the warm VM `vm_name` of type `t`.
#[derive(Debug, Clone)]
pub struct WarmObjects {
    /// The user-data Secret (`<vm>-userdata`).
    pub secret: k8s_openapi::api::core::v1::Secret,
    /// The VirtualMachine.
    pub vm: Value,
}

/// Renders the warm VM `vm_name` of type `t` with `user_data` ([`crate::userdata::warm`]):
/// the type's composed template with the warm labels ([`vm_labels`] and
/// [`LABEL_WARM_VM`], which its DataVolumes get too; [`LABEL_WARM_NODEPOOL`] with
/// `pool_uid` for a pool's warm VM) and the type's definition hash
/// ([`LABEL_WARM_DEFINITION`]), and when its credential expires
/// ([`ANNOTATION_WARM_CREDENTIAL_EXPIRES`]).
pub fn render_vm(
    t: &PreparedType,
    vm_name: &str,
    user_data: String,
    installation: &str,
    pool_uid: Option<&str>,
    credential_expires: Timestamp,
) -> Result<WarmObjects, crate::template::error::TemplateError> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let mut labels = credential_labels(&t.name, vm_name, installation);
    if let Some(uid) = pool_uid {
        labels.insert(
            LABEL_WARM_NODEPOOL.to_string(),
            crate::names::label_value(uid),
        );
    }
    let mut vm_labels = labels.clone();
    vm_labels.insert(LABEL_WARM_DEFINITION.to_string(), t.definition.clone());
    let mut vm = crate::template::finalize_vm(
        &t.template,
        &crate::template::names::VmIdentity {
            name: vm_name,
            namespace: &t.vm_namespace,
            labels: &vm_labels,
        },
        &t.name,
    )?;
    if let Some(meta) = vm.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(
                ANNOTATION_WARM_CREDENTIAL_EXPIRES.to_string(),
                Value::String(credential_expires.to_string()),
            );
        }
    }
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(crate::template::names::user_data_secret_name(vm_name)),
            namespace: Some(t.vm_namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(
            crate::template::names::USER_DATA_KEY.to_string(),
            k8s_openapi::ByteString(user_data.into_bytes()),
        )])),
        ..Default::default()
    };
    Ok(WarmObjects { secret, vm })
}

/// The labels a claim puts on the warm VM it takes (and its user-data Secret and
/// DataVolumes), as a merge patch: the claim's own ([`crate::template::names::managed_labels`])
/// in place of the warm type's (and pool's), so from then on the VM is the claim's like any
/// other.
pub fn taken_labels(
    claim_name: &str,
    claim_namespace: &str,
    claim_uid: &str,
    installation: &str,
) -> Value {
    let mut labels: serde_json::Map<String, Value> = crate::template::names::managed_labels(
        claim_name,
        claim_namespace,
        claim_uid,
        installation,
    )
    .into_iter()
    .map(|(k, v)| (k, Value::String(v)))
    .collect();
    labels.insert(LABEL_WARM_NODETYPE.to_string(), Value::Null);
    labels.insert(LABEL_WARM_NODEPOOL.to_string(), Value::Null);
    Value::Object(labels)
}

/// Whether `claim` (scheduled, as the caller knows) is about to launch: it has no VM yet,
/// neither made nor a warm one taken (its `Provisioned` condition absent or still
/// `Creating`, as scheduling leaves it; no `status.warm`; its status may not even be
/// written yet). Such a claim that a warm VM can serve is about to take one, which then
/// becomes its node: counting it against the room warm VMs fill as well as the warm VM it
/// takes would remove that VM first.
pub fn about_to_launch(claim: &NodeClaim) -> bool {
    use autonodes_api::reasons::{ClaimCondition, ClaimReason};
    let s = claim.status.as_ref();
    claim.metadata.deletion_timestamp.is_none()
        && s.is_none_or(|s| {
            s.warm.is_none()
                && autonodes_api::conditions::get(&s.conditions, ClaimCondition::Provisioned)
                    .is_none_or(|c| c.reason == ClaimReason::Creating.as_str())
        })
}

/// One warm VM of a type as observed on its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmVm {
    /// The VM's name.
    pub name: String,
    /// When the VM was created.
    pub created: Timestamp,
    /// The type definition hash it was made from.
    pub definition: Option<String>,
    /// Since when its instance runs, if it does.
    pub running_since: Option<Timestamp>,
    /// The last renewal of its Lease by its agent, if any.
    pub heartbeat: Option<Timestamp>,
    /// When its credential expires, as the host answered its token request (`None` for a
    /// VM made without that record: its credential is taken to live
    /// [`CREDENTIAL_LIFETIME`] from its creation).
    pub credential_expires: Option<Timestamp>,
    /// Being deleted already.
    pub deleting: bool,
}

impl WarmVm {
    /// Whether a claim may take it: it runs and its agent renewed its Lease lately.
    pub fn ready(&self, now: Timestamp) -> bool {
        !self.deleting
            && self.running_since.is_some()
            && self
                .heartbeat
                .is_some_and(|h| since(h, now) <= READY_WITHIN)
    }
}

/// Time from `t` to `now` (zero when `t` is later).
fn since(t: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(t).try_into().unwrap_or(Duration::ZERO)
}

/// Why a warm VM is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Removal {
    /// More warm VMs than wanted (`replicas` lowered, or `maxCapacity` reached by claims).
    Excess,
    /// Made from an older definition of its type.
    Drifted,
    /// Its agent never reported, or stopped reporting, within [`REPORT_WITHIN`].
    NotReporting,
    /// Its credential is about to expire.
    Expiring,
}

/// Every [`Removal`], in the order the metrics page names them.
pub const REMOVALS: [Removal; 4] = [
    Removal::Excess,
    Removal::Drifted,
    Removal::NotReporting,
    Removal::Expiring,
];

impl Removal {
    /// The `reason` label of `autonodes_warm_vms_removed_total`.
    pub fn label(self) -> &'static str {
        match self {
            Removal::Excess => "Excess",
            Removal::Drifted => "Drifted",
            Removal::NotReporting => "NotReporting",
            Removal::Expiring => "Expiring",
        }
    }

    /// As said in logs and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Removal::Excess => "not wanted any more",
            Removal::Drifted => "its node type changed",
            Removal::NotReporting => "its guest does not report to the host API server",
            Removal::Expiring => "its credential expires soon",
        }
    }
}

/// What to do with a type's warm VMs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// How many warm VMs may exist (`replicas`, within what `maxCapacity` leaves).
    pub wanted: i64,
    /// How many to make now.
    pub create: usize,
    /// Which to remove, and why.
    pub remove: Vec<(String, Removal)>,
    /// Of the warm VMs kept, how many are ready.
    pub ready: i64,
    /// Of the warm VMs kept, how many ran for [`REPORT_WITHIN`] without ever reporting, or
    /// stopped reporting (they are being replaced).
    pub not_reporting: i64,
}

/// Plans a type's warm VMs: `replicas` wanted, within `room` (how many more VMs the type's
/// `maxCapacity` allows besides its claims; `None`: unlimited), of definition `definition`.
/// Broken ones (drifted, not reporting, expiring) are removed and made again; at most
/// `replicas` exist; the ones removed for excess are the least ready and youngest first.
pub fn plan(
    replicas: i64,
    room: Option<i64>,
    definition: &str,
    vms: &[WarmVm],
    now: Timestamp,
) -> Plan {
    let wanted = match room {
        Some(room) => replicas.min(room.max(0)),
        None => replicas,
    }
    .max(0);
    let mut out = Plan {
        wanted,
        ..Plan::default()
    };
    let mut kept: Vec<&WarmVm> = Vec::new();
    for vm in vms.iter().filter(|v| !v.deleting) {
        let age = since(vm.created, now);
        let reported_late = match (vm.heartbeat, vm.running_since) {
            (Some(h), _) => since(h, now) > REPORT_WITHIN,
            (None, Some(r)) => since(r, now) > REPORT_WITHIN,
            (None, None) => age > REPORT_WITHIN,
        };
        let why = if vm.definition.as_deref() != Some(definition) {
            Some(Removal::Drifted)
        } else if expiring(vm, now) {
            Some(Removal::Expiring)
        } else if reported_late {
            out.not_reporting += 1;
            Some(Removal::NotReporting)
        } else {
            None
        };
        match why {
            Some(why) => out.remove.push((vm.name.clone(), why)),
            None => kept.push(vm),
        }
    }
    // Keep the ready, then the oldest.
    kept.sort_by(|a, b| {
        b.ready(now)
            .cmp(&a.ready(now))
            .then(a.created.cmp(&b.created))
            .then(a.name.cmp(&b.name))
    });
    let keep = usize::try_from(wanted).unwrap_or(0);
    for vm in kept.iter().skip(keep) {
        out.remove.push((vm.name.clone(), Removal::Excess));
    }
    let kept = &kept[..kept.len().min(keep)];
    out.ready = kept.iter().filter(|v| v.ready(now)).count() as i64;
    // Those being deleted still hold their place until they are gone.
    let deleting = vms.iter().filter(|v| v.deleting).count();
    out.create = keep.saturating_sub(kept.len() + deleting);
    out
}

/// Whether the credential of `vm` is due for replacement ([`replace_at`]).
fn expiring(vm: &WarmVm, now: Timestamp) -> bool {
    let lifetime =
        k8s_openapi::jiff::SignedDuration::try_from(CREDENTIAL_LIFETIME).unwrap_or_default();
    let expires = vm
        .credential_expires
        .unwrap_or_else(|| vm.created.checked_add(lifetime).unwrap_or(vm.created));
    now >= replace_at(vm.created, expires)
}

/// The warm VM a claim takes among `vms`: a ready one, the oldest first (name breaks ties).
pub fn pick(vms: &[WarmVm], now: Timestamp) -> Option<&WarmVm> {
    vms.iter()
        .filter(|v| v.ready(now))
        .min_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)))
}

#[cfg(test)]
mod tests;
