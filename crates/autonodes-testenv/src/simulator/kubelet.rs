//! The guest side of the simulator: cloud-init, `kubeadm join` and the kubelet.
//!
//! The guest reads its user data, validates the join the way kubeadm and the kubelet would,
//! and then registers its Node with the tenant's *admin* client: the simulator does not run
//! the TLS bootstrap (CSR, approval, client certificate), so the admin client stands in for
//! the kubelet's credentials after it. That the bootstrap token authenticates is checked
//! separately, with a request to the tenant's `/api` using only that token.
//!
//! A guest that joined is known by its Node: the Node's `status.nodeInfo.bootID` is the
//! VMI's UID (as a kubelet reports its boot ID), remembered in memory and found again in the
//! tenants' Node caches after a restart, so the simulator writes nothing on the host to
//! remember a join.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use autonodes_core::kubeversion::KubeVersion;
use base64::Engine;
use k8s_openapi::api::core::v1::{Node, Secret, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use serde_json::{json, Value};

use super::context::{publish, Ctx};
use super::error::SimError;
use super::guest::{self, guest_address, JoinPlan};
use super::markers::{
    annotation, GAVE_UP_PREFIX, JOIN_ERROR_ANNOTATION, KUBELET_STOPPED_ANNOTATION,
    KUBELET_VERSION_ANNOTATION,
};
use super::tenant_entry::{TenantEntry, TOKEN_NAMESPACE};

/// The group kubeadm binds for node bootstrap (CSR creation and auto-approval).
const NODE_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The taint the node lifecycle controller keeps on a Node that is not Ready.
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// How long one request to a tenant may take.
const TENANT_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a join attempt failed.
#[derive(Debug)]
pub(crate) struct JoinError {
    pub(crate) reason: String,
    /// kubeadm/kubelet would keep trying (until the discovery timeout).
    retryable: bool,
}

fn retry(reason: impl Into<String>) -> JoinError {
    JoinError {
        reason: reason.into(),
        retryable: true,
    }
}

fn fatal(reason: impl Into<String>) -> JoinError {
    JoinError {
        reason: reason.into(),
        retryable: false,
    }
}

/// The tenant and Node the guest of `vmi` joined: remembered, or (after a restart) the Node
/// whose boot ID is the VMI's UID.
fn joined<'a>(ctx: &'a Ctx, vmi: &DynamicObject) -> Option<(&'a TenantEntry, String)> {
    let uid = vmi.uid()?;
    let known = ctx.joined.lock().get(&uid).cloned();
    let (index, node) = known.or_else(|| {
        let found = ctx
            .tenants
            .iter()
            .enumerate()
            .find_map(|(i, t)| t.node_booted_by(&uid).map(|n| (i, n)))?;
        ctx.joined.lock().insert(uid, found.clone());
        Some(found)
    })?;
    Some((ctx.tenants.get(index)?, node))
}

