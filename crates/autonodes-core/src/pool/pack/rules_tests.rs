//! Tests of packing with the rules pods set on other pods ([`super::constraints`],
//! [`super::topology`]): pod affinity and anti-affinity on any key, required and preferred,
//! topology spread with its options, and how new nodes grow.

use std::collections::BTreeMap;

use serde_json::json;

use super::packer::pack;
use super::tests::candidate;
use super::*;

/// A pending pod from its JSON `spec` additions, asking for `cpu` millicores and 256Mi.
fn pod(name: &str, labels: serde_json::Value, cpu: i128, spec: serde_json::Value) -> PendingPod {
    let mut s = json!({"containers": [{"name": "c", "resources": {"requests": {
        "cpu": format!("{cpu}m"), "memory": "256Mi"}}}]});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": s,
    }))
    .expect("pod");
    PendingPod::from_pod(&p)
}

/// The pods of each new node, by node type, sorted.
fn nodes(p: &Packing) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = p
        .new_nodes
        .iter()
        .map(|n| {
            let mut pods: Vec<String> = n
                .pods
                .iter()
                .map(|k| k.trim_start_matches("default/").to_string())
                .collect();
            pods.sort();
            (n.node_type.clone(), pods)
        })
        .collect();
    out.sort();
    out
}

fn required_affinity(kind: &str, key: &str, selects: serde_json::Value) -> serde_json::Value {
    json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": selects}}
    ]}}})
}

fn preferred_affinity(kind: &str, key: &str, selects: serde_json::Value) -> serde_json::Value {
    json!({"affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": selects}}}
    ]}}})
}

fn spread(key: &str, selects: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": selects}});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    json!({"topologySpreadConstraints": [c]})
}

/// `cache` (1.5 CPU) and `web` (1.5 CPU, required pod affinity on the hostname to
/// `cache`).
fn cache_and_web() -> (PendingPod, PendingPod) {
    let cache = pod("cache", json!({"app": "cache"}), 1500, json!({}));
    let web = pod(
        "web",
        json!({"app": "web"}),
        1500,
        required_affinity("podAffinity", HOST, json!({"app": "cache"})),
    );
    (cache, web)
}

const HOST: &str = HOSTNAME_TOPOLOGY;
const ZONE: &str = ZONE_TOPOLOGY;

