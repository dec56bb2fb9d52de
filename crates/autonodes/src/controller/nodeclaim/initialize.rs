//! Initialize: `Initialized` and `Ready` once the claim's Node is Ready and none of the
//! claim's startup taints is left on it — or the initialization timeout fails the claim.
//! Once initialized, `Ready` follows the Node, and `status.nodeConditions` keeps the Node's
//! conditions for node repair.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::runtime::controller::Action;
use kube::ResourceExt;

use super::provisioning::{elapsed_since, remaining, Provisioning, Step};
use super::status::{INITIALIZED, READY};
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_api::NodeClaim;
use autonodes_core::node_health::node_ready;

/// The initialize stage (the last: it always stops the walk).
pub(super) async fn initialize<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Step, Error> {
    let Some(node) = p.node.clone() else {
        return Err(Error::Internal("initialize ran before register".into()));
    };
    let node_name = node.name_any();
    let startup_left: Vec<String> = startup_taints(p.claim)
        .iter()
        .filter(|st| {
            node_taints(&node)
                .iter()
                .any(|nt| nt.key == st.key && nt.effect == st.effect)
        })
        .map(|t| t.key.clone())
        .collect();
    let ready = node_ready(&node);
    if p.status.is_true(INITIALIZED) || (ready && startup_left.is_empty()) {
        // What node repair reads: the Node's conditions, each since it was first seen so.
        let seen = node.status.as_ref().and_then(|s| s.conditions.as_deref());
        p.status.new.node_conditions = autonodes_core::node_health::observe(
            &p.status.new.node_conditions,
            seen.unwrap_or_default(),
            now(),
        );
    }
    if ready && startup_left.is_empty() {
        if !p.status.is_true(INITIALIZED) {
            p.status.set(
                INITIALIZED,
                true,
                ClaimReason::Initialized,
                format!("Node {node_name} is Ready without startup taints"),
            );
        }
        p.status.set(
            READY,
            true,
            ClaimReason::NodeReady,
            format!("Node {node_name} is Ready"),
        );
        super::power::ready(p).await?;
        return Ok(Step::Stop(Action::requeue(Duration::from_secs(300))));
    }
    let message = if !ready {
        format!("Node {node_name} is not Ready yet")
    } else {
        format!(
            "Node {node_name} still has startup taints: {}",
            startup_left.join(", ")
        )
    };
    if p.status.is_true(INITIALIZED) {
        p.status
            .set(READY, false, ClaimReason::NodeNotReady, message);
        return Ok(Step::Stop(Action::requeue(Duration::from_secs(30))));
    }
    // Counted from when `Initialized=False` was first written: with `Joined` for a new
    // claim, at the upgrade for a claim from a version without the condition (whose Node
    // may have been Ready for months and be NotReady just now).
    let since = p.status.since(INITIALIZED).unwrap_or_else(now);
    let waited = elapsed_since(since);
    let limit = p.ctx.config.initialization_timeout;
    if waited > limit {
        return Ok(Step::Fail {
            reason: ClaimReason::InitializationTimeout,
            message: format!("{message}; not initialized within {}s", limit.as_secs()),
        });
    }
    p.status.set(
        INITIALIZED,
        false,
        ClaimReason::NodeNotReady,
        message.clone(),
    );
    p.status
        .set(READY, false, ClaimReason::NodeNotReady, message);
    Ok(Step::Stop(Action::requeue(remaining(
        limit,
        waited,
        Duration::from_secs(30),
    ))))
}

pub(super) fn node_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn startup_taints(claim: &NodeClaim) -> Vec<Taint> {
    claim.spec.startup_taints.clone()
}
