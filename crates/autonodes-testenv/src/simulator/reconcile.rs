//! The KubeVirt, CDI and garbage-collector part of the simulator: one reconcile per
//! VirtualMachine, plus a periodic sweep of objects whose VirtualMachine is gone.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use super::{kubelet, Ctx, SimError, SimMode, FINALIZER, MANAGED_SELECTOR};

/// Outcome of a request where "not found" is fine.
fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A write on a stale copy: a 409, or a JSON patch whose `test` op failed (422).
fn is_conflict(e: &SimError) -> bool {
    matches!(e, SimError::Kube { source: kube::Error::Api(s), .. } if s.is_conflict() || s.code == 422)
}

/// Reconciles one VirtualMachine (called by the controller).
pub(crate) async fn reconcile(vm: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, SimError> {
    match reconcile_vm(&vm, &ctx).await {
        Err(e) if is_conflict(&e) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

/// What the controller does after a failed reconcile: log it and try again soon.
pub(crate) fn error_policy(vm: Arc<DynamicObject>, error: &SimError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(
        vm = %format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()),
        error = %error,
        "simulating the VM failed; retrying"
    );
    Action::requeue(Duration::from_secs(2))
}

/// What the VM's run strategy asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Desired {
    Run,
    Stop,
    /// Manual / WaitAsReceiver: leave the VMI as it is.
    Keep,
}

fn desired(vm: &DynamicObject) -> Result<Desired, String> {
    let strategy = vm.data.pointer("/spec/runStrategy").and_then(Value::as_str);
    let running = vm.data.pointer("/spec/running").and_then(Value::as_bool);
    match (strategy, running) {
        (Some(_), Some(_)) => Err(
            "spec.running and spec.runStrategy are both set; KubeVirt rejects such a VirtualMachine"
                .into(),
        ),
        (Some("Always" | "RerunOnFailure" | "Once"), None) => Ok(Desired::Run),
        (Some("Halted"), None) => Ok(Desired::Stop),
        (Some("Manual" | "WaitAsReceiver"), None) => Ok(Desired::Keep),
        (Some(other), None) => Err(format!("unknown runStrategy {other:?}")),
        (None, Some(true)) => Ok(Desired::Run),
        (None, Some(false)) | (None, None) => Ok(Desired::Stop),
    }
}

fn owner_reference(ctx: &Ctx, vm: &DynamicObject) -> Result<OwnerReference, SimError> {
    let mut owner = vm
        .controller_owner_ref(&ctx.vm)
        .ok_or_else(|| SimError::Invalid(format!("VM {} has no uid", vm.name_any())))?;
    owner.block_owner_deletion = Some(true);
    Ok(owner)
}

fn owned_by(obj: &impl Resource, uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

pub(crate) async fn publish(
    ctx: &Ctx,
    vm: &DynamicObject,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let reference = vm.object_ref(&ctx.vm);
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: reason.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, reason, "recording an Event failed");
    }
}