#[test]
fn pods_with_required_affinity_on_the_hostname_join_the_node_of_the_pods_they_select() {
    // The cache goes first (it selects itself: the first of its kind may go anywhere);
    // the web pods need a node with a cache pod, and a pod selecting nothing that exists
    // gets no node.
    let cache = pod(
        "cache",
        json!({"app": "cache"}),
        500,
        required_affinity("podAffinity", HOST, json!({"app": "cache"})),
    );
    let web = |n: &str| {
        pod(
            n,
            json!({"app": "web"}),
            2000,
            required_affinity("podAffinity", HOST, json!({"app": "cache"})),
        )
    };
    let lost = pod(
        "lost",
        json!({"app": "web"}),
        100,
        required_affinity("podAffinity", HOST, json!({"app": "db"})),
    );
    let out = pack(
        &[web("web-0"), cache, web("web-1"), lost],
        &[],
        &[candidate("small", 4000, &[]), candidate("big", 16000, &[])],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(
        nodes(&out),
        [(
            "big".to_string(),
            vec!["cache".into(), "web-0".into(), "web-1".into()]
        )],
        "{out:?}"
    );
    assert_eq!(out.blocked_by_constraints, ["default/lost"]);
}

#[test]
fn anti_affinity_on_the_zone_keeps_selected_pods_in_different_zones_and_blocks_a_third() {
    let db = |n: &str| {
        pod(
            n,
            json!({"app": "db"}),
            500,
            required_affinity("podAntiAffinity", ZONE, json!({"app": "db"})),
        )
    };
    let out = pack(
        &[db("db-0"), db("db-1"), db("db-2")],
        &[],
        &[
            candidate("a", 4000, &[(ZONE, "a")]),
            candidate("b", 4000, &[(ZONE, "b")]),
        ],
        &Limits::default(),
        (0, Amount::default()),
    );
    let zones: Vec<String> = nodes(&out).into_iter().map(|(t, _)| t).collect();
    assert_eq!(zones, ["a", "b"]);
    assert_eq!(out.blocked_by_constraints.len(), 1);
    // A running db pod in zone a (on an in-flight node) sends the next one to zone b.
    let bin = Bin {
        claim: "in-a".into(),
        shape: NodeShape {
            labels: BTreeMap::from([(ZONE.to_string(), "a".to_string())]),
            taints: Vec::new(),
        },
        free: candidate("a", 4000, &[]).allocatable,
        residents: vec![db("db-old")],
        replaceable: false,
    };
    let out = pack(
        &[db("db-new")],
        &[bin],
        &[
            candidate("a", 4000, &[(ZONE, "a")]),
            candidate("b", 4000, &[(ZONE, "b")]),
        ],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert!(out.placed.is_empty());
    assert_eq!(nodes(&out), [("b".to_string(), vec!["db-new".to_string()])]);
}

#[test]
fn a_running_pods_anti_affinity_keeps_a_pod_it_selects_off_its_node() {
    // The newcomer has no rule; the resident's term selects it.
    let resident = pod(
        "guard",
        json!({"app": "guard"}),
        500,
        required_affinity("podAntiAffinity", HOST, json!({"app": "noisy"})),
    );
    let bin = Bin {
        claim: "c".into(),
        shape: NodeShape::default(),
        free: candidate("x", 4000, &[]).allocatable,
        residents: vec![resident],
        replaceable: false,
    };
    let noisy = pod("noisy", json!({"app": "noisy"}), 500, json!({}));
    let quiet = pod("quiet", json!({"app": "quiet"}), 500, json!({}));
    let out = pack(
        &[noisy, quiet],
        &[bin],
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert_eq!(
        out.placed.get("c"),
        Some(&vec!["default/quiet".to_string()])
    );
    assert_eq!(
        nodes(&out),
        [("small".to_string(), vec!["noisy".to_string()])]
    );
}

#[test]
fn spread_over_hostnames_with_max_skew_one_gives_each_selected_pod_a_node_and_others_share() {
    let web = |n: &str| {
        pod(
            n,
            json!({"app": "web"}),
            500,
            spread(HOST, json!({"app": "web"}), json!({})),
        )
    };
    let other = pod("other", json!({"app": "other"}), 500, json!({}));
    let out = pack(
        &[web("w0"), web("w1"), web("w2"), other],
        &[],
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (0, Amount::default()),
    );
    let per_node: Vec<usize> = nodes(&out).iter().map(|(_, p)| p.len()).collect();
    assert_eq!(per_node.len(), 3, "{out:?}");
    for (_, pods) in nodes(&out) {
        assert_eq!(pods.iter().filter(|p| p.starts_with('w')).count(), 1);
    }
}

#[test]
fn min_domains_above_the_zones_there_are_caps_each_zone_at_max_skew() {
    // Two zones and minDomains 3: the least count is taken as zero, so each zone holds at
    // most one selected pod; without minDomains all four find a place.
    let web = |n: &str, extra: serde_json::Value| {
        pod(
            n,
            json!({"app": "web"}),
            500,
            spread(ZONE, json!({"app": "web"}), extra),
        )
    };
    let zones = [
        candidate("a", 4000, &[(ZONE, "a")]),
        candidate("b", 4000, &[(ZONE, "b")]),
    ];
    let with: Vec<PendingPod> = (0..4)
        .map(|i| web(&format!("w{i}"), json!({"minDomains": 3})))
        .collect();
    let out = pack(
        &with,
        &[],
        &zones,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.iter().map(|n| n.pods.len()).sum::<usize>(), 2);
    assert_eq!(out.blocked_by_constraints.len(), 2);
    let without: Vec<PendingPod> = (0..4).map(|i| web(&format!("w{i}"), json!({}))).collect();
    let out = pack(
        &without,
        &[],
        &zones,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.iter().map(|n| n.pods.len()).sum::<usize>(), 4);
}

#[test]
fn node_affinity_policy_ignore_counts_zones_the_pod_may_not_go_to() {
    // The pod may only go to zone a. Honoured (the default), zone b is no domain and the
    // pods pile up in a; ignored, zone b counts with zero pods and caps a at one.
    let web = |n: &str, policy: &str| {
        let mut spec = spread(
            ZONE,
            json!({"app": "web"}),
            json!({"nodeAffinityPolicy": policy}),
        );
        spec["nodeSelector"] = json!({ZONE: "a"});
        pod(n, json!({"app": "web"}), 500, spec)
    };
    let zones = [
        candidate("a", 4000, &[(ZONE, "a")]),
        candidate("b", 4000, &[(ZONE, "b")]),
    ];
    let honour: Vec<PendingPod> = (0..3).map(|i| web(&format!("w{i}"), "Honor")).collect();
    let out = pack(
        &honour,
        &[],
        &zones,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.iter().map(|n| n.pods.len()).sum::<usize>(), 3);
    let ignore: Vec<PendingPod> = (0..3).map(|i| web(&format!("w{i}"), "Ignore")).collect();
    let out = pack(
        &ignore,
        &[],
        &zones,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.iter().map(|n| n.pods.len()).sum::<usize>(), 1);
    assert_eq!(out.blocked_by_constraints.len(), 2);
}

#[test]
fn preferences_are_honoured_while_nodes_can_be_added_and_dropped_at_the_limit() {
    let web = |n: &str| {
        pod(
            n,
            json!({"app": "web"}),
            500,
            preferred_affinity("podAntiAffinity", HOST, json!({"app": "web"})),
        )
    };
    let soft = |n: &str| {
        let mut c = spread(HOST, json!({"app": "api"}), json!({}));
        c["topologySpreadConstraints"][0]["whenUnsatisfiable"] = json!("ScheduleAnyway");
        pod(n, json!({"app": "api"}), 500, c)
    };
    for pods in [
        vec![web("w0"), web("w1"), web("w2")],
        vec![soft("a0"), soft("a1"), soft("a2")],
    ] {
        let apart = pack(
            &pods,
            &[],
            &[candidate("small", 4000, &[])],
            &Limits::default(),
            (0, Amount::default()),
        );
        assert_eq!(apart.new_nodes.len(), 3, "{apart:?}");
        let limits = Limits {
            nodes: Some(1),
            ..Limits::default()
        };
        let together = pack(
            &pods,
            &[],
            &[candidate("small", 4000, &[])],
            &limits,
            (0, Amount::default()),
        );
        assert_eq!(nodes(&together).len(), 1);
        assert_eq!(together.new_nodes[0].pods.len(), 3);
        assert!(together.blocked_by_limits.is_empty());
    }
}

#[test]
fn preferred_node_affinity_chooses_the_type_it_names_when_it_can() {
    let mut spec = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fast"]}]}}
    ]}}});
    let p = pod("p", json!({}), 500, spec.clone());
    let cands = [
        candidate("cheap", 4000, &[("tier", "slow")]),
        candidate("fast", 8000, &[("tier", "fast")]),
    ];
    let out = pack(
        &[p],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out)[0].0, "fast");
    // Where no type offers it, the pod still gets a node.
    spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        ["preference"]["matchExpressions"][0]["values"] = json!(["gold"]);
    let out = pack(
        &[pod("p", json!({}), 500, spec)],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out)[0].0, "cheap");
}

