//! Tenant quotas (`NodeQuota`): which node types the claims of a namespace may be scheduled
//! to, and how much they may hold together. Pure code, no I/O.
//!
//! A quota covers the namespaces it lists (every namespace when it lists none), each on
//! its own. A claim holds, for its namespace: one `nodes`, its type's `cost`, and its
//! type's resources (`cpu`, `memory`, extended resources), counted while it holds
//! capacity (the ledger's rule: from scheduling until its VM is gone). A type is allowed
//! to a claim when every quota covering the claim's namespace selects the type and the
//! namespace's use plus the type stays within every limit.

use std::collections::BTreeMap;

use crate::catalogue::PreparedType;
use crate::requirements::label_selector_matches;
use crate::resources::{self, ResourceAmounts, CPU, MEMORY};
use autonodes_api::{NodeQuotaSpec, ResourceList};

/// The limit on the number of claims (nodes) a namespace holds.
pub(crate) const NODES: &str = "nodes";
/// The limit on the sum of the costs of the types a namespace's claims hold.
pub const COST: &str = "cost";

/// A NodeQuota, read once: its limits parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedQuota {
    /// The NodeQuota's name.
    pub name: String,
    /// Its spec.
    pub spec: NodeQuotaSpec,
    /// Its limits, in milli-units.
    pub limits: ResourceAmounts,
    /// Why the quota cannot be applied (its limits do not parse), if so. Such a quota
    /// allows nothing in the namespaces it covers: a broken limit never lets claims
    /// through.
    pub problem: Option<String>,
}

impl PreparedQuota {
    /// Reads a quota.
    pub fn new(name: &str, spec: &NodeQuotaSpec) -> Self {
        let (limits, problem) = match ResourceAmounts::from_list(&spec.limits) {
            Ok(l) => (l, None),
            Err(e) => (
                ResourceAmounts::default(),
                Some(format!("spec.limits: {e}")),
            ),
        };
        Self {
            name: name.to_string(),
            spec: spec.clone(),
            limits,
            problem,
        }
    }

    /// Whether the quota covers `namespace`.
    pub fn covers(&self, namespace: &str) -> bool {
        covers(&self.spec, namespace)
    }

    /// Whether the quota lets a claim of its namespaces be scheduled to `t`, given what
    /// the namespace's claims hold (`used`). The error says which quota refuses and why.
    pub fn admits(&self, t: &PreparedType, used: &Usage, namespace: &str) -> Result<(), String> {
        if let Some(problem) = &self.problem {
            return Err(format!(
                "NodeQuota {} cannot be applied: {problem}",
                self.name
            ));
        }
        if let Some(selector) = &self.spec.node_type_selector {
            if !label_selector_matches(selector, &t.properties) {
                return Err(format!(
                    "NodeQuota {} does not allow node type {} in namespace {namespace}",
                    self.name, t.name
                ));
            }
        }
        let adds = Usage::of_type(t);
        for (resource, limit) in self.limits.iter() {
            let after = used.milli(resource) + adds.milli(resource);
            if after > limit {
                return Err(format!(
                    "NodeQuota {} limits {resource} to {} in namespace {namespace}: {} used, node type {} adds {}",
                    self.name,
                    show(resource, limit),
                    show(resource, used.milli(resource)),
                    t.name,
                    show(resource, adds.milli(resource)),
                ));
            }
        }
        Ok(())
    }
}

/// Whether a quota covers `namespace`: it lists it, or lists none (every namespace).
pub fn covers(spec: &NodeQuotaSpec, namespace: &str) -> bool {
    spec.namespaces.is_empty() || spec.namespaces.iter().any(|n| n == namespace)
}

/// What claims hold, in milli-units per resource name ([`NODES`], [`COST`], `cpu`,
/// `memory`, extended resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    amounts: BTreeMap<String, i128>,
}

impl Usage {
    /// What one claim of `t` holds.
    pub fn of_type(t: &PreparedType) -> Self {
        let mut amounts: BTreeMap<String, i128> = t
            .amounts
            .iter()
            .map(|(name, milli)| (name.to_string(), milli))
            .collect();
        amounts.insert(NODES.to_string(), 1000);
        amounts.insert(COST.to_string(), i128::from(t.cost) * 1000);
        Self { amounts }
    }

