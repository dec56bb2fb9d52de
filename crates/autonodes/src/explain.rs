//! `autonodes explain`: reads a claim, a pool or a node's claim from the management cluster
//! (the kubeconfig kubectl would use) and prints why it is where it is, as
//! [`autonodes_core::explain`] works it out from the controller's own rules. Read-only: it
//! lists NodeClaims, NodePools, NodeProviders, NodeTypes and NodeQuotas and reads the
//! claim's Namespace (for a pod or a node also the tenant's pods, DaemonSets, Node and
//! PodDisruptionBudgets, through the vCluster's kubeconfig Secret), and writes nothing.

use std::time::Duration;

use anyhow::{bail, Context as _};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use std::collections::BTreeMap;

use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeQuota, NodeType};
use autonodes_core::access::TenantNamespace;
use autonodes_core::catalogue::{count_claimed, Catalogue};
use autonodes_core::explain::{self, Explanation};
use autonodes_core::quota::{PreparedQuota, Usage};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};

/// What to explain.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Target {
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
        /// `config`), checked as the controller checks it (no commands, files or proxies).
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
pub enum Format {
    /// Text for people.
    #[default]
    Text,
    /// The same as JSON.
    Json,
}

/// Arguments of `autonodes explain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// What to explain.
    #[command(subcommand)]
    pub target: Target,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text, global = true)]
    pub output: Format,
    /// The controller's `--node-repair-after` (the default toleration of a Node not Ready),
    /// for pools whose repair lists no conditions.
    #[arg(long = "node-repair-after", default_value = "10m", global = true,
          value_parser = crate::run::parse_duration)]
    pub node_repair_after: Duration,
}

/// `NAMESPACE/NAME`.
fn split(name: &str) -> anyhow::Result<(&str, &str)> {
    match name.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() => Ok((ns, n)),
        _ => bail!("{name:?} is not NAMESPACE/NAME"),
    }
}

/// Explains the target against the cluster of the current kubeconfig and prints it.
pub async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the management cluster (the current kubeconfig)")?;
    let e = explain(&client, &args).await?;
    match args.output {
        Format::Text => print!("{}", e.text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&e)?),
    }
    Ok(())
}

