//! vCluster import: a vCluster's own configuration, the Secret `vc-config-<name>` its chart
//! writes, kept as NodePools (the mapping is the core's [`autonodes_core::vcluster`]).
//!
//! observe (the Secret, the vCluster's kubeconfig Secret `vc-<name>` next to it, the pools
//! it owns) → plan (core: the pools of the configuration) → act (server-side apply of each
//! pool, deletion of the owned pools the configuration no longer names).
//!
//! Everything in the Secret is untrusted: a configuration that cannot be read changes
//! nothing and gets a Warning Event on the Secret; a pool that cannot be mapped keeps what
//! it had and is named in a Warning Event; a NodePool of the same name that the Secret does
//! not own is never touched. Other vClusters are served as before.

use crate::controller::reconciler::{self, Reconciler};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Resource, ResourceExt};

use crate::controller::config::ImportScope;
use crate::controller::context::Context;
use crate::controller::error::Error;
use autonodes_api::NodePool;
use autonodes_core::vcluster::{self, CONFIG_SECRET_KEY, CONFIG_SECRET_PREFIX};

/// The field manager of the pools this controller writes.
const MANAGER: &str = "autonodes-vcluster-import";
/// The label the vCluster chart puts on its Secrets (`app: vcluster`).
const CHART_SELECTOR: &str = "app=vcluster";

/// Runs the import until `shutdown` resolves (at once when the scope is off).
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let apis: Vec<Api<Secret>> = match &ctx.config.vcluster_import {
        ImportScope::Off => return,
        ImportScope::All => vec![Api::all(ctx.client.clone())],
        ImportScope::Namespaces(ns) => ns
            .iter()
            .map(|n| Api::namespaced(ctx.client.clone(), n))
            .collect(),
    };
    tracing::info!(scope = ?ctx.config.vcluster_import, "importing vCluster configurations (vc-config-* Secrets)");
    let ictx = Arc::new(ImportContext {
        ctx: ctx.clone(),
        reported: Mutex::default(),
    });
    let runs = apis.into_iter().map(|api| {
        let config = watcher::Config::default()
            .labels(CHART_SELECTOR)
            .page_size(50)
            .any_semantic();
        // The chart labels its other Secrets (kubeconfigs, certificates) the same way: the
        // cache keeps only what the import reads, the configuration of `vc-config-*`.
        let (reader, writer) = kube::runtime::reflector::store();
        let secrets = watcher(api, config)
            .default_backoff()
            .modify(keep_only_configuration)
            .reflect(writer)
            .applied_objects();
        // A pool's spec changed or it went: put it back as the configuration says (its
        // status writes do not concern the import).
        let controller = Controller::for_stream(secrets, reader)
            .owns_shared_stream(ctx.reflectors.pools.spec_touched())
            .graceful_shutdown_on(shutdown.clone());
        reconciler::run(controller, ictx.clone())
    });
    futures::future::join_all(runs).await;
}

/// Keeps of a Secret the vCluster chart labelled what the import reads: its metadata
/// (without managed fields and annotations) and, for a `vc-config-<name>` Secret, its
/// configuration; every other key, and every other Secret's data, is dropped before it is
/// cached.
fn keep_only_configuration(secret: &mut Secret) {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.string_data = None;
    let is_config = secret
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(CONFIG_SECRET_PREFIX));
    match secret.data.as_mut() {
        Some(data) if is_config => data.retain(|k, _| k == CONFIG_SECRET_KEY),
        _ => secret.data = None,
    }
}

/// What a reconcile of the import sees.
pub(crate) struct ImportContext {
    ctx: Arc<Context>,
    /// The problems last reported per Secret UID: the same problems are not reported
    /// again on each wake-up.
    reported: Mutex<HashMap<String, String>>,
}

impl ImportContext {
    /// Whether `problems` differ from what was last reported for the Secret `uid`
    /// (remembering them).
    fn is_news(&self, uid: &str, problems: &str) -> bool {
        let Ok(mut reported) = self.reported.lock() else {
            return true;
        };
        if reported.get(uid).map(String::as_str) == Some(problems) {
            return false;
        }
        if problems.is_empty() {
            reported.remove(uid);
        } else {
            reported.insert(uid.to_string(), problems.to_string());
        }
        true
    }
}