/// When the VMI turned Running (its creation time if not recorded).
fn running_since(vmi: &DynamicObject) -> Option<Timestamp> {
    vmi.data
        .pointer("/status/phaseTransitionTimestamps")
        .and_then(Value::as_array)
        .and_then(|h| {
            h.iter()
                .rev()
                .find(|t| t.get("phase").and_then(Value::as_str) == Some("Running"))
        })
        .and_then(|t| t.get("phaseTransitionTimestamp").and_then(Value::as_str))
        .and_then(|t| t.parse().ok())
        .or_else(|| vmi.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

async fn annotate_vmi(
    ctx: &Ctx,
    vmi: &DynamicObject,
    ns: &str,
    annotations: Value,
) -> Result<(), SimError> {
    let patch = json!({"metadata": {"annotations": annotations}});
    let patched = ctx
        .api(&ctx.vmi, ns)
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(SimError::kube(format!(
            "annotating VMI {ns}/{}",
            vmi.name_any()
        )))?;
    ctx.vmis.wrote(patched);
    Ok(())
}

/// Plays the guest of a Running VMI: join once, then keep the Node Ready.
pub(crate) async fn guest(
    ctx: &Ctx,
    vm: &DynamicObject,
    vmi: &DynamicObject,
    ns: &str,
) -> Result<Action, SimError> {
    let vm_key = format!("{ns}/{}", vm.name_any());
    if let (Some(_), Some((entry, node))) =
        (annotation(vm, KUBELET_STOPPED_ANNOTATION), joined(ctx, vmi))
    {
        // The kubelet stopped posting: what the node lifecycle controller then shows.
        if let Err(e) = set_ready(entry, &node, "Unknown").await {
            tracing::warn!(vm = %vm_key, node, error = %e, "marking the Node Unknown failed");
            return Ok(Action::requeue(ctx.opts.join_retry_interval));
        }
        return Ok(Action::await_change());
    }
    if let Some((entry, node)) = joined(ctx, vmi) {
        // Joined already: the kubelet keeps posting Ready. (A real kubelet would also
        // re-register a deleted Node; the simulator lets a deleted Node stay deleted.)
        if let Err(e) = keep_ready(entry, &node).await {
            tracing::warn!(vm = %vm_key, node, error = %e, "keeping the Node Ready failed");
            return Ok(Action::requeue(ctx.opts.join_retry_interval));
        }
        if let Some(version) = annotation(vm, KUBELET_VERSION_ANNOTATION) {
            if let Err(e) = report_kubelet_version(entry, &node, version).await {
                tracing::warn!(vm = %vm_key, node, error = %e, "reporting the kubelet's version failed");
                return Ok(Action::requeue(ctx.opts.join_retry_interval));
            }
        }
        return Ok(Action::requeue(ctx.opts.resync_interval));
    }
    if let Some((index, node)) = rebooted(ctx, vm, vmi) {
        // A new instance of a VM whose guest joined before (a restart): the kubelet starts
        // again with the credentials on its disk, no second join.
        if let Some(entry) = ctx.tenants.get(index) {
            // A kubelet marked stopped stays so across the reboot (the fault persists).
            let booted = match annotation(vm, KUBELET_STOPPED_ANNOTATION) {
                Some(_) => set_ready(entry, &node, "Unknown").await,
                None => report_boot(entry, &node, vmi).await,
            };
            if let Err(e) = booted {
                tracing::warn!(vm = %vm_key, node, error = %e, "reporting the new boot failed");
                return Ok(Action::requeue(ctx.opts.join_retry_interval));
            }
            if let Some(uid) = vmi.uid() {
                ctx.joined.lock().insert(uid, (index, node.clone()));
            }
            tracing::info!(vm = %vm_key, node, "guest rebooted; its kubelet posts Ready again");
            return Ok(Action::requeue(ctx.opts.resync_interval));
        }
    }
    let previous = annotation(vmi, JOIN_ERROR_ANNOTATION);
    if previous.is_some_and(|p| p.starts_with(GAVE_UP_PREFIX)) {
        return Ok(Action::await_change());
    }
    // A warm VM: its agent waits for its binding before anything joins.
    let warm = match user_data(ctx, vm, ns).await {
        Ok(text) => autonodes_core::userdata::warm::read_warm_agent(&text),
        Err(_) => None,
    };
    let mut bound = None;
    if let Some(agent) = &warm {
        match super::warm_agent::tick(ctx, &vm.name_any(), agent).await {
            Ok(Some(join)) => bound = Some(join),
            Ok(None) => {
                if previous.is_some() {
                    annotate_vmi(ctx, vmi, ns, json!({ JOIN_ERROR_ANNOTATION: null })).await?;
                }
                return Ok(Action::requeue(autonodes_core::warm::BINDING_POLL_INTERVAL));
            }
            Err(reason) => {
                let message = format!("warm agent: {reason}");
                if previous != Some(message.as_str()) {
                    tracing::warn!(vm = %vm_key, reason = %message, "the warm VM's agent failed");
                    annotate_vmi(ctx, vmi, ns, json!({ JOIN_ERROR_ANNOTATION: message })).await?;
                    publish(ctx, vm, EventType::Warning, "WarmAgentFailed", &message).await;
                }
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
        }
    }
    let mut timeout = guest::DEFAULT_DISCOVERY_TIMEOUT;
    let outcome = join(ctx, vm, vmi, ns, &mut timeout, bound.as_deref()).await;
    match outcome {
        Ok((node, index)) => {
            if let Some(uid) = vmi.uid() {
                ctx.joined.lock().insert(uid, (index, node.clone()));
            }
            if previous.is_some() {
                annotate_vmi(ctx, vmi, ns, json!({ JOIN_ERROR_ANNOTATION: null })).await?;
            }
            let endpoint = ctx
                .tenants
                .get(index)
                .map(TenantEntry::endpoint_string)
                .unwrap_or_default();
            // No Event for a join that worked: the simulator records only what went wrong
            // (`JoinFailed`), so its own writes stay a small part of a benchmark's.
            tracing::info!(vm = %vm_key, node = %node, tenant = %endpoint, "guest joined the tenant");
            Ok(Action::requeue(ctx.opts.resync_interval))
        }
        Err(e) => {
            // A warm VM's join starts when it is bound, not when it booted.
            let deadline_passed = warm.is_none()
                && running_since(vmi).is_some_and(|since| {
                    Timestamp::now()
                        .duration_since(since)
                        .try_into()
                        .is_ok_and(|elapsed: Duration| elapsed >= timeout)
                });
            let give_up = !e.retryable || deadline_passed;
            let message = if give_up {
                format!("{GAVE_UP_PREFIX}{}", e.reason)
            } else {
                e.reason.clone()
            };
            if previous != Some(message.as_str()) {
                tracing::warn!(vm = %vm_key, reason = %message, "the guest did not join");
                annotate_vmi(ctx, vmi, ns, json!({ JOIN_ERROR_ANNOTATION: message })).await?;
                publish(ctx, vm, EventType::Warning, "JoinFailed", &message).await;
            }
            if give_up {
                Ok(Action::await_change())
            } else {
                Ok(Action::requeue(ctx.opts.join_retry_interval))
            }
        }
    }
}

/// The tenant and Node the VM's guest joined under an earlier instance: a Node named as
/// the VM, with its provider ID, booted by another instance.
fn rebooted(ctx: &Ctx, vm: &DynamicObject, vmi: &DynamicObject) -> Option<(usize, String)> {
    let name = vm.name_any();
    let provider_id = format!("kubevirt://{name}");
    let uid = vmi.uid()?;
    ctx.tenants.iter().enumerate().find_map(|(i, t)| {
        let node = t.nodes.get(None, &name)?;
        let ours = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(&provider_id);
        let booted = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.as_str());
        (ours && booted.is_some_and(|b| !b.is_empty() && b != uid)).then(|| (i, name.clone()))
    })
}

/// A rebooted guest's kubelet posts its new boot ID, its addresses as the new instance has
/// them, and fresh conditions: Ready, and none of the conditions other agents
/// (node-problem-detector) had set before the reboot.
async fn report_boot(entry: &TenantEntry, name: &str, vmi: &DynamicObject) -> Result<(), SimError> {
    let now = Timestamp::now().to_string();
    let mut status = json!({
        "nodeInfo": {"bootID": vmi.uid().unwrap_or_default()},
        "conditions": node_conditions("True", &now),
    });
    if let Some(ip) = vmi
        .data
        .pointer("/status/interfaces/0/ipAddress")
        .and_then(Value::as_str)
    {
        status["addresses"] = json!([
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name},
        ]);
    }
    let patch = json!({ "status": status });
    let patched = entry
        .nodes_api()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(SimError::kube(format!(
            "reporting the new boot of Node {name}"
        )))?;
    entry.nodes.wrote(patched);
    Ok(())
}

/// Reads the user data the VM's cloud-init volume points at.
pub(crate) async fn user_data(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
) -> Result<String, JoinError> {
    let volumes = vm
        .data
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let source = volumes
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some("cloudinitdisk"))
        .into_iter()
        .chain(volumes.iter())
        .find_map(|v| {
            v.get("cloudInitNoCloud")
                .or_else(|| v.get("cloudInitConfigDrive"))
                .cloned()
        })
        .ok_or_else(|| {
            fatal("the VM has no cloudInitNoCloud volume: the guest gets no user data")
        })?;
    if let Some(name) = source.pointer("/secretRef/name").and_then(Value::as_str) {
        // From the watch cache of autonodes' Secrets (as a kubelet watches the Secrets its
        // pods mount); from the API server when the cache does not hold it (yet).
        let secrets: Api<Secret> = Api::namespaced(ctx.host.clone(), ns);
        let secret = ctx
            .secrets
            .read_existing(&secrets, name)
            .await
            .map_err(|e| retry(format!("reading user-data Secret {ns}/{name}: {e}")))?
            .ok_or_else(|| retry(format!("user-data Secret {ns}/{name} not found")))?;
        let data = secret.data.clone().unwrap_or_default();
        let bytes = data
            .get("userdata")
            .or_else(|| data.get("userData"))
            .ok_or_else(|| fatal(format!("user-data Secret {ns}/{name} has no key userdata")))?;
        return String::from_utf8(bytes.0.clone()).map_err(|_| {
            fatal(format!(
                "user-data Secret {ns}/{name}: userdata is not UTF-8"
            ))
        });
    }
    if let Some(text) = source.get("userData").and_then(Value::as_str) {
        return Ok(text.to_string());
    }
    if let Some(b64) = source.get("userDataBase64").and_then(Value::as_str) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| fatal(format!("userDataBase64: {e}")))?;
        return String::from_utf8(bytes).map_err(|_| fatal("userDataBase64 is not UTF-8"));
    }
    Err(fatal(
        "the cloudInitNoCloud volume has no secretRef, userData or userDataBase64 (a misspelt userDataSecretRef is pruned by the API server)",
    ))
}

