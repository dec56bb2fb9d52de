//! The tenant interface: what the claim lifecycle asks of a tenant (Kubernetes) cluster —
//! its Nodes, bootstrap tokens and pods. Reads come from the tenant's watch caches while
//! they are live ([`super::caches`]), else from the API server; every call is bounded in
//! time and counted ([`crate::remote::calls::remote_call`]); what this process writes is remembered
//! until the watch shows it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::remote::caches::TOKEN_NAMESPACE;
use crate::remote::calls::{claim_selector, read, remote_call, Caller};
use crate::remote::clients::Remote;
use crate::remote::error::Error;
use crate::remote::host::ignore_not_found;

/// How long a tenant's published join address is used before it is read again.
pub(crate) const PUBLISHED_JOIN_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// Each tenant's published join address and version, and when they were read
/// ([`Tenant::join_info`]); one per process, keyed by the tenant's cluster key.
#[derive(Default)]
pub(crate) struct PublishedJoins(
    std::sync::Mutex<
        std::collections::HashMap<String, (std::time::Instant, autonodes_core::join::JoinInfo)>,
    >,
);

/// A tenant cluster.
pub(crate) struct Tenant<'a> {
    caller: Caller<'a>,
    joins: &'a PublishedJoins,
    remote: &'a Remote,
}

impl<'a> Tenant<'a> {
    /// The tenant behind `remote`.
    pub(crate) fn new(caller: Caller<'a>, joins: &'a PublishedJoins, remote: &'a Remote) -> Self {
        Tenant {
            caller,
            joins,
            remote,
        }
    }

    /// The tenant's client and what its kubeconfig says.
    pub(crate) fn remote(&self) -> &Remote {
        self.remote
    }