#[test]
fn preferences_are_dropped_one_term_at_a_time_the_lightest_first() {
    // The pod prefers `disk=ssd` (weight 80) and zone a (weight 10); no type offers both.
    // Dropping both at once would take the cheapest type (hdd in zone a); dropping the
    // lighter one first keeps the heavier: ssd in zone b.
    let prefer = |weight: i32, key: &str, value: &str| {
        json!({"weight": weight, "preference": {"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]}]}})
    };
    let spec = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer(10, ZONE, "a"), prefer(80, "disk", "ssd")
    ]}}});
    let cands = [
        candidate("hdd-a", 4000, &[("disk", "hdd"), (ZONE, "a")]),
        candidate("ssd-b", 8000, &[("disk", "ssd"), (ZONE, "b")]),
    ];
    let out = pack(
        &[pod("p", json!({}), 500, spec)],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out)[0].0, "ssd-b", "{out:?}");
    // The same pod with the weights the other way round keeps zone a.
    let spec = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer(80, ZONE, "a"), prefer(10, "disk", "ssd")
    ]}}});
    let out = pack(
        &[pod("p", json!({}), 500, spec)],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out)[0].0, "hdd-a", "{out:?}");
}

#[test]
fn a_pod_keeps_its_heavier_pod_anti_affinity_when_the_lighter_one_cannot_be_met() {
    // `w0` and `w1` each prefer a node without `db` (weight 90) and without each other
    // (weight 5). The pool may add one node beside the one running db: w0 takes it, and
    // w1, which cannot avoid both, drops the lighter term and joins w0 rather than db.
    let web = |n: &str| {
        pod(
            n,
            json!({"app": "web"}),
            500,
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "podAffinityTerm": {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "web"}}}},
                {"weight": 90, "podAffinityTerm": {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "db"}}}}
            ]}}}),
        )
    };
    let small = candidate("small", 4000, &[]);
    let with_db = Bin {
        claim: "db-node".into(),
        shape: small.shape.clone(),
        free: small.allocatable.clone(),
        residents: vec![pod("db", json!({"app": "db"}), 500, json!({}))],
        replaceable: false,
    };
    let limits = Limits {
        nodes: Some(2),
        ..Limits::default()
    };
    let out = pack(
        &[web("w0"), web("w1")],
        &[with_db],
        &[small],
        &limits,
        (1, Amount::default()),
    );
    assert!(out.placed.is_empty(), "nothing beside db: {out:?}");
    assert_eq!(
        nodes(&out),
        [("small".to_string(), vec!["w0".into(), "w1".into()])]
    );
}

