//! Register: the tenant Node with the VM's provider ID gets the labels the kubelet may not
//! set and loses the registration taint; `Joined`, and the bootstrap token is deleted —
//! or the registration timeout fails the claim.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::controller::Action;
use kube::ResourceExt;

use super::provisioning::{elapsed_since, remaining, uid, Provisioning, Step};
use super::status::{JOINED, PROVISIONED};
use super::tokens::delete_tokens;
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_core::join;

/// The register stage.
pub(super) async fn register<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Step, Error> {
    let provider_id = p.provider_id();
    let node = p.tenant().node(&p.vm_name).await?.filter(|n| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
    });
    let Some(node) = node else {
        let since = p.status.true_since(PROVISIONED).unwrap_or_else(now);
        let waited = elapsed_since(since);
        let limit = p.ctx.config.registration_timeout;
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
    let node = match sync_node(p, &node).await? {
        Some(patched) => Arc::new(patched),
        None => node,
    };
    if !p.status.is_true(JOINED) {
        let message = match &p.tenant().remote().via {
            Some(via) => format!("Node {node_name} joined the tenant; {via}"),
            None => format!("Node {node_name} joined the tenant"),
        };
        p.status.set(JOINED, true, ClaimReason::NodeJoined, message);
        // The token has done its job.
        delete_tokens(p.tenant(), &uid(p.claim)?).await?;
    }
    p.node = Some(node);
    Ok(Step::Next)
}

/// Sets the labels the kubelet could not, and removes the registration taint
/// ([`join::node_patch`]). Returns the Node as patched, or None when it needed nothing.
async fn sync_node<H: HostApi, T: TenantApi>(
    p: &Provisioning<'_, H, T>,
    node: &Node,
) -> Result<Option<Node>, Error> {
    let properties = autonodes_core::node_config::claim_node_properties(p.node_type, None, p.claim);
    let labels = autonodes_core::node_config::node_labels(
        &properties,
        None,
        &p.claim.spec.labels,
        &BTreeMap::new(),
    )
    .map_err(|e| Error::Internal(e.to_string()))?;
    let Some(ops) = join::node_patch(node, &labels.after_join) else {
        return Ok(None);
    };
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Internal(format!("building the Node patch: {e}")))?;
    let patched = p
        .tenant()
        .patch_node(node, patch, "updating the Node's labels and taints")
        .await;
    match patched {
        Ok(n) => Ok(Some(n)),
        // The taints changed since they were read (`test` failed): look again.
        Err(e) if e.status_code() == Some(422) && join::removes_registration_taint(node) => Err(
            Error::Conflict(format!("Node {} (taints changed)", node.name_any())),
        ),
        Err(e) => Err(e.into()),
    }
}