/// One join attempt; on success the Node name and the tenant's index in `Ctx::tenants`.
async fn join(
    ctx: &Ctx,
    vm: &DynamicObject,
    vmi: &DynamicObject,
    ns: &str,
    timeout: &mut Duration,
    bound: Option<&str>,
) -> Result<(String, usize), JoinError> {
    let plan = match bound {
        // A warm VM joins with the JoinConfiguration of its binding.
        Some(join) => guest::parse_join_configuration(join).map_err(|e| fatal(e.0))?,
        None => {
            let text = user_data(ctx, vm, ns).await?;
            guest::parse_user_data(&text).map_err(|e| fatal(e.0))?
        }
    };
    *timeout = plan.discovery_timeout;
    for w in &plan.warnings {
        tracing::warn!(vm = %format!("{ns}/{}", vm.name_any()), "kubeadm: {w}");
    }
    let wanted = guest::split_host_port(&plan.api_server_endpoint);
    // A tenant that publishes a join address (kubeadm-config's controlPlaneEndpoint) is
    // reached there and nowhere else: its kubeconfig's server is not a join address.
    let mut join_addresses = Vec::new();
    for t in &ctx.tenants {
        let published = t.published().await;
        if published.is_some() && wanted.is_some() && t.endpoint == wanted && published != wanted {
            return Err(retry(format!(
                "{} is the tenant's API server as its kubeconfig names it, not the join address it publishes ({})",
                plan.api_server_endpoint,
                published.map(|(h, p)| format!("{h}:{p}")).unwrap_or_default()
            )));
        }
        join_addresses.push(published.or_else(|| t.endpoint.clone()));
    }
    let (index, entry) = ctx
        .tenants
        .iter()
        .enumerate()
        .find(|(i, _)| join_addresses[*i].is_some() && join_addresses[*i] == wanted)
        .ok_or_else(|| {
            retry(format!(
                "no tenant API server at {} (known: {})",
                plan.api_server_endpoint,
                ctx.tenants
                    .iter()
                    .map(TenantEntry::endpoint_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    // The guest runs the tenant's release of kubeadm (and of the kubelet, which the Node
    // reports): it must read the JoinConfiguration's apiVersion, or `kubeadm join` stops.
    let version = entry
        .version()
        .await
        .map_err(|e| retry(format!("reading the tenant's version: {e}")))?;
    let kubeadm =
        KubeVersion::parse(&version).map_err(|e| fatal(format!("the tenant's version: {e}")))?;
    plan.config_api.readable_by(kubeadm).map_err(fatal)?;
    if !plan.unsafe_skip_ca_verification {
        let hashes = entry
            .ca_hashes
            .as_ref()
            .map_err(|e| fatal(format!("the tenant's CA bundle is unusable: {e}")))?;
        if !plan
            .ca_cert_hashes
            .iter()
            .any(|pin| guest::pin_matches(pin, hashes))
        {
            return Err(fatal(format!(
                "cluster CA found in cluster-info is invalid: none of the public keys {:?} are pinned by caCertHashes {:?}",
                hashes, plan.ca_cert_hashes
            )));
        }
    }
    if let Some(script) = &plan.join_script {
        // The script comes from the join address (or the URL the tenant publishes for it)
        // and carries the token the guest joins with.
        let from = guest::endpoint_of_url(&script.url);
        let published_url = entry.published_script_url().await;
        let allowed = published_url
            .as_deref()
            .and_then(guest::endpoint_of_url)
            .or_else(|| join_addresses[index].clone());
        if from.is_none() || from != allowed {
            return Err(fatal(format!(
                "the join script URL {} is not served by the tenant's join address",
                script.url
            )));
        }
        if !script
            .url
            .ends_with(&format!("token={}", plan.discovery_token))
        {
            return Err(fatal(format!(
                "the join script URL {} does not carry the join token",
                script.url
            )));
        }
    }
    check_tokens(entry, &plan).await?;
    let hostname = vm
        .data
        .pointer("/spec/template/spec/hostname")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| vm.name_any());
    let node_name = plan.node_name.clone().unwrap_or(hostname);
    let sized = instancetype_capacity(ctx, vm, ns).await;
    register_node(entry, vm, vmi, &plan, &node_name, sized).await?;
    Ok((node_name, index))
}

/// The tokens work as kubeadm needs them: the TLS-bootstrap token authenticates against the
/// tenant (`GET /api` answers 200, not 401); the discovery token's Secret has that token's
/// secret, has not expired and carries the signing usage (so cluster-info is signed for it);
/// and the TLS-bootstrap token's Secret carries the kubeadm node-bootstrap group (CSR
/// creation).
async fn check_tokens(entry: &TenantEntry, plan: &JoinPlan) -> Result<(), JoinError> {
    let client = entry
        .anonymous_client()
        .await
        .map_err(|e| retry(format!("building a client for the tenant: {e}")))?;
    let request = http::Request::get("/api")
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", plan.tls_bootstrap_token),
        )
        .body(Vec::new())
        .map_err(|e| fatal(e.to_string()))?;
    match tokio::time::timeout(TENANT_TIMEOUT, client.request_text(request)).await {
        Err(_) => return Err(retry("the tenant API server did not answer within 15s")),
        Ok(Ok(_)) => {}
        Ok(Err(kube::Error::Api(s))) if s.code == 401 => {
            return Err(retry(format!(
                "the bootstrap token was rejected by the tenant (401 Unauthorized: {}): wrong, expired or missing token",
                s.message
            )))
        }
        Ok(Err(e)) => return Err(retry(format!("GET /api with the bootstrap token: {e}"))),
    }
    // The token authenticated, so its Secret exists: from the cache, or (not there yet)
    // from the API server.
    let secrets: Api<Secret> = Api::namespaced(entry.tenant.client.clone(), TOKEN_NAMESPACE);
    let read = |token: &str| {
        let id = token.split('.').next().unwrap_or_default().to_string();
        let secrets = secrets.clone();
        async move {
            let name = format!("bootstrap-token-{id}");
            let secret = entry
                .tokens
                .read_existing(&secrets, &name)
                .await
                .map_err(|e| retry(format!("reading {TOKEN_NAMESPACE}/{name}: {e}")))?
                .ok_or_else(|| retry(format!("{TOKEN_NAMESPACE}/{name} not found")))?;
            let data: BTreeMap<String, String> = secret
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            Ok::<_, JoinError>((name, data))
        }
    };
    let (_, data) = read(&plan.discovery_token).await?;
    if let Some(problem) =
        guest::discovery_token_problem(&plan.discovery_token, &data, Timestamp::now())
    {
        return Err(retry(problem));
    }
    let (name, data) = read(&plan.tls_bootstrap_token).await?;
    let groups = data.get("auth-extra-groups").cloned().unwrap_or_default();
    if !groups.split(',').any(|g| g.trim() == NODE_BOOTSTRAP_GROUP) {
        return Err(retry(format!(
            "{name} lacks auth-extra-groups {NODE_BOOTSTRAP_GROUP}: the kubelet may not create its certificate signing request"
        )));
    }
    Ok(())
}

/// The Node's capacity: the VM's resource requests, with cpu/memory falling back to the
/// CPU topology and guest memory, plus `pods: 110`.
pub(crate) fn capacity(vm: &DynamicObject) -> BTreeMap<String, String> {
    let domain = vm
        .data
        .pointer("/spec/template/spec/domain")
        .cloned()
        .unwrap_or(Value::Null);
    let quantity = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let mut out: BTreeMap<String, String> = domain
        .pointer("/resources/requests")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| quantity(v).map(|q| (k.clone(), q)))
                .collect()
        })
        .unwrap_or_default();
    if !out.contains_key("cpu") {
        let n = |f: &str| {
            domain
                .pointer(&format!("/cpu/{f}"))
                .and_then(Value::as_u64)
                .unwrap_or(1)
        };
        out.insert(
            "cpu".into(),
            (n("cores") * n("sockets") * n("threads")).to_string(),
        );
    }
    if !out.contains_key("memory") {
        if let Some(guest) = domain.pointer("/memory/guest").and_then(quantity) {
            out.insert("memory".into(), guest);
        }
    }
    out.insert("pods".into(), "110".into());
    out
}

