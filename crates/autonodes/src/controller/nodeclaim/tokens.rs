//! Bootstrap tokens in the tenant: at most one live token per claim, reused while the
//! claim waits, deleted once its Node joined.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::ResourceExt;

use super::{claim_labels, uid, TOKEN_GROUP, TOKEN_NAMESPACE};
use crate::api::NodeClaim;
use crate::controller::tenant::Tenant;
use crate::controller::{now, Context, Error};
use crate::userdata::BootstrapToken;

/// A fresh random bootstrap token.
fn new_token() -> BootstrapToken {
    let mut bytes = Vec::new();
    BootstrapToken::from_random(|| {
        if bytes.is_empty() {
            bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        bytes.pop().unwrap_or(0)
    })
}

fn secret_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// Returns the claim's live bootstrap token in the tenant, creating one if needed, and
/// deleting any other (at most one live token per claim).
pub(super) async fn ensure_token(
    claim: &NodeClaim,
    ctx: &Context,
    tenant: &Tenant<'_>,
) -> Result<BootstrapToken, Error> {
    let uid = uid(claim)?;
    let existing = tenant.tokens(&uid).await?;
    let min_left = now().as_second() + 60;
    let mut found = None;
    for s in existing {
        let expires = secret_text(&s, "expiration")
            .and_then(|e| e.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_second())
            .unwrap_or(0);
        match (
            &found,
            secret_text(&s, "token-id"),
            secret_text(&s, "token-secret"),
        ) {
            (None, Some(id), Some(secret)) if expires > min_left => {
                found = BootstrapToken::parse(&format!("{id}.{secret}"))
            }
            _ => {
                // Best effort: a stale token expires anyway.
                let _ = tenant
                    .delete_token(&s, "deleting a stale bootstrap token")
                    .await;
            }
        }
    }
    if let Some(token) = found {
        return Ok(token);
    }
    let token = new_token();
    let expiration = now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            ctx.config.registration_timeout.as_secs() as i64,
        ))
        .map_err(|e| Error::Internal(e.to_string()))?;
    let data: BTreeMap<String, ByteString> = [
        ("token-id", token.id().to_string()),
        ("token-secret", token.secret().to_string()),
        ("expiration", expiration.to_string()),
        ("usage-bootstrap-authentication", "true".into()),
        ("usage-bootstrap-signing", "true".into()),
        ("auth-extra-groups", TOKEN_GROUP.into()),
        (
            "description",
            format!(
                "autonodes join token for NodeClaim {}/{}",
                claim.namespace().unwrap_or_default(),
                claim.name_any()
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some(claim_labels(claim)),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        data: Some(data),
        ..Default::default()
    };
    tenant.create_token(&secret).await?;
    tracing::info!(nodeclaim = %claim.name_any(), token_id = %token.id(), "created bootstrap token");
    Ok(token)
}

/// Deletes the claim's bootstrap tokens; returns how many there were.
pub(super) async fn delete_tokens(tenant: &Tenant<'_>, uid: &str) -> Result<usize, Error> {
    let existing = tenant.tokens(uid).await?;
    for s in &existing {
        tenant.delete_token(s, "deleting a bootstrap token").await?;
    }
    Ok(existing.len())
}
