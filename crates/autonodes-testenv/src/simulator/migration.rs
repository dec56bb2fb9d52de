//! KubeVirt's live migration, as the simulator plays it: whether an instance can migrate
//! (its `LiveMigratable` condition), the VirtualMachineInstanceMigrations asking for one,
//! and the garbage collection of finished ones.
//!
//! A migration's progress is written on the instance first (`status.migrationState`, with
//! the migration's uid), then on the migration: a restarted simulator reads where each one
//! stands from the instance and finishes it from there.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::{json, Map, Value};

use super::context::Ctx;
use super::crds::MIGRATION_PHASES;
use super::error::SimError;
use super::markers::{annotation, MIGRATION_FAILS_ANNOTATION};
use super::placement;
use autonodes_api::kubevirt::LIVE_MIGRATABLE;

/// The reason of a `LiveMigratable=False` for disks that cannot move.
const DISKS_NOT_LIVE_MIGRATABLE: &str = "DisksNotLiveMigratable";
/// The shortest time a migration takes (the boot delay when longer).
const MIGRATION_TIME: Duration = Duration::from_secs(1);
/// How often a migration queued behind another one of the same instance looks again.
const QUEUED_RETRY: Duration = Duration::from_secs(1);
/// How long a finished migration of an instance that is gone is kept.
const FINISHED_KEPT: Duration = Duration::from_secs(30);
/// The failure reason of a migration of a VM annotated [`MIGRATION_FAILS_ANNOTATION`]
/// with an empty value or `true`.
const DEFAULT_INJECTED_FAILURE: &str = "the live migration failed (simulated)";

/// The instance a migration names (`spec.vmiName`).
pub(crate) fn vmi_name(vmim: &DynamicObject) -> Option<&str> {
    vmim.data.pointer("/spec/vmiName").and_then(Value::as_str)
}

fn phase(obj: &DynamicObject) -> Option<&str> {
    obj.data.pointer("/status/phase").and_then(Value::as_str)
}

/// The migration ended (`Succeeded` or `Failed`).
fn finished(vmim: &DynamicObject) -> bool {
    matches!(phase(vmim), Some("Succeeded" | "Failed"))
}

// ---------------------------------------------------------------------------------------
// LiveMigratable.

/// The access modes a `dataVolumeTemplates[]` entry of the VM named `name` asks for
/// (`spec.pvc.accessModes`, else `spec.storage.accessModes`); None without such a template.
fn template_access_modes<'a>(vm: &'a DynamicObject, name: &str) -> Option<Vec<&'a str>> {
    let template = vm
        .data
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)?
        .iter()
        .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(name))?;
    let modes = template
        .pointer("/spec/pvc/accessModes")
        .or_else(|| template.pointer("/spec/storage/accessModes"))
        .and_then(Value::as_array)
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    Some(modes)
}

fn volumes(vm: &DynamicObject) -> impl Iterator<Item = &Value> {
    vm.data
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// The claims of the VM's `persistentVolumeClaim` volumes that no DataVolume template of the
/// VM makes (their access modes are read from the claims themselves).
fn claims_outside_templates(vm: &DynamicObject) -> Vec<String> {
    volumes(vm)
        .filter_map(|v| v.pointer("/persistentVolumeClaim/claimName"))
        .filter_map(Value::as_str)
        .filter(|claim| template_access_modes(vm, claim).is_none())
        .map(str::to_string)
        .collect()
}

/// Why KubeVirt could not live-migrate the VM's instance for its disks, None when it could:
/// a `dataVolume` or `persistentVolumeClaim` volume that is not `ReadWriteMany` (by its
/// DataVolume template; a claim made by none of them by `shared_claims`, the claims known to
/// be `ReadWriteMany`; a DataVolume that is no template of the VM counts as not shared), or
/// a `hostDisk` volume. Container disks, cloud-init, empty and ephemeral disks move with the
/// guest.
pub(crate) fn disks_not_migratable(
    vm: &DynamicObject,
    shared_claims: &HashSet<String>,
) -> Option<String> {
    let shared = |claim: &str| match template_access_modes(vm, claim) {
        Some(modes) => modes.contains(&"ReadWriteMany"),
        None => shared_claims.contains(claim),
    };
    let problems: Vec<String> = volumes(vm)
        .filter_map(|v| {
            let name = v.get("name").and_then(Value::as_str).unwrap_or("?");
            if let Some(dv) = v.pointer("/dataVolume/name").and_then(Value::as_str) {
                let template = template_access_modes(vm, dv).is_some();
                return (!template || !shared(dv)).then(|| {
                    format!("volume {name}: DataVolume {dv} is not ReadWriteMany (shared)")
                });
            }
            if let Some(claim) = v
                .pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
            {
                return (!shared(claim)).then(|| {
                    format!("volume {name}: PersistentVolumeClaim {claim} is not ReadWriteMany (shared)")
                });
            }
            v.get("hostDisk")
                .map(|_| format!("volume {name}: a hostDisk stays on its host node"))
        })
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "cannot live-migrate, a live migration needs every disk on shared storage: {}",
            problems.join("; ")
        )
    })
}

