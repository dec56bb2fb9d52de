//! Every request the controller's own clients send, counted by cluster kind, verb, resource
//! and answer: `autonodes_kube_requests_total{cluster,verb,resource,code}`.
//!
//! The count is taken in the clients' HTTP stack (a tower layer), so it sees every call —
//! reads, writes, watches, Events, retries — whichever code path made it. The verbs are the
//! API server's own (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`), so the figures compare with `apiserver_request_total`.

use std::sync::LazyLock;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use prometheus::{IntCounterVec, Opts};

/// `autonodes_kube_requests_total{cluster,verb,resource,code}` (registered by
/// [`crate::metrics::Metrics::new`]; one counter per process, whatever registry shows it).
pub(crate) static KUBE_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "kube_requests_total",
            "Requests autonodes sent to Kubernetes API servers, by cluster kind (management, host, tenant), verb, resource (`resource/subresource`) and HTTP status code (or `error`).",
        ),
        &["cluster", "verb", "resource", "code"],
    )
    // Startup: the name and labels are constants.
    .expect("the kube_requests_total metric is well-formed")
});

/// Which cluster a client talks to, as the `cluster` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClusterKind {
    /// The management cluster (autonodes' own resources, Events, the Lease).
    Management,
    /// A host cluster (VirtualMachines and their Secrets).
    Host,
    /// A tenant cluster (bootstrap tokens, Nodes).
    Tenant,
}

impl ClusterKind {
    /// The `cluster` label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ClusterKind::Management => "management",
            ClusterKind::Host => "host",
            ClusterKind::Tenant => "tenant",
        }
    }
}

/// The tower layer that counts each request of a client in [`KUBE_REQUESTS`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct CountRequests(pub ClusterKind);

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            cluster: self.0,
        }
    }
}

/// A client's HTTP service wrapped by [`CountRequests`].
#[derive(Clone, Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    cluster: ClusterKind,
}

impl<S, B, RB> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri());
        let cluster = self.cluster.label();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => response.status().as_str().to_string(),
                Err(_) => "error".to_string(),
            };
            KUBE_REQUESTS
                .with_label_values(&[cluster, verb, &resource, &code])
                .inc();
            result
        })
    }
}

/// The API server's verb and the `resource[/subresource]` of a request; `-` for paths
/// that name no resource (`/version`, discovery).
pub(crate) fn classify(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    let (resource, named, sub) = match rest {
        [] => (None, false, None),
        ["namespaces", _ns, resource, more @ ..] => {
            (Some(*resource), !more.is_empty(), more.get(1))
        }
        [resource, more @ ..] => (Some(*resource), !more.is_empty(), more.get(1)),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match method.as_str() {
        "GET" if watch => "watch",
        "GET" if named || resource.is_none() => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if named => "delete",
        "DELETE" => "deletecollection",
        _ => "other",
    };
    let resource = match (resource, sub) {
        (None, _) => "-".to_string(),
        (Some(r), None) => r.to_string(),
        (Some(r), Some(s)) => format!("{r}/{s}"),
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().expect("uri"))
    }

    #[test]
    fn requests_are_named_with_the_api_servers_verbs_and_resources() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abc",
                "get",
                "secrets",
            ),
            (
                Method::GET,
                "/api/v1/nodes?labelSelector=a",
                "list",
                "nodes",
            ),
            (
                Method::GET,
                "/api/v1/nodes?watch=true&resourceVersion=5",
                "watch",
                "nodes",
            ),
            (Method::GET, "/api/v1/namespaces", "list", "namespaces"),
            (
                Method::GET,
                "/api/v1/namespaces/tenant",
                "get",
                "namespaces",
            ),
            (
                Method::POST,
                "/apis/kubevirt.io/v1/namespaces/vms/virtualmachines",
                "create",
                "virtualmachines",
            ),
            (
                Method::PATCH,
                "/apis/autonodes.io/v1alpha1/namespaces/t/nodeclaims/c1/status",
                "patch",
                "nodeclaims/status",
            ),
            (Method::PATCH, "/api/v1/nodes/n1", "patch", "nodes"),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/autonodes",
                "update",
                "leases",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/kube-system/secrets/t",
                "delete",
                "secrets",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/kube-system/secrets?labelSelector=x",
                "deletecollection",
                "secrets",
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/t/events",
                "create",
                "events",
            ),
            (Method::GET, "/version", "get", "-"),
            (Method::GET, "/apis/kubevirt.io/v1", "get", "-"),
        ];
        for (method, uri, verb, resource) in cases {
            assert_eq!(of(method, uri), (verb, resource.to_string()), "{uri}");
        }
    }
}
