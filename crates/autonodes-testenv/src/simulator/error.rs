//! The simulator's errors.

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A request to a cluster failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file (or a description of the kubeconfig).
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The host cluster does not serve a KubeVirt kind.
    #[error(
        "the host cluster does not serve {0}: install the KubeVirt CRDs (autonodes::simulator::kubevirt_crds) first"
    )]
    CrdsMissing(String),
    /// An object the simulator read is not what it expects.
    #[error("{0}")]
    Invalid(String),
}

impl SimError {
    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> SimError {
        let context = context.into();
        move |source| SimError::Kube { context, source }
    }
}