#[test]
fn match_label_keys_spread_each_value_of_the_key_on_its_own() {
    // Two revisions of one app, spread per revision: each revision gets one pod per node.
    let web = |n: &str, rev: &str| {
        pod(
            n,
            json!({"app": "web", "rev": rev}),
            500,
            spread(
                HOST,
                json!({"app": "web"}),
                json!({"matchLabelKeys": ["rev"]}),
            ),
        )
    };
    let out = pack(
        &[
            web("a0", "1"),
            web("a1", "1"),
            web("b0", "2"),
            web("b1", "2"),
        ],
        &[],
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.len(), 2, "{out:?}");
    for (_, pods) in nodes(&out) {
        assert_eq!(pods.iter().filter(|p| p.starts_with('a')).count(), 1);
        assert_eq!(pods.iter().filter(|p| p.starts_with('b')).count(), 1);
    }
}

#[test]
fn a_new_node_grows_into_a_larger_type_priced_alike_so_many_pods_need_few_nodes() {
    // 40 one-CPU pods, types of 4, 16 and 32 cores priced by the core: two nodes (32 and
    // 8 cores' worth, the second the cheapest that holds it), not ten small ones.
    let pods: Vec<PendingPod> = (0..40)
        .map(|i| pod(&format!("p{i:02}"), json!({}), 1000, json!({})))
        .collect();
    let cands = [
        candidate("c4", 4000, &[]),
        candidate("c16", 16000, &[]),
        candidate("c32", 32000, &[]),
    ];
    let out = pack(
        &pods,
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    let types: Vec<String> = nodes(&out).into_iter().map(|(t, _)| t).collect();
    assert_eq!(types, ["c16", "c32"]);
    // A node grows only within the limits: at most 8 cores in all gives two 4-core nodes.
    let limits = Limits {
        cpu: Some(8000),
        ..Limits::default()
    };
    let out = pack(&pods, &[], &cands, &limits, (0, Amount::default()));
    let types: Vec<String> = nodes(&out).into_iter().map(|(t, _)| t).collect();
    assert_eq!(types, ["c4", "c4"]);
    assert_eq!(out.blocked_by_limits.len(), 32);
}

#[test]
fn a_new_node_is_made_only_while_the_types_that_hold_its_pods_offer_min_values_of_the_key() {
    // Two types hold a 1-CPU pod, one a 6-CPU pod: with minValues 2 on the type, the small
    // pod gets a node and the large one none.
    let cands = [
        candidate("c4", 4000, &[("autonodes.io/node-type", "c4")]),
        candidate("c8", 8000, &[("autonodes.io/node-type", "c8")]),
    ];
    let mut r = autonodes_api::Requirement {
        key: "autonodes.io/node-type".into(),
        operator: autonodes_api::Operator::Exists,
        values: Vec::new(),
        min_values: Some(2),
    };
    let limits = |r: &autonodes_api::Requirement| Limits {
        min_values: vec![crate::scheduling::CheckedRequirement::new(r, "f").expect("valid")],
        ..Limits::default()
    };
    let out = pack(
        &[
            pod("small", json!({}), 1000, json!({})),
            pod("large", json!({}), 6000, json!({})),
        ],
        &[],
        &cands,
        &limits(&r),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out), [("c4".to_string(), vec!["small".to_string()])]);
    assert_eq!(out.blocked_by_min_values, ["default/large"]);
    // A small node that would have to grow beyond what two types hold stays as it is.
    let pods: Vec<PendingPod> = (0..6)
        .map(|i| pod(&format!("p{i}"), json!({}), 1000, json!({})))
        .collect();
    let out = pack(&pods, &[], &cands, &limits(&r), (0, Amount::default()));
    assert_eq!(out.new_nodes.len(), 2, "{out:?}");
    r.min_values = Some(1);
    let out = pack(&pods, &[], &cands, &limits(&r), (0, Amount::default()));
    assert_eq!(
        nodes(&out),
        [(
            "c8".to_string(),
            pods.iter()
                .map(|p| p.key.trim_start_matches("default/").to_string())
                .collect::<Vec<_>>()
        )]
    );
}

