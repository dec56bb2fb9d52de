//! Objects of autonodes' kinds that cannot be decoded: each gets the condition
//! `InvalidSpec` with the decoding error, an Event and a log line, once per change.

use std::sync::Arc;

use futures::channel::mpsc;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::Client;

use super::lenient::{Report, FIELD_MANAGER, REASON};
use crate::controller::context::Context;
use autonodes_api::conditions;

/// Reports undecodable objects until the channel closes: an object whose stored status
/// already says `InvalidSpec` with the same error is left alone, so each change is
/// reported once (writing the condition changes the object, and the watch sees it again).
pub(crate) async fn report(ctx: Arc<Context>, mut reports: mpsc::UnboundedReceiver<Report>) {
    while let Some(r) = reports.next().await {
        let message = conditions::bounded_message(format!("cannot be read: {}", r.object.error));
        if already_reported(r.object.status.as_ref(), &message) {
            continue;
        }
        let name = r.object.meta.name.clone().unwrap_or_default();
        let namespace = r.object.meta.namespace.clone();
        tracing::warn!(
            kind = %r.resource.kind,
            name = %name,
            namespace = %namespace.clone().unwrap_or_default(),
            error = %r.object.error,
            "object cannot be decoded; it is not served until it is fixed"
        );
        if let Err(e) = write_condition(&ctx.client, &r, &message).await {
            tracing::warn!(kind = %r.resource.kind, %name, error = %e, "writing the InvalidSpec condition failed");
        }
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(r.resource.api_version.clone()),
            kind: Some(r.resource.kind.clone()),
            name: Some(name),
            namespace,
            uid: r.object.meta.uid.clone(),
            ..Default::default()
        };
        ctx.event_about(regarding, EventType::Warning, REASON, "Decode", message)
            .await;
    }
}

/// True when `status` holds `Ready=False` with reason [`REASON`] and `message`.
pub(crate) fn already_reported(status: Option<&serde_json::Value>, message: &str) -> bool {
    status
        .and_then(|s| s.get("conditions"))
        .and_then(|c| c.as_array())
        .is_some_and(|list| {
            list.iter().any(|c| {
                c.get("type").and_then(|v| v.as_str()) == Some("Ready")
                    && c.get("status").and_then(|v| v.as_str()) == Some(conditions::FALSE)
                    && c.get("reason").and_then(|v| v.as_str()) == Some(REASON)
                    && c.get("message").and_then(|v| v.as_str()) == Some(message)
            })
        })
}

/// Applies `Ready=False/InvalidSpec` to the object's status with this module's own field
/// manager (the conditions are a list-map keyed by type: only `Ready` changes hands).
async fn write_condition(client: &Client, r: &Report, message: &str) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = match &r.object.meta.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r.resource),
        None => Api::all_with(client.clone(), &r.resource),
    };
    let patch = serde_json::json!({
        "apiVersion": r.resource.api_version,
        "kind": r.resource.kind,
        "status": {"conditions": [{
            "type": "Ready",
            "status": conditions::FALSE,
            "reason": REASON,
            "message": message,
            "lastTransitionTime": crate::controller::context::now().to_string(),
            "observedGeneration": r.object.meta.generation,
        }]},
    });
    api.patch_status(
        r.object.meta.name.as_deref().unwrap_or_default(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_whose_status_says_invalid_spec_with_the_same_message_is_not_reported_again() {
        let status = serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
            "reason": "InvalidSpec", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert!(already_reported(Some(&status), "m"));
        assert!(!already_reported(Some(&status), "other"));
        assert!(!already_reported(None, "m"));
    }
}
