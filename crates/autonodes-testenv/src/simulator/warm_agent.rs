//! The warm-VM agent, simulated: what `warm-agent.py` does in a real guest, with the VM's
//! own token against the real host API server (so the host's RBAC decides what it may
//! read): renew the VM's Lease as a heartbeat, and look for the VM's binding Secret; once a
//! claim wrote it, revoke the token (delete the VM's ServiceAccount) and hand the binding's
//! JoinConfiguration to the simulated `kubeadm join`. The claim's user data in the binding
//! is left alone: no cloud-init runs here.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use super::context::Ctx;
use autonodes_core::userdata::warm::WarmAgent;
use autonodes_core::warm::{BINDING_JOIN_KEY, HEARTBEAT_INTERVAL};

/// How long one request of the agent may take.
const AGENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that authenticates as the warm VM: its token, its view of the host's server
/// and CA, nothing else.
pub async fn agent_client(agent: &WarmAgent) -> Result<Client, String> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(agent.host_ca_pem.as_bytes());
    let kubeconfig: Kubeconfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "vm",
        "clusters": [{"name": "host", "cluster": {"server": agent.server, "certificate-authority-data": ca}}],
        "users": [{"name": "vm", "user": {"token": agent.token}}],
        "contexts": [{"name": "vm", "context": {"cluster": "host", "user": "vm"}}],
    }))
    .map_err(|e| format!("the agent's kubeconfig: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("the agent's configuration: {e}"))?;
    Client::try_from(config).map_err(|e| format!("the agent's client: {e}"))
}

/// One turn of the agent of the VM `vm`: the heartbeat (at most every
/// [`HEARTBEAT_INTERVAL`]), then the binding. `Ok(Some(join))` once the binding is there;
/// `Ok(None)` while it is not; `Err` when the host refuses or cannot be reached.
pub(crate) async fn tick(ctx: &Ctx, vm: &str, agent: &WarmAgent) -> Result<Option<String>, String> {
    if let Some(join) = ctx.bindings.lock().get(vm) {
        return Ok(Some(join.clone()));
    }
    let client = agent_client(agent).await?;
    let due = ctx
        .beats
        .lock()
        .get(vm)
        .is_none_or(|at| at.elapsed() >= HEARTBEAT_INTERVAL);
    if due {
        let leases: Api<Lease> = Api::namespaced(client.clone(), &agent.namespace);
        let patch = serde_json::json!({"spec": {
            "holderIdentity": vm,
            "renewTime": MicroTime(Timestamp::now()),
        }});
        tokio::time::timeout(
            AGENT_TIMEOUT,
            leases.patch(&agent.lease, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map_err(|_| "renewing the Lease: no answer".to_string())?
        .map_err(|e| format!("renewing Lease {}/{}: {e}", agent.namespace, agent.lease))?;
        ctx.beats.lock().insert(vm.to_string(), Instant::now());
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &agent.namespace);
    let binding = tokio::time::timeout(AGENT_TIMEOUT, secrets.get_opt(&agent.binding))
        .await
        .map_err(|_| "reading the binding: no answer".to_string())?
        .map_err(|e| format!("reading binding {}/{}: {e}", agent.namespace, agent.binding))?;
    let Some(binding) = binding else {
        return Ok(None);
    };
    let join = binding
        .data
        .as_ref()
        .and_then(|d| d.get(BINDING_JOIN_KEY))
        .ok_or_else(|| format!("binding {} has no {BINDING_JOIN_KEY}", agent.binding))?;
    let join = String::from_utf8(join.0.clone())
        .map_err(|_| format!("binding {}: {BINDING_JOIN_KEY} is not UTF-8", agent.binding))?;
    revoke(&client, agent).await?;
    ctx.bindings.lock().insert(vm.to_string(), join.clone());
    Ok(Some(join))
}

/// Deletes the VM's ServiceAccount with its own token (its Role allows that and no other
/// deletion); gone already, or the token refused, counts as done.
async fn revoke(client: &Client, agent: &WarmAgent) -> Result<(), String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &agent.namespace);
    let deleted = tokio::time::timeout(
        AGENT_TIMEOUT,
        accounts.delete(&agent.lease, &DeleteParams::default()),
    )
    .await
    .map_err(|_| "revoking the credential: no answer".to_string())?;
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 401 => Ok(()),
        Err(e) => Err(format!(
            "revoking the credential (deleting ServiceAccount {}/{}): {e}",
            agent.namespace, agent.lease
        )),
    }
}
