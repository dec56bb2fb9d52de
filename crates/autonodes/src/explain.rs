//! `autonodes explain`: reads a claim, a pool or a node's claim from the management cluster
//! (the kubeconfig kubectl would use) and prints why it is where it is, as
//! [`autonodes_core::explain`] works it out from the controller's own rules. Read-only: it
//! lists NodeClaims, NodePools, NodeProviders, NodeTypes and NodeQuotas and reads the
//! claim's Namespace (for a pod or a node also the tenant's pods, DaemonSets, Node and
//! PodDisruptionBudgets, through the vCluster's kubeconfig Secret), and writes nothing.
//! Lists go a page at a time, at most [`MAX_LISTED`] objects of a kind; a tenant kubeconfig,
//! from the Secret or a file, goes through the controller's own check
//! ([`autonodes_core::kubeconfig::check`]), and the tenant is read with the controller's
//! own guarded client ([`crate::remote::egress::guarded_client`]): the same address policy
//! (the built-in refusals, the management API server, `--tenant-allow-cidrs`), the same
//! answer caps, and every read of the tenant within [`TENANT_READ_LIMIT`].

use std::time::Duration;

use anyhow::{bail, Context as _};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};
use autonodes_core::access::TenantNamespace;
use autonodes_core::catalogue::{count_claimed, Catalogue};
use autonodes_core::explain::{self, Explanation};
use autonodes_core::kubeconfig::vcluster_service;
use autonodes_core::quota::{PreparedQuota, Usage};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service};

/// What to explain.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum Target {
    /// A NodeClaim: each node type and why it was or was not chosen.
    Nodeclaim {
        /// `NAMESPACE/NAME`.
        name: String,
    },
    /// A NodePool: its budgets, its repair policy, and for each claim what consolidates,
    /// rolls, repairs or holds it.
    Nodepool {
        /// `NAMESPACE/NAME`.
        name: String,
    },
    /// A tenant pod: which of the tenant's pools could make a node for it, and what holds
    /// them.
    Pod {
        /// `NAMESPACE/NAME` of the pod in the tenant.
        name: String,
        /// The tenant: `NAMESPACE/NAME` of its vCluster on the management cluster.
        #[arg(long = "vcluster", value_name = "NS/NAME")]
        vcluster: String,
        /// Kubeconfig of the tenant. Absent: the vCluster's `vc-NAME` Secret (key
        /// `config`). Either is checked as the controller checks tenant kubeconfigs (no
        /// commands, files, proxies or impersonation).
        #[arg(long = "tenant-kubeconfig", value_name = "FILE")]
        tenant_kubeconfig: Option<std::path::PathBuf>,
    },
    /// A tenant Node: what its pool makes of it, and what holds it in the tenant.
    Node {
        /// The Node's name in the tenant.
        name: String,
        /// The tenant: `NAMESPACE/NAME` of its vCluster on the management cluster.
        #[arg(long = "vcluster", value_name = "NS/NAME")]
        vcluster: String,
        /// Kubeconfig of the tenant (as for `pod`).
        #[arg(long = "tenant-kubeconfig", value_name = "FILE")]
        tenant_kubeconfig: Option<std::path::PathBuf>,
    },
}

/// Output format of `autonodes explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum Format {
    /// Text for people.
    #[default]
    Text,
    /// The same as JSON.
    Json,
    /// The same as YAML.
    Yaml,
}

/// Arguments of `autonodes explain`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ExplainArgs {
    /// What to explain.
    #[command(subcommand)]
    pub target: Target,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text, global = true)]
    pub output: Format,
    /// The management cluster's kubeconfig, as kubectl's `--kubeconfig` (default: `KUBECONFIG`,
    /// then `~/.kube/config`, then the pod's own ServiceAccount).
    #[arg(long = "kubeconfig", value_name = "FILE", global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use, as kubectl's `--context` (default: its current one).
    #[arg(long = "context", value_name = "NAME", global = true)]
    pub context: Option<String>,
    /// The namespace of a NodeClaim, NodePool or `--vcluster` given by its name alone, as
    /// kubectl's `-n`.
    #[arg(
        short = 'n',
        long = "namespace",
        value_name = "NAMESPACE",
        global = true
    )]
    pub namespace: Option<String>,
    /// The controller's `--node-repair-after` (the default toleration of a Node not Ready),
    /// for pools whose repair lists no conditions.
    #[arg(long = "node-repair-after", default_value = "10m", global = true,
          value_parser = crate::run::parse_duration)]
    pub node_repair_after: Duration,
    /// Addresses tenant kubeconfigs may point at although the built-in list refuses them,
    /// as the controller's `--tenant-allow-cidrs` (comma-separated networks such as
    /// `10.0.0.0/8`); the management API server stays refused.
    #[arg(long = "tenant-allow-cidrs", default_value = "", global = true)]
    pub tenant_allow_cidrs: String,
    /// The controller's namespace (its `--namespace`), where replicas that share the tenant
    /// namespaces (`--shard-tenants`) keep their member Leases: a claim's or pool's
    /// explanation names the replica that acts for its namespace.
    #[arg(
        long = "controller-namespace",
        env = "AUTONODES_NAMESPACE",
        default_value = "autonodes-system",
        global = true
    )]
    pub controller_namespace: String,
}

