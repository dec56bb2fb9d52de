//! Requirements and tolerations: the one matcher of a key/operator/values requirement
//! against a map of labels or properties, and of tolerations against taints.
//!
//! Both sides of autonodes use it: a claim's requirements against a node type's properties
//! ([`crate::scheduling::CheckedRequirement`], which validates them first and reports why
//! one fails), and a pending pod's `nodeSelector`, required node affinity and tolerations
//! against the labels and taints a pool's node would have ([`crate::pool::pack::accepts`]).
//!
//! A pod's requirements come as Kubernetes writes them ([`NodeSelectorRequirement`]) and are
//! read the way the scheduler reads them: an operator it does not know, or `Gt`/`Lt`
//! without an integer, is a requirement no node meets ([`Requirement::from_node_selector`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// How a requirement compares the value of its key, with its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    /// The key is set and its value is one of these.
    In(Vec<String>),
    /// The key is unset, or its value is none of these.
    NotIn(Vec<String>),
    /// The key is set (any value).
    Exists,
    /// The key is not set.
    DoesNotExist,
    /// The key's value is an integer greater than this one.
    Gt(i64),
    /// The key's value is an integer less than this one.
    Lt(i64),
    /// The key's value is an integer greater than or equal to this one.
    Gte(i64),
    /// The key's value is an integer less than or equal to this one.
    Lte(i64),
}

/// A requirement on the value of one key of a label or property map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label or property key.
    pub key: String,
    /// How its value is compared.
    pub operator: Operator,
}

/// Why a requirement does not hold on a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequirementMiss {
    /// The key is absent or has a value the requirement excludes.
    NotMet {
        /// The key's value, if set.
        actual: Option<String>,
    },
    /// Gt/Lt/Gte/Lte on a key whose value is not an integer.
    NotAnInteger {
        /// The key's value.
        actual: String,
    },
}

/// A value read as an integer for `Gt`/`Lt` (surrounding whitespace ignored); `None` if it
/// is none.
pub fn integer(value: &str) -> Option<i64> {
    value.trim().parse().ok()
}

impl Requirement {
    /// Whether the requirement holds on `map` (labels or properties), and if not, why.
    pub fn matches(&self, map: &BTreeMap<String, String>) -> Result<(), RequirementMiss> {
        let actual = map.get(&self.key);
        let not_met = || RequirementMiss::NotMet {
            actual: actual.cloned(),
        };
        let ok = match &self.operator {
            Operator::In(values) => actual.is_some_and(|a| values.contains(a)),
            Operator::NotIn(values) => actual.is_none_or(|a| !values.contains(a)),
            Operator::Exists => actual.is_some(),
            Operator::DoesNotExist => actual.is_none(),
            Operator::Gt(bound)
            | Operator::Lt(bound)
            | Operator::Gte(bound)
            | Operator::Lte(bound) => {
                let Some(a) = actual else {
                    return Err(not_met());
                };
                let value = integer(a)
                    .ok_or_else(|| RequirementMiss::NotAnInteger { actual: a.clone() })?;
                match self.operator {
                    Operator::Gt(_) => value > *bound,
                    Operator::Lt(_) => value < *bound,
                    Operator::Gte(_) => value >= *bound,
                    _ => value <= *bound,
                }
            }
        };
        if ok {
            Ok(())
        } else {
            Err(not_met())
        }
    }

