//! The orphan sweep: every `--orphan-sweep-interval` (and once the caches have synced after
//! start), list what autonodes made on every known host and tenant cluster
//! (`app.kubernetes.io/managed-by=autonodes`), then the NodeClaims, and delete the
//! VirtualMachines, user-data Secrets, DataVolumes and bootstrap tokens whose claim no
//! longer exists, and the tenant Nodes their VMs registered (labelled with this
//! installation; `autonodes_core::orphans` picks them). Each removal is an Event, a log line and
//! `autonodes_orphans_removed_total{kind}`. A cluster that cannot be read is skipped until
//! the next sweep; nothing is deleted without a fresh list of the claims.
//!
//! For providers that place VMs in a host namespace per tenant (`vmNamespacePerTenant`),
//! the sweep also looks in each known tenant's namespace and, on those providers' hosts, in
//! every namespace autonodes created (labelled `managed-by=autonodes` and with this
//! installation), and deletes such a namespace once no claim's VM goes there and nothing of
//! autonodes is left in it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta};
use kube::runtime::events::EventType;
use kube::ResourceExt;

use crate::controller::context::Context;
use crate::remote::caches::TOKEN_NAMESPACE;
use crate::remote::calls::remote_call;
use crate::remote::clients::{ClientError, ClusterKey, Remote};
use autonodes_api::kubevirt;
use autonodes_api::{NodeClaim, LABEL_INSTALLATION, LABEL_MANAGED_BY, MANAGED_BY};
use autonodes_core::orphans::{orphans, Cluster, Found, OrphanKind};

/// Runs the sweep until `stop` resolves: first once the caches have synced, then every
/// `interval`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    interval: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    tokio::select! {
        _ = &mut stop => return,
        _ = ctx.wait_synced() => {}
    }
    let mut tenants = BTreeSet::new();
    loop {
        let removed = sweep(&ctx, &mut tenants).await;
        let forgotten = forget_gone_tenants(&ctx).await;
        tracing::debug!(removed, forgotten, "orphan sweep done");
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// The tenants some claim or pool names now.
fn named_tenants(ctx: &Context) -> BTreeSet<(String, String)> {
    let claims = ctx
        .claims()
        .state()
        .iter()
        .map(|c| {
            (
                c.namespace().unwrap_or_default(),
                c.spec.v_cluster_ref.name.clone(),
            )
        })
        .collect::<Vec<_>>();
    let pools = ctx
        .reflectors
        .pools
        .store()
        .state()
        .iter()
        .map(|p| {
            (
                p.namespace().unwrap_or_default(),
                p.spec.v_cluster_ref.name.clone(),
            )
        })
        .collect::<Vec<_>>();
    claims.into_iter().chain(pools).collect()
}

/// Drops the clients (and their watches) of tenants no claim or pool names any more, so
/// what a tenant that is gone had cached does not stay.
async fn forget_gone_tenants(ctx: &Context) -> usize {
    let named = named_tenants(ctx);
    ctx.clients
        .retain_tenants(|k| match k {
            ClusterKey::Tenant {
                namespace,
                vcluster,
            } => {
                named.contains(&(namespace.clone(), vcluster.clone()))
                    && ctx.shards.acts_for(namespace)
            }
            ClusterKey::Host(_) => true,
        })
        .await
}

/// The host clusters (each with the namespaces to look in), and the tenants, the sweep
/// looks at: those of every provider and claim in the caches, and the tenants of earlier
/// sweeps (a tenant whose last claim went may still hold a leaked token).
fn targets(
    ctx: &Context,
    tenants: &mut BTreeSet<(String, String)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut hosts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in ctx.providers().state() {
        let r = &p.spec.kube_virt.cluster_ref;
        hosts
            .entry(r.cluster.clone())
            .or_default()
            .insert(r.namespace.clone());
    }
    for c in ctx.claims().state() {
        if let Some(s) = &c.status {
            if let (Some(h), Some(ns)) = (&s.host_cluster, &s.vm_namespace) {
                hosts.entry(h.clone()).or_default().insert(ns.clone());
            }
        }
        tenants.insert((
            c.namespace().unwrap_or_default(),
            c.spec.v_cluster_ref.name.clone(),
        ));
    }
    // A provider with a namespace per tenant: each known tenant's (a VM may be left there
    // by a claim that is gone).
    for p in ctx.providers().state() {
        let context = autonodes_core::catalogue::ProviderContext::from_provider(&p);
        if let Some(per_tenant) = &context.per_tenant {
            let namespaces = hosts.entry(context.host_cluster.clone()).or_default();
            for (tenant, _) in tenants.iter() {
                namespaces.insert(per_tenant.namespace_of(tenant));
            }
        }
    }
    hosts
}

/// The host namespaces autonodes created on `remote` for tenants (labelled as this
/// installation's); empty when they cannot be listed.
async fn created_namespaces(ctx: &Context, remote: &Remote) -> Vec<String> {
    let selector = format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_INSTALLATION}={}",
        autonodes_core::names::label_value(&ctx.config.installation)
    );
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(remote.client.clone());
    let params = ListParams::default().labels(&selector);
    match list_metadata_paged(ctx, remote, &api, &params, "listing the VM namespaces").await {
        Ok(items) => items
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name)
            .collect(),
        Err(e) => {
            tracing::debug!(cluster = %remote.key, error = %e, "orphan sweep cannot list namespaces");
            Vec::new()
        }
    }
}