async fn reconcile_vm(vm: &DynamicObject, ctx: &Ctx) -> Result<Action, SimError> {
    let ns = vm
        .namespace()
        .ok_or_else(|| SimError::Invalid(format!("VM {} has no namespace", vm.name_any())))?;
    let name = vm.name_any();
    if vm.metadata.deletion_timestamp.is_some() {
        return teardown(vm, &ns, ctx).await;
    }
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = vm.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        set_finalizers(ctx, vm, &ns, finalizers).await?;
    }
    let want = match desired(vm) {
        Ok(want) => want,
        Err(message) => {
            publish(ctx, vm, EventType::Warning, "InvalidSpec", &message).await;
            return Ok(Action::await_change());
        }
    };
    ensure_data_volumes(ctx, vm, &ns).await?;
    let vmis = ctx.api(&ctx.vmi, &ns);
    let existing = vmis
        .get_opt(&name)
        .await
        .map_err(SimError::kube(format!("reading VMI {ns}/{name}")))?;
    let uid = vm.uid().unwrap_or_default();
    if let Some(vmi) = &existing {
        if vmi.metadata.deletion_timestamp.is_some() {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        if !owned_by(vmi, &uid) {
            // A VMI left over from an earlier VM of the same name.
            delete_vmi(ctx, vmi, &ns).await?;
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
    }
    match want {
        Desired::Stop => {
            if let Some(vmi) = &existing {
                delete_vmi(ctx, vmi, &ns).await?;
            }
            set_vm_status(ctx, vm, &ns, false, false, "Stopped").await?;
            return Ok(Action::await_change());
        }
        Desired::Keep if existing.is_none() => {
            set_vm_status(ctx, vm, &ns, false, false, "Stopped").await?;
            return Ok(Action::await_change());
        }
        Desired::Keep | Desired::Run => {}
    }
    let vmi = match existing {
        Some(vmi) => vmi,
        None => create_vmi(ctx, vm, &ns).await?,
    };
    let vmi = if vmi_phase(&vmi) == Some("Running") {
        vmi
    } else {
        let Some(delay) = ctx.opts.mode.boot_delay() else {
            let vmi = ensure_scheduling(ctx, &vmi, &ns).await?;
            set_vm_status(ctx, vm, &ns, true, false, "Starting").await?;
            drop(vmi);
            return Ok(Action::await_change());
        };
        let age = age(&vmi);
        if age < delay {
            ensure_scheduling(ctx, &vmi, &ns).await?;
            set_vm_status(ctx, vm, &ns, true, false, "Starting").await?;
            return Ok(Action::requeue(delay - age));
        }
        let vmi = boot(ctx, vm, &vmi, &ns).await?;
        publish(
            ctx,
            vm,
            EventType::Normal,
            "Started",
            &format!("VirtualMachineInstance {name} is running (simulated)"),
        )
        .await;
        vmi
    };
    set_vm_status(ctx, vm, &ns, true, true, "Running").await?;
    if ctx.opts.mode == SimMode::NeverJoin {
        return Ok(Action::await_change());
    }
    kubelet::guest(ctx, vm, &vmi, &ns).await
}

/// Time since the object was created (zero when unknown or in the future).
fn age(obj: &DynamicObject) -> Duration {
    obj.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| {
            let since = Timestamp::now().duration_since(t.0);
            Duration::try_from(since).ok()
        })
        .unwrap_or(Duration::ZERO)
}

pub(crate) fn vmi_phase(vmi: &DynamicObject) -> Option<&str> {
    vmi.data.pointer("/status/phase").and_then(Value::as_str)
}

