//! A vCluster's own `vcluster.yaml` read as NodePools: each `privateNodes.autoNodes[]`
//! entry's `static[]` and `dynamic[]` pools become one NodePool `<vcluster>-<pool name>`.
//!
//! The vCluster chart stores its whole configuration in the Secret `vc-config-<release>`
//! (key `config.yaml`) next to the kubeconfig Secret `vc-<release>`; the controller reads
//! it from there, `autonodes import-vcluster -f vcluster.yaml` from a file. Both call
//! [`node_pools`]. Everything here is untrusted input: a field that cannot be mapped is an
//! [`EntryError`] naming its path, for that pool only; the other pools still map.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Deserialize;

use crate::{names, pool, resources, template};
use autonodes_api::{
    Budget, ConsolidationPolicy, Disruption, DurationOrNever, NodePool, NodePoolSpec, Operator,
    Requirement, VClusterRef, LABEL_MANAGED_BY, MANAGED_BY,
};

/// Label on an imported NodePool: the vCluster whose configuration it comes from.
pub const LABEL_VCLUSTER: &str = "autonodes.io/vcluster";
/// Label on an imported NodePool: the name of its `static[]`/`dynamic[]` entry.
pub(crate) const LABEL_VCLUSTER_POOL: &str = "autonodes.io/vcluster-pool";
/// Prefix of the Secret holding a vCluster's configuration (`vc-config-<release>`).
pub const CONFIG_SECRET_PREFIX: &str = "vc-config-";
/// Key of the configuration in that Secret.
pub const CONFIG_SECRET_KEY: &str = "config.yaml";
/// Largest configuration read (the chart's values are a few tens of KiB).
pub(crate) const MAX_CONFIG_BYTES: usize = 1 << 20;

/// The part of `vcluster.yaml` autonodes reads. Everything else is ignored.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VClusterConfig {
    /// `privateNodes`.
    #[serde(default)]
    pub private_nodes: PrivateNodes,
}

/// `privateNodes`.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrivateNodes {
    /// `privateNodes.enabled`: without it vCluster runs no private nodes, and no pool is
    /// made.
    #[serde(default)]
    pub enabled: bool,
    /// `privateNodes.autoNodes`: one entry per node provider.
    #[serde(default)]
    pub auto_nodes: Vec<AutoNodes>,
}

/// One `privateNodes.autoNodes[]` entry.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoNodes {
    /// The node provider: the NodeProvider of the pools.
    #[serde(default)]
    pub provider: String,
    /// Properties of every pool of the entry (a pool's own win).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Pools of a fixed size.
    #[serde(default, rename = "static")]
    pub static_pools: Vec<StaticPool>,
    /// Pools that grow with pending pods.
    #[serde(default, rename = "dynamic")]
    pub dynamic_pools: Vec<DynamicPool>,
}

/// A selector entry: `{property, operator (empty: In), value | values}`.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
pub struct VRequirement {
    /// The node type property.
    #[serde(default)]
    pub property: String,
    /// In, NotIn, Exists, DoesNotExist, Gt, Lt; empty is In.
    #[serde(default)]
    pub operator: String,
    /// One value.
    #[serde(default)]
    pub value: String,
    /// Several values.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A taint as vCluster writes it.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
pub struct VTaint {
    /// The taint key.
    #[serde(default)]
    pub key: String,
    /// The taint value.
    #[serde(default)]
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    #[serde(default)]
    pub effect: String,
}

/// The fields static and dynamic pools share.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolFields {
    /// The pool's name.
    #[serde(default)]
    pub name: String,
    /// Requirements on the node type.
    #[serde(default)]
    pub node_type_selector: Vec<VRequirement>,
    /// Properties of the pool's nodes.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Taints of the pool's nodes.
    #[serde(default)]
    pub taints: Vec<VTaint>,
    /// Labels of the pool's nodes.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// Longest drain.
    #[serde(default)]
    pub termination_grace_period: String,
}