    /// Where the tenant says nodes join ([`autonodes_core::join::published`], from
    /// `kube-system/kubeadm-config`), read at most once a minute per tenant. A tenant
    /// without that ConfigMap, or that does not let autonodes read it, publishes nothing
    /// (its kubeconfig's server is the join address); what it publishes in a form autonodes
    /// refuses is logged and not used. With it, the tenant's version from its `/version`.
    pub(crate) async fn join_info(&self) -> Result<autonodes_core::join::JoinInfo, Error> {
        let key = self.remote.key.to_string();
        if let Ok(cache) = self.joins.0.lock() {
            if let Some((at, info)) = cache.get(&key) {
                if at.elapsed() < PUBLISHED_JOIN_TTL {
                    return Ok(info.clone());
                }
            }
        }
        let (ns, name) = autonodes_core::join::KUBEADM_CONFIG;
        let api: Api<ConfigMap> = Api::namespaced(self.remote.client.clone(), ns);
        let read = remote_call(
            self.caller.requests,
            self.remote,
            "reading kube-system/kubeadm-config",
            api.get_opt(name),
        )
        .await;
        let published = match read {
            Ok(Some(cm)) => {
                let data = cm.data.clone().unwrap_or_default();
                match autonodes_core::join::published(&data, cm.annotations()) {
                    Ok(p) => p,
                    Err(why) => {
                        tracing::warn!(cluster = %self.remote.key, %why, "kube-system/kubeadm-config: the published join address is not used");
                        autonodes_core::join::Published::default()
                    }
                }
            }
            Ok(None) => autonodes_core::join::Published::default(),
            Err(Error::Call { ref source, .. }) if crate::remote::clients::forbidden(source) => {
                tracing::debug!(cluster = %self.remote.key, "kube-system/kubeadm-config is not readable; joining at the kubeconfig's server");
                autonodes_core::join::Published::default()
            }
            Err(e) => return Err(e),
        };
        let info = remote_call(
            self.caller.requests,
            self.remote,
            "reading /version",
            self.remote.client.apiserver_version(),
        )
        .await?;
        let version = autonodes_core::kubeversion::KubeVersion::parse(&info.git_version)
            .map_err(|why| format!("the {} reports version {why}", self.remote.key));
        let info = autonodes_core::join::JoinInfo { published, version };
        if let Ok(mut cache) = self.joins.0.lock() {
            cache.insert(key, (std::time::Instant::now(), info.clone()));
        }
        Ok(info)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.remote.client.clone())
    }

    fn tokens_api(&self) -> Api<Secret> {
        Api::namespaced(self.remote.client.clone(), TOKEN_NAMESPACE)
    }

    /// The Node `name`, if it exists.
    pub(crate) async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, Error> {
        let cache = self.remote.tenant_cache().map(|c| &c.nodes);
        let what = "reading the Node";
        read(
            self.caller.requests,
            self.remote,
            cache,
            &self.nodes(),
            None,
            name,
            what,
        )
        .await
    }

    /// Applies a JSON patch to `node`; returns the Node as patched.
    pub(crate) async fn patch_node(
        &self,
        node: &Node,
        patch: json_patch::Patch,
        what: &str,
    ) -> Result<Node, Error> {
        let patched = remote_call(
            self.caller.requests,
            self.remote,
            what,
            self.nodes().patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            ),
        )
        .await?;
        if let Some(cache) = self.remote.tenant_cache() {
            cache.nodes.wrote(patched.clone());
        }
        Ok(patched)
    }

    /// Marks the Node `name` unschedulable.
    pub(crate) async fn cordon(&self, name: &str) -> Result<(), Error> {
        self.schedulable(name, false).await
    }

    /// Marks the Node `name` schedulable again.
    pub(crate) async fn uncordon(&self, name: &str) -> Result<(), Error> {
        self.schedulable(name, true).await
    }

    async fn schedulable(&self, name: &str, schedulable: bool) -> Result<(), Error> {
        let what = if schedulable {
            "uncordoning the Node"
        } else {
            "cordoning the Node"
        };
        let unschedulable = (!schedulable).then_some(true);
        remote_call(
            self.caller.requests,
            self.remote,
            what,
            self.nodes().patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"unschedulable": unschedulable}})),
            ),
        )
        .await
        .map(|_| ())
    }

    /// Deletes the Node `name`; true when it was there to delete.
    pub(crate) async fn delete_node(&self, name: &str) -> Result<bool, Error> {
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            "deleting the Node",
            self.nodes().delete(name, &DeleteParams::default()),
        )
        .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The pods bound to the Node `name`, from the API server's watch cache (indexed by
    /// node there, not read from etcd; the Node is cordoned before, so no new pod binds).
    pub(crate) async fn pods_on(&self, name: &str) -> Result<Vec<Pod>, Error> {
        let pods: Api<Pod> = Api::all(self.remote.client.clone());
        let on_node = ListParams::default()
            .fields(&format!("spec.nodeName={name}"))
            .match_any();
        let listed = remote_call(
            self.caller.requests,
            self.remote,
            "listing the Node's pods",
            pods.list(&on_node),
        )
        .await?;
        Ok(listed.items)
    }

    /// Evicts `pod`. A pod already gone is evicted; one a PodDisruptionBudget protects now
    /// (429) is left for the next try.
    pub(crate) async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(
            self.remote.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let evicted = remote_call(
            self.caller.requests,
            self.remote,
            "evicting a pod",
            api.evict(&pod.name_any(), &EvictParams::default()),
        )
        .await;
        match evicted {
            Err(e) if e.status_code() == Some(429) => Ok(()),
            other => ignore_not_found(other),
        }
    }

    /// The bootstrap-token Secrets of the claim with `uid`.
    pub(crate) async fn tokens(&self, uid: &str) -> Result<Vec<Arc<Secret>>, Error> {
        let ours =
            |s: &Secret| autonodes_core::template::names::labelled_for_claim(s.labels(), uid);
        if let Some(found) = self
            .remote
            .tenant_cache()
            .and_then(|c| c.tokens.filter(ours))
        {
            return Ok(found);
        }
        let selector = claim_selector(uid);
        let listed = remote_call(
            self.caller.requests,
            self.remote,
            "listing bootstrap tokens",
            self.tokens_api()
                .list(&ListParams::default().labels(&selector)),
        )
        .await?;
        Ok(listed.items.into_iter().map(Arc::new).collect())
    }

    /// Creates a bootstrap-token Secret.
    pub(crate) async fn create_token(&self, secret: &Secret) -> Result<(), Error> {
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating a bootstrap token",
            self.tokens_api().create(&PostParams::default(), secret),
        )
        .await?;
        if let Some(cache) = self.remote.tenant_cache() {
            cache.tokens.wrote(created);
        }
        Ok(())
    }

    /// Deletes a bootstrap-token Secret (one already gone is deleted).
    pub(crate) async fn delete_token(&self, secret: &Secret, what: &str) -> Result<(), Error> {
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            what,
            self.tokens_api()
                .delete(&secret.name_any(), &DeleteParams::default()),
        )
        .await;
        ignore_not_found(deleted)?;
        if let Some(cache) = self.remote.tenant_cache() {
            cache.tokens.deleted(secret);
        }
        Ok(())
    }
}