/// Deletes the namespaces autonodes created on host `host` (`created`) that no claim's VM
/// goes to and where `found` saw nothing of autonodes; returns how many it deleted.
async fn remove_unused_namespaces(
    ctx: &Context,
    remote: &Remote,
    host: &str,
    created: &[String],
    found: &[Found],
) -> usize {
    let cluster = Cluster::Host(host.to_string());
    let used: BTreeSet<String> = ctx
        .claims()
        .state()
        .iter()
        .filter_map(|c| {
            let s = c.status.as_ref()?;
            (s.host_cluster.as_deref() == Some(host)).then(|| s.vm_namespace.clone())?
        })
        .collect();
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(remote.client.clone());
    let mut removed = 0;
    for ns in created {
        let holds = found
            .iter()
            .any(|f| f.cluster == cluster && &f.namespace == ns);
        if used.contains(ns) || holds {
            continue;
        }
        let deleted = remote_call(
            &ctx.metrics.cluster_requests,
            remote,
            "deleting an unused VM namespace",
            api.delete(ns, &DeleteParams::background()),
        )
        .await;
        match deleted {
            Ok(_) => {
                tracing::info!(cluster = %remote.key, namespace = %ns, "unused VM namespace removed");
                removed += 1;
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(cluster = %remote.key, namespace = %ns, error = %e, "cannot remove an unused VM namespace; retrying at the next sweep")
            }
        }
    }
    removed
}

/// The API of one kind of object the sweep removes, in `namespace` of `remote` (Nodes are
/// cluster-scoped).
fn api_for(remote: &Remote, kind: OrphanKind, namespace: &str) -> Api<DynamicObject> {
    if kind == OrphanKind::Node {
        return Api::all_with(remote.client.clone(), &ApiResource::erase::<Node>(&()));
    }
    let resource = match kind {
        OrphanKind::VirtualMachine => kubevirt::virtual_machine(),
        OrphanKind::DataVolume => kubevirt::data_volume(),
        OrphanKind::UserDataSecret | OrphanKind::BootstrapToken | OrphanKind::Node => {
            ApiResource::erase::<Secret>(&())
        }
    };
    Api::namespaced_with(remote.client.clone(), namespace, &resource)
}