impl Reconciler for ImportContext {
    type Object = Secret;
    const NAME: &'static str = "vcluster_import";
    const DOING: &'static str = "importing a vCluster configuration";

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn reconcile(&self, secret: Arc<Secret>) -> Result<Action, Error> {
        if !self
            .ctx
            .shards
            .acts_for(&secret.namespace().unwrap_or_default())
        {
            // Another replica acts for the namespace: look again in a while.
            return Ok(Action::requeue(crate::controller::shards::NOT_OURS_RETRY));
        }
        import(&secret, self).await
    }
}

/// The owner reference an imported pool carries: the configuration Secret.
fn owner_of(secret: &Secret) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Secret".into(),
        name: secret.name_any(),
        uid: secret.uid()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

fn owned_by(pool: &NodePool, uid: &str) -> bool {
    pool.owner_references().iter().any(|o| o.uid == uid)
}

/// Remembers why each pool of the vCluster `key` (`<namespace>/<label value>`) could not be
/// imported, and wakes the pools whose answer changed (their `VClusterConfig` condition).
fn record_problems(ctx: &Context, key: &str, problems: std::collections::BTreeMap<String, String>) {
    let before = ctx
        .index
        .import_problems
        .lock()
        .ok()
        .and_then(|mut all| {
            if problems.is_empty() {
                all.remove(key)
            } else {
                all.insert(key.to_string(), problems.clone())
            }
        })
        .unwrap_or_default();
    let Some((ns, _)) = key.split_once('/') else {
        return;
    };
    let touched: std::collections::BTreeSet<&String> = before
        .iter()
        .chain(problems.iter())
        .filter(|(name, why)| before.get(*name) != Some(*why) || problems.get(*name) != Some(*why))
        .map(|(name, _)| name)
        .collect();
    for name in touched {
        let _ = ctx
            .wakes
            .pools
            .unbounded_send(ObjectRef::new(name).within(ns));
    }
}

/// Deletes the claims `pool` owns (also those this process made that the store does not
/// show yet).
async fn remove_claims_of(ctx: &Context, pool: &NodePool) -> Result<(), Error> {
    let ns = pool.namespace().unwrap_or_default();
    let Some(pool_uid) = pool.uid() else {
        return Ok(());
    };
    let claims: Api<autonodes_api::NodeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    for c in ctx.claims_in(&ns).iter().filter(|c| {
        autonodes_core::pool::owned_by(c, &pool_uid) && c.meta().deletion_timestamp.is_none()
    }) {
        match claims
            .delete(&c.name_any(), &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(format!(
                    "deleting NodeClaim {ns}/{} of a removed pool",
                    c.name_any()
                ))(e))
            }
        }
    }
    Ok(())
}