/// The `LiveMigratable` condition: True, or False with reason `DisksNotLiveMigratable` and
/// `problem` as its message.
fn live_migratable_condition(problem: Option<&str>, now: &str) -> Value {
    match problem {
        None => json!({"type": LIVE_MIGRATABLE, "status": "True", "lastTransitionTime": now}),
        Some(message) => json!({
            "type": LIVE_MIGRATABLE, "status": "False", "reason": DISKS_NOT_LIVE_MIGRATABLE,
            "message": message, "lastTransitionTime": now,
        }),
    }
}

/// The `LiveMigratable` condition of the VM's instance; the claims no DataVolume template
/// makes are read from the host (one that cannot be read counts as not shared).
pub(crate) async fn live_migratable(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
    now: &str,
) -> Result<Value, SimError> {
    let mut shared = HashSet::new();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.host.clone(), ns);
    for claim in claims_outside_templates(vm) {
        let found = match claims.get_opt(&claim).await {
            Ok(found) => found,
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            Err(source) => {
                return Err(SimError::Kube {
                    context: format!("reading PersistentVolumeClaim {ns}/{claim}"),
                    source,
                })
            }
        };
        let rwx = found
            .and_then(|pvc| pvc.spec)
            .and_then(|spec| spec.access_modes)
            .is_some_and(|modes| modes.iter().any(|m| m == "ReadWriteMany"));
        if rwx {
            shared.insert(claim);
        }
    }
    let problem = disks_not_migratable(vm, &shared);
    Ok(live_migratable_condition(problem.as_deref(), now))
}

fn condition<'a>(vmi: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    vmi.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// Why the instance cannot migrate by its `LiveMigratable` condition; None when True.
fn not_live_migratable(vmi: &DynamicObject) -> Option<String> {
    let Some(c) = condition(vmi, LIVE_MIGRATABLE) else {
        return Some("the VMI has no LiveMigratable condition".into());
    };
    let field = |f: &str| c.get(f).and_then(Value::as_str).unwrap_or_default();
    (field("status") != "True").then(|| {
        format!(
            "the VMI is not live-migratable ({}): {}",
            field("reason"),
            field("message")
        )
    })
}

// ---------------------------------------------------------------------------------------
// A migration's state.

/// A migration's state (`migrationState`), as the simulator writes it on the instance and
/// on the migration.
#[derive(Debug, Clone, Default, PartialEq)]
struct State {
    uid: String,
    source: String,
    target: Option<String>,
    start: Option<String>,
    end: Option<String>,
    completed: bool,
    failed: bool,
    reason: Option<String>,
    mode: Option<String>,
}