    /// What `count` claims of each type hold (`types` finds a type by name; a type that is
    /// gone counts as a node without resources or cost).
    pub fn of_counts<'t>(
        counts: &BTreeMap<String, i64>,
        types: impl Fn(&str) -> Option<&'t PreparedType>,
    ) -> Self {
        let mut total = Usage::default();
        for (name, n) in counts {
            let one = match types(name) {
                Some(t) => Usage::of_type(t),
                None => Usage {
                    amounts: BTreeMap::from([(NODES.to_string(), 1000)]),
                },
            };
            for (resource, milli) in one.amounts {
                *total.amounts.entry(resource).or_insert(0) += milli * i128::from(*n);
            }
        }
        total
    }

    /// The amount of a resource in milli-units (0 when absent).
    pub fn milli(&self, resource: &str) -> i128 {
        self.amounts.get(resource).copied().unwrap_or(0)
    }

    /// The use of the resources a quota limits (always `nodes`), as a resource list for
    /// `status.namespaces[].used`.
    pub fn report(&self, limits: &ResourceAmounts) -> ResourceList {
        let mut out = ResourceList::new();
        let mut names: Vec<&str> = limits.iter().map(|(n, _)| n).collect();
        names.push(NODES);
        for name in names {
            out.insert(
                name.to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(show(
                    name,
                    self.milli(name),
                )),
            );
        }
        out
    }
}

/// A milli-unit amount as a quantity of its resource (`16Gi`, `1500m`, `3`).
fn show(resource: &str, milli: i128) -> String {
    match resource {
        CPU => resources::format_cpu(milli),
        MEMORY => resources::format_memory(milli / 1000),
        _ if milli % 1000 == 0 => (milli / 1000).to_string(),
        _ => format!("{milli}m"),
    }
}

/// Whether the quotas covering `namespace` let a claim there be scheduled to `t`, given
/// what the namespace's claims hold; the first refusal's reason otherwise.
pub fn admits(
    quotas: &[PreparedQuota],
    namespace: &str,
    used: &Usage,
    t: &PreparedType,
) -> Result<(), String> {
    quotas
        .iter()
        .filter(|q| q.covers(namespace))
        .try_for_each(|q| q.admits(t, used, namespace))
}