/// The longest the reads of a tenant for one explanation may take.
pub(crate) const TENANT_READ_LIMIT: Duration = Duration::from_secs(30);

/// Where `explain` lets a tenant client connect: the controller's address policy for
/// tenants, with the management API server refused.
#[derive(Clone, Debug)]
pub(crate) struct TenantGuard {
    egress: crate::remote::egress::Egress,
}

impl TenantGuard {
    /// The policy of `--tenant-allow-cidrs` (`allow`) with the management cluster's API
    /// server (`protected`) refused.
    pub(crate) fn new(allow: &str, protected: &[std::net::SocketAddr]) -> anyhow::Result<Self> {
        let egress = crate::remote::egress::Egress::allowing_list(allow)
            .map_err(|e| anyhow::anyhow!("--tenant-allow-cidrs: {e}"))?;
        Ok(TenantGuard {
            egress: egress.protecting(protected),
        })
    }
}

/// `fut`, a read of the tenant, within [`TENANT_READ_LIMIT`].
async fn within<T>(fut: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(TENANT_READ_LIMIT, fut)
        .await
        .unwrap_or_else(|_| {
            bail!(
                "the tenant did not answer within {}s",
                TENANT_READ_LIMIT.as_secs()
            )
        })
}

/// `NAMESPACE/NAME`.
fn split(name: &str) -> anyhow::Result<(&str, &str)> {
    match name.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() => Ok((ns, n)),
        _ => bail!("{name:?} is not NAMESPACE/NAME"),
    }
}

/// The namespace and name of a management-cluster object given as `NAMESPACE/NAME`, or as
/// `NAME` with `-n NAMESPACE` (kubectl's way).
fn resolve<'a>(name: &'a str, namespace: Option<&'a str>) -> anyhow::Result<(&'a str, &'a str)> {
    match (name.contains('/'), namespace) {
        (true, _) => split(name),
        (false, Some(ns)) if !ns.is_empty() && !name.is_empty() => Ok((ns, name)),
        (false, _) => bail!("{name:?} is not NAMESPACE/NAME (or NAME with -n NAMESPACE)"),
    }
}

/// The management cluster's client configuration: `--kubeconfig` and `--context` as kubectl
/// reads them, else the usual places.
async fn management_config(args: &ExplainArgs) -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("using --kubeconfig {}", path.display()))
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("reading the kubeconfig's --context"),
        None => kube::Config::infer()
            .await
            .context("reading the current kubeconfig (the management cluster)"),
    }
}

/// Explains the target against the cluster of the current kubeconfig and prints it.
pub(crate) async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let config = management_config(&args).await?;
    // The management API server as this kubeconfig reaches it, never a tenant's address.
    let server = crate::remote::clients::endpoint_of(&config.cluster_url.to_string()).ok();
    let client = Client::try_from(config)
        .context("connecting to the management cluster (the current kubeconfig)")?;
    let protected = crate::controller::management_api::read(&client, server.as_deref())
        .await
        .map_err(|why| {
            anyhow::anyhow!("{why} (explain connects to no tenant without the management API server's addresses)")
        })?;
    let guard = TenantGuard::new(&args.tenant_allow_cidrs, &protected)?;
    let mut e = explain(&client, &args, &guard).await?;
    if let Target::Nodeclaim { name } | Target::Nodepool { name } = &args.target {
        if let Ok((ns, _)) = resolve(name, args.namespace.as_deref()) {
            if let Some(line) = served_by(&client, &args.controller_namespace, ns).await {
                e.summary.push(line);
            }
        }
    }
    match args.output {
        Format::Text => print!("{}", e.text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&e)?),
        Format::Yaml => print!("{}", autonodes_core::yaml::to_string(&e)?),
    }
    Ok(())
}

