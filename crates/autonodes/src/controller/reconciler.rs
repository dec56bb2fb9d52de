//! What every controller's reconcile shares: the reconcile metrics, the error policy (a
//! stale read retried at once and quietly, anything else logged and retried after a
//! pause) and the log of the controller runtime's own errors. A controller implements
//! [`Reconciler`] and runs with [`reconcile`] and [`error_policy`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::Controller;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::context::Context;
use super::error::{error_requeue, Error};

/// One controller's reconcile of one kind, and its own state.
pub(crate) trait Reconciler: Send + Sync + 'static {
    /// The kind this controller reconciles.
    type Object: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;
    /// The controller's name in metrics and log lines (`nodeclaim`).
    const NAME: &'static str;
    /// What it does to one object, for the log line of a failure (`reconciling NodeClaim`).
    const DOING: &'static str;

    /// The context every controller shares.
    fn context(&self) -> &Context;

    /// Reconciles one object.
    fn reconcile(
        &self,
        obj: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Error>> + Send;

    /// How this controller retries an error in a way of its own (a cleanup that waits
    /// for a cluster), or `None` for the common policy.
    fn retry(&self, _obj: &Self::Object, _error: &Error) -> Option<Action> {
        None
    }
}

/// Runs `controller` (its watches and shutdown set) with `R`'s reconcile and error policy
/// until it shuts down.
pub(crate) async fn run<R: Reconciler>(controller: Controller<R::Object>, r: Arc<R>) {
    controller
        .run(reconcile::<R>, error_policy::<R>, r)
        .for_each(log_run_error)
        .await;
}

/// Runs `R`'s reconcile and records its duration and outcome.
pub(crate) async fn reconcile<R: Reconciler>(
    obj: Arc<R::Object>,
    r: Arc<R>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = r.reconcile(obj).await;
    let (outcome, error) = reconcile_labels(&result);
    r.context()
        .metrics
        .observe_reconcile(R::NAME, started, outcome, error);
    result
}

/// The `result` label a reconcile is counted under: a stale read or a wait
/// ([`Error::is_conflict`]) is `requeued`, not a failure, so the reconcile-error alert sees
/// only what failed.
pub(crate) fn reconcile_result<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) if e.is_conflict() => "requeued",
        Err(_) => "error",
    }
}

/// The `result` label of a reconcile ([`reconcile_result`]) and, when it returned an
/// error, the `error` label ([`Error::metric_label`] of the error the finalizer helper
/// wrapped, if it did).
pub(crate) fn reconcile_labels<T>(
    result: &Result<T, Error>,
) -> (&'static str, Option<&'static str>) {
    let error = result.as_ref().err().map(|e| e.inner().metric_label());
    (reconcile_result(result), error)
}

/// Logs a failed reconcile (a stale read only at debug level) and says when to retry.
pub(crate) fn error_policy<R: Reconciler>(obj: Arc<R::Object>, error: &Error, r: Arc<R>) -> Action {
    if let Some(action) = r.retry(&obj, error) {
        return action;
    }
    if error.is_conflict() {
        tracing::debug!(controller = R::NAME, %error, "stale read; reconciling again");
    } else {
        tracing::warn!(
            controller = R::NAME,
            name = %obj.name_any(),
            namespace = %obj.namespace().unwrap_or_default(),
            %error,
            "{} failed",
            R::DOING
        );
    }
    error_requeue(error)
}

/// Logs what the controller runtime reports besides reconcile results (queue errors,
/// objects missing from the cache).
pub(crate) async fn log_run_error<K: Resource, E: std::fmt::Debug, Q: std::fmt::Debug>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_reads_and_waits_count_as_requeued_and_only_failures_as_errors() {
        assert_eq!(reconcile_result::<()>(&Ok(())), "ok");
        assert_eq!(
            reconcile_result::<()>(&Err(Error::Conflict("stale".into()))),
            "requeued"
        );
        assert_eq!(
            reconcile_result::<()>(&Err(Error::Waiting("the VM is going".into()))),
            "requeued"
        );
        assert_eq!(
            reconcile_result::<()>(&Err(Error::Internal("broken".into()))),
            "error"
        );
    }

    #[test]
    fn a_reconcile_error_is_counted_by_its_kind_and_a_wait_is_not_a_failure() {
        use crate::remote::error::Error as RemoteError;
        use kube::runtime::finalizer::Error as F;
        let wrapped = |e: Error| Error::Finalizer(Box::new(F::CleanupFailed(e)));
        let unreachable = || {
            Error::Remote(RemoteError::Call {
                cluster: "host cluster h".into(),
                on_host: true,
                context: "reading a VM".into(),
                source: Box::new(kube::Error::Service("no answer".into())),
            })
        };
        type Labels = (&'static str, Option<&'static str>);
        let cases: [(Result<(), Error>, Labels); 7] = [
            (Ok(()), ("ok", None)),
            (
                Err(Error::Waiting("the VM".into())),
                ("requeued", Some("waiting")),
            ),
            (
                Err(wrapped(Error::Waiting("the Node drains".into()))),
                ("requeued", Some("waiting")),
            ),
            (
                Err(Error::Remote(RemoteError::Waiting("a Secret went".into()))),
                ("requeued", Some("waiting")),
            ),
            (Err(unreachable()), ("error", Some("remote"))),
            (Err(wrapped(unreachable())), ("error", Some("remote"))),
            (
                Err(Error::CleanupBlocked {
                    reason: "HostUnreachable",
                    message: "host cluster h".into(),
                }),
                ("error", Some("cleanup_blocked")),
            ),
        ];
        for (result, want) in &cases {
            assert_eq!(reconcile_labels(result), *want, "{result:?}");
            if let Some(label) = want.1 {
                assert!(crate::controller::error::ERROR_LABELS.contains(&label));
            }
        }

        let metrics = crate::metrics::Metrics::new().expect("metrics register");
        for (result, _) in &cases {
            let (outcome, error) = reconcile_labels(result);
            metrics.observe_reconcile("nodeclaim", Instant::now(), outcome, error);
        }
        let text = metrics.encode();
        for (series, value) in [
            (
                r#"reconcile_errors_total{controller="nodeclaim",error="waiting"}"#,
                3,
            ),
            (
                r#"reconcile_errors_total{controller="nodeclaim",error="remote"}"#,
                2,
            ),
            (
                r#"reconcile_errors_total{controller="nodeclaim",error="cleanup_blocked"}"#,
                1,
            ),
            (
                r#"reconcile_errors_total{controller="nodepool",error="waiting"}"#,
                0,
            ),
            (
                r#"reconcile_total{controller="nodeclaim",result="requeued"}"#,
                3,
            ),
            (
                r#"reconcile_total{controller="nodeclaim",result="error"}"#,
                3,
            ),
        ] {
            let line = format!("autonodes_{series} {value}");
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