/// Adds the managed objects of `kinds` in `namespace` of `remote` to `found`. A kind the
/// cluster does not serve (a host without CDI has no DataVolumes) is skipped; a list that
/// fails is logged and tried again at the next sweep.
async fn list_into(
    ctx: &Context,
    remote: &Remote,
    cluster: &Cluster,
    namespace: &str,
    kinds: &[OrphanKind],
    found: &mut Vec<Found>,
) {
    let managed = ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    // Nodes carry no managed-by label (their kubelet made them): this installation's.
    let installed = ListParams::default().labels(&format!(
        "{LABEL_INSTALLATION}={}",
        autonodes_core::names::label_value(&ctx.config.installation)
    ));
    for &kind in kinds {
        let api = api_for(remote, kind, namespace);
        let selector = match kind {
            OrphanKind::Node => &installed,
            _ => &managed,
        };
        match list_metadata_paged(ctx, remote, &api, selector, "listing for the orphan sweep").await
        {
            Ok(items) => found.extend(items.iter().map(|o| Found {
                cluster: cluster.clone(),
                kind,
                namespace: o.namespace().unwrap_or_default(),
                name: o.name_any(),
                labels: o.labels().clone(),
            })),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::debug!(cluster = %remote.key, kind = kind.label(), error = %e, "orphan sweep cannot list")
            }
        }
    }
}

/// Objects per page of the sweep's remote lists.
const SWEEP_PAGE: u32 = 500;

/// The metadata of every object `api` lists with `params` on `remote`, a page of
/// [`SWEEP_PAGE`] at a time (no answer holds a whole host's or tenant's objects).
async fn list_metadata_paged<K>(
    ctx: &Context,
    remote: &Remote,
    api: &Api<K>,
    params: &ListParams,
    what: &str,
) -> Result<Vec<kube::core::PartialObjectMeta<K>>, crate::remote::error::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone().limit(SWEEP_PAGE);
    let mut out = Vec::new();
    loop {
        let page = remote_call(
            &ctx.metrics.cluster_requests,
            remote,
            what,
            api.list_metadata(&params),
        )
        .await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// One sweep; returns how many objects it removed.
///
/// With `--shard-tenants` the leader sweeps the hosts, and each replica the tenants of the
/// namespaces it acts for.
pub(crate) async fn sweep(ctx: &Context, tenants: &mut BTreeSet<(String, String)>) -> usize {
    let mut hosts = targets(ctx, tenants);
    if !ctx.shards.leads() {
        hosts.clear();
    }
    let mut found = Vec::new();
    let mut created_by_host = Vec::new();
    let per_tenant_hosts: BTreeSet<String> = ctx
        .providers()
        .state()
        .iter()
        .filter(|p| p.spec.kube_virt.vm_namespace_per_tenant.is_some())
        .map(|p| p.spec.kube_virt.cluster_ref.cluster.clone())
        .collect();
    let mut remotes = Vec::new();
    for (host, namespaces) in &hosts {
        let remote = match ctx.clients.host(host).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(host = %host, error = %e, "orphan sweep skips a host");
                continue;
            }
        };
        let cluster = Cluster::Host(host.clone());
        // Namespaces autonodes made exist only where a provider places VMs per tenant: no
        // other host is asked to list its namespaces.
        let created = if per_tenant_hosts.contains(host) {
            created_namespaces(ctx, &remote).await
        } else {
            Vec::new()
        };
        let mut namespaces = namespaces.clone();
        namespaces.extend(created.iter().cloned());
        created_by_host.push((host.clone(), created));
        for ns in &namespaces {
            list_into(
                ctx,
                &remote,
                &cluster,
                ns,
                &[
                    OrphanKind::VirtualMachine,
                    OrphanKind::DataVolume,
                    OrphanKind::UserDataSecret,
                ],
                &mut found,
            )
            .await;
        }
        remotes.push((cluster, remote));
    }
    let mut gone_tenants = Vec::new();
    for (ns, vcluster) in tenants.iter() {
        if !ctx.shards.acts_for(ns) {
            continue;
        }
        let remote = match ctx.clients.tenant(ns, vcluster).await {
            Ok(r) => r,
            Err(ClientError::SecretNotFound { .. }) => {
                // The vCluster was deleted with its nodes and tokens.
                gone_tenants.push((ns.clone(), vcluster.clone()));
                continue;
            }
            Err(e) => {
                tracing::debug!(namespace = %ns, vcluster = %vcluster, error = %e, "orphan sweep skips a tenant");
                continue;
            }
        };
        let cluster = Cluster::Tenant {
            namespace: ns.clone(),
            vcluster: vcluster.clone(),
        };
        list_into(
            ctx,
            &remote,
            &cluster,
            TOKEN_NAMESPACE,
            &[OrphanKind::BootstrapToken, OrphanKind::Node],
            &mut found,
        )
        .await;
        remotes.push((cluster, remote));
    }
    for t in gone_tenants {
        tenants.remove(&t);
    }
    // A tenant no claim names any more is looked at again only while it still holds
    // something of autonodes (a leaked token, a Node left behind).
    let named = named_tenants(ctx);
    tenants.retain(|(namespace, vcluster)| {
        named.contains(&(namespace.clone(), vcluster.clone()))
            || found.iter().any(|f| {
                f.cluster
                    == Cluster::Tenant {
                        namespace: namespace.clone(),
                        vcluster: vcluster.clone(),
                    }
            })
    });
    // Namespaces made for tenants that nothing uses any more (what was found in them goes
    // below; the namespace with the next sweep).
    let mut removed = 0;
    for (host, created) in &created_by_host {
        let remote = remotes.iter().find_map(|(c, r)| match c {
            Cluster::Host(h) if h == host => Some(r),
            _ => None,
        });
        if let Some(remote) = remote {
            removed += remove_unused_namespaces(ctx, remote, host, created, &found).await;
        }
    }
    if found.is_empty() {
        return removed;
    }

    // The claims, listed after the objects: an object exists only once its claim does.
    let live: HashSet<String> = match Api::<NodeClaim>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await
    {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|c| c.metadata.uid)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "orphan sweep cannot list NodeClaims; nothing removed");
            return 0;
        }
    };
    for o in orphans(&found, &live, &ctx.config.installation) {
        let Some((_, remote)) = remotes.iter().find(|(c, _)| *c == o.cluster) else {
            continue;
        };
        if remove(ctx, remote, o).await {
            removed += 1;
        }
    }
    // Warm VMs belong to a type, not a claim: those of types that are gone.
    removed += super::nodetype::warm_pool::sweep_gone_types(ctx, &ctx.types().state()).await;
    removed
}

