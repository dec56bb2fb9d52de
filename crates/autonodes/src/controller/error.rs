//! The error a reconcile returns, and how soon what failed is tried again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::remote::clients::ClientError;
use crate::remote::error::Error as RemoteError;

/// Errors a reconcile returns (transient: the object is retried with backoff). Bad input
/// never ends up here: it becomes a status condition and an Event instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A call to the management cluster failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The API error.
        source: kube::Error,
    },
    /// A call to a host or tenant cluster failed, or its client could not be built.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The object changed since it was read; the reconcile runs again on the new version.
    #[error("{0} changed while it was reconciled")]
    Conflict(String),
    /// A cleanup is still waiting (for a VM to go, a Node to drain, claims to end). The
    /// finalizer stays; the object is looked at again shortly.
    #[error("waiting: {0}")]
    Waiting(String),
    /// A cleanup holds on purpose until a set time (a replaced node's VM kept halted for
    /// debugging). The finalizer stays; the object is looked at again after `wait`.
    #[error("kept: {message}")]
    Kept {
        /// What is kept, until when.
        message: String,
        /// How long until the cleanup goes on.
        wait: Duration,
    },
    /// A cleanup step failed (a cluster unreachable, a 403, a kubeconfig Secret missing or
    /// refused). The finalizer stays — what the step guards may still exist — and the
    /// cleanup is retried with backoff ([`cleanup_backoff`]).
    #[error("cleanup blocked ({reason}): {message}")]
    CleanupBlocked {
        /// The condition reason.
        reason: &'static str,
        /// What failed.
        message: String,
    },
    /// An object lacks a field the API server always sets.
    #[error("{0} lacks {1}")]
    Missing(String, &'static str),
    /// Rendering failed for a reason that is not the user's input.
    #[error("{0}")]
    Internal(String),
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        Error::Remote(e.into())
    }
}

impl Error {
    /// A management-cluster error with context.
    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// The `error` label of `autonodes_reconcile_errors_total` (one of
    /// [`ERROR_LABELS`]): what kind of error a reconcile returned.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Remote(RemoteError::Client(_)) => "client",
            Error::Remote(RemoteError::Waiting(_)) => "waiting",
            Error::Remote(_) => "remote",
            Error::Finalizer(_) => "finalizer",
            Error::Conflict(_) => "conflict",
            Error::Waiting(_) => "waiting",
            Error::Kept { .. } => "kept",
            Error::CleanupBlocked { .. } => "cleanup_blocked",
            Error::Missing(..) => "missing",
            Error::Internal(_) => "internal",
        }
    }
}

impl Error {
    /// The error a reconcile returned, unwrapped from the finalizer helper's error.
    pub(crate) fn inner(&self) -> &Error {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e,
                _ => self,
            },
            e => e,
        }
    }

    /// The claim reason of an error reaching a host or tenant cluster or reading its
    /// kubeconfig Secret: `{Host,Tenant}Forbidden` for a 401/403, else
    /// `{Host,Tenant}Unreachable`; `None` for other errors.
    pub(crate) fn cluster_reason(&self) -> Option<autonodes_api::reasons::ClaimReason> {
        match self {
            Error::Remote(e) => e.cluster_reason(),
            _ => None,
        }
    }

    /// True for a failed call to a tenant cluster.
    pub(crate) fn is_tenant_error(&self) -> bool {
        matches!(self, Error::Remote(e) if e.is_tenant_call())
    }

    /// True for a 409 from a host or tenant cluster (the object exists, or changed).
    pub(crate) fn is_remote_conflict(&self) -> bool {
        matches!(self, Error::Remote(e) if e.is_conflict())
    }

    /// True when removing the finalizer found the object deleted already (a reconcile that
    /// ran on a cached copy from before the finalizer was released).
    pub(crate) fn is_gone(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Finalizer(f) => {
                matches!(f.as_ref(), F::RemoveFinalizer(kube::Error::Api(s)) if s.code == 404)
            }
            _ => false,
        }
    }

    /// True for a write conflict (stale read) or a cleanup that is waiting, wrapped or
    /// not: expected states, retried soon and not logged as failures.
    pub(crate) fn is_conflict(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        let expected = |e: &Error| {
            matches!(
                e,
                Error::Conflict(_)
                    | Error::Waiting(_)
                    | Error::Kept { .. }
                    | Error::Remote(RemoteError::Waiting(_))
            )
        };
        match self {
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => expected(e),
                // The finalizer is added and removed with a JSON patch that tests the
                // object's version: a changed object fails the test (422) or conflicts (409).
                F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s)) => {
                    s.code == 409 || s.code == 422
                }
                _ => false,
            },
            e => expected(e),
        }
    }
}

/// Every value of [`Error::metric_label`]: `conflict`, `waiting` and `kept` are expected
/// states (counted `requeued` in `autonodes_reconcile_total`), the others failures.
pub(crate) const ERROR_LABELS: [&str; 10] = [
    "kube",
    "remote",
    "client",
    "finalizer",
    "conflict",
    "waiting",
    "kept",
    "cleanup_blocked",
    "missing",
    "internal",
];

/// How soon a blocked cleanup is tried again: 5 s at first, then a tenth of the time the
/// object has been waiting for deletion, at most 60 s — quick after a blip, and no storm
/// of retries against a cluster that stays away.
pub(crate) fn cleanup_backoff(deletion_requested: Option<&Time>) -> Duration {
    let waited = deletion_requested
        .map(|t| {
            let secs = Timestamp::now().as_second() - t.0.as_second();
            Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        })
        .unwrap_or_default();
    (waited / 10).clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// Requeue delay after an error: at once for a conflict (a stale cache catches up within
/// milliseconds), after a few seconds for a cleanup that waits (the watch on what it waits
/// for — a VM going, a Node draining — usually wakes it sooner), else with a pause.
pub(crate) fn error_requeue(error: &Error) -> kube::runtime::controller::Action {
    use kube::runtime::controller::Action;
    match error.inner() {
        Error::Conflict(_) => Action::requeue(Duration::from_millis(200)),
        Error::Waiting(_) | Error::Remote(RemoteError::Waiting(_)) => {
            Action::requeue(Duration::from_secs(3))
        }
        Error::Kept { wait, .. } => {
            Action::requeue((*wait).clamp(Duration::from_secs(1), Duration::from_secs(300)))
        }
        _ if error.is_conflict() => Action::requeue(Duration::from_millis(1000)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}