/// The guest cpu and memory of the VM's instance type (`spec.instancetype`), which KubeVirt
/// would give its VMI; `None` for a VM without one, or when it cannot be read (the Node's
/// capacity then comes from the VM alone). One GET per joining guest of such a VM.
async fn instancetype_capacity(
    ctx: &Ctx,
    vm: &DynamicObject,
    ns: &str,
) -> Option<(String, String)> {
    use autonodes_core::template::instancetype::{Matcher, CLUSTER_INSTANCETYPE};
    let on_vm = vm.data.pointer("/spec/instancetype")?;
    let it = Matcher {
        kind: on_vm
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or(CLUSTER_INSTANCETYPE)
            .to_string(),
        name: on_vm.get("name").and_then(Value::as_str)?.to_string(),
    };
    let resource = crate::kubevirt::instancetype(&it.kind);
    let api: kube::Api<DynamicObject> = if it.is_cluster_scoped() {
        kube::Api::all_with(ctx.host.clone(), &resource)
    } else {
        kube::Api::namespaced_with(ctx.host.clone(), ns, &resource)
    };
    let found = api.get_opt(&it.name).await.ok()??;
    let cpu = found.data.pointer("/spec/cpu/guest")?.as_i64()?.to_string();
    let memory = found
        .data
        .pointer("/spec/memory/guest")?
        .as_str()?
        .to_string();
    Some((cpu, memory))
}

