//! Calls to host and tenant clusters: one wrapper that bounds each call in time, counts
//! it, and turns its error into [`Error::Remote`] with the cluster and what was being done;
//! reads that prefer a live watch cache.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::Lookup;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::remote::clients::{ClusterKey, Remote, REMOTE_TIMEOUT};
use crate::remote::watched::Watched;

fn remote_err(
    remote: &Remote,
    context: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error + '_ {
    let context = context.into();
    move |source| Error::Remote {
        cluster: remote.key.to_string(),
        on_host: matches!(remote.key, ClusterKey::Host(_)),
        context,
        source,
    }
}

/// Runs a remote call with a timeout, counting it in `autonodes_cluster_requests_total`.
pub async fn remote_call<T>(
    ctx: &Context,
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
    ctx.metrics.remote_request(&remote.key, &result);
    result.map_err(remote_err(remote, what))
}

/// A 404 from a cluster.
pub fn not_found(e: &Error) -> bool {
    matches!(e, Error::Remote { source: kube::Error::Api(s), .. } if s.code == 404)
}

/// The object `name`, if it exists (one GET).
pub async fn get_opt<K>(
    ctx: &Context,
    remote: &Remote,
    api: &Api<K>,
    name: &str,
    what: &str,
) -> Result<Option<K>, Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    remote_call(ctx, remote, what, api.get_opt(name)).await
}

/// The object `namespace/name`: from `cache` while its watch is live (see
/// [`Watched::get`]), else from the API server.
pub async fn read<K>(
    ctx: &Context,
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
        None => Ok(get_opt(ctx, remote, api, name, what).await?.map(Arc::new)),
    }
}

/// The label selector of the objects autonodes made for the claim with `uid`.
pub fn claim_selector(uid: &str) -> String {
    use autonodes_api::{LABEL_MANAGED_BY, LABEL_NODECLAIM_UID, MANAGED_BY};
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_NODECLAIM_UID}={uid}")
}