impl State {
    fn read(value: &Value) -> Option<State> {
        let text = |f: &str| value.get(f).and_then(Value::as_str).map(str::to_string);
        let flag = |f: &str| value.get(f).and_then(Value::as_bool).unwrap_or(false);
        Some(State {
            uid: text("migrationUid")?,
            source: text("sourceNode").unwrap_or_default(),
            target: text("targetNode"),
            start: text("startTimestamp"),
            end: text("endTimestamp"),
            completed: flag("completed"),
            failed: flag("failed"),
            reason: text("failureReason"),
            mode: text("mode"),
        })
    }

    /// As a merge patch: every field the simulator writes, null where unset, so that nothing
    /// of an earlier migration's state stays (false flags are left out, as KubeVirt does).
    fn patch(&self) -> Value {
        json!({
            "migrationUid": self.uid,
            "sourceNode": self.source,
            "targetNode": self.target,
            "startTimestamp": self.start,
            "endTimestamp": self.end,
            "completed": self.completed.then_some(true),
            "failed": self.failed.then_some(true),
            "failureReason": self.reason,
            "mode": self.mode,
        })
    }

    /// As it is stored (the patch without its nulls).
    fn stored(&self) -> Value {
        match self.patch() {
            Value::Object(fields) => {
                Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
            }
            other => other,
        }
    }

    fn in_flight(&self) -> bool {
        !self.completed && !self.failed
    }
}

/// The instance's migration state, if it is that of the migration `uid`.
fn state_of(vmi: Option<&DynamicObject>, uid: &str) -> Option<State> {
    vmi.and_then(|v| v.data.pointer("/status/migrationState"))
        .and_then(State::read)
        .filter(|s| s.uid == uid)
}

/// How long a migration takes: the boot delay, at least [`MIGRATION_TIME`].
fn migration_time(ctx: &Ctx) -> Duration {
    ctx.opts
        .mode
        .boot_delay()
        .unwrap_or_default()
        .max(MIGRATION_TIME)
}

/// Time since `start` (as much as needed when it cannot be read).
fn since(start: Option<&str>) -> Duration {
    start
        .and_then(|s| s.parse::<Timestamp>().ok())
        .and_then(|at| Duration::try_from(Timestamp::now().duration_since(at)).ok())
        .unwrap_or(Duration::MAX)
}

/// The phase transitions of a migration moving from `from` to `to`: the phases a migration
/// goes through on the way (in [`MIGRATION_PHASES`] order, up to `Running`) not passed yet,
/// then `to`; a failure records only `Pending` (when it had no phase) before `Failed`.
fn transitions_to(mut history: Vec<Value>, from: Option<&str>, to: &str, now: &str) -> Vec<Value> {
    let progression = &MIGRATION_PHASES[..6];
    let position = |p: Option<&str>| p.and_then(|p| progression.iter().position(|q| *q == p));
    let passed = position(from);
    let next = passed.map_or(0, |p| p + 1);
    let phases: Vec<&str> = match (to, position(Some(to))) {
        ("Failed", _) => from.is_none().then_some("Pending").into_iter().collect(),
        (_, Some(target)) => progression.get(next..target).unwrap_or_default().to_vec(),
        _ => progression.get(next..).unwrap_or_default().to_vec(),
    };
    for phase in phases.into_iter().chain([to]) {
        if from != Some(phase) {
            history.push(json!({"phase": phase, "phaseTransitionTimestamp": now}));
        }
    }
    history
}

// ---------------------------------------------------------------------------------------
// Writes.

/// Merge-patches the instance (it has no status subresource: status and metadata in one).
pub(crate) async fn patch_vmi(
    ctx: &Ctx,
    vmi: &DynamicObject,
    ns: &str,
    body: &Value,
) -> Result<Arc<DynamicObject>, SimError> {
    let patched = ctx
        .api(&ctx.vmi, ns)
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(body),
        )
        .await
        .map_err(SimError::kube(format!(
            "updating the status of VMI {ns}/{}",
            vmi.name_any()
        )))?;
    Ok(ctx.vmis.wrote(patched))
}

