//! Zones: a NodeProvider or NodeType lists the zones of its host cluster its VMs may run in,
//! as the values of its `topology.kubernetes.io/zone` property (`zone-a,zone-b`). A claim
//! scheduled to such a type gets one zone, fixed in its status with the type: the zone its
//! requirements (and its pool's) pin, else the one the type's claims use least. The zone is
//! the node's `topology.kubernetes.io/zone` label and the VM's host node affinity
//! ([`crate::template::placement::require_host_zone`]). Pure code, no I/O.

use std::collections::BTreeMap;

use crate::properties::PROP_ZONE;
use crate::requirements::{Offer, Operator, Requirement};

/// The zone a new claim of a type goes to. `offer` is the type's zone property value;
/// `requirements` are the claim's (and its pool's) requirements on [`PROP_ZONE`]; `in_use`
/// counts the type's claims per zone. Among the zones the type offers that every
/// requirement accepts, the one with the fewest claims; ties go to the zone listed first
/// (in the type's list, or for `*` in the requirements' `In` values). `None` when the type
/// has no zone property, or offers any zone (`*`) and no requirement names one.
pub fn choose_zone(
    offer: Option<&str>,
    requirements: &[&Requirement],
    in_use: &BTreeMap<String, i64>,
) -> Option<String> {
    choose_zone_where(offer, requirements, in_use, |_| true)
}

/// The zones a zone property value lists (`zone-a` or `zone-a,zone-b`); `None` when it
/// offers any zone (`*`).
pub fn listed(offer: &str) -> Option<Vec<&str>> {
    match Offer::parse(offer) {
        Offer::One => Some(vec![offer.trim()]),
        Offer::Several(zones) => Some(zones),
        Offer::Any => None,
    }
}

/// [`choose_zone`] among the zones `allowed` accepts (where the host has room for the VM).
pub(crate) fn choose_zone_where(
    offer: Option<&str>,
    requirements: &[&Requirement],
    in_use: &BTreeMap<String, i64>,
    allowed: impl Fn(&str) -> bool,
) -> Option<String> {
    let offer_value = offer?;
    let accepted = |zone: &str| {
        let single = BTreeMap::from([(PROP_ZONE.to_string(), zone.to_string())]);
        requirements.iter().all(|r| r.matches(&single).is_ok())
    };
    let candidates: Vec<&str> = match listed(offer_value) {
        Some(zones) => zones,
        None => requirements
            .iter()
            .flat_map(|r| match &r.operator {
                Operator::In(values) => values.iter().map(String::as_str).collect(),
                _ => Vec::new(),
            })
            .collect(),
    };
    candidates
        .into_iter()
        .filter(|z| !z.is_empty() && accepted(z) && allowed(z))
        .enumerate()
        .min_by_key(|(i, z)| (in_use.get(*z).copied().unwrap_or(0), *i))
        .map(|(_, z)| z.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(operator: Operator) -> Requirement {
        Requirement {
            key: PROP_ZONE.to_string(),
            operator,
        }
    }

    fn used(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(z, n)| (z.to_string(), *n)).collect()
    }

    #[test]
    fn an_unpinned_claim_goes_to_the_zone_its_type_uses_least_ties_in_listed_order() {
        let offer = Some("zone-a, zone-b, zone-c");
        assert_eq!(
            choose_zone(offer, &[], &used(&[])).as_deref(),
            Some("zone-a")
        );
        assert_eq!(
            choose_zone(offer, &[], &used(&[("zone-a", 1)])).as_deref(),
            Some("zone-b")
        );
        assert_eq!(
            choose_zone(
                offer,
                &[],
                &used(&[("zone-a", 2), ("zone-b", 1), ("zone-c", 1)])
            )
            .as_deref(),
            Some("zone-b")
        );
    }

    #[test]
    fn a_requirement_pins_or_excludes_zones_whatever_their_use() {
        let offer = Some("zone-a,zone-b,zone-c");
        let pin = req(Operator::In(vec!["zone-c".into()]));
        assert_eq!(
            choose_zone(offer, &[&pin], &used(&[("zone-c", 9)])).as_deref(),
            Some("zone-c")
        );
        let not_a = req(Operator::NotIn(vec!["zone-a".into()]));
        assert_eq!(
            choose_zone(offer, &[&not_a], &used(&[("zone-b", 1)])).as_deref(),
            Some("zone-c")
        );
        let elsewhere = req(Operator::In(vec!["zone-x".into()]));
        assert_eq!(choose_zone(offer, &[&elsewhere], &used(&[])), None);
    }

    #[test]
    fn a_single_zone_is_that_zone_and_any_zone_is_only_what_a_requirement_names() {
        assert_eq!(
            choose_zone(Some("zone-a"), &[], &used(&[])).as_deref(),
            Some("zone-a")
        );
        assert_eq!(choose_zone(None, &[], &used(&[])), None);
        assert_eq!(choose_zone(Some("*"), &[], &used(&[])), None);
        let either = req(Operator::In(vec!["zone-x".into(), "zone-y".into()]));
        assert_eq!(
            choose_zone(Some("*"), &[&either], &used(&[("zone-x", 1)])).as_deref(),
            Some("zone-y")
        );
    }

    #[test]
    fn a_zone_the_host_has_no_room_in_is_passed_over_whatever_its_use() {
        let offer = Some("zone-a,zone-b");
        let no_room_in_a = |z: &str| z != "zone-a";
        assert_eq!(
            choose_zone_where(offer, &[], &used(&[("zone-b", 5)]), no_room_in_a).as_deref(),
            Some("zone-b")
        );
        assert_eq!(choose_zone_where(offer, &[], &used(&[]), |_| false), None);
    }

    proptest! {
        /// Claims scheduled one after another without requirements spread evenly: no two
        /// zones ever differ by more than one claim.
        #[test]
        fn claims_scheduled_one_by_one_never_leave_zones_more_than_one_apart(
            zones in 1usize..6, claims in 0usize..40,
        ) {
            let names: Vec<String> = (0..zones).map(|i| format!("z{i}")).collect();
            let offer = names.join(",");
            let mut in_use: BTreeMap<String, i64> = BTreeMap::new();
            for _ in 0..claims {
                let z = choose_zone(Some(&offer), &[], &in_use).expect("a zone");
                *in_use.entry(z).or_insert(0) += 1;
                let counts: Vec<i64> = names.iter().map(|n| in_use.get(n).copied().unwrap_or(0)).collect();
                let (lo, hi) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
                prop_assert!(hi - lo <= 1, "{:?}", counts);
            }
        }
    }
}