async fn set_finalizers(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
    finalizers: Vec<String>,
) -> Result<(), SimError> {
    // A JSON patch that tests the finalizers it replaces: concurrent on the finalizers, as
    // a resourceVersion would be, without conflicting with every status write.
    let current = vm.finalizers().to_vec();
    let ops = if current.is_empty() {
        json!([
            {"op": "test", "path": "/metadata/uid", "value": vm.uid()},
            {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ])
    };
    let patch: json_patch::Patch = serde_json::from_value(ops)
        .map_err(|e| SimError::Invalid(format!("finalizer patch: {e}")))?;
    // Gone already: a reconcile on a copy from before the last finalizer was released.
    ignore_not_found(
        ctx.api(&ctx.vm, ns)
            .patch(
                &vm.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await,
    )
    .map_err(SimError::kube(format!(
        "updating the finalizers of VM {ns}/{}",
        vm.name_any()
    )))?;
    Ok(())
}

async fn set_vm_status(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
    created: bool,
    ready: bool,
    printable: &str,
) -> Result<(), SimError> {
    let current = |f: &str| vm.data.pointer(&format!("/status/{f}")).cloned();
    if current("created") == Some(json!(created))
        && current("ready") == Some(json!(ready))
        && current("printableStatus") == Some(json!(printable))
    {
        return Ok(());
    }
    let now = Timestamp::now().to_string();
    let (status, reason) = if ready {
        ("True", "Ready")
    } else if created {
        ("False", "GuestNotRunning")
    } else {
        ("False", "VMINotExists")
    };
    let patch = json!({
        "status": {
            "created": created,
            "ready": ready,
            "printableStatus": printable,
            "conditions": [{
                "type": "Ready",
                "status": status,
                "reason": reason,
                "lastProbeTime": null,
                "lastTransitionTime": now,
            }],
        }
    });
    ctx.api(&ctx.vm, ns)
        .patch_status(
            &vm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(SimError::kube(format!(
            "updating the status of VM {ns}/{}",
            vm.name_any()
        )))?;
    Ok(())
}

async fn ensure_data_volumes(ctx: &Ctx, vm: &DynamicObject, ns: &str) -> Result<(), SimError> {
    let Some(templates) = vm
        .data
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
    else {
        return Ok(());
    };
    let api = ctx.api(&ctx.dv, ns);
    let owner = owner_reference(ctx, vm)?;
    for template in templates {
        let Some(name) = template.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        let existing = api
            .get_opt(name)
            .await
            .map_err(SimError::kube(format!("reading DataVolume {ns}/{name}")))?;
        let dv = match existing {
            Some(dv) => dv,
            None => {
                let body = json!({
                    "apiVersion": "cdi.kubevirt.io/v1beta1",
                    "kind": "DataVolume",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": template.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
                        "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
                        "ownerReferences": [owner],
                    },
                    "spec": template.get("spec").cloned().unwrap_or(json!({})),
                });
                let dv: DynamicObject = serde_json::from_value(body)
                    .map_err(|e| SimError::Invalid(format!("DataVolume {ns}/{name}: {e}")))?;
                match api.create(&PostParams::default(), &dv).await {
                    Ok(dv) => dv,
                    Err(kube::Error::Api(s)) if s.is_already_exists() => api
                        .get(name)
                        .await
                        .map_err(SimError::kube(format!("reading DataVolume {ns}/{name}")))?,
                    Err(source) => {
                        return Err(SimError::Kube {
                            context: format!("creating DataVolume {ns}/{name}"),
                            source,
                        })
                    }
                }
            }
        };
        if dv.data.pointer("/status/phase").and_then(Value::as_str) != Some("Succeeded") {
            let patch =
                json!({"status": {"phase": "Succeeded", "progress": "100.0%", "claimName": name}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(SimError::kube(format!(
                    "updating the status of DataVolume {ns}/{name}"
                )))?;
        }
    }
    Ok(())
}

async fn create_vmi(ctx: &Ctx, vm: &DynamicObject, ns: &str) -> Result<DynamicObject, SimError> {
    let name = vm.name_any();
    let template = vm
        .data
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut labels: BTreeMap<String, String> = template
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    labels.insert(
        "kubevirt.io/nodeName".into(),
        ctx.opts.host_node_name.clone(),
    );
    let body = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
            "ownerReferences": [owner_reference(ctx, vm)?],
        },
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    });
    let vmi: DynamicObject = serde_json::from_value(body)
        .map_err(|e| SimError::Invalid(format!("VMI {ns}/{name}: {e}")))?;
    let api = ctx.api(&ctx.vmi, ns);
    match api.create(&PostParams::default(), &vmi).await {
        Ok(vmi) => Ok(vmi),
        Err(kube::Error::Api(s)) if s.is_already_exists() => api
            .get(&name)
            .await
            .map_err(SimError::kube(format!("reading VMI {ns}/{name}"))),
        Err(source) => Err(SimError::Kube {
            context: format!("creating VMI {ns}/{name}"),
            source,
        }),
    }
}

fn transitions(vmi: &DynamicObject) -> Vec<Value> {
    vmi.data
        .pointer("/status/phaseTransitionTimestamps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

async fn ensure_scheduling(
    ctx: &Ctx,
    vmi: &DynamicObject,
    ns: &str,
) -> Result<DynamicObject, SimError> {
    if vmi_phase(vmi) == Some("Scheduling") {
        return Ok(vmi.clone());
    }
    let now = Timestamp::now().to_string();
    let mut history = transitions(vmi);
    history.push(json!({"phase": "Scheduling", "phaseTransitionTimestamp": now}));
    let patch = json!({
        "status": {
            "phase": "Scheduling",
            "phaseTransitionTimestamps": history,
            "conditions": [{
                "type": "Ready", "status": "False", "reason": "GuestNotRunning",
                "lastTransitionTime": now,
            }],
        }
    });
    ctx.api(&ctx.vmi, ns)
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(SimError::kube(format!(
            "updating the status of VMI {ns}/{}",
            vmi.name_any()
        )))
}

/// A stable `10.a.b.c` address and a locally administered MAC for a VM.
pub(crate) fn guest_address(vm_uid: &str) -> (String, String) {
    use sha2::Digest;
    let d = sha2::Sha256::digest(vm_uid.as_bytes());
    let b = d.as_slice();
    let ip = format!("10.{}.{}.{}", b[0], b[1], 2 + b[2] % 252);
    let mac = format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[3], b[4], b[5], b[6]);
    (ip, mac)
}

async fn boot(
    ctx: &Ctx,
    vm: &DynamicObject,
    vmi: &DynamicObject,
    ns: &str,
) -> Result<DynamicObject, SimError> {
    let (ip, mac) = guest_address(&vm.uid().unwrap_or_default());
    let interface = vm
        .data
        .pointer("/spec/template/spec/domain/devices/interfaces/0/name")
        .or_else(|| vm.data.pointer("/spec/template/spec/networks/0/name"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let now = Timestamp::now().to_string();
    let mut history = transitions(vmi);
    history.push(json!({"phase": "Running", "phaseTransitionTimestamp": now}));
    let patch = json!({
        "status": {
            "phase": "Running",
            "nodeName": ctx.opts.host_node_name,
            "qosClass": "Burstable",
            "interfaces": [{
                "name": interface,
                "interfaceName": "eth0",
                "ipAddress": ip,
                "ipAddresses": [ip],
                "mac": mac,
                "infoSource": "domain, guest-agent",
            }],
            "phaseTransitionTimestamps": history,
            "conditions": [{
                "type": "Ready", "status": "True", "lastTransitionTime": now,
            }],
        }
    });
    ctx.api(&ctx.vmi, ns)
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(SimError::kube(format!(
            "updating the status of VMI {ns}/{}",
            vmi.name_any()
        )))
}

async fn delete_vmi(ctx: &Ctx, vmi: &DynamicObject, ns: &str) -> Result<(), SimError> {
    kubelet::stop_guest(ctx, vmi).await;
    let dp = DeleteParams {
        preconditions: vmi.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    ignore_not_found(ctx.api(&ctx.vmi, ns).delete(&vmi.name_any(), &dp).await).map_err(
        SimError::kube(format!("deleting VMI {ns}/{}", vmi.name_any())),
    )
}

fn delete_params_for(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// The VM is being deleted: stop the guest, delete the VMI and DataVolumes (and, for a
/// foreground deletion, the other dependents), then release the finalizers.
async fn teardown(vm: &DynamicObject, ns: &str, ctx: &Ctx) -> Result<Action, SimError> {
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    let ours = vm.finalizers().iter().any(|f| f == FINALIZER);
    let foreground = vm.finalizers().iter().any(|f| f == "foregroundDeletion");
    if !ours && !foreground {
        return Ok(Action::await_change());
    }
    let vmis = ctx.api(&ctx.vmi, ns);
    if let Some(vmi) = vmis
        .get_opt(&name)
        .await
        .map_err(SimError::kube(format!("reading VMI {ns}/{name}")))?
    {
        if owned_by(&vmi, &uid) {
            delete_vmi(ctx, &vmi, ns).await?;
        }
    }
    // The VM's own DataVolumes, by the names its templates give (no list of the namespace).
    let dvs = ctx.api(&ctx.dv, ns);
    let names: Vec<String> = vm
        .data
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    for name in names {
        let Some(dv) = dvs
            .get_opt(&name)
            .await
            .map_err(SimError::kube(format!("reading DataVolume {ns}/{name}")))?
        else {
            continue;
        };
        if owned_by(&dv, &uid) {
            ignore_not_found(
                dvs.delete(&dv.name_any(), &delete_params_for(dv.uid()))
                    .await,
            )
            .map_err(SimError::kube(format!(
                "deleting DataVolume {ns}/{}",
                dv.name_any()
            )))?;
        }
    }
    if foreground {
        let secrets: Api<Secret> = Api::namespaced(ctx.host.clone(), ns);
        for secret in secrets
            .list(&ListParams::default().labels(MANAGED_SELECTOR))
            .await
            .map_err(SimError::kube(format!("listing Secrets in {ns}")))?
        {
            if owned_by(&secret, &uid) {
                ignore_not_found(
                    secrets
                        .delete(&secret.name_any(), &delete_params_for(secret.uid()))
                        .await,
                )
                .map_err(SimError::kube(format!(
                    "deleting Secret {ns}/{}",
                    secret.name_any()
                )))?;
            }
        }
    }
    let remaining: Vec<String> = vm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER && *f != "foregroundDeletion")
        .cloned()
        .collect();
    set_finalizers(ctx, vm, ns, remaining).await?;
    tracing::info!(vm = %format!("{ns}/{name}"), "VM torn down");
    Ok(Action::await_change())
}

/// Runs [`sweep`] every `sweep_interval` until `stop` turns true.
pub(crate) async fn sweep_loop(ctx: Arc<Ctx>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        if let Err(e) = sweep(&ctx).await {
            tracing::warn!(error = %e, "garbage-collection sweep failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(ctx.opts.sweep_interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The VirtualMachine owners of an object, if every owner is a VirtualMachine.
fn vm_owners(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Vec<&str>> {
    let owners = meta.owner_references.as_ref()?;
    if owners.is_empty()
        || !owners
            .iter()
            .all(|o| o.kind == "VirtualMachine" && o.api_version.starts_with("kubevirt.io/"))
    {
        return None;
    }
    Some(owners.iter().map(|o| o.uid.as_str()).collect())
}

/// Deletes VMIs, DataVolumes and autonodes Secrets whose owning VirtualMachines are all
/// gone, as the garbage collector would.
async fn sweep(ctx: &Ctx) -> Result<(), SimError> {
    // Dependents first, owners second: an owner created after the first list cannot own a
    // dependent in it, so nothing alive is mistaken for an orphan. The dependents come from
    // the API server's watch cache (an older view is only safer), the owners from etcd:
    // this runs every few seconds and must not read thousands of objects from etcd each time.
    let vmis = ctx
        .api_scope(&ctx.vmi)
        .list(&ListParams::default().match_any())
        .await
        .map_err(SimError::kube("listing VMIs"))?;
    let dvs = ctx
        .api_scope(&ctx.dv)
        .list(&ListParams::default().match_any())
        .await
        .map_err(SimError::kube("listing DataVolumes"))?;
    let secret_api: Api<Secret> = match &ctx.opts.namespace {
        Some(ns) => Api::namespaced(ctx.host.clone(), ns),
        None => Api::all(ctx.host.clone()),
    };
    let secrets = secret_api
        .list(&ListParams::default().labels(MANAGED_SELECTOR).match_any())
        .await
        .map_err(SimError::kube("listing autonodes Secrets"))?;
    let live: HashSet<String> = ctx
        .api_scope(&ctx.vm)
        .list_metadata(&ListParams::default())
        .await
        .map_err(SimError::kube("listing VMs"))?
        .into_iter()
        .filter_map(|vm| vm.metadata.uid)
        .collect();
    let orphaned = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.deletion_timestamp.is_none()
            && vm_owners(meta).is_some_and(|owners| owners.iter().all(|uid| !live.contains(*uid)))
    };
    for (ar, items) in [(&ctx.vmi, vmis.items), (&ctx.dv, dvs.items)] {
        for obj in items.into_iter().filter(|o| orphaned(&o.metadata)) {
            let ns = obj.namespace().unwrap_or_default();
            if ar.kind == "VirtualMachineInstance" {
                kubelet::stop_guest(ctx, &obj).await;
            }
            tracing::info!(kind = %ar.kind, object = %format!("{ns}/{}", obj.name_any()), "deleting an orphan");
            ignore_not_found(
                ctx.api(ar, &ns)
                    .delete(&obj.name_any(), &delete_params_for(obj.uid()))
                    .await,
            )
            .map_err(SimError::kube(format!(
                "deleting {} {ns}/{}",
                ar.kind,
                obj.name_any()
            )))?;
        }
    }
    for secret in secrets.items.into_iter().filter(|s| orphaned(&s.metadata)) {
        let ns = secret.namespace().unwrap_or_default();
        tracing::info!(object = %format!("{ns}/{}", secret.name_any()), "deleting an orphaned Secret");
        ignore_not_found(
            Api::<Secret>::namespaced(ctx.host.clone(), &ns)
                .delete(&secret.name_any(), &delete_params_for(secret.uid()))
                .await,
        )
        .map_err(SimError::kube(format!(
            "deleting Secret {ns}/{}",
            secret.name_any()
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "x", "namespace": "y"}, "spec": spec
        }))
        .expect("valid")
    }

    #[test]
    fn the_run_strategy_decides_whether_the_guest_runs() {
        assert_eq!(
            desired(&vm(json!({"runStrategy": "Always"}))),
            Ok(Desired::Run)
        );
        assert_eq!(
            desired(&vm(json!({"runStrategy": "Once"}))),
            Ok(Desired::Run)
        );
        assert_eq!(
            desired(&vm(json!({"runStrategy": "Halted"}))),
            Ok(Desired::Stop)
        );
        assert_eq!(
            desired(&vm(json!({"runStrategy": "Manual"}))),
            Ok(Desired::Keep)
        );
        assert_eq!(desired(&vm(json!({"running": true}))), Ok(Desired::Run));
        assert_eq!(desired(&vm(json!({}))), Ok(Desired::Stop));
        assert!(desired(&vm(json!({"running": true, "runStrategy": "Always"}))).is_err());
    }

    #[test]
    fn guest_addresses_are_stable_10_x_addresses() {
        let (ip, mac) = guest_address("3f1c2a");
        assert_eq!(guest_address("3f1c2a").0, ip);
        assert!(ip.starts_with("10."), "{ip}");
        assert_eq!(ip.split('.').count(), 4);
        assert!(mac.starts_with("02:00:"));
        assert_ne!(guest_address("other").0, ip);
    }
}