/// A `static[]` pool.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StaticPool {
    /// What every pool has.
    #[serde(flatten)]
    pub pool: PoolFields,
    /// How many nodes.
    #[serde(default)]
    pub quantity: i64,
    /// A vCluster Platform node profile (ignored).
    #[serde(default)]
    pub profile: String,
}

/// A `dynamic[]` pool.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DynamicPool {
    /// What every pool has.
    #[serde(flatten)]
    pub pool: PoolFields,
    /// Limits by resource name, as strings.
    #[serde(default)]
    pub limits: BTreeMap<String, LimitValue>,
    /// When nodes may go.
    #[serde(default)]
    pub disruption: VDisruption,
    /// Replace nodes older than this.
    #[serde(default)]
    pub expire_after: String,
    /// Preference among pools.
    #[serde(default)]
    pub weight: i64,
}

/// A limit written as a string (vCluster's type) or a number (what YAML makes of `64`).
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum LimitValue {
    /// `"64"`, `"256Gi"`.
    Text(String),
    /// `64`.
    Integer(i64),
}

impl LimitValue {
    fn text(&self) -> String {
        match self {
            LimitValue::Text(s) => s.clone(),
            LimitValue::Integer(i) => i.to_string(),
        }
    }
}

/// `disruption` of a dynamic pool.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VDisruption {
    /// Remove empty nodes after this.
    #[serde(default)]
    pub consolidate_after: String,
    /// WhenEmpty or WhenEmptyOrUnderutilized.
    #[serde(default)]
    pub consolidation_policy: String,
    /// Disruption budgets.
    #[serde(default)]
    pub budgets: Vec<VBudget>,
}

/// A disruption budget.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
pub struct VBudget {
    /// A count or a percentage.
    #[serde(default)]
    pub nodes: String,
    /// Cron, UTC.
    #[serde(default)]
    pub schedule: String,
    /// How long after each schedule hit.
    #[serde(default)]
    pub duration: String,
}

/// Why a configuration cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Larger than [`MAX_CONFIG_BYTES`].
    #[error("the configuration is {0} bytes, more than the {MAX_CONFIG_BYTES} autonodes reads")]
    TooLarge(usize),
    /// Not YAML of the expected shape.
    #[error("the configuration is not a vcluster.yaml autonodes can read: {0}")]
    Malformed(String),
}

/// Why one pool of the configuration cannot be mapped (the others still are).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct EntryError {
    /// Where, e.g. `privateNodes.autoNodes[0].dynamic[1].limits.cpu`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Reads `vcluster.yaml` (or the chart values in `vc-config-<release>`), bounded in size;
/// the message of an error never quotes the text (it may hold credentials).
pub fn parse(text: &[u8]) -> Result<VClusterConfig, ConfigError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge(text.len()));
    }
    crate::yaml::from_slice::<VClusterConfig>(text).map_err(|e| {
        let at = crate::yaml::position(&e);
        let what = e.to_string();
        let what = what.split(" at line ").next().unwrap_or("malformed YAML");
        ConfigError::Malformed(format!("{}{at}", without_quoted(what)))
    })
}

/// `message` with every double-quoted part elided and at most 200 characters: a parse
/// error may quote the text it failed on, which is the user's and may be a secret.
fn without_quoted(message: &str) -> String {
    let mut out = String::new();
    for (i, part) in message.split('"').enumerate() {
        out.push_str(if i % 2 == 1 { "…" } else { part });
    }
    out.chars().take(200).collect()
}