#[test]
fn a_pod_that_must_share_its_partners_node_grows_that_node_into_the_cheapest_type_holding_both() {
    // web needs cache's node; both ask 1.5 CPU. A node of its own for web is no option, so
    // the dearer type per pod is no reason to strand it: the node becomes the 4-CPU type.
    let (cache, web) = cache_and_web();
    let priced = |name: &str, cpu: i128, cost: i64| Candidate {
        cost,
        ..candidate(name, cpu, &[])
    };
    let cands = [
        priced("two", 2000, 10),
        priced("four", 4000, 30),
        priced("eight", 8000, 50),
    ];
    for pods in [[cache.clone(), web.clone()], [web.clone(), cache.clone()]] {
        let out = pack(
            &pods,
            &[],
            &cands,
            &Limits::default(),
            (0, Amount::default()),
        );
        assert_eq!(
            nodes(&out),
            [("four".to_string(), vec!["cache".into(), "web".into()])],
            "{out:?}"
        );
        assert!(out.blocked_by_constraints.is_empty(), "{out:?}");
    }
    // Within the pool's limits: with 3 CPU at most, no type the pool may make holds both,
    // and web is held by the limits.
    let limits = Limits {
        cpu: Some(3000),
        ..Limits::default()
    };
    let out = pack(&[cache, web], &[], &cands, &limits, (0, Amount::default()));
    assert_eq!(nodes(&out), [("two".to_string(), vec!["cache".into()])]);
    assert_eq!(out.blocked_by_limits, ["default/web"], "{out:?}");
}