    /// Whether the requirement holds on a node type's `properties`, whose values may offer
    /// several choices: `a,b` is either `a` or `b`, `*` is any value ([`Offer`]). The
    /// requirement holds when some choice meets it (so `NotIn [a]` holds on `a,b`, and
    /// every operator but `DoesNotExist` holds on `*`); a single value is compared as in
    /// [`Requirement::matches`].
    pub fn matches_offer(
        &self,
        properties: &BTreeMap<String, String>,
    ) -> Result<(), RequirementMiss> {
        let Some(actual) = properties.get(&self.key) else {
            return self.matches(properties);
        };
        let choices = match Offer::parse(actual) {
            Offer::Any => {
                return match self.operator {
                    Operator::DoesNotExist => Err(RequirementMiss::NotMet {
                        actual: Some(actual.clone()),
                    }),
                    _ => Ok(()),
                }
            }
            Offer::One => return self.matches(properties),
            Offer::Several(choices) => choices,
        };
        let mut no_integer = true;
        for choice in choices {
            let single = BTreeMap::from([(self.key.clone(), choice.to_string())]);
            match self.matches(&single) {
                Ok(()) => return Ok(()),
                Err(RequirementMiss::NotMet { .. }) => no_integer = false,
                Err(RequirementMiss::NotAnInteger { .. }) => {}
            }
        }
        // `In` may list the whole text as one value (a value may itself contain a comma).
        if matches!(self.operator, Operator::In(_)) && self.matches(properties).is_ok() {
            return Ok(());
        }
        Err(if no_integer {
            RequirementMiss::NotAnInteger {
                actual: actual.clone(),
            }
        } else {
            RequirementMiss::NotMet {
                actual: Some(actual.clone()),
            }
        })
    }

    /// A pod's node-affinity requirement as the scheduler reads it; `None` for one no node
    /// meets: an unknown operator, or `Gt`/`Lt` whose first value is not an integer
    /// written without surrounding spaces. `Exists`/`DoesNotExist` ignore values.
    pub fn from_node_selector(r: &NodeSelectorRequirement) -> Option<Requirement> {
        let values = r.values.as_deref().unwrap_or_default();
        // Kubernetes parses the bound as written: spaces around it make it no integer.
        let bound = || {
            values
                .first()
                .filter(|v| v.trim() == v.as_str())
                .and_then(|v| integer(v))
        };
        let operator = match r.operator.as_str() {
            "In" => Operator::In(values.to_vec()),
            "NotIn" => Operator::NotIn(values.to_vec()),
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt(bound()?),
            "Lt" => Operator::Lt(bound()?),
            _ => return None,
        };
        Some(Requirement {
            key: r.key.clone(),
            operator,
        })
    }
}

/// What a node type's property value offers: one value, several (`a,b`: either), or any
/// value (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Offer<'a> {
    /// A single value (no comma, not `*`).
    One,
    /// Either of these (the value split at commas, blanks trimmed, empty parts dropped).
    Several(Vec<&'a str>),
    /// Any value.
    Any,
}

impl<'a> Offer<'a> {
    /// Reads a property value.
    pub(crate) fn parse(value: &'a str) -> Offer<'a> {
        if value.trim() == "*" {
            return Offer::Any;
        }
        if !value.contains(',') {
            return Offer::One;
        }
        let parts: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if parts.contains(&"*") {
            Offer::Any
        } else {
            Offer::Several(parts)
        }
    }
}

/// Whether a pod's `nodeSelector` matches `labels`: every key set to exactly its value.
pub(crate) fn selector_matches(
    node_selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    node_selector.iter().all(|(key, value)| {
        Requirement {
            key: key.clone(),
            operator: Operator::In(vec![value.clone()]),
        }
        .matches(labels)
        .is_ok()
    })
}

/// Whether a label selector (`matchLabels` and `matchExpressions`) selects `labels`; an
/// empty selector selects everything, as in Kubernetes. An operator it does not know
/// selects nothing.
pub(crate) fn label_selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let by_labels = selector
        .match_labels
        .as_ref()
        .is_none_or(|m| selector_matches(m, labels));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let operator = match e.operator.as_str() {
            "In" => Operator::In(values),
            "NotIn" => Operator::NotIn(values),
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            _ => return false,
        };
        Requirement {
            key: e.key.clone(),
            operator,
        }
        .matches(labels)
        .is_ok()
    });
    by_labels && by_expressions
}

/// Whether a required node-affinity term matches `labels`: every match expression holds.
/// A term with `matchFields` names a node (`metadata.name`), which a node yet to be made
/// cannot meet; an empty term matches nothing (as in the scheduler).
pub(crate) fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    fields.is_empty()
        && !exprs.is_empty()
        && exprs
            .iter()
            .all(|r| Requirement::from_node_selector(r).is_some_and(|r| r.matches(labels).is_ok()))
}

