//! Who may read `/metrics` (`--metrics-auth`): a caller shows a bearer token, the
//! management cluster's API server says whose it is (a TokenReview) and whether that user
//! may `get` the non-resource URL `/metrics` (a SubjectAccessReview) — as Kubernetes'
//! own components and controller-runtime's secure metrics decide it. Grant it with a
//! ClusterRole rule `nonResourceURLs: ["/metrics"], verbs: ["get"]` (the chart's
//! `<release>-metrics-reader`). `/healthz` and `/readyz` stay open.
//!
//! Decisions are kept for a minute per token (by its SHA-256, never the token), at most
//! [`MAX_DECISIONS`] of them (allowed callers kept longest), so a scrape every few seconds
//! costs two reviews a minute. Tokens not decided yet are reviewed at most
//! [`REVIEWS_PER_SECOND`] a second (bursts of [`REVIEW_BURST`]); past that a caller gets
//! `429` with `Retry-After: 1`, so a flood of distinct bad tokens costs the management API
//! server a bounded number of reviews, and callers already decided are answered as
//! before.

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
pub(crate) const MAX_DECISIONS: usize = 1024;
/// The longest token looked at (a service account token is about 1 KiB).
const MAX_TOKEN: usize = 16 * 1024;
/// Reviews of undecided tokens a second, over time.
pub const REVIEWS_PER_SECOND: u32 = 5;
/// Reviews of undecided tokens at once.
pub const REVIEW_BURST: u32 = 10;

/// What a request to `/metrics` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Served.
    Allowed,
    /// No bearer token, or one the API server does not know: 401.
    Unauthenticated,
    /// A known user that may not get `/metrics`: 403.
    Forbidden,
    /// The reviews could not be made: 503 (not kept).
    Unavailable,
    /// Too many tokens to review now ([`REVIEWS_PER_SECOND`]): 429 (not kept).
    Throttled,
}

/// Decides who may read `/metrics`, with the management cluster's API server.
pub(crate) struct MetricsAuth {
    client: Client,
    decisions: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
    reviews: Mutex<autonodes_core::throttle::Bucket>,
}

impl MetricsAuth {
    /// Reviews with `client` (the controller's own identity needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`).
    pub(crate) fn new(client: Client) -> Self {
        MetricsAuth {
            client,
            decisions: Mutex::new(HashMap::new()),
            reviews: Mutex::new(autonodes_core::throttle::Bucket::new(
                REVIEW_BURST,
                REVIEWS_PER_SECOND,
            )),
        }
    }

    /// The verdict for a request with this `Authorization` header.
    pub(crate) async fn check(&self, authorization: Option<&str>) -> Verdict {
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
        let may_review = self
            .reviews
            .lock()
            .is_ok_and(|mut b| b.take(Instant::now()));
        if !may_review {
            tracing::debug!("a /metrics caller's token waits: too many reviews this second");
            return Verdict::Throttled;
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
        }
        if decisions.len() >= MAX_DECISIONS {
            // Refusals go first: a flood of bad tokens does not push out the scrapers.
            decisions.retain(|_, (_, v)| *v == Verdict::Allowed);
        }
        if decisions.len() >= MAX_DECISIONS {
            decisions.clear();
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
