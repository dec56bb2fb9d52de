//! Bootstrap tokens in the tenant: at most one live token per claim, reused while the
//! claim waits, deleted once its Node joined.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::ResourceExt;

use super::provisioning::uid;
use crate::controller::config::ControllerConfig;
use crate::controller::context::now;
use crate::controller::error::Error;
use crate::remote::api::TenantApi;
use crate::remote::caches::TOKEN_NAMESPACE;
use autonodes_api::NodeClaim;
use autonodes_core::userdata::BootstrapToken;

/// Group a bootstrap token authenticates as (kubeadm's default node token group).
pub(super) const TOKEN_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// The labels of every object autonodes creates for `claim`, as `installation` makes it.
pub(super) fn claim_labels(claim: &NodeClaim, installation: &str) -> BTreeMap<String, String> {
    autonodes_core::template::names::managed_labels(
        &claim.name_any(),
        &claim.namespace().unwrap_or_default(),
        claim.uid().as_deref().unwrap_or_default(),
        installation,
    )
}

/// A fresh random bootstrap token.
fn new_token() -> Result<BootstrapToken, Error> {
    let mut bytes = Vec::new();
    let mut failed = None;
    let token = BootstrapToken::from_random(|| {
        if bytes.is_empty() {
            match crate::random::bytes::<32>() {
                Ok(b) => bytes.extend_from_slice(&b),
                Err(e) => failed = Some(e),
            }
        }
        bytes.pop().unwrap_or(0)
    });
    match failed {
        Some(e) => Err(Error::Internal(format!(
            "the operating system gave no random bytes for a bootstrap token: {e}"
        ))),
        None => Ok(token),
    }
}

fn secret_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// A token is reused while it has more than this left; with less it is replaced.
const TOKEN_MIN_LEFT: Duration = Duration::from_secs(60);

/// How long a bootstrap token lives: long enough for the VM to be launched and its Node
/// to register (`--launch-timeout` + `--registration-timeout`), plus the margin under
/// which a token is replaced. A token minted at the start of a launch thus outlives every
/// claim that does not time out.
pub(super) fn token_lifetime(launch_timeout: Duration, registration_timeout: Duration) -> Duration {
    launch_timeout
        .saturating_add(registration_timeout)
        .saturating_add(TOKEN_MIN_LEFT)
}

/// The claim's live bootstrap token, and whether it was minted just now.
pub(super) struct Token {
    /// The token.
    pub token: BootstrapToken,
    /// Minted by this call: user data written with an earlier token must be rewritten.
    pub fresh: bool,
}

/// Returns the claim's live bootstrap token in the tenant, creating one if needed, and
/// deleting any other (at most one live token per claim).
pub(super) async fn ensure_token(
    claim: &NodeClaim,
    config: &ControllerConfig,
    tenant: &impl TenantApi,
) -> Result<Token, Error> {
    let uid = uid(claim)?;
    let existing = tenant.tokens(&uid).await?;
    let min_left = now().as_second() + TOKEN_MIN_LEFT.as_secs() as i64;
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
        return Ok(Token {
            token,
            fresh: false,
        });
    }
    let token = new_token()?;
    let lifetime = token_lifetime(config.launch_timeout, config.registration_timeout);
    let expiration = now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
            i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX),
        ))
        .map_err(|e| Error::Internal(format!("a token expiring in {lifetime:?}: {e}")))?;
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
            labels: Some(claim_labels(claim, &config.installation)),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        data: Some(data),
        ..Default::default()
    };
    tenant.create_token(&secret).await?;
    tracing::info!(nodeclaim = %claim.name_any(), token_id = %token.id(), "created bootstrap token");
    Ok(Token { token, fresh: true })
}

/// Deletes the claim's bootstrap tokens; returns how many there were.
pub(super) async fn delete_tokens(tenant: &impl TenantApi, uid: &str) -> Result<usize, Error> {
    let existing = tenant.tokens(uid).await?;
    for s in &existing {
        tenant.delete_token(s, "deleting a bootstrap token").await?;
    }
    Ok(existing.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_outlives_the_launch_and_the_registration_with_the_margin_to_spare() {
        let m = |s: u64| Duration::from_secs(s * 60);
        assert_eq!(token_lifetime(m(10), m(15)), m(26));
        assert_eq!(
            token_lifetime(Duration::MAX, m(1)),
            Duration::MAX,
            "saturates instead of overflowing"
        );
    }
}
