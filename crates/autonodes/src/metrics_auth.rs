//! Who may read `/metrics` (`--metrics-auth`): a caller shows a bearer token, the
//! management cluster's API server says whose it is (a TokenReview) and whether that user
//! may `get` the non-resource URL `/metrics` (a SubjectAccessReview) — as Kubernetes'
//! own components and controller-runtime's secure metrics decide it. Grant it with a
//! ClusterRole rule `nonResourceURLs: ["/metrics"], verbs: ["get"]` (the chart's
//! `<release>-metrics-reader`). `/healthz` and `/readyz` stay open.
//!
//! Decisions are kept for a minute per token (by its SHA-256, never the token), at most
//! [`MAX_DECISIONS`] of them, so a scrape every few seconds costs two reviews a minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;
use sha2::{Digest, Sha256};

/// How long a decision about a token is reused.
const TTL: Duration = Duration::from_secs(60);
/// The most decisions kept; past it, stale ones go, and if none is stale, all.
pub const MAX_DECISIONS: usize = 1024;
/// The longest token looked at (a service account token is about 1 KiB).
const MAX_TOKEN: usize = 16 * 1024;

/// What a request to `/metrics` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Allowed,
    /// No bearer token, or one the API server does not know: 401.
    Unauthenticated,
    /// A known user that may not get `/metrics`: 403.
    Forbidden,
    /// The reviews could not be made: 503 (not kept).
    Unavailable,
}

/// Decides who may read `/metrics`, with the management cluster's API server.
pub struct MetricsAuth {
    client: Client,
    decisions: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
}

impl MetricsAuth {
    /// Reviews with `client` (the controller's own identity needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`).
    pub fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict for a request with this `Authorization` header.
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN)
        else {
            return Verdict::Unauthenticated;
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(v) = self.kept(&key) {
            return v;
        }
        let verdict = self.review(token).await;
        if verdict != Verdict::Unavailable {
            self.keep(key, verdict);
        }
        verdict
    }

    fn kept(&self, key: &[u8; 32]) -> Option<Verdict> {
        let decisions = self.decisions.lock().ok()?;
        let (at, v) = decisions.get(key)?;
        (at.elapsed() < TTL).then_some(*v)
    }

    fn keep(&self, key: [u8; 32], verdict: Verdict) {
        let Ok(mut decisions) = self.decisions.lock() else {
            return;
        };
        if decisions.len() >= MAX_DECISIONS {
            decisions.retain(|_, (at, _)| at.elapsed() < TTL);
            if decisions.len() >= MAX_DECISIONS {
                decisions.clear();
            }
        }
        decisions.insert(key, (Instant::now(), verdict));
    }

    async fn review(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, "cannot review a /metrics caller's token");
                return Verdict::Unavailable;
            }
        };
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => return Verdict::Unauthenticated,
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
            Ok(_) => {
                tracing::debug!(user = ?user.username, "a /metrics caller may not get /metrics");
                Verdict::Forbidden
            }
            Err(error) => {
                tracing::warn!(%error, "cannot review a /metrics caller's access");
                Verdict::Unavailable
            }
        }
    }
}