/// Which member acts for `namespace` when replicas share the tenant namespaces: the live
/// member Leases in `controller_namespace` (renewed within their duration by the wall
/// clock, not released), and the owner rendezvous hashing gives among them. `None` when
/// there is no member Lease (one replica serves every namespace) or they cannot be read.
async fn served_by(client: &Client, controller_namespace: &str, namespace: &str) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases = Api::<Lease>::namespaced(client.clone(), controller_namespace)
        .list(&ListParams::default().labels(crate::membership::LABEL_MEMBER))
        .await
        .ok()?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let glance: Vec<(String, bool)> = leases
        .items
        .iter()
        .filter_map(|l| {
            let member = l
                .metadata
                .name
                .as_deref()?
                .strip_prefix(crate::membership::MEMBER_LEASE_PREFIX)?
                .to_string();
            let spec = l.spec.as_ref()?;
            let held = spec
                .holder_identity
                .as_deref()
                .is_some_and(|h| !h.is_empty());
            let renewed = spec.renew_time.as_ref()?.0;
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            let fresh = now.duration_since(renewed).as_secs() <= duration;
            Some((member, held && fresh))
        })
        .collect();
    if glance.is_empty() {
        return None;
    }
    Some(autonodes_core::shards::served_by_line(namespace, &glance))
}