/// The pools of one vCluster's configuration: for each `static[]` and `dynamic[]` entry of
/// each `privateNodes.autoNodes[]` provider, its NodePool or why it has none. Empty when
/// `privateNodes.enabled` is false. Pool names are `<vcluster>-<pool name>`; a name used
/// twice maps the first use only.
pub fn node_pools(
    vcluster: &str,
    namespace: &str,
    config: &VClusterConfig,
    owner: Option<&OwnerReference>,
) -> Vec<Result<NodePool, EntryError>> {
    let mut out = Vec::new();
    if !config.private_nodes.enabled {
        return out;
    }
    let mut seen = BTreeSet::new();
    for (i, auto) in config.private_nodes.auto_nodes.iter().enumerate() {
        let at = format!("privateNodes.autoNodes[{i}]");
        for (j, s) in auto.static_pools.iter().enumerate() {
            let path = format!("{at}.static[{j}]");
            out.push(
                named(vcluster, &s.pool.name, &path, &mut seen).and_then(|name| {
                    let spec = static_spec(vcluster, auto, s, &path, &at)?;
                    Ok(pool_object(
                        vcluster,
                        namespace,
                        &name,
                        &s.pool.name,
                        spec,
                        owner,
                    ))
                }),
            );
        }
        for (j, d) in auto.dynamic_pools.iter().enumerate() {
            let path = format!("{at}.dynamic[{j}]");
            out.push(
                named(vcluster, &d.pool.name, &path, &mut seen).and_then(|name| {
                    let spec = dynamic_spec(vcluster, auto, d, &path, &at)?;
                    Ok(pool_object(
                        vcluster,
                        namespace,
                        &name,
                        &d.pool.name,
                        spec,
                        owner,
                    ))
                }),
            );
        }
    }
    out
}

/// The NodePool names the configuration names, whether each maps or not: the imported
/// pools to keep (a pool whose entry cannot be mapped keeps what it had). Empty when
/// `privateNodes.enabled` is false.
pub fn pool_names(vcluster: &str, config: &VClusterConfig) -> BTreeSet<String> {
    entry_names(vcluster, config).into_iter().collect()
}

/// The NodePool name of each entry, in the order [`node_pools`] returns them.
pub fn entry_names(vcluster: &str, config: &VClusterConfig) -> Vec<String> {
    if !config.private_nodes.enabled {
        return Vec::new();
    }
    config
        .private_nodes
        .auto_nodes
        .iter()
        .flat_map(|a| {
            let statics = a.static_pools.iter().map(|s| &s.pool.name);
            statics.chain(a.dynamic_pools.iter().map(|d| &d.pool.name))
        })
        .map(|pool| format!("{vcluster}-{pool}"))
        .collect()
}

/// The NodePool name of a vCluster's pool, checked and not used before.
fn named(
    vcluster: &str,
    pool: &str,
    path: &str,
    seen: &mut BTreeSet<String>,
) -> Result<String, EntryError> {
    let err = |message: String| EntryError {
        path: format!("{path}.name"),
        message,
    };
    if pool.is_empty() {
        return Err(err("a pool needs a name".to_string()));
    }
    let name = format!("{vcluster}-{pool}");
    // Claims are named `<pool>-<5 characters>`, their VMs after them: room for both.
    if !names::is_dns_subdomain(&name, 200) {
        return Err(err(format!(
            "{name:?} (the vCluster's name, a dash and the pool's) is not a DNS subdomain of at most 200 characters"
        )));
    }
    if !seen.insert(name.clone()) {
        return Err(err(format!("another pool is already named {pool:?}")));
    }
    Ok(name)
}