/// The tightest `nodes` limit of the quotas covering `namespace`, with the quota's name:
/// how many claims the namespace may hold. A quota whose limits cannot be read limits
/// `nodes` to 0 (a broken limit never lets claims through).
pub fn nodes_limit<'q>(quotas: &'q [PreparedQuota], namespace: &str) -> Option<(&'q str, usize)> {
    quotas
        .iter()
        .filter(|q| q.covers(namespace))
        .filter_map(|q| {
            let nodes = if q.problem.is_some() {
                0
            } else {
                q.spec
                    .limits
                    .contains_key(NODES)
                    .then(|| usize::try_from(q.limits.milli(NODES) / 1000).unwrap_or(usize::MAX))?
            };
            Some((q.name.as_str(), nodes))
        })
        .min_by_key(|(_, nodes)| *nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{prepare_type, ProviderContext};
    use autonodes_api::NodeTypeSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn node_type(name: &str, cpu: &str, memory: &str) -> PreparedType {
        let spec: NodeTypeSpec = serde_json::from_value(json!({
            "providerRef": "p",
            "resources": {"cpu": cpu, "memory": memory},
        }))
        .expect("spec");
        let t = prepare_type(
            &format!("p.{name}"),
            &spec,
            Some(&ProviderContext::for_tests("p")),
        );
        assert!(t.problem.is_none(), "{:?}", t.problem);
        t
    }

    fn quota(spec: serde_json::Value) -> PreparedQuota {
        PreparedQuota::new("team", &serde_json::from_value(spec).expect("quota spec"))
    }

    #[test]
    fn the_tightest_nodes_limit_of_the_quotas_covering_a_namespace_bounds_its_claims() {
        let quotas = [
            PreparedQuota::new(
                "wide",
                &serde_json::from_value(json!({"limits": {"nodes": "10"}})).expect("spec"),
            ),
            PreparedQuota::new(
                "narrow",
                &serde_json::from_value(json!({"namespaces": ["a"], "limits": {"nodes": "3"}}))
                    .expect("spec"),
            ),
            PreparedQuota::new(
                "cpu-only",
                &serde_json::from_value(json!({"limits": {"cpu": "1"}})).expect("spec"),
            ),
        ];
        assert_eq!(nodes_limit(&quotas, "a"), Some(("narrow", 3)));
        assert_eq!(nodes_limit(&quotas, "b"), Some(("wide", 10)));
        assert_eq!(nodes_limit(&quotas[2..], "b"), None);
        let broken = [PreparedQuota::new(
            "broken",
            &serde_json::from_value(json!({"limits": {"memory": "lots"}})).expect("spec"),
        )];
        assert_eq!(nodes_limit(&broken, "b"), Some(("broken", 0)));
    }

    #[test]
    fn a_claim_fits_until_the_namespace_would_exceed_a_limit() {
        let small = node_type("small", "2", "4Gi");
        let q = quota(json!({"limits": {"nodes": "3", "memory": "10Gi", "cost": "100"}}));
        let used = Usage::of_counts(&BTreeMap::from([("p.small".to_string(), 2)]), |_| {
            Some(&small)
        });
        assert_eq!(used.milli(NODES), 2000);
        assert_eq!(used.milli(COST), 56_000, "2 × 28");
        let e = q.admits(&small, &used, "tenant").expect_err("12Gi > 10Gi");
        assert!(e.contains("limits memory to 10Gi"), "{e}");
        assert!(e.contains("8Gi used"), "{e}");
        let one = Usage::of_counts(&BTreeMap::from([("p.small".to_string(), 1)]), |_| {
            Some(&small)
        });
        assert!(q.admits(&small, &one, "tenant").is_ok());
    }

    #[test]
    fn a_node_type_the_selector_does_not_select_is_refused_by_name() {
        let small = node_type("small", "2", "4Gi");
        let q =
            quota(json!({"nodeTypeSelector": {"matchLabels": {"autonodes.io/node-type": "big"}}}));
        let e = q
            .admits(&small, &Usage::default(), "tenant")
            .expect_err("not selected");
        assert!(e.contains("does not allow node type p.small"), "{e}");
        let q = quota(json!({"nodeTypeSelector": {"matchExpressions": [
            {"key": "autonodes.io/node-type", "operator": "In", "values": ["small", "big"]},
        ]}}));
        assert!(q.admits(&small, &Usage::default(), "tenant").is_ok());
    }

    #[test]
    fn quotas_apply_to_the_namespaces_they_list_or_to_every_namespace() {
        let small = node_type("small", "2", "4Gi");
        let none = quota(json!({"namespaces": ["team-a"], "limits": {"nodes": "0"}}));
        assert!(admits(
            std::slice::from_ref(&none),
            "team-b",
            &Usage::default(),
            &small
        )
        .is_ok());
        assert!(admits(
            std::slice::from_ref(&none),
            "team-a",
            &Usage::default(),
            &small
        )
        .is_err());
        let all = quota(json!({"limits": {"nodes": "0"}}));
        assert!(admits(&[all], "anywhere", &Usage::default(), &small).is_err());
    }

    #[test]
    fn a_quota_whose_limits_do_not_parse_lets_nothing_through() {
        let small = node_type("small", "2", "4Gi");
        let mut q = quota(json!({}));
        q = PreparedQuota::new(
            "broken",
            &NodeQuotaSpec {
                limits: ResourceList::from([("memory".to_string(), Quantity("lots".into()))]),
                ..q.spec
            },
        );
        let e = q
            .admits(&small, &Usage::default(), "t")
            .expect_err("broken");
        assert!(e.contains("cannot be applied"), "{e}");
    }

    #[test]
    fn usage_is_reported_for_the_limited_resources_and_nodes() {
        let small = node_type("small", "2", "4Gi");
        let q = quota(json!({"limits": {"cpu": "10", "memory": "32Gi"}}));
        let used = Usage::of_counts(&BTreeMap::from([("p.small".to_string(), 3)]), |_| {
            Some(&small)
        });
        let report = used.report(&q.limits);
        assert_eq!(report["nodes"].0, "3");
        assert_eq!(report["cpu"].0, "6");
        assert_eq!(report["memory"].0, "12Gi");
        assert!(!report.contains_key("cost"));
    }
}
