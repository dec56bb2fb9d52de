//! What every controller's reconcile shares.

use kube::runtime::reflector::ObjectRef;
use kube::Resource;

/// Logs what the controller runtime reports besides reconcile results (queue errors,
/// objects missing from the cache).
pub async fn log_run_error<K: Resource, E: std::fmt::Debug, Q: std::fmt::Debug>(
    result: Result<
        (ObjectRef<K>, kube::runtime::controller::Action),
        kube::runtime::controller::Error<E, Q>,
    >,
) where
    K::DynamicType: std::fmt::Debug,
{
    if let Err(e) = result {
        tracing::debug!(error = ?e, "controller runtime");
    }
}