fn pool_object(
    vcluster: &str,
    namespace: &str,
    name: &str,
    pool: &str,
    spec: NodePoolSpec,
    owner: Option<&OwnerReference>,
) -> NodePool {
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_VCLUSTER.to_string(), names::label_value(vcluster)),
        (LABEL_VCLUSTER_POOL.to_string(), names::label_value(pool)),
    ]);
    NodePool {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The spec from what every pool has; the kind's own fields come on top.
fn base_spec(
    vcluster: &str,
    auto: &AutoNodes,
    c: &PoolFields,
    path: &str,
    at: &str,
) -> Result<NodePoolSpec, EntryError> {
    if auto.provider.is_empty() {
        return Err(EntryError {
            path: format!("{at}.provider"),
            message: "a provider is required".to_string(),
        });
    }
    if !names::is_dns_subdomain(&auto.provider, 253) {
        return Err(EntryError {
            path: format!("{at}.provider"),
            message: format!("{:?} is not a NodeProvider name", auto.provider),
        });
    }
    let mut requirements = Vec::new();
    for (k, r) in c.node_type_selector.iter().enumerate() {
        requirements.push(requirement(r, &format!("{path}.nodeTypeSelector[{k}]"))?);
    }
    let mut taints = Vec::new();
    for (k, t) in c.taints.iter().enumerate() {
        let taint = Taint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.clone(),
            time_added: None,
        };
        template::check_taint(&taint).map_err(|message| EntryError {
            path: format!("{path}.taints[{k}]"),
            message,
        })?;
        taints.push(taint);
    }
    for (k, v) in &c.node_labels {
        if !names::is_qualified_name(k) || !names::is_label_value(v) {
            return Err(EntryError {
                path: format!("{path}.nodeLabels"),
                message: format!("{k}={v:?} is not a valid label"),
            });
        }
    }
    let mut properties = auto.properties.clone();
    properties.extend(c.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(NodePoolSpec {
        v_cluster_ref: VClusterRef {
            name: vcluster.to_string(),
        },
        provider_ref: Some(auto.provider.clone()),
        requirements,
        properties,
        taints,
        startup_taints: Vec::new(),
        labels: c.node_labels.clone(),
        kubelet_args: BTreeMap::new(),
        replicas: None,
        limits: None,
        disruption: None,
        termination_grace_period: duration(
            &c.termination_grace_period,
            &format!("{path}.terminationGracePeriod"),
        )?,
        expire_after: None,
        weight: None,
        autoscaling: None,
        repair: None,
        warm: None,
        preference_policy: None,
    })
}

fn static_spec(
    vcluster: &str,
    auto: &AutoNodes,
    s: &StaticPool,
    path: &str,
    at: &str,
) -> Result<NodePoolSpec, EntryError> {
    let mut spec = base_spec(vcluster, auto, &s.pool, path, at)?;
    let replicas = i32::try_from(s.quantity)
        .ok()
        .filter(|q| (0..=autonodes_api::MAX_REPLICAS).contains(q))
        .ok_or_else(|| EntryError {
            path: format!("{path}.quantity"),
            message: format!(
                "{} is not a node count from 0 to {} (the most a NodePool holds)",
                s.quantity,
                autonodes_api::MAX_REPLICAS
            ),
        })?;
    spec.replicas = Some(replicas);
    Ok(spec)
}

fn dynamic_spec(
    vcluster: &str,
    auto: &AutoNodes,
    d: &DynamicPool,
    path: &str,
    at: &str,
) -> Result<NodePoolSpec, EntryError> {
    let mut spec = base_spec(vcluster, auto, &d.pool, path, at)?;
    let mut limits = BTreeMap::new();
    for (name, value) in &d.limits {
        let text = value.text();
        let field = format!("{path}.limits.{name}");
        if !(names::is_qualified_name(name)) {
            return Err(EntryError {
                path: field,
                message: "not a resource name".to_string(),
            });
        }
        if resources::parse_quantity(&text).is_err() || !is_quantity_text(&text) {
            return Err(EntryError {
                path: field,
                message: format!("{text:?} is not a quantity such as 64 or 256Gi"),
            });
        }
        limits.insert(name.clone(), Quantity(text));
    }
    // A dynamic pool has no replicas; without limits it grows as far as demand goes.
    spec.limits = Some(limits);
    let policy = match d.disruption.consolidation_policy.as_str() {
        "" => None,
        "WhenEmpty" => Some(ConsolidationPolicy::WhenEmpty),
        "WhenEmptyOrUnderutilized" => Some(ConsolidationPolicy::WhenEmptyOrUnderutilized),
        other => {
            return Err(EntryError {
                path: format!("{path}.disruption.consolidationPolicy"),
                message: format!("{other:?} is neither WhenEmpty nor WhenEmptyOrUnderutilized"),
            })
        }
    };
    let mut budgets = Vec::new();
    for (k, b) in d.disruption.budgets.iter().enumerate() {
        let field = format!("{path}.disruption.budgets[{k}]");
        let budget = Budget {
            nodes: b.nodes.clone(),
            schedule: (!b.schedule.is_empty()).then(|| b.schedule.clone()),
            duration: (!b.duration.is_empty()).then(|| b.duration.clone()),
            reasons: Vec::new(),
        };
        let schedule_ok = budget
            .schedule
            .as_deref()
            .is_none_or(|s| s.len() <= 128 && pattern_admits_cron(s));
        if !schedule_ok {
            return Err(EntryError {
                path: format!("{field}.schedule"),
                message: format!("{:?} is not a cron schedule", b.schedule),
            });
        }
        budgets.push(budget);
    }
    let consolidate_after = duration(
        &d.disruption.consolidate_after,
        &format!("{path}.disruption.consolidateAfter"),
    )?;
    spec.disruption = Some(Disruption {
        consolidate_after,
        expire_after: None,
        budget: None,
        consolidation_policy: policy,
        budgets,
        kubernetes_version_drift: None,
    });
    if let Some(problem) = pool::disruption_problem(&spec) {
        return Err(EntryError {
            path: path.to_string(),
            message: problem,
        });
    }
    spec.expire_after = duration(&d.expire_after, &format!("{path}.expireAfter"))?;
    if d.weight != 0 {
        spec.weight = Some(
            i32::try_from(d.weight)
                .ok()
                .filter(|w| (0..=100).contains(w))
                .ok_or_else(|| EntryError {
                    path: format!("{path}.weight"),
                    message: format!("{} is not between 0 and 100", d.weight),
                })?,
        );
    }
    Ok(spec)
}

/// Whether `s` has the shape the CRD's cron pattern admits: a macro or five fields.
fn pattern_admits_cron(s: &str) -> bool {
    if let Some(m) = s.strip_prefix('@') {
        return [
            "annually", "yearly", "monthly", "weekly", "daily", "midnight", "hourly",
        ]
        .contains(&m);
    }
    let fields: Vec<&str> = s.split(' ').filter(|f| !f.is_empty()).collect();
    fields.len() == 5
        && fields.iter().all(|f| {
            f.chars()
                .all(|c| c.is_ascii_alphanumeric() || "*,/?-".contains(c))
        })
}

/// Whether `s` has the shape the CRDs' quantity pattern admits (the parser also reads
/// forms the pattern refuses, such as surrounding blanks).
fn is_quantity_text(s: &str) -> bool {
    !s.is_empty() && s.trim() == s
}

/// A requirement in autonodes' shape.
fn requirement(r: &VRequirement, path: &str) -> Result<Requirement, EntryError> {
    let err = |message: String| EntryError {
        path: path.to_string(),
        message,
    };
    if !names::is_qualified_name(&r.property) {
        return Err(err(format!(
            "property {:?} is not a qualified name",
            r.property
        )));
    }
    let operator = match r.operator.as_str() {
        "" | "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "NotExists" => Operator::NotExists,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        other => {
            return Err(err(format!(
                "operator {other:?} is not one autonodes knows"
            )))
        }
    };
    let values = match (r.value.is_empty(), r.values.is_empty()) {
        (false, false) => return Err(err("value and values are exclusive".to_string())),
        (false, true) => vec![r.value.clone()],
        _ => r.values.clone(),
    };
    let requirement = Requirement {
        key: r.property.clone(),
        operator,
        values,
        min_values: None,
    };
    crate::scheduling::CheckedRequirement::new(&requirement, path)
        .map_err(|e| err(e.to_string()))?;
    Ok(requirement)
}

/// A duration field: empty is absent.
fn duration(s: &str, path: &str) -> Result<Option<DurationOrNever>, EntryError> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|why| EntryError {
        path: path.to_string(),
        message: why,
    })
}

#[cfg(test)]
mod tests;
