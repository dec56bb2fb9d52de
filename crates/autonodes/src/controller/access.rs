//! Who may use what, read from the management cluster: the labels of a tenant namespace
//! (what a NodeProvider's `tenantNamespaceSelector` selects) and the catalogue a namespace
//! may use. The decisions themselves are `autonodes_core::access`.

use std::collections::BTreeMap;
use std::sync::Arc;

use autonodes_core::access::{self, TenantNamespace};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use crate::controller::catalogue::catalogue;
use crate::controller::context::Context;
use autonodes_core::catalogue::Catalogue;

/// The labels of namespace `ns`, read only when some provider serves only some namespaces
/// (`None` when not needed or not readable; a read that fails is logged, and only
/// providers serving every namespace serve it then).
pub(crate) async fn namespace_labels(
    ctx: &Context,
    catalogue: &Catalogue,
    ns: &str,
) -> Option<BTreeMap<String, String>> {
    if !access::restricts(catalogue) {
        return None;
    }
    match Api::<Namespace>::all(ctx.client.clone()).get(ns).await {
        Ok(n) => Some(n.metadata.labels.unwrap_or_default()),
        Err(error) => {
            tracing::warn!(namespace = %ns, %error, "cannot read the namespace's labels; only NodeProviders serving every namespace serve it");
            None
        }
    }
}

/// The catalogue namespace `ns` may use: every type whose provider serves it.
pub(crate) async fn catalogue_for(ctx: &Context, ns: &str) -> Arc<Catalogue> {
    let all = catalogue(ctx);
    if !access::restricts(&all) {
        return all;
    }
    let labels = namespace_labels(ctx, &all, ns).await;
    Arc::new(access::allowed(
        &all,
        &TenantNamespace {
            name: ns,
            labels: labels.as_ref(),
        },
    ))
}
