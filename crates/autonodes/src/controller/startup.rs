//! What `run` reads from the management cluster before the controllers start: the
//! installation id (the management API server's addresses: [`super::management_api`]).

use kube::Client;

/// The default installation id: the UID of the controller's namespace, unique to this
/// management cluster and namespace and stable for as long as the installation lives.
pub(crate) async fn installation_of_namespace(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let ns = api.get(namespace).await.with_context(|| {
        format!("reading namespace {namespace} for the installation id (set --installation-id, or let autonodes get that namespace)")
    })?;
    ns.metadata
        .uid
        .with_context(|| format!("namespace {namespace} has no UID"))
}