/// The explanation of `args.target`, read through `client` (the tenant where `guard`
/// lets its client connect).
pub(crate) async fn explain(
    client: &Client,
    args: &ExplainArgs,
    guard: &TenantGuard,
) -> anyhow::Result<Explanation> {
    let repair_after = (!args.node_repair_after.is_zero()).then_some(args.node_repair_after);
    let now = k8s_openapi::jiff::Timestamp::now();
    match &args.target {
        Target::Nodeclaim { name } => {
            let (ns, n) = resolve(name, args.namespace.as_deref())?;
            let claim = Api::<NodeClaim>::namespaced(client.clone(), ns)
                .get(n)
                .await
                .with_context(|| format!("reading NodeClaim {name}"))?;
            let pool = pool_of(client, &claim).await?;
            let pool_warm = pool.as_ref().and_then(|p| p.status.as_ref()?.warm.clone());
            let pool = pool.map(|p| p.spec);
            let (catalogue, all) = catalogue(client).await?;
            let claimed = count_claimed(&all, &Default::default(), &Default::default());
            // What scheduling admits types by: the namespace's labels (for providers that
            // serve only some namespaces), the quotas covering it and what its claims hold.
            let labels = Api::<Namespace>::all(client.clone())
                .get_opt(ns)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.metadata.labels);
            let quotas: Vec<PreparedQuota> = list_all(
                &Api::<NodeQuota>::all(client.clone()),
                &ListParams::default(),
                "NodeQuotas",
            )
            .await?
            .iter()
            .map(|q| PreparedQuota::new(&q.name_any(), &q.spec))
            .filter(|q| q.covers(ns))
            .collect();
            let mine = all
                .iter()
                .filter(|c| c.metadata.namespace.as_deref() == Some(ns));
            let counts = count_claimed(mine, &Default::default(), &Default::default());
            let types = list_all(
                &Api::<NodeType>::all(client.clone()),
                &ListParams::default(),
                "NodeTypes",
            )
            .await?;
            let admission = explain::claim::Admission {
                namespace: TenantNamespace {
                    name: ns,
                    labels: labels.as_ref(),
                },
                quotas: &quotas,
                used: Usage::of_counts(&counts, |n| catalogue.named(n)),
                hosts: types
                    .iter()
                    .filter_map(|t| Some((t.name_any(), t.status.as_ref()?.host.clone()?)))
                    .collect(),
                warm: types
                    .iter()
                    .filter_map(|t| Some((t.name_any(), t.status.as_ref()?.warm.clone()?)))
                    .collect(),
                pool_warm: pool_warm.clone(),
            };
            Ok(explain::claim::nodeclaim(
                &claim,
                pool.as_ref(),
                &catalogue,
                &claimed,
                &admission,
            ))
        }
        Target::Nodepool { name } => {
            let (ns, n) = resolve(name, args.namespace.as_deref())?;
            let pool = Api::<NodePool>::namespaced(client.clone(), ns)
                .get(n)
                .await
                .with_context(|| format!("reading NodePool {name}"))?;
            let in_ns = namespace_claims(client, ns).await?;
            let (claims, provider) = pool_context(client, &pool, &in_ns).await?;
            let repair = provider.as_ref().and_then(|p| p.spec.repair.as_ref());
            Ok(explain::pool::nodepool(
                &pool,
                &claims,
                repair,
                repair_after,
                now,
            ))
        }
        Target::Pod {
            name,
            vcluster,
            tenant_kubeconfig,
        } => {
            let (pod_ns, pod_name) = split(name)?;
            let (ns, vc) = resolve(vcluster, args.namespace.as_deref())?;
            let tenant = tenant_client(client, ns, vc, tenant_kubeconfig.as_deref(), guard).await?;
            let (pod, daemonsets, tenant_pods) = within(async {
                let pod = Api::<Pod>::namespaced(tenant.clone(), pod_ns)
                    .get(pod_name)
                    .await
                    .with_context(|| format!("reading pod {name} in the tenant"))?;
                // The tenant's pods say whom the pod must share a node with; without them
                // the rest is told all the same.
                let tenant_pods = list_all(
                    &Api::<Pod>::all(tenant.clone()),
                    &ListParams::default(),
                    "pods in the tenant",
                )
                .await
                .map_err(|e| format!("{e:#}"));
                // Without the right to list DaemonSets the controller plans without them too.
                let daemonsets = match list_all(
                    &Api::<DaemonSet>::all(tenant),
                    &ListParams::default(),
                    "DaemonSets in the tenant",
                )
                .await
                {
                    Ok(d) => d,
                    Err(e) if refused_or_not_served(&e) => Vec::new(),
                    Err(e) => return Err(e),
                };
                Ok((pod, daemonsets, tenant_pods))
            })
            .await?;
            let pools: Vec<NodePool> = list_all(
                &Api::<NodePool>::namespaced(client.clone(), ns),
                &ListParams::default(),
                "NodePools",
            )
            .await?
            .into_iter()
            .filter(|p| p.spec.v_cluster_ref.name == vc)
            .collect();
            let (catalogue, all) = catalogue(client).await?;
            let claimed = count_claimed(&all, &Default::default(), &Default::default());
            let overheads = list_all(
                &Api::<NodeType>::all(client.clone()),
                &ListParams::default(),
                "NodeTypes",
            )
            .await?
            .into_iter()
            .filter_map(|t| Some((t.name_any(), t.spec.overhead?)))
            .collect();
            let mut e = explain::pod::pod(
                &pod,
                &explain::pod::PodInput {
                    pools: &pools,
                    catalogue: &catalogue,
                    claimed: &claimed,
                    overheads: &overheads,
                    daemonsets: &daemonsets,
                    tenant_pods: tenant_pods.as_deref().unwrap_or_default(),
                    now,
                },
            );
            if let Err(why) = tenant_pods {
                e.summary.push(format!(
                    "the tenant's pods could not be read, so whom it must share a node with is not told: {why}"
                ));
            }
            Ok(e)
        }
        Target::Node {
            name,
            vcluster,
            tenant_kubeconfig,
        } => {
            let (ns, vc) = resolve(vcluster, args.namespace.as_deref())?;
            let in_ns = namespace_claims(client, ns).await?;
            let Some(claim) = in_ns.iter().find(|c| {
                c.spec.v_cluster_ref.name == vc
                    && c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name)
            }) else {
                bail!("no NodeClaim of vCluster {vcluster} has the node {name}");
            };
            // What holds the node in the tenant; the rest is told without it.
            let tenant =
                match tenant_client(client, ns, vc, tenant_kubeconfig.as_deref(), guard).await {
                    Ok(t) => within(on_node(&t, name)).await,
                    Err(e) => Err(e),
                };
            let (node, pods, budgets, unread) = match tenant {
                Ok((node, pods, budgets)) => (node, pods, budgets, None),
                Err(e) => (None, Vec::new(), Vec::new(), Some(format!("{e:#}"))),
            };
            let on = explain::pool::OnNode {
                node: node.as_ref(),
                pods: &pods,
                budgets: &budgets,
            };
            let pool = pool_of(client, claim).await?;
            let mut e = match &pool {
                None => explain::pool::node(name, claim, None, &on, None, repair_after, now),
                Some(pool) => {
                    let (claims, provider) = pool_context(client, pool, &in_ns).await?;
                    let repair = provider.as_ref().and_then(|p| p.spec.repair.as_ref());
                    explain::pool::node(
                        name,
                        claim,
                        Some((pool, &claims)),
                        &on,
                        repair,
                        repair_after,
                        now,
                    )
                }
            };
            if let Some(why) = unread {
                e.summary
                    .push(format!("the tenant could not be read: {why}"));
            }
            Ok(e)
        }
    }
}