async fn register_node(
    entry: &TenantEntry,
    vm: &DynamicObject,
    vmi: &DynamicObject,
    plan: &JoinPlan,
    node_name: &str,
    instancetype: Option<(String, String)>,
) -> Result<(), JoinError> {
    let nodes = entry.nodes_api();
    let arch = vm
        .data
        .pointer("/spec/template/spec/architecture")
        .and_then(Value::as_str)
        .unwrap_or("amd64");
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), node_name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), arch.to_string()),
    ]);
    labels.extend(plan.node_labels.clone());
    // A VM marked with a kubelet version registers with it from the start (a baked
    // kubelet); else the kubelet is of the tenant's release.
    let version = match annotation(vm, KUBELET_VERSION_ANNOTATION) {
        Some(v) => v.to_string(),
        None => entry
            .version()
            .await
            .map_err(|e| retry(format!("reading the tenant's version: {e}")))?,
    };
    let (ip, _) = guest_address(&vm.uid().unwrap_or_default());
    let ip = vmi
        .data
        .pointer("/status/interfaces/0/ipAddress")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or(ip);
    let mut capacity = capacity(vm);
    if let Some((cpu, memory)) = instancetype {
        capacity.insert("cpu".into(), cpu);
        capacity.insert("memory".into(), memory);
    }
    let now = Timestamp::now().to_string();
    let machine_id = vm.uid().unwrap_or_default().replace('-', "");
    let status = json!({
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": node_name},
        ],
        "nodeInfo": {
            "architecture": arch,
            "bootID": vmi.uid().unwrap_or_default(),
            "containerRuntimeVersion": "containerd://1.7.24",
            "kernelVersion": "6.1.0-simulated",
            "kubeProxyVersion": version,
            "kubeletVersion": version,
            "machineID": machine_id,
            "operatingSystem": "linux",
            "osImage": "autonodes simulated guest",
            "systemUUID": vmi.uid().unwrap_or_default(),
        },
        "conditions": node_conditions("True", &now),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    });
    // The kubelet registers its Node with the status it has (a Node's status may be set on
    // creation), here Ready at once: the guest boots instantly.
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": labels},
        "spec": {"providerID": plan.provider_id, "taints": plan.taints},
        "status": status,
    }))
    .map_err(|e| fatal(format!("building the Node: {e}")))?;
    let (node, created) = match tokio::time::timeout(
        TENANT_TIMEOUT,
        nodes.create(&PostParams::default(), &node),
    )
    .await
    {
        Err(_) => return Err(retry("creating the Node timed out")),
        Ok(Ok(created)) => (entry.nodes.wrote(created), true),
        Ok(Err(kube::Error::Api(s))) if s.is_already_exists() => {
            let existing = entry
                .nodes
                .read_existing(&nodes, node_name)
                .await
                .map_err(|e| retry(format!("reading Node {node_name}: {e}")))?
                .ok_or_else(|| retry(format!("Node {node_name} went away meanwhile")))?;
            let theirs = existing.spec.as_ref().and_then(|s| s.provider_id.clone());
            if theirs.is_some() && theirs != plan.provider_id {
                return Err(fatal(format!(
                    "Node {node_name} exists with providerID {theirs:?}, not {:?}: another machine has this name",
                    plan.provider_id
                )));
            }
            (existing, false)
        }
        Ok(Err(kube::Error::Api(s))) if s.is_invalid() => {
            return Err(fatal(format!(
                "the tenant rejected Node {node_name}: {}",
                s.message
            )))
        }
        Ok(Err(e)) => return Err(retry(format!("creating Node {node_name}: {e}"))),
    };
    // The node lifecycle controller's part: the not-ready taint the API server put on the
    // new Node goes once it is Ready.
    remove_not_ready_taint(entry, &node)
        .await
        .map_err(|e| retry(e.to_string()))?;
    if !created {
        // Registered by an earlier attempt: the kubelet posts its status.
        let patched = nodes
            .patch_status(
                node_name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .map_err(|e| retry(format!("updating the status of Node {node_name}: {e}")))?;
        entry.nodes.wrote(patched);
    }
    Ok(())
}