/// Whether `toleration` tolerates `taint` (the scheduler's rules).
pub(crate) fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    if !effect_ok {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Whether a pod with `tolerations` may be scheduled onto a node with `taints`: every
/// `NoSchedule` and `NoExecute` taint is tolerated (`PreferNoSchedule` only steers).
pub(crate) fn tolerates_taints(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_selector_needs_every_match_label_and_expression_and_an_empty_one_selects_all() {
        let labels = BTreeMap::from([
            ("app".to_string(), "db".to_string()),
            ("tier".to_string(), "gold".to_string()),
        ]);
        let sel = |v: serde_json::Value| -> LabelSelector {
            serde_json::from_value(v).expect("selector")
        };
        assert!(label_selector_matches(&sel(serde_json::json!({})), &labels));
        assert!(label_selector_matches(
            &sel(serde_json::json!({"matchLabels": {"app": "db"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]},
                                     {"key": "zone", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!label_selector_matches(
            &sel(serde_json::json!({"matchLabels": {"app": "web"}})),
            &labels
        ));
        assert!(!label_selector_matches(
            &sel(
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]})
            ),
            &labels
        ));
        assert!(!label_selector_matches(
            &sel(
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]})
            ),
            &labels
        ));
    }

    fn on(key: &str, operator: Operator) -> Requirement {
        Requirement {
            key: key.to_string(),
            operator,
        }
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn a_property_offering_several_values_meets_a_requirement_any_of_them_meets() {
        let zones = labels(&[("zone", "a, b"), ("cores", "2,8")]);
        assert!(on("zone", Operator::In(strings(&["b"])))
            .matches_offer(&zones)
            .is_ok());
        assert!(on("zone", Operator::In(strings(&["c"])))
            .matches_offer(&zones)
            .is_err());
        assert!(on("zone", Operator::NotIn(strings(&["a"])))
            .matches_offer(&zones)
            .is_ok());
        assert!(on("zone", Operator::NotIn(strings(&["a", "b"])))
            .matches_offer(&zones)
            .is_err());
        assert!(on("cores", Operator::Gt(4)).matches_offer(&zones).is_ok());
        assert!(on("cores", Operator::Lt(2)).matches_offer(&zones).is_err());
        assert!(on("zone", Operator::Exists).matches_offer(&zones).is_ok());
        assert!(on("zone", Operator::DoesNotExist)
            .matches_offer(&zones)
            .is_err());
        // The whole text still counts as one value.
        assert!(on("zone", Operator::In(strings(&["a, b"])))
            .matches_offer(&zones)
            .is_ok());
        assert_eq!(
            on("zone", Operator::Gt(1)).matches_offer(&zones),
            Err(RequirementMiss::NotAnInteger {
                actual: "a, b".into()
            })
        );
    }

    #[test]
    fn a_property_offering_any_value_meets_every_requirement_but_does_not_exist() {
        let any = labels(&[("zone", "*")]);
        for op in [
            Operator::In(strings(&["x"])),
            Operator::NotIn(strings(&["x"])),
            Operator::Exists,
            Operator::Gt(10),
            Operator::Lt(-10),
        ] {
            assert!(on("zone", op.clone()).matches_offer(&any).is_ok(), "{op:?}");
        }
        assert!(on("zone", Operator::DoesNotExist)
            .matches_offer(&any)
            .is_err());
        // Labels are single values: `matches` reads `*` literally.
        assert!(on("zone", Operator::In(strings(&["x"])))
            .matches(&any)
            .is_err());
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod_requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn holds(key: &str, operator: &str, values: &[&str], on: &BTreeMap<String, String>) -> bool {
        Requirement::from_node_selector(&pod_requirement(key, operator, values))
            .is_some_and(|r| r.matches(on).is_ok())
    }

    #[test]
    fn gt_and_lt_compare_integers_not_strings_and_report_values_that_are_not_integers() {
        let on = labels(&[("cores", "10"), ("name", "big"), ("padded", " 7 ")]);
        let gt = |key: &str, bound| Requirement {
            key: key.into(),
            operator: Operator::Gt(bound),
        };
        assert!(
            gt("cores", 9).matches(&on).is_ok(),
            "10 > 9 although \"10\" < \"9\""
        );
        assert!(gt("padded", 6).matches(&on).is_ok());
        assert_eq!(
            gt("cores", 10).matches(&on),
            Err(RequirementMiss::NotMet {
                actual: Some("10".into())
            })
        );
        assert_eq!(
            gt("name", 1).matches(&on),
            Err(RequirementMiss::NotAnInteger {
                actual: "big".into()
            })
        );
        assert_eq!(
            gt("absent", 1).matches(&on),
            Err(RequirementMiss::NotMet { actual: None })
        );
    }

    #[test]
    fn a_pod_requirement_the_scheduler_cannot_read_holds_on_no_node() {
        let on = labels(&[("cores", "8"), ("zone", "a")]);
        assert!(!holds("zone", "NotExists", &[], &on), "not a pod operator");
        assert!(!holds("zone", "Matches", &["a"], &on));
        assert!(!holds("cores", "Gt", &["four"], &on));
        assert!(!holds("cores", "Gt", &[" 4"], &on));
        assert!(!holds("cores", "Lt", &[], &on));
        assert!(holds("cores", "Gt", &["4", "ignored"], &on));
        assert!(holds("zone", "Exists", &["ignored"], &on));
        assert!(!holds("zone", "In", &[], &on));
        assert!(holds("zone", "NotIn", &[], &on));
    }

    #[test]
    fn a_node_selector_needs_every_label_with_its_exact_value() {
        let on = labels(&[("kind", "big"), ("zone", "a")]);
        assert!(selector_matches(&BTreeMap::new(), &on));
        assert!(selector_matches(&labels(&[("kind", "big")]), &on));
        assert!(!selector_matches(
            &labels(&[("kind", "big"), ("zone", "b")]),
            &on
        ));
        assert!(!selector_matches(&labels(&[("gpu", "")]), &on));
    }

    #[test]
    fn an_affinity_term_matches_when_all_its_expressions_hold_and_it_names_no_field() {
        let on = labels(&[("zone", "a"), ("cores", "8")]);
        let term = |exprs: Vec<NodeSelectorRequirement>, fields: Option<Vec<_>>| NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: fields,
        };
        assert!(term_matches(
            &term(
                vec![
                    pod_requirement("zone", "In", &["a", "b"]),
                    pod_requirement("cores", "Lt", &["16"])
                ],
                None
            ),
            &on
        ));
        assert!(!term_matches(
            &term(
                vec![
                    pod_requirement("zone", "In", &["a"]),
                    pod_requirement("gpu", "Exists", &[])
                ],
                None
            ),
            &on
        ));
        assert!(!term_matches(&term(vec![], None), &on), "empty term");
        assert!(!term_matches(
            &term(
                vec![pod_requirement("zone", "In", &["a"])],
                Some(vec![pod_requirement("metadata.name", "In", &["n1"])])
            ),
            &on
        ));
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    fn toleration(
        key: Option<&str>,
        operator: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            ..Toleration::default()
        }
    }

    #[test]
    fn a_toleration_matches_key_value_and_effect_and_exists_without_a_key_tolerates_all() {
        let t = taint("dedicated", Some("x"), "NoSchedule");
        assert!(tolerates(
            &toleration(Some("dedicated"), None, Some("x"), None),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("dedicated"), Some("Equal"), Some("y"), None),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("dedicated"), Some("Exists"), None, Some("NoExecute")),
            &t
        ));
        assert!(tolerates(
            &toleration(Some("dedicated"), Some("Exists"), None, Some("")),
            &t
        ));
        assert!(tolerates(&toleration(None, Some("Exists"), None, None), &t));
        assert!(!tolerates(&toleration(None, Some("Equal"), None, None), &t));
    }

    #[test]
    fn only_no_schedule_and_no_execute_taints_keep_pods_away() {
        let taints = vec![
            taint("soft", None, "PreferNoSchedule"),
            taint("hard", Some("1"), "NoExecute"),
        ];
        assert!(!tolerates_taints(&[], &taints));
        assert!(tolerates_taints(
            &[toleration(Some("hard"), None, Some("1"), None)],
            &taints
        ));
        assert!(tolerates_taints(&[], &taints[..1]));
    }
}