#[test]
fn a_group_bound_by_required_affinity_that_no_type_holds_is_reported_and_none_of_it_placed() {
    // Three pods, each needing another of the three on its node, 2 CPU each: 6 CPU, and
    // the largest type has 4. Placing two would leave the third pending for ever.
    let trio = |n: &str| {
        pod(
            n,
            json!({"app": "trio"}),
            2000,
            required_affinity("podAffinity", HOST, json!({"app": "trio"})),
        )
    };
    let other = pod("other", json!({}), 500, json!({}));
    let cands = [candidate("c2", 2000, &[]), candidate("c4", 4000, &[])];
    let out = pack(
        &[trio("t0"), trio("t1"), trio("t2"), other],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(nodes(&out), [("c2".to_string(), vec!["other".into()])]);
    assert_eq!(out.blocked_groups.len(), 1, "{out:?}");
    let g = &out.blocked_groups[0];
    assert_eq!(g.pods, ["default/t0", "default/t1", "default/t2"]);
    assert_eq!(g.request.cpu, 6000);
    assert_eq!(g.largest.as_ref().map(|(t, _)| t.as_str()), Some("c4"));
    let said = g.describe();
    assert!(said.contains("must share a node"), "{said}");
    assert!(said.contains("cpu 6"), "{said}");
    assert!(said.contains("c4"), "{said}");
    assert!(out.blocked_by_constraints.is_empty(), "{out:?}");
    // Two of them fit one c4 together.
    let out = pack(
        &[trio("t0"), trio("t1")],
        &[],
        &cands,
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(
        nodes(&out),
        [("c4".to_string(), vec!["t0".into(), "t1".into()])]
    );
}

#[test]
fn the_first_pod_of_a_group_goes_where_the_whole_group_has_room() {
    // An in-flight node with 2 CPU free would take the cache alone, but web could not
    // follow it there: the pair goes to a new node that holds both.
    let (cache, web) = cache_and_web();
    let small = candidate("c2", 2000, &[]);
    let bin = Bin {
        claim: "in-flight".into(),
        shape: small.shape.clone(),
        free: small.allocatable.clone(),
        residents: Vec::new(),
        replaceable: false,
    };
    let out = pack(
        &[web, cache],
        &[bin],
        &[small, candidate("c4", 4000, &[])],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert!(out.placed.is_empty(), "{out:?}");
    assert_eq!(
        nodes(&out),
        [("c4".to_string(), vec!["cache".into(), "web".into()])]
    );
}

mod groups_properties {
    use super::*;
    use proptest::prelude::*;

    /// A group: whether it has a pod the others follow (without terms of its own), and
    /// the millicores of each of its pods.
    fn group() -> impl Strategy<Value = (bool, Vec<i128>)> {
        (any::<bool>(), proptest::collection::vec(1i128..=8, 1..4))
            .prop_map(|(anchor, cpus)| (anchor, cpus.into_iter().map(|c| c * 250).collect()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every pod of a group bound by required affinity on the hostname ends up on one
        /// node whose type holds the whole group, or no pod of it is placed and the group
        /// is reported; the other pods are placed as before.
        #[test]
        fn a_group_bound_by_required_affinity_is_placed_whole_on_a_type_that_holds_it_or_reported(
            groups in proptest::collection::vec(group(), 1..4),
            free in proptest::collection::vec(1i128..=8, 0..5),
            costs in proptest::collection::vec(1i64..100, 3),
        ) {
            let mut pods = Vec::new();
            let mut sizes = Vec::new();
            for (g, (anchor, cpus)) in groups.iter().enumerate() {
                let label = json!({"app": format!("g{g}")});
                let mut members = Vec::new();
                if *anchor {
                    members.push(format!("g{g}-anchor"));
                    pods.push(pod(&format!("g{g}-anchor"), label.clone(), 500, json!({})));
                }
                for (k, cpu) in cpus.iter().enumerate() {
                    let name = format!("g{g}-m{k}");
                    members.push(name.clone());
                    pods.push(pod(&name, label.clone(), *cpu,
                        required_affinity("podAffinity", HOST, label.clone())));
                }
                let total: i128 = cpus.iter().sum::<i128>() + if *anchor { 500 } else { 0 };
                // A lone member with no anchor selects only itself: no group.
                sizes.push((members, total));
            }
            for (k, cpu) in free.iter().enumerate() {
                pods.push(pod(&format!("free-{k}"), json!({}), cpu * 250, json!({})));
            }
            let cands: Vec<Candidate> = [("c2", 2000), ("c4", 4000), ("c8", 8000)]
                .iter()
                .zip(&costs)
                .map(|((n, cpu), cost)| Candidate { cost: *cost, ..candidate(n, *cpu, &[]) })
                .collect();
            let out = pack(&pods, &[], &cands, &Limits::default(), (0, Amount::default()));
            let node_of = |name: &str| {
                out.new_nodes.iter().position(|n| n.pods.iter().any(|p| p == &format!("default/{name}")))
            };
            for n in &out.new_nodes {
                let c = cands.iter().find(|c| c.node_type == n.node_type).expect("a candidate");
                prop_assert!(c.allocatable.covers(&n.request), "{n:?}");
            }
            for (members, total) in &sizes {
                if members.len() < 2 {
                    continue;
                }
                let reported = out.blocked_groups.iter().any(|g| {
                    g.pods.iter().any(|p| p == &format!("default/{}", members[0]))
                });
                if *total > 8000 {
                    prop_assert!(reported, "{members:?} ({total}m) reported: {out:?}");
                    for m in members {
                        prop_assert!(node_of(m).is_none(), "{m} not placed: {out:?}");
                    }
                } else {
                    prop_assert!(!reported, "{members:?}: {out:?}");
                    let first = node_of(&members[0]);
                    prop_assert!(first.is_some(), "{members:?} placed: {out:?}");
                    for m in members {
                        prop_assert_eq!(node_of(m), first, "{} with its group: {:?}", m, out);
                    }
                    let on = &out.new_nodes[first.unwrap_or_default()];
                    let c = cands.iter().find(|c| c.node_type == on.node_type).expect("a candidate");
                    prop_assert!(c.allocatable.cpu >= *total, "{on:?} holds {total}m");
                }
            }
            prop_assert!(out.blocked_by_constraints.is_empty(), "{out:?}");
            prop_assert!(out.blocked_by_capacity.is_empty(), "{out:?}");
        }

        /// With claims on their way (some the pool may still replace), a group is never
        /// split: its pods share one claim's room or one new node; and a claim is given
        /// up for a group's new node only if it may be replaced, got no pod, and would
        /// have taken the group's first pod alone.
        #[test]
        fn a_claim_on_its_way_is_given_up_only_for_a_group_it_could_not_hold_and_only_if_it_serves_no_pod(
            groups in proptest::collection::vec(group(), 1..4),
            bins in proptest::collection::vec((1i128..=8, any::<bool>()), 0..4),
            free in proptest::collection::vec(1i128..=8, 0..3),
        ) {
            let mut pods = Vec::new();
            let mut members_of = Vec::new();
            for (g, (anchor, cpus)) in groups.iter().enumerate() {
                let label = json!({"app": format!("g{g}")});
                let mut members = Vec::new();
                if *anchor {
                    members.push(format!("default/g{g}-anchor"));
                    pods.push(pod(&format!("g{g}-anchor"), label.clone(), 500, json!({})));
                }
                for (k, cpu) in cpus.iter().enumerate() {
                    members.push(format!("default/g{g}-m{k}"));
                    pods.push(pod(&format!("g{g}-m{k}"), label.clone(), *cpu,
                        required_affinity("podAffinity", HOST, label.clone())));
                }
                members_of.push(members);
            }
            for (k, cpu) in free.iter().enumerate() {
                pods.push(pod(&format!("free-{k}"), json!({}), cpu * 250, json!({})));
            }
            let c2 = candidate("c2", 2000, &[]);
            let bins: Vec<Bin> = bins
                .iter()
                .enumerate()
                .map(|(b, (cpu, replaceable))| Bin {
                    claim: format!("b{b}"),
                    shape: c2.shape.clone(),
                    free: Amount { cpu: cpu * 250, ..c2.allocatable.clone() },
                    residents: Vec::new(),
                    replaceable: *replaceable,
                })
                .collect();
            let cands = [c2.clone(), candidate("c4", 4000, &[]), candidate("c8", 8000, &[])];
            let out = pack(&pods, &bins, &cands, &Limits::default(), (bins.len() as i64, Amount::default()));
            let place_of = |key: &String| {
                out.placed.iter().find(|(_, ps)| ps.contains(key)).map(|(c, _)| c.clone())
                    .or_else(|| out.new_nodes.iter().position(|n| n.pods.contains(key)).map(|n| format!("+{n}")))
            };
            for members in members_of.iter().filter(|m| m.len() > 1) {
                let first = place_of(&members[0]);
                for m in members {
                    prop_assert_eq!(place_of(m), first.clone(), "{} with its group: {:?}", m, out);
                }
            }
            let mut given_up = std::collections::BTreeSet::new();
            for (claim, n) in &out.outgrown {
                prop_assert!(given_up.insert(claim.clone()), "{claim} once: {out:?}");
                let bin = bins.iter().find(|b| &b.claim == claim).expect("a bin");
                prop_assert!(bin.replaceable, "{claim}: {out:?}");
                prop_assert!(!out.placed.contains_key(claim), "{claim} serves no pod: {out:?}");
                let node = &out.new_nodes[*n];
                // A group on that node whose first pod the claim would have held alone.
                let held = members_of.iter().filter(|m| m.len() > 1 && node.pods.contains(&m[0])).any(|g| {
                    pods.iter().any(|p| p.key == g[0] && bin.free.covers(&p.request))
                });
                prop_assert!(held, "{claim} gives way to a group whose first pod it held: {out:?}");
            }
        }
    }
}

#[test]
fn a_group_that_fits_a_nodes_room_moves_there_whole_without_any_new_node_type() {
    // As consolidation asks: may cache and web leave their node for another's room?
    let (cache, web) = cache_and_web();
    let room = |name: &str, cpu: i128| {
        let c = candidate("c", cpu, &[]);
        Bin {
            claim: name.into(),
            shape: c.shape.clone(),
            free: c.allocatable.clone(),
            residents: Vec::new(),
            replaceable: false,
        }
    };
    let pods = [&cache, &web];
    let out = super::packer::place(
        &pods,
        &[room("two", 2000), room("four", 4000)],
        &[],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(
        out.placed.get("four").map(Vec::len),
        Some(2),
        "both on the node with room for both: {out:?}"
    );
    assert!(out.blocked_groups.is_empty(), "{out:?}");
    let out = super::packer::place(
        &pods,
        &[room("two", 2000), room("other-two", 2000)],
        &[],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert!(out.placed.is_empty(), "not split: {out:?}");
    assert_eq!(out.blocked_groups.len(), 1, "{out:?}");
}

/// `cache` (1.5 CPU) and `web` (1.5 CPU, required affinity on the hostname to `cache`),
/// and a claim of a 2-CPU type on its way, made for `cache` before `web` came.
fn late_partner() -> (PendingPod, PendingPod, Candidate, Bin) {
    let (cache, web) = cache_and_web();
    let small = candidate("c2", 2000, &[]);
    let bin = Bin {
        claim: "for-cache".into(),
        shape: small.shape.clone(),
        free: small.allocatable.clone(),
        residents: Vec::new(),
        replaceable: true,
    };
    (cache, web, small, bin)
}

#[test]
fn a_claim_that_has_not_joined_gives_way_to_one_holding_its_pod_and_the_partner_that_came_later() {
    let (cache, web, small, bin) = late_partner();
    let out = pack(
        &[cache, web],
        &[bin],
        &[small, candidate("c4", 4000, &[])],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert_eq!(
        nodes(&out),
        [("c4".to_string(), vec!["cache".into(), "web".into()])]
    );
    assert_eq!(out.outgrown, [("for-cache".to_string(), 0)], "{out:?}");
}

#[test]
fn a_claim_that_runs_pods_or_is_not_the_pool_s_or_takes_other_pods_is_never_replaced() {
    let (cache, web, small, bin) = late_partner();
    let cands = [small, candidate("c4", 4000, &[])];
    // Not replaceable (its node runs a pod, or another pool owns it): kept.
    let kept = Bin {
        replaceable: false,
        ..bin.clone()
    };
    let out = pack(
        &[cache.clone(), web.clone()],
        &[kept],
        &cands,
        &Limits::default(),
        (1, Amount::default()),
    );
    assert_eq!(out.new_nodes.len(), 1, "{out:?}");
    assert!(out.outgrown.is_empty(), "{out:?}");
    // Another pending pod takes its room: it still serves, so it stays.
    let other = pod("other", json!({"app": "other"}), 1000, json!({}));
    let out = pack(
        &[cache, web, other],
        &[bin],
        &cands,
        &Limits::default(),
        (1, Amount::default()),
    );
    assert_eq!(
        out.placed.get("for-cache"),
        Some(&vec!["default/other".to_string()])
    );
    assert!(out.outgrown.is_empty(), "{out:?}");
}