/// The Node `name` of the tenant, the pods bound to it and the tenant's
/// PodDisruptionBudgets (`policy/v1`, else `v1beta1` on tenants older than 1.21).
async fn on_node(
    tenant: &Client,
    name: &str,
) -> anyhow::Result<(Option<Node>, Vec<Pod>, Vec<explain::pool::DisruptionBudget>)> {
    let node = Api::<Node>::all(tenant.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("reading Node {name} in the tenant"))?;
    let pods = list_all(
        &Api::<Pod>::all(tenant.clone()),
        &ListParams::default().fields(&format!("spec.nodeName={name}")),
        "pods on the Node",
    )
    .await?;
    let mut budgets = Vec::new();
    for version in ["v1", "v1beta1"] {
        let gvk = kube::api::GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
        let api = Api::<kube::api::DynamicObject>::all_with(tenant.clone(), &resource);
        match list_all(&api, &ListParams::default(), "PodDisruptionBudgets").await {
            Ok(list) => {
                budgets = list.iter().map(disruption_budget).collect();
                break;
            }
            // A version the tenant does not serve: the next one.
            Err(e) if refused_or_not_served(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((node, pods, budgets))
}

/// The fields of a PodDisruptionBudget `explain` reads.
fn disruption_budget(o: &kube::api::DynamicObject) -> explain::pool::DisruptionBudget {
    let namespace = o.namespace().unwrap_or_default();
    explain::pool::DisruptionBudget {
        key: format!("{namespace}/{}", o.name_any()),
        namespace,
        selector: o
            .data
            .pointer("/spec/selector")
            .and_then(|s| serde_json::from_value(s.clone()).ok()),
        disruptions_allowed: o
            .data
            .pointer("/status/disruptionsAllowed")
            .and_then(serde_json::Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0),
    }
}

/// The node types of every NodeProvider, and every NodeClaim (what counts against the
/// types' `maxCapacity`).
async fn catalogue(client: &Client) -> anyhow::Result<(Catalogue, Vec<NodeClaim>)> {
    let providers = list_all(
        &Api::<NodeProvider>::all(client.clone()),
        &ListParams::default(),
        "NodeProviders",
    )
    .await?;
    let types = providers
        .iter()
        .flat_map(|p| Catalogue::from_provider(p).types().to_vec())
        .collect();
    let all = list_all(
        &Api::<NodeClaim>::all(client.clone()),
        &ListParams::default(),
        "NodeClaims",
    )
    .await?;
    Ok((Catalogue::new(types), all))
}

/// Objects listed a page at a time.
const PAGE: u32 = 500;
/// The most objects of one kind `explain` reads; a cluster with more gets an error instead.
const MAX_LISTED: usize = 20_000;

/// Every object `api` lists with `params`, a page at a time, at most [`MAX_LISTED`].
async fn list_all<K>(api: &Api<K>, params: &ListParams, what: &str) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone().limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("listing {what}"))?;
        out.extend(page.items);
        if out.len() > MAX_LISTED {
            bail!("there are more than {MAX_LISTED} {what}; explain reads at most that many");
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Whether a list failed because the cluster refused it (401, 403) or does not serve the
/// kind (404).
fn refused_or_not_served(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if [401, 403, 404].contains(&s.code))
}

/// The NodeClaims of namespace `ns`.
async fn namespace_claims(client: &Client, ns: &str) -> anyhow::Result<Vec<NodeClaim>> {
    let what = format!("the NodeClaims of namespace {ns}");
    list_all(
        &Api::namespaced(client.clone(), ns),
        &ListParams::default(),
        &what,
    )
    .await
}

/// A client of the tenant: from `file`, else from the vCluster's `vc-<name>` Secret in
/// `ns`; either is checked as the controller checks tenant kubeconfigs (no commands, files,
/// proxies or impersonation), and its connections go only where `guard` allows, its
/// answers capped as the controller's are.
async fn tenant_client(
    client: &Client,
    ns: &str,
    vcluster: &str,
    file: Option<&std::path::Path>,
    guard: &TenantGuard,
) -> anyhow::Result<Client> {
    let (bytes, source) = match file {
        Some(path) => (
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let secret_name = format!("vc-{vcluster}");
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get(&secret_name)
                .await
                .with_context(|| format!("reading Secret {ns}/{secret_name}"))?;
            let Some(bytes) = secret
                .data
                .and_then(|mut d| d.remove(autonodes_api::TENANT_KUBECONFIG_KEY))
            else {
                bail!("Secret {ns}/{secret_name} has no key `config`");
            };
            (bytes.0, format!("Secret {ns}/{secret_name}"))
        }
    };
    let mut checked = autonodes_core::kubeconfig::check(&bytes, &Default::default())
        .map_err(|r| anyhow::anyhow!("{source}: {r}"))?;
    // The vCluster chart's own export names its loopback address: reached through the
    // vCluster's Service, as the controller does (from inside the cluster).
    if file.is_none() && vcluster_service::server_is_loopback(&checked.server) {
        if let Some(svc) = Api::<Service>::namespaced(client.clone(), ns)
            .get_opt(vcluster)
            .await
            .ok()
            .flatten()
        {
            checked = vcluster_service::through_service(&checked, vcluster, ns, &svc)
                .map_err(|why| anyhow::anyhow!("{source}: {why}"))?
                .kubeconfig;
        }
    }
    let config = crate::remote::clients::client_config(&checked)
        .map_err(|why| anyhow::anyhow!("{source}: {why}"))?;
    crate::remote::egress::guarded_client(
        &config,
        guard.egress.tenant.clone(),
        guard.egress.management.clone(),
        crate::remote::request_metrics::ClusterKind::Tenant,
        None,
        &crate::remote::egress::Transports::default(),
    )
    .context("building the tenant's client")
}

/// The NodePool that controls `claim`, if any.
async fn pool_of(client: &Client, claim: &NodeClaim) -> anyhow::Result<Option<NodePool>> {
    let Some(owner) = claim
        .owner_references()
        .iter()
        .find(|o| o.kind == "NodePool" && o.controller == Some(true))
    else {
        return Ok(None);
    };
    let ns = claim.namespace().unwrap_or_default();
    Api::<NodePool>::namespaced(client.clone(), &ns)
        .get_opt(&owner.name)
        .await
        .with_context(|| format!("reading NodePool {ns}/{}", owner.name))
}

/// The claims `pool` controls (among `in_ns`, its namespace's claims) and the NodeProvider
/// it names (if that exists).
async fn pool_context(
    client: &Client,
    pool: &NodePool,
    in_ns: &[NodeClaim],
) -> anyhow::Result<(Vec<NodeClaim>, Option<NodeProvider>)> {
    let uid = pool.uid().unwrap_or_default();
    let claims = in_ns
        .iter()
        .filter(|c| autonodes_core::pool::owned_by(c, &uid))
        .cloned()
        .collect();
    Ok((claims, provider_of(client, pool).await?))
}

/// The NodeProvider the pool names, if it names one that exists.
async fn provider_of(client: &Client, pool: &NodePool) -> anyhow::Result<Option<NodeProvider>> {
    let Some(name) = pool.spec.provider_ref.as_deref() else {
        return Ok(None);
    };
    Api::<NodeProvider>::all(client.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("reading NodeProvider {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_namespace_slash_name_or_a_name_with_the_namespace_flag() {
        assert_eq!(resolve("team-a/x", None).unwrap(), ("team-a", "x"));
        assert_eq!(resolve("team-a/x", Some("other")).unwrap(), ("team-a", "x"));
        assert_eq!(resolve("x", Some("team-a")).unwrap(), ("team-a", "x"));
        let err = resolve("x", None).unwrap_err().to_string();
        assert!(err.contains("NAME with -n NAMESPACE"), "{err}");
        assert!(resolve("/x", None).is_err());
    }
}
