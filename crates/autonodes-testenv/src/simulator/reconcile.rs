//! The KubeVirt, CDI and garbage-collector part of the simulator: one reconcile per
//! VirtualMachine (its instance's migrations in [`migration`]), plus a periodic sweep of
//! objects whose VirtualMachine is gone.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::cache::Cache;
use super::context::{publish, Ctx};
use super::error::SimError;
use super::guest::guest_address;
use super::kubelet;
use super::markers::FINALIZER;
use super::migration;
use super::options::SimMode;

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
    let ns = vm
        .namespace()
        .ok_or_else(|| SimError::Invalid(format!("VM {} has no namespace", vm.name_any())))?;
    let name = vm.name_any();
    // The store's copy, or the newer one the last write of the simulator returned.
    let Some(vm) = ctx.vms.get(Some(&ns), &name) else {
        return Ok(Action::await_change());
    };
    let action = match reconcile_vm(vm, &ns, &ctx).await {
        Err(e) if is_conflict(&e) => {
            // Acted on a stale copy: read the VM once from the API server and look again.
            ctx.vms
                .fetch(&ctx.api(&ctx.vm, &ns), &name)
                .await
                .map_err(SimError::kube(format!("reading VM {ns}/{name}")))?;
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        other => other?,
    };
    // The instance's live migrations, on the copies the reconcile left in the caches.
    Ok(match migration::reconcile(&ctx, &ns, &name).await? {
        Some(after) => Action::requeue(after),
        None => action,
    })
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

async fn reconcile_vm(mut vm: Arc<DynamicObject>, ns: &str, ctx: &Ctx) -> Result<Action, SimError> {
    let name = vm.name_any();
    if vm.metadata.deletion_timestamp.is_some() {
        return teardown(&vm, ns, ctx).await;
    }
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = vm.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        if let Some(patched) = set_finalizers(ctx, &vm, ns, finalizers).await? {
            vm = patched;
        }
    }
    let vm = vm.as_ref();
    let want = match desired(vm) {
        Ok(want) => want,
        Err(message) => {
            publish(ctx, vm, EventType::Warning, "InvalidSpec", &message).await;
            return Ok(Action::await_change());
        }
    };
    ensure_data_volumes(ctx, vm, ns).await?;
    let existing = ctx
        .vmis
        .read(&ctx.api(&ctx.vmi, ns), &name)
        .await
        .map_err(SimError::kube(format!("reading VMI {ns}/{name}")))?;
    let uid = vm.uid().unwrap_or_default();
    if let Some(vmi) = &existing {
        if vmi.metadata.deletion_timestamp.is_some() {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        if !owned_by(vmi.as_ref(), &uid) {
            // A VMI left over from an earlier VM of the same name.
            delete_vmi(ctx, vmi).await?;
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
    }
    match want {
        Desired::Stop => {
            if let Some(vmi) = &existing {
                delete_vmi(ctx, vmi).await?;
            }
            set_vm_status(ctx, vm, ns, false, false, "Stopped").await?;
            return Ok(Action::await_change());
        }
        Desired::Keep if existing.is_none() => {
            set_vm_status(ctx, vm, ns, false, false, "Stopped").await?;
            return Ok(Action::await_change());
        }
        Desired::Keep | Desired::Run => {}
    }
    let vmi = match existing {
        Some(vmi) => vmi,
        None => create_vmi(ctx, vm, ns).await?,
    };
    let vmi = if vmi_phase(&vmi) == Some("Running") {
        vmi
    } else {
        let Some(delay) = ctx.opts.mode.boot_delay() else {
            ensure_scheduling(ctx, &vmi, ns).await?;
            set_vm_status(ctx, vm, ns, true, false, "Starting").await?;
            return Ok(Action::await_change());
        };
        let age = age(&vmi);
        let booted = match age < delay {
            true => None,
            false => boot(ctx, vm, &vmi, ns).await?,
        };
        match booted {
            Some(vmi) => vmi,
            None => {
                // Not yet, or no host node to run on (every one cordoned).
                ensure_scheduling(ctx, &vmi, ns).await?;
                set_vm_status(ctx, vm, ns, true, false, "Starting").await?;
                return Ok(Action::requeue(if age < delay {
                    delay - age
                } else {
                    NO_HOST_RETRY
                }));
            }
        }
    };
    set_vm_status(ctx, vm, ns, true, true, "Running").await?;
    if ctx.opts.mode == SimMode::NeverJoin {
        return Ok(Action::await_change());
    }
    if let Some(real) = &ctx.opts.real_guests {
        // A real guest joins by itself; the simulator only keeps it running.
        let seed = async {
            let user_data = kubelet::user_data(ctx, vm, ns)
                .await
                .map_err(|e| e.reason)?;
            let network = network_data(ctx, vm, ns).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((user_data, network))
        };
        let booted = match seed.await {
            Ok((user_data, network)) => real.ensure(vm, &vmi, ns, &user_data, network.as_deref()),
            Err(e) => Err(e),
        };
        if let Err(message) = booted {
            publish(ctx, vm, EventType::Warning, "GuestBootFailed", &message).await;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
        return Ok(Action::requeue(ctx.opts.resync_interval));
    }
    kubelet::guest(ctx, vm, &vmi, ns).await
}

/// How often an instance with no host node to run on looks again.
const NO_HOST_RETRY: Duration = Duration::from_secs(2);

/// How long ago the VMI entered `Scheduling`: from the transition's own timestamp, which the
/// simulator writes to the nanosecond; else from `creationTimestamp`, which has whole seconds
/// only, taken as one second later so that a slow guest never boots before its delay.
fn age(vmi: &DynamicObject) -> Duration {
    let scheduled = transitions(vmi).iter().find_map(|t| {
        (t.get("phase").and_then(Value::as_str) == Some("Scheduling"))
            .then(|| t.get("phaseTransitionTimestamp").and_then(Value::as_str))
            .flatten()
            .and_then(|s| s.parse::<Timestamp>().ok())
    });
    let since = match scheduled {
        Some(at) => Timestamp::now().duration_since(at),
        None => match vmi.metadata.creation_timestamp.as_ref() {
            Some(t) => Timestamp::now().duration_since(t.0) - SignedDuration::from_secs(1),
            None => return Duration::ZERO,
        },
    };
    Duration::try_from(since).unwrap_or(Duration::ZERO)
}

pub(crate) fn vmi_phase(vmi: &DynamicObject) -> Option<&str> {
    vmi.data.pointer("/status/phase").and_then(Value::as_str)
}

/// Replaces the VM's finalizers; the patched VM, or None when it is gone.
async fn set_finalizers(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
    finalizers: Vec<String>,
) -> Result<Option<Arc<DynamicObject>>, SimError> {
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
    match ctx
        .api(&ctx.vm, ns)
        .patch(
            &vm.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(patched) => Ok(Some(ctx.vms.wrote(patched))),
        // Gone already: a reconcile on a copy from before the last finalizer was released.
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
        Err(source) => Err(SimError::Kube {
            context: format!("updating the finalizers of VM {ns}/{}", vm.name_any()),
            source,
        }),
    }
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
    let patched = ctx
        .api(&ctx.vm, ns)
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
    ctx.vms.wrote(patched);
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
        let existing = ctx
            .dvs
            .read(&api, name)
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
                    Ok(dv) => ctx.dvs.wrote(dv),
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {
                        let dv = ctx
                            .dvs
                            .read_existing(&api, name)
                            .await
                            .map_err(SimError::kube(format!("reading DataVolume {ns}/{name}")))?;
                        let Some(dv) = dv else {
                            // Deleted again meanwhile: the next reconcile creates it.
                            continue;
                        };
                        dv
                    }
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
            let patched = api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(SimError::kube(format!(
                    "updating the status of DataVolume {ns}/{name}"
                )))?;
            ctx.dvs.wrote(patched);
        }
    }
    Ok(())
}

/// Creates the VM's VMI, with the status of its first phase written with it (the VMI has
/// no status subresource): `Running` (with its host node's label) when the guest boots at
/// once and has a host node to run on, else `Scheduling`.
async fn create_vmi(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
) -> Result<Arc<DynamicObject>, SimError> {
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
    let now = Timestamp::now().to_string();
    let status = match (ctx.opts.mode.boot_delay(), ctx.place_new_vmi()) {
        (Some(Duration::ZERO), Some(node)) => {
            let scheduled = json!({"phase": "Scheduling", "phaseTransitionTimestamp": now});
            let static_ip = static_address(ctx, vm, ns).await?;
            let migratable = migration::live_migratable(ctx, vm, ns, &now).await?;
            labels.insert("kubevirt.io/nodeName".into(), node.clone());
            running_status(vm, &node, migratable, static_ip, vec![scheduled], &now)
        }
        _ => scheduling_status(Vec::new(), &now),
    };
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
        "status": status,
    });
    let vmi: DynamicObject = serde_json::from_value(body)
        .map_err(|e| SimError::Invalid(format!("VMI {ns}/{name}: {e}")))?;
    let api = ctx.api(&ctx.vmi, ns);
    match api.create(&PostParams::default(), &vmi).await {
        Ok(vmi) => Ok(ctx.vmis.wrote(vmi)),
        Err(kube::Error::Api(s)) if s.is_already_exists() => ctx
            .vmis
            .read_existing(&api, &name)
            .await
            .map_err(SimError::kube(format!("reading VMI {ns}/{name}")))?
            .ok_or_else(|| SimError::Invalid(format!("VMI {ns}/{name} went away meanwhile"))),
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

/// A VMI's status on entering `Scheduling` after the transitions in `history`.
fn scheduling_status(mut history: Vec<Value>, now: &str) -> Value {
    history.push(json!({"phase": "Scheduling", "phaseTransitionTimestamp": now}));
    json!({
        "phase": "Scheduling",
        "phaseTransitionTimestamps": history,
        "conditions": [{
            "type": "Ready", "status": "False", "reason": "GuestNotRunning",
            "lastTransitionTime": now,
        }],
    })
}

/// The VM's cloud-init network data: the Secret the cloud-init volume names
/// (`networkDataSecretRef`, key `networkdata`); none when it names none. A Secret that is
/// not there yet is an error (retried).
pub(crate) async fn network_data(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
) -> Result<Option<String>, SimError> {
    let Some(name) = vm
        .data
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|v| v.pointer("/cloudInitNoCloud/networkDataSecretRef/name"))
        .and_then(Value::as_str)
    else {
        return Ok(None);
    };
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(ctx.host.clone(), ns);
    let secret = ctx
        .secrets
        .read_existing(&secrets, name)
        .await
        .map_err(SimError::kube(format!(
            "reading network data Secret {ns}/{name}"
        )))?
        .ok_or_else(|| SimError::Invalid(format!("network data Secret {ns}/{name} not found")))?;
    let data = secret.data.clone().unwrap_or_default();
    let text = data
        .get("networkdata")
        .or_else(|| data.get("networkData"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| SimError::Invalid(format!("Secret {ns}/{name} has no key networkdata")))?;
    Ok(Some(text))
}

/// The address the VM's cloud-init network data gives its first interface, as a guest's
/// cloud-init would set it: the first address of the first Ethernet of its
/// [`network_data`], when that Ethernet matches the MAC address the VM gives its first
/// interface; none when the VM has no network data or it matches another interface.
async fn static_address(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
) -> Result<Option<String>, SimError> {
    let Some(text) = network_data(ctx, vm, ns).await? else {
        return Ok(None);
    };
    let config: Value = autonodes_core::yaml::from_str(&text).map_err(|e| {
        SimError::Invalid(format!("network data of VM {ns}/{}: {e}", vm.name_any()))
    })?;
    let Some(nic) = config
        .get("ethernets")
        .and_then(Value::as_object)
        .and_then(|nics| nics.values().next())
    else {
        return Ok(None);
    };
    let wanted = nic.pointer("/match/macaddress").and_then(Value::as_str);
    let has = super::guest::first_mac(vm);
    if let Some(wanted) = wanted {
        if !has.is_some_and(|m| m.eq_ignore_ascii_case(wanted)) {
            return Ok(None);
        }
    }
    Ok(nic
        .pointer("/addresses/0")
        .and_then(Value::as_str)
        .and_then(|a| a.split('/').next())
        .map(str::to_string))
}

/// A VMI's status once its guest runs: the host node `node`, the guest's address (the static
/// one of its network data, else one derived from the VM), Ready and the `migratable`
/// condition (LiveMigratable).
fn running_status(
    vm: &DynamicObject,
    node: &str,
    migratable: Value,
    static_ip: Option<String>,
    mut history: Vec<Value>,
    now: &str,
) -> Value {
    let (ip, mac) = guest_address(&vm.uid().unwrap_or_default());
    let ip = static_ip.unwrap_or(ip);
    // KubeVirt gives the interface the MAC address its template sets.
    let mac = vm
        .data
        .pointer("/spec/template/spec/domain/devices/interfaces/0/macAddress")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or(mac);
    let interface = vm
        .data
        .pointer("/spec/template/spec/domain/devices/interfaces/0/name")
        .or_else(|| vm.data.pointer("/spec/template/spec/networks/0/name"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    history.push(json!({"phase": "Running", "phaseTransitionTimestamp": now}));
    json!({
        "phase": "Running",
        "nodeName": node,
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
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            migratable,
        ],
    })
}

/// Writes a VMI's status (a merge patch of the object: no status subresource).
async fn patch_vmi_status(
    ctx: &Ctx,
    vmi: &DynamicObject,
    ns: &str,
    status: Value,
) -> Result<Arc<DynamicObject>, SimError> {
    migration::patch_vmi(ctx, vmi, ns, &json!({ "status": status })).await
}

/// A VMI without a phase (one an older simulator created) enters `Scheduling`.
async fn ensure_scheduling(ctx: &Ctx, vmi: &DynamicObject, ns: &str) -> Result<(), SimError> {
    if vmi_phase(vmi) == Some("Scheduling") {
        return Ok(());
    }
    let now = Timestamp::now().to_string();
    patch_vmi_status(ctx, vmi, ns, scheduling_status(transitions(vmi), &now)).await?;
    Ok(())
}

/// Boots the guest on the host node a new instance gets (labelled with it); None while
/// there is none.
async fn boot(
    ctx: &Ctx,
    vm: &DynamicObject,
    vmi: &DynamicObject,
    ns: &str,
) -> Result<Option<Arc<DynamicObject>>, SimError> {
    let Some(node) = ctx.place_new_vmi() else {
        return Ok(None);
    };
    let now = Timestamp::now().to_string();
    let static_ip = static_address(ctx, vm, ns).await?;
    let migratable = migration::live_migratable(ctx, vm, ns, &now).await?;
    let status = running_status(vm, &node, migratable, static_ip, transitions(vmi), &now);
    let body = json!({
        "metadata": {"labels": {"kubevirt.io/nodeName": node}},
        "status": status,
    });
    migration::patch_vmi(ctx, vmi, ns, &body).await.map(Some)
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

/// Deletes `obj` (this very one: a uid precondition) through `api` and tells `cache`;
/// gone already is fine.
async fn delete_known<K, C>(api: Api<K>, cache: &Cache<C>, obj: &C) -> Result<(), SimError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    C: Resource + Clone,
    C::DynamicType: Eq + std::hash::Hash + Clone,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    ignore_not_found(api.delete(&name, &delete_params_for(obj.uid())).await).map_err(
        SimError::kube(format!(
            "deleting {} {ns}/{name}",
            C::kind(&cache.dyntype())
        )),
    )?;
    cache.deleted(obj);
    Ok(())
}

/// Deletes a VMI or DataVolume (`ar` and its cache).
async fn delete_dynamic(
    ctx: &Ctx,
    (ar, cache): (&ApiResource, &Cache<DynamicObject>),
    obj: &DynamicObject,
) -> Result<(), SimError> {
    let api = ctx.api(ar, &obj.namespace().unwrap_or_default());
    delete_known(api, cache, obj).await
}

async fn delete_vmi(ctx: &Ctx, vmi: &DynamicObject) -> Result<(), SimError> {
    kubelet::stop_guest(ctx, vmi).await;
    if let Some(real) = &ctx.opts.real_guests {
        real.stop(vmi);
    }
    delete_dynamic(ctx, (&ctx.vmi, &ctx.vmis), vmi).await
}

/// Deletes an autonodes Secret (this very one).
async fn delete_secret(ctx: &Ctx, secret: &Secret) -> Result<(), SimError> {
    let api = Api::<Secret>::namespaced(ctx.host.clone(), &secret.namespace().unwrap_or_default());
    delete_known(api, &ctx.secrets, secret).await
}

/// The VM is being deleted: stop the guest, delete the VMI, its migrations and the
/// DataVolumes (and, for a foreground deletion, the other dependents), then release the
/// finalizers.
async fn teardown(vm: &DynamicObject, ns: &str, ctx: &Ctx) -> Result<Action, SimError> {
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    let ours = vm.finalizers().iter().any(|f| f == FINALIZER);
    let foreground = vm.finalizers().iter().any(|f| f == "foregroundDeletion");
    if !ours && !foreground {
        return Ok(Action::await_change());
    }
    if let Some(vmi) = ctx
        .vmis
        .read(&ctx.api(&ctx.vmi, ns), &name)
        .await
        .map_err(SimError::kube(format!("reading VMI {ns}/{name}")))?
    {
        if owned_by(vmi.as_ref(), &uid) {
            delete_vmi(ctx, &vmi).await?;
        }
    }
    migration::delete_for_vm(ctx, vm, ns).await?;
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
        let Some(dv) = ctx
            .dvs
            .read(&dvs, &name)
            .await
            .map_err(SimError::kube(format!("reading DataVolume {ns}/{name}")))?
        else {
            continue;
        };
        if owned_by(dv.as_ref(), &uid) {
            delete_dynamic(ctx, (&ctx.dv, &ctx.dvs), &dv).await?;
        }
    }
    if foreground {
        for secret in ctx.secrets.objects() {
            if secret.namespace().as_deref() == Some(ns) && owned_by(secret.as_ref(), &uid) {
                delete_secret(ctx, &secret).await?;
            }
        }
    }
    let remaining: Vec<String> = vm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER && *f != "foregroundDeletion")
        .cloned()
        .collect();
    let last = remaining.is_empty();
    set_finalizers(ctx, vm, ns, remaining).await?;
    if last {
        // The API server deleted the VM with its last finalizer and answered with the copy
        // from before (no newer version to remember): a reconcile woken meanwhile must not
        // find that copy and release the finalizer once more.
        ctx.vms.deleted(vm);
    }
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
fn vm_owners(meta: &ObjectMeta) -> Option<&[OwnerReference]> {
    let owners = meta.owner_references.as_deref()?;
    if owners.is_empty()
        || !owners
            .iter()
            .all(|o| o.kind == "VirtualMachine" && o.api_version.starts_with("kubevirt.io/"))
    {
        return None;
    }
    Some(owners)
}

/// True when every VirtualMachine owning `meta` is gone, asked of the API server: an
/// object can name a VM the VM cache has not shown yet.
async fn owners_gone(ctx: &Ctx, ns: &str, meta: &ObjectMeta) -> Result<bool, SimError> {
    let api = ctx.api(&ctx.vm, ns);
    for owner in vm_owners(meta).unwrap_or_default() {
        let vm = api
            .get_metadata_opt(&owner.name)
            .await
            .map_err(SimError::kube(format!("reading VM {ns}/{}", owner.name)))?;
        if vm.is_some_and(|vm| vm.metadata.uid.as_deref() == Some(owner.uid.as_str())) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Deletes VMIs, migrations, DataVolumes and autonodes Secrets whose owning
/// VirtualMachines are all gone, as the garbage collector would, and finished migrations of
/// instances that are gone ([`migration::sweep`]), as KubeVirt does. Reads the caches (only
/// when every watch is live); only a candidate's owners are read from the API server before
/// it is deleted.
async fn sweep(ctx: &Ctx) -> Result<(), SimError> {
    let caches = [&ctx.vms, &ctx.vmis, &ctx.dvs, &ctx.vmims];
    if !(caches.iter().all(|c| c.is_live()) && ctx.secrets.is_live()) {
        return Ok(());
    }
    let live: HashSet<String> = ctx.vms.objects().iter().filter_map(|vm| vm.uid()).collect();
    let orphaned = |meta: &ObjectMeta| {
        meta.deletion_timestamp.is_none()
            && vm_owners(meta).is_some_and(|owners| owners.iter().all(|o| !live.contains(&o.uid)))
    };
    let owned = [
        (&ctx.vmi, &ctx.vmis),
        (&ctx.vmim, &ctx.vmims),
        (&ctx.dv, &ctx.dvs),
    ];
    for (ar, cache) in owned {
        for obj in cache.objects().iter().filter(|o| orphaned(&o.metadata)) {
            let ns = obj.namespace().unwrap_or_default();
            if !owners_gone(ctx, &ns, &obj.metadata).await? {
                continue;
            }
            if ar.kind == ctx.vmi.kind {
                kubelet::stop_guest(ctx, obj).await;
                if let Some(real) = &ctx.opts.real_guests {
                    real.stop(obj);
                }
            }
            tracing::info!(kind = %ar.kind, object = %format!("{ns}/{}", obj.name_any()), "deleting an orphan");
            delete_dynamic(ctx, (ar, cache), obj).await?;
        }
    }
    for secret in ctx.secrets.objects() {
        let ns = secret.namespace().unwrap_or_default();
        if !orphaned(&secret.metadata) || !owners_gone(ctx, &ns, &secret.metadata).await? {
            continue;
        }
        tracing::info!(object = %format!("{ns}/{}", secret.name_any()), "deleting an orphaned Secret");
        delete_secret(ctx, &secret).await?;
    }
    migration::sweep(ctx).await
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

    fn vmi(metadata: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": metadata, "status": status
        }))
        .expect("valid")
    }

    #[test]
    fn a_vmi_s_age_counts_from_its_scheduling_to_the_nanosecond_and_never_runs_ahead_of_a_whole_second_creation_stamp(
    ) {
        let scheduled_at = Timestamp::now() - SignedDuration::from_millis(2_500);
        let scheduled = vmi(
            json!({"name": "x"}),
            json!({"phaseTransitionTimestamps": [
                {"phase": "Scheduling", "phaseTransitionTimestamp": scheduled_at.to_string()}
            ]}),
        );
        let counted = age(&scheduled);
        assert!(counted >= Duration::from_millis(2_500), "{counted:?}");
        assert!(counted < Duration::from_secs(60), "{counted:?}");
        // Only a creation stamp, truncated to its second as the API server writes it: the age
        // read from it never exceeds the time that really passed since the creation.
        let created_at = Timestamp::now();
        let stamp = Timestamp::from_second(created_at.as_second()).expect("a time");
        let created = vmi(
            json!({"name": "x", "creationTimestamp": stamp.to_string()}),
            json!({}),
        );
        let counted = age(&created);
        let passed =
            Duration::try_from(Timestamp::now().duration_since(created_at)).expect("ahead");
        assert!(counted <= passed, "{counted:?} > {passed:?}");
        assert_eq!(age(&vmi(json!({"name": "x"}), json!({}))), Duration::ZERO);
    }
}