fn node_conditions(ready: &str, now: &str) -> Value {
    let (reason, message) = match ready {
        "True" => ("KubeletReady", "kubelet is posting ready status"),
        _ => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
    };
    let pressure = |type_: &str, ok_reason: &str| {
        let (status, reason) = if ready == "True" {
            ("False", ok_reason)
        } else {
            ("Unknown", "NodeStatusUnknown")
        };
        json!({
            "type": type_, "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID"),
        {
            "type": "Ready", "status": ready, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }
    ])
}

/// Removes `node.kubernetes.io/not-ready` (the API server adds it on creation and no
/// node-lifecycle controller runs to take it off); leaves every other taint alone. A JSON
/// patch that removes the taint by its position after testing that the position still holds
/// it, made from `node` (the cache's or a write's copy), so that autonodes removing its own
/// registration taint behind it meanwhile does not make it fail; only when the test fails
/// (a taint before it changed) is the Node read again, once.
async fn remove_not_ready_taint(entry: &TenantEntry, node: &Arc<Node>) -> Result<(), SimError> {
    let nodes = entry.nodes_api();
    let name = node.name_any();
    let mut node = node.clone();
    for attempt in 0..2 {
        let Some(ops) = without_not_ready_taint(&node) else {
            return Ok(());
        };
        let patch: json_patch::Patch = serde_json::from_value(ops)
            .map_err(|e| SimError::Invalid(format!("the taint patch of Node {name}: {e}")))?;
        match nodes
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(patched) => {
                entry.nodes.wrote(patched);
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            Err(kube::Error::Api(s)) if attempt == 0 && (s.code == 422 || s.is_conflict()) => {
                let fresh = entry
                    .nodes
                    .fetch(&nodes, &name)
                    .await
                    .map_err(SimError::kube(format!("reading Node {name}")))?;
                match fresh {
                    Some(fresh) => node = fresh,
                    None => return Ok(()),
                }
            }
            Err(source) => {
                return Err(SimError::Kube {
                    context: format!("patching the taints of Node {name}"),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// The JSON patch that drops the not-ready taint from `node`'s taints if its position still
/// holds it; None when it has no such taint.
fn without_not_ready_taint(node: &Node) -> Option<Value> {
    let taints: &[Taint] = node.spec.as_ref()?.taints.as_deref()?;
    let i = taints.iter().position(|t| t.key == NOT_READY_TAINT)?;
    let path = format!("/spec/taints/{i}");
    Some(json!([
        {"op": "test", "path": path, "value": taints[i]},
        {"op": "remove", "path": path},
    ]))
}

fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// The kubelet is running: the Node (if it still exists) is Ready and has no not-ready
/// taint. Reads the Node from the cache; writes only what is not so.
async fn keep_ready(entry: &TenantEntry, name: &str) -> Result<(), SimError> {
    let nodes = entry.nodes_api();
    let cached = entry.nodes.read(&nodes, name).await;
    let Some(node) = cached.map_err(SimError::kube(format!("reading Node {name}")))? else {
        // Deleted: the simulator lets a deleted Node stay deleted.
        return Ok(());
    };
    remove_not_ready_taint(entry, &node).await?;
    set_ready(entry, name, "True").await
}

/// Sets the Node's `status.nodeInfo.kubeletVersion` (and kube-proxy's) to `version` unless
/// it is so already (read from the cache).
async fn report_kubelet_version(
    entry: &TenantEntry,
    name: &str,
    version: &str,
) -> Result<(), SimError> {
    let reported = |node: &Node| {
        node.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .is_some_and(|i| i.kubelet_version == version)
    };
    let patch = || json!({"status": {"nodeInfo": {"kubeletVersion": version, "kubeProxyVersion": version}}});
    patch_node_status_unless(entry, name, reported, patch, || {
        format!("reporting kubelet {version} on Node {name}")
    })
    .await
}

/// Sets the Node's `Ready` condition to `status` (`True`, `Unknown`) unless it is so
/// already (read from the cache).
async fn set_ready(entry: &TenantEntry, name: &str, status: &str) -> Result<(), SimError> {
    let is_so = |node: &Node| ready_status(node).as_deref() == Some(status);
    let patch = || {
        let now = Timestamp::now().to_string();
        json!({"status": {"conditions": node_conditions(status, &now)}})
    };
    patch_node_status_unless(entry, name, is_so, patch, || {
        format!("marking Node {name} Ready={status}")
    })
    .await
}

/// Merge-patches the status of the Node `name` with `patch()` unless `is_so` holds for it
/// as the cache has it (or it is gone); `what` names the write in an error.
async fn patch_node_status_unless(
    entry: &TenantEntry,
    name: &str,
    is_so: impl Fn(&Node) -> bool,
    patch: impl Fn() -> Value,
    what: impl Fn() -> String,
) -> Result<(), SimError> {
    let nodes = entry.nodes_api();
    let cached = entry.nodes.read(&nodes, name).await;
    let Some(node) = cached.map_err(SimError::kube(format!("reading Node {name}")))? else {
        return Ok(());
    };
    if !is_so(&node) {
        let patched = nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch()))
            .await
            .map_err(SimError::kube(what()))?;
        entry.nodes.wrote(patched);
    }
    Ok(())
}

/// The guest stops: its Node, if it joined one that still exists, turns `Ready=Unknown`.
pub(crate) async fn stop_guest(ctx: &Ctx, vmi: &DynamicObject) {
    let Some((entry, node)) = joined(ctx, vmi) else {
        return;
    };
    if let Some(uid) = vmi.uid() {
        ctx.joined.lock().remove(&uid);
    }
    let node = node.as_str();
    let now = Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": node_conditions("Unknown", &now)}});
    match entry
        .nodes_api()
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => {
            entry.nodes.wrote(patched);
            tracing::info!(node, "guest stopped: Node marked NotReady");
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => tracing::warn!(node, error = %e, "marking the Node NotReady failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_comes_from_requests_or_the_cpu_topology() {
        let vm: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "x"},
            "spec": {"template": {"spec": {"domain": {
                "cpu": {"cores": 2, "sockets": 2},
                "memory": {"guest": "3Gi"},
                "resources": {"requests": {"nvidia.com/gpu": 1}},
            }}}}
        }))
        .expect("valid");
        let cap = capacity(&vm);
        assert_eq!(cap["cpu"], "4");
        assert_eq!(cap["memory"], "3Gi");
        assert_eq!(cap["nvidia.com/gpu"], "1");
        assert_eq!(cap["pods"], "110");
    }
}