/// Writes the migration's phase and state (nothing when both are so already).
async fn set_vmim_status(
    ctx: &Ctx,
    vmim: &DynamicObject,
    ns: &str,
    to: &str,
    state: Option<&State>,
) -> Result<(), SimError> {
    let current = phase(vmim);
    let state_now = vmim.data.pointer("/status/migrationState");
    if current == Some(to) && state_now == state.map(State::stored).as_ref() {
        return Ok(());
    }
    let now = Timestamp::now().to_string();
    let history = vmim
        .data
        .pointer("/status/phaseTransitionTimestamps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut status = Map::new();
    status.insert("phase".into(), json!(to));
    status.insert(
        "phaseTransitionTimestamps".into(),
        json!(transitions_to(history, current, to, &now)),
    );
    if let Some(state) = state {
        status.insert("migrationState".into(), state.patch());
    }
    let name = vmim.name_any();
    let patched = ctx
        .api(&ctx.vmim, ns)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .map_err(SimError::kube(format!(
            "updating the status of VirtualMachineInstanceMigration {ns}/{name}"
        )))?;
    ctx.vmims.wrote(patched);
    Ok(())
}

/// Fails the migration: its state (on the instance too, when there is one) says why.
async fn fail(
    ctx: &Ctx,
    vmi: Option<&DynamicObject>,
    vmim: &DynamicObject,
    ns: &str,
    base: State,
    reason: String,
) -> Result<(), SimError> {
    tracing::info!(migration = %format!("{ns}/{}", vmim.name_any()), reason = %reason, "live migration failed");
    let state = State {
        end: Some(Timestamp::now().to_string()),
        completed: false,
        failed: true,
        reason: Some(reason),
        ..base
    };
    record(ctx, vmi, vmim, ns, "Failed", &state).await
}

/// Writes a migration's `state` on its instance (when there is one) first, then `phase` and
/// `state` on the migration: a restarted simulator reads where it stands from the instance.
async fn record(
    ctx: &Ctx,
    vmi: Option<&DynamicObject>,
    vmim: &DynamicObject,
    ns: &str,
    phase: &str,
    state: &State,
) -> Result<(), SimError> {
    if let Some(vmi) = vmi {
        patch_vmi(
            ctx,
            vmi,
            ns,
            &json!({"status": {"migrationState": state.patch()}}),
        )
        .await?;
    }
    set_vmim_status(ctx, vmim, ns, phase, Some(state)).await
}

async fn delete(ctx: &Ctx, vmim: &DynamicObject) -> Result<(), SimError> {
    let ns = vmim.namespace().unwrap_or_default();
    let name = vmim.name_any();
    let params = DeleteParams {
        preconditions: vmim.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match ctx.api(&ctx.vmim, &ns).delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(source) => {
            return Err(SimError::Kube {
                context: format!("deleting VirtualMachineInstanceMigration {ns}/{name}"),
                source,
            })
        }
    }
    ctx.vmims.deleted(vmim);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The reconcile.

/// Plays KubeVirt's migration controller for the instance of the VirtualMachine `ns/name`
/// (the instance is named as the VM): its unfinished migrations, oldest first, one at a
/// time. Reads the caches (with the simulator's own last writes). Returns when to look
/// again while a migration runs or waits.
pub(crate) async fn reconcile(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> Result<Option<Duration>, SimError> {
    let Some(vm) = ctx.vms.get(Some(ns), name) else {
        return Ok(None);
    };
    if vm.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let vmi = || {
        ctx.vmis
            .get(Some(ns), name)
            .filter(|v| v.metadata.deletion_timestamp.is_none())
    };
    // An instance a simulator without live migration booted gets its condition.
    if let Some(running) = vmi().filter(|v| phase(v) == Some("Running")) {
        if condition(&running, LIVE_MIGRATABLE).is_none() {
            let now = Timestamp::now().to_string();
            let mut conditions: Vec<Value> = running
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            conditions.push(live_migratable(ctx, &vm, ns, &now).await?);
            let body = json!({"status": {"conditions": conditions}});
            patch_vmi(ctx, &running, ns, &body).await?;
        }
    }
    let mut queue: Vec<Arc<DynamicObject>> = ctx
        .vmims
        .objects()
        .into_iter()
        .filter(|m| {
            m.namespace().as_deref() == Some(ns)
                && vmi_name(m) == Some(name)
                && m.metadata.deletion_timestamp.is_none()
                && !finished(m)
        })
        .collect();
    queue.sort_by(|a, b| {
        let created = |m: &DynamicObject| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let unfinished: HashSet<String> = queue.iter().filter_map(|m| m.uid()).collect();
    // A migration deleted before it ended is aborted: the guest stays where it is.
    if let Some(current) = vmi() {
        let state = current
            .data
            .pointer("/status/migrationState")
            .and_then(State::read);
        if let Some(state) = state.filter(|s| s.in_flight() && !unfinished.contains(&s.uid)) {
            if ctx.vmims.is_live() {
                let aborted = State {
                    end: Some(Timestamp::now().to_string()),
                    failed: true,
                    reason: Some("the migration was deleted before it ended (aborted)".into()),
                    ..state
                };
                let body = json!({"status": {"migrationState": aborted.patch()}});
                patch_vmi(ctx, &current, ns, &body).await?;
            }
        }
    }
    let mut queue = queue.into_iter();
    while let Some(vmim) = queue.next() {
        if let Some(after) = step(ctx, &vm, vmi().as_deref(), &vmim, ns, &unfinished).await? {
            // The others wait for this one.
            for waiting in queue {
                if phase(&waiting).is_none() {
                    set_vmim_status(ctx, &waiting, ns, "Pending", None).await?;
                }
            }
            return Ok(Some(after));
        }
    }
    Ok(None)
}

/// Moves one migration on; when it has not ended, returns when to look again.
async fn step(
    ctx: &Ctx,
    vm: &DynamicObject,
    vmi: Option<&DynamicObject>,
    vmim: &DynamicObject,
    ns: &str,
    unfinished: &HashSet<String>,
) -> Result<Option<Duration>, SimError> {
    let Some(uid) = vmim.uid() else {
        return Ok(None);
    };
    let vmi_key = format!("{ns}/{}", vm.name_any());
    if let (Some(vmi), Some(state)) = (vmi, state_of(vmi, &uid)) {
        // Started: the instance says how far it got.
        if state.completed {
            set_vmim_status(ctx, vmim, ns, "Succeeded", Some(&state)).await?;
            return Ok(None);
        }
        if state.failed {
            set_vmim_status(ctx, vmim, ns, "Failed", Some(&state)).await?;
            return Ok(None);
        }
        if phase(vmi) != Some("Running") {
            let reason = format!("VMI {vmi_key} stopped running during the migration");
            fail(ctx, Some(vmi), vmim, ns, state, reason).await?;
            return Ok(None);
        }
        set_vmim_status(ctx, vmim, ns, "Running", Some(&state)).await?;
        let (took, time) = (since(state.start.as_deref()), migration_time(ctx));
        if took < time {
            return Ok(Some(time - took));
        }
        let target = state.target.clone().unwrap_or_default();
        let done = State {
            completed: true,
            end: Some(Timestamp::now().to_string()),
            ..state
        };
        let body = json!({
            "metadata": {"labels": {"kubevirt.io/nodeName": target}},
            "status": {
                "nodeName": target,
                "evacuationNodeName": null,
                "migrationState": done.patch(),
            },
        });
        patch_vmi(ctx, vmi, ns, &body).await?;
        set_vmim_status(ctx, vmim, ns, "Succeeded", Some(&done)).await?;
        tracing::info!(vmi = %vmi_key, from = %done.source, to = %target, "live migration completed");
        return Ok(None);
    }
    if phase(vmim) == Some("Running") {
        // Started, but the instance does not know it: a new instance replaced the one that
        // was migrating.
        let reason = format!("VMI {vmi_key} was replaced during the migration");
        let base = vmim
            .data
            .pointer("/status/migrationState")
            .and_then(State::read)
            .unwrap_or(State {
                uid,
                ..State::default()
            });
        fail(ctx, None, vmim, ns, base, reason).await?;
        return Ok(None);
    }
    // Not started. Another migration of the instance runs: this one waits.
    let current = vmi
        .and_then(|v| v.data.pointer("/status/migrationState"))
        .and_then(State::read);
    if current.is_some_and(|s| s.in_flight() && unfinished.contains(&s.uid)) {
        if phase(vmim).is_none() {
            set_vmim_status(ctx, vmim, ns, "Pending", None).await?;
        }
        return Ok(Some(QUEUED_RETRY));
    }
    let source = vmi
        .and_then(|v| v.data.pointer("/status/nodeName"))
        .and_then(Value::as_str)
        .unwrap_or(&ctx.opts.host_node_name)
        .to_string();
    let base = State {
        uid,
        source: source.clone(),
        ..State::default()
    };
    let Some(vmi) = vmi else {
        let reason = format!("VMI {vmi_key} does not exist");
        fail(ctx, None, vmim, ns, base, reason).await?;
        return Ok(None);
    };
    let target = placement::migration_target(&source, &ctx.host_nodes.objects());
    let failure = if phase(vmi) != Some("Running") {
        Some(format!(
            "VMI {vmi_key} is not running (phase {})",
            phase(vmi).unwrap_or("unknown")
        ))
    } else if let Some(why) = not_live_migratable(vmi) {
        Some(why)
    } else if let Some(injected) = annotation(vm, MIGRATION_FAILS_ANNOTATION) {
        Some(match injected.trim() {
            "" | "true" => DEFAULT_INJECTED_FAILURE.to_string(),
            reason => reason.to_string(),
        })
    } else if target.is_none() {
        Some(format!(
            "no host node to migrate to: every host node other than {source} is cordoned or not ready"
        ))
    } else {
        None
    };
    if let Some(reason) = failure {
        fail(ctx, Some(vmi), vmim, ns, base, reason).await?;
        return Ok(None);
    }
    let state = State {
        target,
        start: Some(Timestamp::now().to_string()),
        mode: Some("PreCopy".into()),
        ..base
    };
    record(ctx, Some(vmi), vmim, ns, "Running", &state).await?;
    tracing::info!(vmi = %vmi_key, from = %state.source, to = ?state.target, "live migration started");
    Ok(Some(migration_time(ctx)))
}

// ---------------------------------------------------------------------------------------
// Garbage collection.

/// Deletes the migrations of the VirtualMachine `vm` being torn down: those naming its
/// instance and those it owns.
pub(crate) async fn delete_for_vm(ctx: &Ctx, vm: &DynamicObject, ns: &str) -> Result<(), SimError> {
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    for vmim in ctx.vmims.objects() {
        let owned = vmim
            .owner_references()
            .iter()
            .any(|o| !uid.is_empty() && o.uid == uid);
        if vmim.namespace().as_deref() == Some(ns)
            && (vmi_name(&vmim) == Some(name.as_str()) || owned)
        {
            delete(ctx, &vmim).await?;
        }
    }
    Ok(())
}

/// When the migration ended (its `Succeeded` or `Failed` transition, else its creation).
fn finished_at(vmim: &DynamicObject) -> Option<Timestamp> {
    vmim.data
        .pointer("/status/phaseTransitionTimestamps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| {
            matches!(
                t.get("phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|t| t.get("phaseTransitionTimestamp").and_then(Value::as_str))
        .filter_map(|t| t.parse::<Timestamp>().ok())
        .max()
        .or_else(|| vmim.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// A finished migration whose instance is gone, ended more than [`FINISHED_KEPT`] before
/// `now`: KubeVirt's migration controller deletes it.
fn expired(vmim: &DynamicObject, vmi_exists: bool, now: Timestamp) -> bool {
    finished(vmim)
        && !vmi_exists
        && vmim.meta().deletion_timestamp.is_none()
        && finished_at(vmim).is_some_and(|at| {
            Duration::try_from(now.duration_since(at)).is_ok_and(|ago| ago > FINISHED_KEPT)
        })
}

/// Deletes the finished migrations of instances that are gone ([`expired`]). Reads the
/// caches, only when their watches are live.
pub(crate) async fn sweep(ctx: &Ctx) -> Result<(), SimError> {
    if !(ctx.vmims.is_live() && ctx.vmis.is_live()) {
        return Ok(());
    }
    let now = Timestamp::now();
    for vmim in ctx.vmims.objects() {
        let ns = vmim.namespace();
        let exists = vmi_name(&vmim).is_some_and(|n| ctx.vmis.get(ns.as_deref(), n).is_some());
        if expired(&vmim, exists, now) {
            tracing::info!(object = %format!("{}/{}", ns.unwrap_or_default(), vmim.name_any()), "deleting a finished migration");
            delete(ctx, &vmim).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn vm(volumes: Value, templates: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm", "namespace": "ns"},
            "spec": {
                "dataVolumeTemplates": templates,
                "template": {"spec": {"domain": {}, "volumes": volumes}},
            },
        }))
        .expect("a VM")
    }

    fn template(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec})
    }

    fn none() -> HashSet<String> {
        HashSet::new()
    }

    #[test]
    fn a_vmi_with_container_cloud_init_empty_and_ephemeral_disks_is_live_migratable() {
        let vm = vm(
            json!([
                {"name": "root", "containerDisk": {"image": "i"}},
                {"name": "ci", "cloudInitNoCloud": {"secretRef": {"name": "s"}}},
                {"name": "cd", "cloudInitConfigDrive": {"userData": "x"}},
                {"name": "scratch", "emptyDisk": {"capacity": "1Gi"}},
                {"name": "eph", "ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}},
            ]),
            json!([]),
        );
        assert_eq!(disks_not_migratable(&vm, &none()), None);
        let condition = live_migratable_condition(None, "t");
        assert_eq!(condition["status"], "True");
    }

    #[test]
    fn a_vmi_with_a_read_write_once_data_volume_is_not_live_migratable() {
        let vm = vm(
            json!([{"name": "root", "dataVolume": {"name": "root-dv"}}]),
            json!([template(
                "root-dv",
                json!({"storage": {"accessModes": ["ReadWriteOnce"]}})
            )]),
        );
        let why = disks_not_migratable(&vm, &none()).expect("not migratable");
        assert!(why.contains("root-dv"), "{why}");
        let condition = live_migratable_condition(Some(&why), "t");
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "DisksNotLiveMigratable");
        assert_eq!(condition["message"], why);
    }

    #[test]
    fn a_vmi_with_read_write_many_data_volumes_is_live_migratable() {
        let vm = vm(
            json!([
                {"name": "a", "dataVolume": {"name": "a"}},
                {"name": "b", "persistentVolumeClaim": {"claimName": "b"}},
            ]),
            json!([
                template("a", json!({"pvc": {"accessModes": ["ReadWriteMany"]}})),
                template(
                    "b",
                    json!({"storage": {"accessModes": ["ReadWriteOnce", "ReadWriteMany"]}})
                ),
            ]),
        );
        assert_eq!(disks_not_migratable(&vm, &none()), None);
        assert!(claims_outside_templates(&vm).is_empty());
    }

    #[test]
    fn a_data_volume_without_a_template_or_access_modes_and_a_host_disk_are_not_live_migratable() {
        let vm = vm(
            json!([
                {"name": "a", "dataVolume": {"name": "elsewhere"}},
                {"name": "b", "dataVolume": {"name": "b"}},
                {"name": "c", "hostDisk": {"path": "/x", "type": "Disk"}},
            ]),
            json!([template("b", json!({"storage": {}}))]),
        );
        let why = disks_not_migratable(&vm, &none()).expect("not migratable");
        for part in ["elsewhere", "DataVolume b", "hostDisk"] {
            assert!(why.contains(part), "{part}: {why}");
        }
    }

    #[test]
    fn a_claim_outside_the_templates_is_live_migratable_only_when_seen_read_write_many() {
        let vm = vm(
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]),
            json!([]),
        );
        assert_eq!(claims_outside_templates(&vm), ["shared"]);
        assert!(disks_not_migratable(&vm, &none()).is_some());
        let seen = HashSet::from(["shared".to_string()]);
        assert_eq!(disks_not_migratable(&vm, &seen), None);
    }

    #[test]
    fn a_migration_state_patch_clears_what_an_earlier_migration_left() {
        let state = State {
            uid: "u".into(),
            source: "h0".into(),
            target: Some("h1".into()),
            start: Some("t0".into()),
            mode: Some("PreCopy".into()),
            ..State::default()
        };
        let patch = state.patch();
        assert_eq!(patch["completed"], Value::Null);
        assert!(patch
            .as_object()
            .is_some_and(|o| o.contains_key("failureReason")));
        let stored = state.stored();
        assert!(!stored.as_object().is_some_and(|o| o.contains_key("failed")));
        assert_eq!(State::read(&stored), Some(state.clone()));
        assert!(state.in_flight());
        let done = State {
            completed: true,
            ..state
        };
        assert_eq!(State::read(&done.stored()), Some(done.clone()));
        assert!(!done.in_flight());
    }

    fn phases(history: &[Value]) -> Vec<&str> {
        history
            .iter()
            .filter_map(|t| t.get("phase").and_then(Value::as_str))
            .collect()
    }

    #[test]
    fn a_migration_records_every_phase_it_passes_once() {
        let running = transitions_to(Vec::new(), None, "Running", "t");
        assert_eq!(
            phases(&running),
            [
                "Pending",
                "Scheduling",
                "Scheduled",
                "PreparingTarget",
                "TargetReady",
                "Running"
            ]
        );
        let done = transitions_to(running, Some("Running"), "Succeeded", "t");
        assert_eq!(phases(&done).last(), Some(&"Succeeded"));
        assert_eq!(phases(&done).len(), 7);
        let failed = transitions_to(Vec::new(), None, "Failed", "t");
        assert_eq!(phases(&failed), ["Pending", "Failed"]);
        let pending = transitions_to(Vec::new(), None, "Pending", "t");
        assert_eq!(phases(&pending), ["Pending"]);
        let started = transitions_to(pending, Some("Pending"), "Running", "t");
        assert_eq!(phases(&started).len(), 6);
        let again = transitions_to(started, Some("Running"), "Running", "t");
        assert_eq!(phases(&again).len(), 6);
    }

    fn vmim(phase: &str, ended: Timestamp) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
            "spec": {"vmiName": "vm"},
            "status": {"phase": phase, "phaseTransitionTimestamps": [
                {"phase": phase, "phaseTransitionTimestamp": ended.to_string()},
            ]},
        }))
        .expect("a migration")
    }

    #[test]
    fn a_finished_migration_of_a_gone_instance_is_collected_after_a_while() {
        let now = Timestamp::now();
        let long_ago = now - SignedDuration::from_mins(5);
        assert!(expired(&vmim("Succeeded", long_ago), false, now));
        assert!(expired(&vmim("Failed", long_ago), false, now));
        // Its instance still runs, it only just ended, or it has not ended.
        assert!(!expired(&vmim("Succeeded", long_ago), true, now));
        assert!(!expired(&vmim("Succeeded", now), false, now));
        assert!(!expired(&vmim("Running", long_ago), false, now));
    }

    #[test]
    fn an_instance_without_a_true_live_migratable_condition_cannot_migrate() {
        let vmi = |conditions: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "vm"}, "status": {"conditions": conditions},
            }))
            .expect("a VMI")
        };
        assert!(not_live_migratable(&vmi(json!([]))).is_some());
        let no = vmi(json!([live_migratable_condition(Some("disks"), "t")]));
        let why = not_live_migratable(&no).expect("not migratable");
        assert!(
            why.contains("DisksNotLiveMigratable") && why.contains("disks"),
            "{why}"
        );
        let yes =
            vmi(json!([{"type": "Ready", "status": "True"}, live_migratable_condition(None, "t")]));
        assert_eq!(not_live_migratable(&yes), None);
    }
}
