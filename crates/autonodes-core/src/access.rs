//! Who may use what. A NodeProvider's node types serve only the tenant namespaces its
//! `tenantNamespaceSelector` selects (absent: every namespace), and a controller started
//! with `--require-quota` lets a namespace claim nothing unless a NodeQuota covers it.
//!
//! Both are checked where claims are scheduled (a refused type is passed over, and a claim
//! every fitting type refuses says why) and where pools plan (a pool plans only with the
//! types its namespace may use).

use std::collections::BTreeMap;

use crate::catalogue::{Catalogue, PreparedType};
use crate::quota::PreparedQuota;
use crate::requirements::label_selector_matches;
use crate::scheduling::NoFit;

/// Reason: the provider of every fitting node type serves other namespaces only.
pub const REASON_PROVIDER_NOT_ALLOWED: &str = "ProviderNotAllowed";

/// A tenant namespace as access checks see it.
#[derive(Debug, Clone, Copy)]
pub struct TenantNamespace<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels (`None`: they could not be read; only a provider without a selector,
    /// or with the empty selector, serves it then).
    pub labels: Option<&'a BTreeMap<String, String>>,
}

/// Whether any type of the catalogue serves only some namespaces: only then are a
/// namespace's labels needed.
pub fn restricts(catalogue: &Catalogue) -> bool {
    catalogue
        .types()
        .iter()
        .any(|t| t.tenant_namespaces.is_some())
}

/// Whether the provider of `t` serves `ns`; the error names the provider and namespace.
pub fn provider_admits(t: &PreparedType, ns: &TenantNamespace) -> Result<(), NoFit> {
    let Some(selector) = &t.tenant_namespaces else {
        return Ok(());
    };
    let empty = BTreeMap::new();
    let admitted = label_selector_matches(selector, ns.labels.unwrap_or(&empty))
        && (ns.labels.is_some() || selector == &Default::default());
    if admitted {
        return Ok(());
    }
    let why = if ns.labels.is_some() {
        "its tenantNamespaceSelector does not select the namespace"
    } else {
        "the namespace's labels could not be read"
    };
    Err(NoFit {
        reason: REASON_PROVIDER_NOT_ALLOWED,
        message: format!(
            "NodeProvider {} does not serve namespace {} ({why})",
            t.provider, ns.name
        ),
    })
}

/// The catalogue `ns` may use: the types whose provider serves it.
pub fn allowed(catalogue: &Catalogue, ns: &TenantNamespace) -> Catalogue {
    Catalogue::new(
        catalogue
            .types()
            .iter()
            .filter(|t| provider_admits(t, ns).is_ok())
            .cloned()
            .collect(),
    )
}

/// With `required` (`--require-quota`), a namespace no NodeQuota covers may claim
/// nothing: the error says so. Without it, every namespace may.
pub fn quota_admits(
    required: bool,
    quotas: &[PreparedQuota],
    namespace: &str,
) -> Result<(), String> {
    if !required || quotas.iter().any(|q| q.covers(namespace)) {
        return Ok(());
    }
    Err(format!(
        "no NodeQuota covers namespace {namespace}, and the controller requires one (--require-quota)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{prepare_type, ProviderContext};
    use autonodes_api::NodeQuotaSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn typed(provider: &str, selector: Option<LabelSelector>) -> PreparedType {
        let spec: autonodes_api::NodeTypeSpec = serde_json::from_value(serde_json::json!({
            "providerRef": provider,
            "resources": {"cpu": "1", "memory": "1Gi"},
        }))
        .expect("spec");
        let ctx = ProviderContext {
            tenant_namespaces: selector,
            per_tenant: None,
            ..ProviderContext::for_tests(provider)
        };
        let t = prepare_type(&format!("{provider}.small"), &spec, Some(&ctx));
        assert!(t.problem.is_none(), "{:?}", t.problem);
        t
    }

    fn team(value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([("team".to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_provider_without_a_selector_serves_every_namespace() {
        let t = typed("shared", None);
        let ns = TenantNamespace {
            name: "a",
            labels: None,
        };
        assert!(provider_admits(&t, &ns).is_ok());
    }

    #[test]
    fn a_provider_serves_only_the_namespaces_its_selector_selects() {
        let t = typed("gpu", Some(team("ml")));
        let ml: BTreeMap<String, String> = [("team".to_string(), "ml".to_string())].into();
        let web: BTreeMap<String, String> = [("team".to_string(), "web".to_string())].into();
        assert!(provider_admits(
            &t,
            &TenantNamespace {
                name: "ml",
                labels: Some(&ml)
            }
        )
        .is_ok());
        let refused = provider_admits(
            &t,
            &TenantNamespace {
                name: "web",
                labels: Some(&web),
            },
        )
        .expect_err("web is not selected");
        assert_eq!(refused.reason, REASON_PROVIDER_NOT_ALLOWED);
        assert!(refused
            .message
            .contains("NodeProvider gpu does not serve namespace web"));
    }

    #[test]
    fn a_namespace_whose_labels_cannot_be_read_is_served_only_by_unrestricted_providers() {
        let unknown = TenantNamespace {
            name: "x",
            labels: None,
        };
        assert!(provider_admits(&typed("gpu", Some(team("ml"))), &unknown).is_err());
        assert!(provider_admits(&typed("any", Some(LabelSelector::default())), &unknown).is_ok());
    }

    #[test]
    fn the_allowed_catalogue_keeps_only_the_types_of_providers_serving_the_namespace() {
        let catalogue = Catalogue::new(vec![typed("shared", None), typed("gpu", Some(team("ml")))]);
        assert!(restricts(&catalogue));
        let web: BTreeMap<String, String> = [("team".to_string(), "web".to_string())].into();
        let allowed = allowed(
            &catalogue,
            &TenantNamespace {
                name: "web",
                labels: Some(&web),
            },
        );
        let names: Vec<&str> = allowed
            .types()
            .iter()
            .map(|t| t.provider.as_str())
            .collect();
        assert_eq!(names, ["shared"]);
    }

    #[test]
    fn with_quotas_required_only_a_covered_namespace_may_claim() {
        let quota = PreparedQuota::new(
            "team-a",
            &NodeQuotaSpec {
                namespaces: vec!["a".to_string()],
                ..Default::default()
            },
        );
        assert!(quota_admits(false, &[], "b").is_ok());
        assert!(quota_admits(true, std::slice::from_ref(&quota), "a").is_ok());
        let refused = quota_admits(true, &[quota], "b").expect_err("b is not covered");
        assert!(refused.contains("--require-quota"), "{refused}");
    }
}