/// Keeps the pools of one vCluster configuration Secret as its configuration says.
async fn import(secret: &Secret, ictx: &ImportContext) -> Result<Action, Error> {
    let ctx = &ictx.ctx;
    let name = secret.name_any();
    let Some(vcluster) = name.strip_prefix(CONFIG_SECRET_PREFIX) else {
        return Ok(Action::await_change());
    };
    if secret.meta().deletion_timestamp.is_some() {
        // Its pools go with it (owner references).
        return Ok(Action::await_change());
    }
    let ns = secret.namespace().unwrap_or_default();
    let (Some(owner), Some(uid)) = (owner_of(secret), secret.uid()) else {
        return Ok(Action::await_change());
    };
    // Only vClusters whose kubeconfig Secret autonodes can use.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let kubeconfig = format!("vc-{vcluster}");
    if secrets
        .get_metadata_opt(&kubeconfig)
        .await
        .map_err(Error::kube(format!("reading Secret {ns}/{kubeconfig}")))?
        .is_none()
    {
        tracing::debug!(%ns, %vcluster, "no kubeconfig Secret next to the vCluster configuration; not imported yet");
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get(CONFIG_SECRET_KEY))
        .map(|b| b.0.as_slice())
        .unwrap_or_default();
    let key = format!("{ns}/{}", autonodes_core::names::label_value(vcluster));
    let config = match vcluster::parse(text) {
        Ok(c) => c,
        Err(e) => {
            // Every pool of the vCluster says so (its VClusterConfig condition).
            let owned: std::collections::BTreeMap<String, String> = ctx
                .reflectors
                .pools
                .store()
                .state()
                .iter()
                .filter(|p| owned_by(p, &uid))
                .map(|p| (p.name_any(), format!("vc-config-{vcluster}: {e}")))
                .collect();
            record_problems(ctx, &key, owned);
            if !ictx.is_news(&uid, &e.to_string()) {
                return Ok(Action::await_change());
            }
            tracing::warn!(%ns, %vcluster, error = %e, "vCluster configuration not imported");
            ctx.event(
                secret,
                EventType::Warning,
                "InvalidVClusterConfig",
                "Import",
                format!("{e}; its NodePools are left as they are"),
            )
            .await;
            return Ok(Action::await_change());
        }
    };

    let pools: Api<NodePool> = Api::namespaced(ctx.client.clone(), &ns);
    let store = ctx.reflectors.pools.store();
    let mut problems = Vec::new();
    let mut per_pool = std::collections::BTreeMap::new();
    let mut changed = Vec::new();
    let names = vcluster::entry_names(vcluster, &config);
    let planned_pools = vcluster::node_pools(vcluster, &ns, &config, Some(&owner));
    for (pool_name, planned) in names.into_iter().zip(planned_pools) {
        let pool = match planned {
            Ok(p) => p,
            Err(e) => {
                per_pool.insert(pool_name, e.to_string());
                problems.push(e.to_string());
                continue;
            }
        };
        if let Some(existing) = store.get(&ObjectRef::new(&pool_name).within(&ns)) {
            if !owned_by(&existing, &uid) {
                problems.push(format!(
                    "NodePool {pool_name} exists and was not made from this configuration; it is left alone"
                ));
                continue;
            }
            if existing.spec == pool.spec && existing.labels() == pool.labels() {
                continue;
            }
        }
        pools
            .patch(
                &pool_name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&pool),
            )
            .await
            .map_err(Error::kube(format!("applying NodePool {ns}/{pool_name}")))?;
        changed.push(format!("applied {pool_name}"));
    }
    let named = vcluster::pool_names(vcluster, &config);
    for old in store.state().iter().filter(|p| {
        p.namespace().as_deref() == Some(ns.as_str())
            && owned_by(p, &uid)
            && p.meta().deletion_timestamp.is_none()
            && !named.contains(&p.name_any())
    }) {
        let old_name = old.name_any();
        match pools.delete(&old_name, &DeleteParams::background()).await {
            Ok(_) => changed.push(format!("deleted {old_name}")),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("deleting NodePool {ns}/{old_name}"))(e)),
        }
        // Then its claims (each drains its node), so the pool cannot make new ones
        // meanwhile: removing the entry removes its nodes whether or not a garbage
        // collector follows the owner references.
        remove_claims_of(ctx, old).await?;
    }
    record_problems(ctx, &key, per_pool);
    if !changed.is_empty() {
        tracing::info!(%ns, %vcluster, changes = ?changed, "vCluster configuration imported");
        ctx.event(
            secret,
            EventType::Normal,
            "VClusterConfigImported",
            "Import",
            changed.join(", "),
        )
        .await;
    }
    if ictx.is_news(&uid, &problems.join("; ")) && !problems.is_empty() {
        tracing::warn!(%ns, %vcluster, problems = ?problems, "vCluster pools not imported");
        ctx.event(
            secret,
            EventType::Warning,
            "InvalidVClusterPool",
            "Import",
            problems.join("; "),
        )
        .await;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, keys: &[&str]) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                annotations: Some([("a".to_string(), "b".repeat(1000))].into()),
                ..Default::default()
            },
            data: Some(
                keys.iter()
                    .map(|k| (k.to_string(), ByteString(vec![b'x'; 100 * 1024])))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_import_cache_keeps_only_the_configuration_of_vc_config_secrets() {
        let mut config = secret("vc-config-a", &[CONFIG_SECRET_KEY, "other"]);
        keep_only_configuration(&mut config);
        let kept: Vec<&String> = config.data.iter().flat_map(|d| d.keys()).collect();
        assert_eq!(kept, [CONFIG_SECRET_KEY]);
        assert!(config.metadata.annotations.is_none());

        let mut kubeconfig = secret("vc-a", &["config", "certificate-authority"]);
        keep_only_configuration(&mut kubeconfig);
        assert!(kubeconfig.data.is_none(), "no data of any other Secret");
    }
}