/// The explanation of `args.target`, read through `client`.
pub async fn explain(client: &Client, args: &ExplainArgs) -> anyhow::Result<Explanation> {
    let repair_after = (!args.node_repair_after.is_zero()).then_some(args.node_repair_after);
    let now = k8s_openapi::jiff::Timestamp::now();
    match &args.target {
        Target::Nodeclaim { name } => {
            let (ns, n) = split(name)?;
            let claim = Api::<NodeClaim>::namespaced(client.clone(), ns)
                .get(n)
                .await
                .with_context(|| format!("reading NodeClaim {name}"))?;
            let pool = pool_of(client, &claim).await?.map(|p| p.spec);
            let (catalogue, claimed) = catalogue(client).await?;
            // What scheduling admits types by: the namespace's labels (for providers that
            // serve only some namespaces), the quotas covering it and what its claims hold.
            let labels = Api::<Namespace>::all(client.clone())
                .get_opt(ns)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.metadata.labels);
            let quotas: Vec<PreparedQuota> = Api::<NodeQuota>::all(client.clone())
                .list(&ListParams::default())
                .await
                .context("listing NodeQuotas")?
                .items
                .iter()
                .map(|q| PreparedQuota::new(&q.name_any(), &q.spec))
                .filter(|q| q.covers(ns))
                .collect();
            let mine = Api::<NodeClaim>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing the NodeClaims of namespace {ns}"))?;
            let counts = count_claimed(&mine.items, &Default::default(), &Default::default());
            let admission = explain::Admission {
                namespace: TenantNamespace {
                    name: ns,
                    labels: labels.as_ref(),
                },
                quotas: &quotas,
                used: Usage::of_counts(&counts, |n| catalogue.named(n)),
                hosts: Api::<NodeType>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .context("listing NodeTypes")?
                    .items
                    .into_iter()
                    .filter_map(|t| Some((t.name_any(), t.status?.host?)))
                    .collect(),
            };
            Ok(explain::nodeclaim(
                &claim,
                pool.as_ref(),
                &catalogue,
                &claimed,
                &admission,
            ))
        }
        Target::Nodepool { name } => {
            let (ns, n) = split(name)?;
            let pool = Api::<NodePool>::namespaced(client.clone(), ns)
                .get(n)
                .await
                .with_context(|| format!("reading NodePool {name}"))?;
            let (claims, provider) = pool_context(client, &pool).await?;
            let repair = provider.as_ref().and_then(|p| p.spec.repair.as_ref());
            Ok(explain::nodepool(&pool, &claims, repair, repair_after, now))
        }
        Target::Pod {
            name,
            vcluster,
            tenant_kubeconfig,
        } => {
            let (pod_ns, pod_name) = split(name)?;
            let (ns, vc) = split(vcluster)?;
            let tenant = tenant_client(client, ns, vc, tenant_kubeconfig.as_deref()).await?;
            let pod = Api::<Pod>::namespaced(tenant.clone(), pod_ns)
                .get(pod_name)
                .await
                .with_context(|| format!("reading pod {name} in the tenant"))?;
            // Without the right to list DaemonSets the controller plans without them too.
            let daemonsets = Api::<DaemonSet>::all(tenant)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let pools: Vec<NodePool> = Api::<NodePool>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing the NodePools of namespace {ns}"))?
                .items
                .into_iter()
                .filter(|p| p.spec.v_cluster_ref.name == vc)
                .collect();
            let (catalogue, claimed) = catalogue(client).await?;
            let overheads = Api::<NodeType>::all(client.clone())
                .list(&ListParams::default())
                .await
                .context("listing NodeTypes")?
                .items
                .into_iter()
                .filter_map(|t| Some((t.name_any(), t.spec.overhead?)))
                .collect();
            Ok(explain::pod(
                &pod,
                &pools,
                &catalogue,
                &claimed,
                &overheads,
                &daemonsets,
                now,
            ))
        }
        Target::Node {
            name,
            vcluster,
            tenant_kubeconfig,
        } => {
            let (ns, vc) = split(vcluster)?;
            let claims = Api::<NodeClaim>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .with_context(|| format!("listing the NodeClaims of namespace {ns}"))?;
            let Some(claim) = claims.items.into_iter().find(|c| {
                c.spec.v_cluster_ref.name == vc
                    && c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name)
            }) else {
                bail!("no NodeClaim of vCluster {vcluster} has the node {name}");
            };
            // What holds the node in the tenant; the rest is told without it.
            let tenant = match tenant_client(client, ns, vc, tenant_kubeconfig.as_deref()).await {
                Ok(t) => on_node(&t, name).await,
                Err(e) => Err(e),
            };
            let (node, pods, budgets, unread) = match tenant {
                Ok((node, pods, budgets)) => (node, pods, budgets, None),
                Err(e) => (None, Vec::new(), Vec::new(), Some(format!("{e:#}"))),
            };
            let on = explain::OnNode {
                node: node.as_ref(),
                pods: &pods,
                budgets: &budgets,
            };
            let pool = pool_of(client, &claim).await?;
            let mut e = match &pool {
                None => explain::node(name, &claim, None, &on, None, repair_after, now),
                Some(pool) => {
                    let (claims, provider) = pool_context(client, pool).await?;
                    let repair = provider.as_ref().and_then(|p| p.spec.repair.as_ref());
                    explain::node(
                        name,
                        &claim,
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
) -> anyhow::Result<(Option<Node>, Vec<Pod>, Vec<explain::DisruptionBudget>)> {
    let node = Api::<Node>::all(tenant.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("reading Node {name} in the tenant"))?;
    let pods = Api::<Pod>::all(tenant.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await
        .with_context(|| format!("listing the pods on Node {name}"))?
        .items;
    let mut budgets = Vec::new();
    for version in ["v1", "v1beta1"] {
        let gvk = kube::api::GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
        let listed = Api::<kube::api::DynamicObject>::all_with(tenant.clone(), &resource)
            .list(&ListParams::default())
            .await;
        if let Ok(list) = listed {
            budgets = list.items.iter().map(disruption_budget).collect();
            break;
        }
    }
    Ok((node, pods, budgets))
}

/// The fields of a PodDisruptionBudget `explain` reads.
fn disruption_budget(o: &kube::api::DynamicObject) -> explain::DisruptionBudget {
    let namespace = o.namespace().unwrap_or_default();
    explain::DisruptionBudget {
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

/// The node types of every NodeProvider, and the live claims per type.
async fn catalogue(client: &Client) -> anyhow::Result<(Catalogue, BTreeMap<String, i64>)> {
    let providers = Api::<NodeProvider>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeProviders")?;
    let types = providers
        .items
        .iter()
        .flat_map(|p| Catalogue::from_provider(p).types().to_vec())
        .collect();
    let all = Api::<NodeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeClaims")?;
    let claimed = count_claimed(&all.items, &Default::default(), &Default::default());
    Ok((Catalogue::new(types), claimed))
}

/// A client of the tenant: from `file`, else from the vCluster's `vc-<name>` Secret in
/// `ns`, checked as the controller checks tenant kubeconfigs.
async fn tenant_client(
    client: &Client,
    ns: &str,
    vcluster: &str,
    file: Option<&std::path::Path>,
) -> anyhow::Result<Client> {
    let config = match file {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using {}", path.display()))?
        }
        None => {
            let secret_name = format!("vc-{vcluster}");
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get(&secret_name)
                .await
                .with_context(|| format!("reading Secret {ns}/{secret_name}"))?;
            let Some(bytes) = secret
                .data
                .as_ref()
                .and_then(|d| d.get(autonodes_api::TENANT_KUBECONFIG_KEY))
            else {
                bail!("Secret {ns}/{secret_name} has no key `config`");
            };
            let checked = autonodes_core::kubeconfig::check(&bytes.0, &Default::default())
                .map_err(|r| anyhow::anyhow!("Secret {ns}/{secret_name}: {r}"))?;
            crate::remote::clients::client_config(&checked)
                .map_err(|why| anyhow::anyhow!("Secret {ns}/{secret_name}: {why}"))?
        }
    };
    Client::try_from(config).context("building the tenant's client")
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

/// The claims `pool` controls and the NodeProvider it names (if that exists).
async fn pool_context(
    client: &Client,
    pool: &NodePool,
) -> anyhow::Result<(Vec<NodeClaim>, Option<NodeProvider>)> {
    Ok((
        pool_claims(client, pool).await?,
        provider_of(client, pool).await?,
    ))
}

/// The claims `pool` controls.
async fn pool_claims(client: &Client, pool: &NodePool) -> anyhow::Result<Vec<NodeClaim>> {
    let ns = pool.namespace().unwrap_or_default();
    let uid = pool.uid().unwrap_or_default();
    let claims = Api::<NodeClaim>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the NodeClaims of namespace {ns}"))?;
    Ok(claims
        .items
        .into_iter()
        .filter(|c| autonodes_core::pool::owned_by(c, &uid))
        .collect())
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