/// Deletes one orphan; true when it was deleted (or was gone already).
async fn remove(ctx: &Context, remote: &Remote, o: &Found) -> bool {
    let api = api_for(remote, o.kind, &o.namespace);
    let result = remote_call(
        &ctx.metrics.cluster_requests,
        remote,
        &format!("deleting an orphaned {}", o.kind.label()),
        api.delete(&o.name, &DeleteParams::background()),
    )
    .await
    .map(|_| ());
    match result {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return true,
        Err(e) => {
            tracing::warn!(cluster = %remote.key, kind = o.kind.label(), namespace = %o.namespace, name = %o.name, error = %e, "cannot remove an orphan; retrying at the next sweep");
            return false;
        }
    }
    ctx.metrics
        .orphans_removed
        .with_label_values(&[o.kind.label()])
        .inc();
    let note = format!(
        "removed {} {}/{} on {}: its NodeClaim no longer exists",
        o.kind.label(),
        o.namespace,
        o.name,
        remote.key
    );
    tracing::info!(cluster = %remote.key, kind = o.kind.label(), namespace = %o.namespace, name = %o.name, "orphan removed");
    match &o.cluster {
        Cluster::Host(host) => {
            // About every provider whose VMs go to that host and namespace.
            for p in ctx.providers().state().iter().filter(|p| {
                let r = &p.spec.kube_virt.cluster_ref;
                &r.cluster == host && r.namespace == o.namespace
            }) {
                ctx.event(
                    &**p,
                    EventType::Warning,
                    "OrphanRemoved",
                    "Sweep",
                    note.clone(),
                )
                .await;
            }
        }
        Cluster::Tenant {
            namespace,
            vcluster,
        } => {
            // About the tenant's kubeconfig Secret, the one object naming the tenant.
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("vc-{vcluster}")),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            ctx.event(&secret, EventType::Warning, "OrphanRemoved", "Sweep", note)
                .await;
        }
    }
    true
}
