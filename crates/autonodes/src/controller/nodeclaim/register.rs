//! Register: the tenant Node with the VM's provider ID gets the labels the kubelet may not
//! set and loses the registration taint; `Joined`, and the bootstrap token is deleted —
//! or the registration timeout fails the claim.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::json;

use super::initialize::node_taints;
use super::tokens::delete_tokens;
use super::{elapsed_since, remaining, uid, Provisioning, Step, JOINED, PROVISIONED};
use crate::api::reasons::ClaimReason;
use crate::api::NodeClaim;
use crate::clients::Remote;
use crate::controller::calls::{read, remote_call};
use crate::controller::{now, Context, Error};
use crate::scheduling::{self, PreparedType, REGISTRATION_TAINT_KEY};

/// The register stage.
pub(super) async fn register(p: &mut Provisioning<'_>) -> Result<Step, Error> {
    let ctx = p.ctx;
    let nodes: Api<Node> = Api::all(p.tenant.client.clone());
    let cached = p
        .tenant
        .tenant_cache()
        .and_then(|c| c.nodes.get(None, &p.vm_name));
    let node = read(
        ctx,
        p.tenant,
        cached,
        &nodes,
        &p.vm_name,
        "reading the Node",
    )
    .await?;
    let provider_id = p.provider_id();
    let node = node.filter(|n| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
    });
    let Some(node) = node else {
        let since = p.status.true_since(PROVISIONED).unwrap_or_else(now);
        let waited = elapsed_since(since);
        let limit = ctx.config.registration_timeout;
        if waited > limit {
            return Ok(Step::Fail {
                reason: ClaimReason::RegistrationTimeout,
                message: format!(
                    "no Node with providerID {provider_id} joined within {}s",
                    limit.as_secs()
                ),
            });
        }
        p.status.set(
            JOINED,
            false,
            ClaimReason::WaitingForNode,
            format!("waiting for a Node with providerID {provider_id} in the tenant"),
        );
        return Ok(Step::Stop(Action::requeue(remaining(
            limit,
            waited,
            Duration::from_secs(30),
        ))));
    };
    let node_name = node.name_any();
    p.status.new.node_name = Some(node_name.clone());
    let node = match sync_node(p.claim, ctx, p.tenant, p.node_type, &node).await? {
        Some(patched) => Arc::new(patched),
        None => node,
    };
    if !p.status.is_true(JOINED) {
        let message = format!("Node {node_name} joined the tenant");
        p.status.set(JOINED, true, ClaimReason::NodeJoined, message);
        // The token has done its job.
        delete_tokens(ctx, p.tenant, &uid(p.claim)?).await?;
    }
    p.node = Some(node);
    Ok(Step::Next)
}

/// Sets the labels the kubelet could not, and removes the registration taint. Returns the
/// Node as patched, or None when it needed nothing.
async fn sync_node(
    claim: &NodeClaim,
    ctx: &Context,
    tenant: &Remote,
    t: &PreparedType,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let properties = scheduling::node_properties(t, None, &claim.spec);
    let labels = scheduling::node_labels(&properties, None, &claim.spec.labels, &BTreeMap::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let current = node.labels();
    let missing: BTreeMap<&String, &String> = labels
        .after_join
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .collect();
    let taints = node_taints(node);
    let has_registration = taints.iter().any(|t| t.key == REGISTRATION_TAINT_KEY);
    if missing.is_empty() && !has_registration {
        return Ok(None);
    }
    let kept: Vec<&Taint> = taints
        .iter()
        .filter(|t| t.key != REGISTRATION_TAINT_KEY)
        .collect();
    // A JSON patch: labels are added one by one; the taints are replaced only if they are
    // still the ones read (a `test` op), so the kubelet's status heartbeats, which change
    // the Node's resourceVersion, do not make the patch conflict.
    let mut ops: Vec<serde_json::Value> = Vec::new();
    if current.is_empty() && !missing.is_empty() {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    for (k, v) in &missing {
        ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", json_pointer_escape(k)), "value": v}));
    }
    if has_registration {
        ops.push(json!({"op": "test", "path": "/spec/taints", "value": taints}));
        if kept.is_empty() {
            ops.push(json!({"op": "remove", "path": "/spec/taints"}));
        } else {
            ops.push(json!({"op": "replace", "path": "/spec/taints", "value": kept}));
        }
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Internal(format!("building the Node patch: {e}")))?;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let patched = remote_call(
        ctx,
        tenant,
        "updating the Node's labels and taints",
        nodes.patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        ),
    )
    .await;
    match patched {
        Ok(n) => {
            if let Some(cache) = tenant.tenant_cache() {
                cache.nodes.wrote(n.clone(), node.resource_version());
            }
            Ok(Some(n))
        }
        // The taints changed since they were read (`test` failed): look again.
        Err(Error::Remote {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 422 && has_registration => Err(Error::Conflict(format!(
            "Node {} (taints changed)",
            node.name_any()
        ))),
        Err(e) => Err(e),
    }
}

/// A JSON pointer segment for `key` (`~` → `~0`, `/` → `~1`).
fn json_pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
