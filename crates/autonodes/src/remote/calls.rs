//! Calls to host and tenant clusters: one wrapper that bounds each call in time, counts
//! it, and turns its error into [`Error::Call`] with the cluster and what was being done;
//! reads that prefer a live watch cache.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::Lookup;

use crate::remote::caches::Watched;
use crate::remote::clients::{ClusterKey, Remote, REMOTE_TIMEOUT};
use crate::remote::error::Error;
use prometheus::{IntCounterVec, Opts};

/// `autonodes_cluster_requests_total{kind,namespace,cluster,code}`: the calls autonodes'
/// code makes to host and tenant clusters ([`crate::remote::calls::remote_call`]), by
/// cluster and answer. `kind` is `host` or `tenant`, `namespace` the tenant's (empty for a
/// host), `cluster` the host's or vCluster's name.
#[derive(Clone)]
pub(crate) struct ClusterRequests(IntCounterVec);

impl ClusterRequests {
    /// The counter, not registered yet ([`crate::metrics::Metrics::new`] registers it).
    pub(crate) fn new() -> prometheus::Result<Self> {
        IntCounterVec::new(
            Opts::new(
                "cluster_requests_total",
                "Requests autonodes made to host and tenant clusters, by kind (host, tenant), tenant namespace, cluster name and HTTP status code (or `error`).",
            ),
            &["kind", "namespace", "cluster", "code"],
        )
        .map(ClusterRequests)
    }

    /// The counter itself, to register and describe.
    pub(crate) fn counter(&self) -> &IntCounterVec {
        &self.0
    }

    /// Counts one call to `cluster` with its outcome.
    pub(crate) fn count<T>(&self, cluster: &ClusterKey, result: &Result<T, kube::Error>) {
        let code = match result {
            Ok(_) => "200".to_string(),
            Err(kube::Error::Api(s)) => s.code.to_string(),
            Err(_) => "error".to_string(),
        };
        let [kind, namespace, name] = cluster.metric_labels();
        self.0
            .with_label_values(&[kind, namespace, name, &code])
            .inc();
    }
}

/// What a call to a cluster needs from the process that makes it: where it is counted,
/// and the installation whose label marks the objects this process owns.
#[derive(Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// `autonodes_cluster_requests_total`.
    pub requests: &'a ClusterRequests,
    /// The installation's name (`--installation`).
    pub installation: &'a str,
}

fn remote_err(
    remote: &Remote,
    context: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error + '_ {
    let context = context.into();
    move |source| Error::Call {
        cluster: remote.key.to_string(),
        on_host: matches!(remote.key, ClusterKey::Host(_)),
        context,
        source: Box::new(source),
    }
}

/// Runs a remote call with a timeout, counting it in `autonodes_cluster_requests_total`.
pub(crate) async fn remote_call<T>(
    requests: &ClusterRequests,
    remote: &Remote,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    let result = match tokio::time::timeout(REMOTE_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {}s", REMOTE_TIMEOUT.as_secs()).into(),
        )),
    };
    requests.count(&remote.key, &result);
    result.map_err(remote_err(remote, what))
}

/// The object `name`, if it exists (one GET).
pub(crate) async fn get_opt<K>(
    requests: &ClusterRequests,
    remote: &Remote,
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<K>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    remote_call(requests, remote, what, api.get_opt(name)).await
}

/// The object `namespace/name`: from `cache` while its watch is live (see
/// [`Watched::get`]), else from the API server.
pub(crate) async fn read<K>(
    requests: &ClusterRequests,
    remote: &Remote,
    cache: Option<&Watched<K>>,
    api: &Api<K>,
    namespace: Option<&str>,
    name: &str,
    what: &str,
) -> Result<Option<Arc<K>>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Lookup + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match cache.and_then(|c| c.get(namespace, name)) {
        Some(found) => Ok(found),
        None => Ok(get_opt(requests, remote, api, name, what)
            .await?
            .map(Arc::new)),
    }
}

/// The label selector of the objects autonodes made for the claim with `uid`.
pub(crate) fn claim_selector(uid: &str) -> String {
    use autonodes_api::{LABEL_MANAGED_BY, LABEL_NODECLAIM_UID, MANAGED_BY};
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_NODECLAIM_UID}={uid}")
}
