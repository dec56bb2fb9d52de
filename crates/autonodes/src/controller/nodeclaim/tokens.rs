//! Bootstrap tokens in the tenant: at most one live token per claim, reused while the
//! claim waits, deleted once its Node joined.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;

use super::{claim_labels, uid, uid_selector, TOKEN_GROUP, TOKEN_NAMESPACE};
use crate::api::{NodeClaim, LABEL_NODECLAIM_UID};
use crate::clients::Remote;
use crate::controller::calls::{not_found, remote_call};
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
    tenant: &Remote,
) -> Result<BootstrapToken, Error> {
    let uid = uid(claim)?;
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let existing = tokens_of(ctx, tenant, &uid).await?;
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
                let _ = remote_call(
                    ctx,
                    tenant,
                    "deleting a stale bootstrap token",
                    secrets.delete(&s.name_any(), &DeleteParams::default()),
                )
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
    let created = remote_call(
        ctx,
        tenant,
        "creating a bootstrap token",
        secrets.create(&PostParams::default(), &secret),
    )
    .await?;
    if let Some(cache) = tenant.tenant_cache() {
        cache.tokens.wrote(created, None);
    }
    tracing::info!(nodeclaim = %claim.name_any(), token_id = %token.id(), "created bootstrap token");
    Ok(token)
}

/// The claim's bootstrap-token Secrets: from the tenant's token cache when it is live, else
/// listed by the claim's UID label.
pub(super) async fn tokens_of(
    ctx: &Context,
    tenant: &Remote,
    uid: &str,
) -> Result<Vec<Arc<Secret>>, Error> {
    let ours = |s: &Secret| s.labels().get(LABEL_NODECLAIM_UID).map(String::as_str) == Some(uid);
    if let Some(found) = tenant.tenant_cache().and_then(|c| c.tokens.filter(ours)) {
        return Ok(found);
    }
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let listed = remote_call(
        ctx,
        tenant,
        "listing bootstrap tokens",
        secrets.list(&ListParams::default().labels(&uid_selector(uid))),
    )
    .await?;
    Ok(listed.items.into_iter().map(Arc::new).collect())
}

/// Deletes the claim's bootstrap tokens; returns how many there were.
pub(super) async fn delete_tokens(
    ctx: &Context,
    tenant: &Remote,
    uid: &str,
) -> Result<usize, Error> {
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), TOKEN_NAMESPACE);
    let existing = tokens_of(ctx, tenant, uid).await?;
    let n = existing.len();
    for s in existing {
        match remote_call(
            ctx,
            tenant,
            "deleting a bootstrap token",
            secrets.delete(&s.name_any(), &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e),
        }
        if let Some(cache) = tenant.tenant_cache() {
            cache.tokens.deleted(&s);
        }
    }
    Ok(n)
}
