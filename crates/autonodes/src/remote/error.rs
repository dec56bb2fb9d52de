//! What a call to a host or tenant cluster can fail with. The controllers wrap it in their
//! own error ([`crate::controller::error::Error::Remote`]); nothing here knows them.

use autonodes_api::reasons::ClaimReason;

use crate::remote::clients::{forbidden, remote_error_text, ClientError};

/// Why a call to a host or tenant cluster failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The cluster answered with an error, or did not answer in time.
    #[error("{cluster}: {context}: {}", remote_error_text(.source))]
    Call {
        /// The cluster.
        cluster: String,
        /// True for a host cluster, false for a tenant.
        on_host: bool,
        /// What was being done.
        context: String,
        /// The API error (boxed: it is large, and every reconcile's error carries it).
        source: Box<kube::Error>,
    },
    /// The cluster's client could not be built (its kubeconfig Secret is missing or refused).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// What a call waits for is not there yet (an object went while it was rewritten): the
    /// caller looks again shortly, as it does for a cleanup that waits.
    #[error("waiting: {0}")]
    Waiting(String),
    /// An answer could not be read or an object not built, for a reason that is not the
    /// user's input.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The status the cluster answered with, if it answered with an error status.
    pub(crate) fn status(&self) -> Option<&kube::core::Status> {
        match self {
            Error::Call { source, .. } => match source.as_ref() {
                kube::Error::Api(s) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// The HTTP status code the cluster answered with, if it answered with an error status.
    pub(crate) fn status_code(&self) -> Option<u16> {
        self.status().map(|s| s.code)
    }

    /// A 404: the object is not there.
    pub(crate) fn is_not_found(&self) -> bool {
        self.status_code() == Some(404)
    }

    /// A 409: the object exists already, or changed.
    pub(crate) fn is_conflict(&self) -> bool {
        self.status_code() == Some(409)
    }

    /// True for a failed call to a tenant cluster.
    pub(crate) fn is_tenant_call(&self) -> bool {
        matches!(self, Error::Call { on_host: false, .. })
    }

    /// The claim reason of a failure to reach a cluster or to read its kubeconfig Secret:
    /// `{Host,Tenant}Forbidden` for a 401/403, else `{Host,Tenant}Unreachable`; `None` for
    /// the other failures.
    pub(crate) fn cluster_reason(&self) -> Option<ClaimReason> {
        Some(match self {
            Error::Client(c) => c.reason().into(),
            Error::Call {
                on_host, source, ..
            } => match (on_host, forbidden(source)) {
                (true, true) => ClaimReason::HostForbidden,
                (true, false) => ClaimReason::HostUnreachable,
                (false, true) => ClaimReason::TenantForbidden,
                (false, false) => ClaimReason::TenantUnreachable,
            },
            _ => return None,
        })
    }
}
