//! Tests of [`super`].

use super::packer::pack;
use super::*;
use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn pod(key: &str, cpu: i128) -> PendingPod {
    PendingPod {
        key: key.into(),
        request: Amount {
            cpu,
            memory: 256 << 20,
            pods: 1,
            ..Amount::default()
        },
        namespace: "default".into(),
        ..PendingPod::default()
    }
}

/// A candidate of `cpu` millicores (16Gi), priced by the core, with `labels`.
pub(super) fn candidate(name: &str, cpu: i128, labels: &[(&str, &str)]) -> Candidate {
    let amount = Amount {
        cpu,
        memory: 16 << 30,
        pods: MAX_PODS_PER_NODE,
        ..Amount::default()
    };
    Candidate {
        node_type: name.into(),
        shape: NodeShape {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints: Vec::new(),
        },
        allocatable: amount.clone(),
        resources: amount,
        room: None,
        // Priced by the core, as providers usually are.
        cost: i64::try_from(cpu / 1000).unwrap_or(i64::MAX),
        requirements: Vec::new(),
    }
}

#[test]
fn twelve_one_cpu_pods_pack_onto_three_four_cpu_nodes() {
    let pods: Vec<PendingPod> = (0..12).map(|i| pod(&format!("p{i:02}"), 1000)).collect();
    // The big type costs more per core: three small nodes are cheaper than one big one.
    let mut big = candidate("big", 16000, &[]);
    big.cost = 20;
    let out = pack(
        &pods,
        &[],
        &[candidate("small", 4000, &[]), big],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.len(), 3);
    assert!(out
        .new_nodes
        .iter()
        .all(|n| n.node_type == "small" && n.pods.len() == 4 && n.request.cpu == 4000));
    assert_eq!(out.wanted, 12);
}

#[test]
fn pods_that_keep_each_other_off_their_node_get_a_node_each_and_others_share() {
    let pod_of = |key: &str, app: &str, anti: bool| {
        let mut p = pod(key, 500);
        p.labels = BTreeMap::from([("app".to_string(), app.to_string())]);
        if anti {
            p.rules.anti_affinity = vec![PodTerm {
                key: HOSTNAME_TOPOLOGY.into(),
                selector: LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
                    match_expressions: None,
                },
                namespaces: Namespaces::Listed(vec!["default".into()]),
            }];
        }
        p
    };
    let pods = vec![
        pod_of("db-0", "db", true),
        pod_of("db-1", "db", true),
        pod_of("db-2", "db", true),
        pod_of("web", "web", false),
    ];
    let out = pack(
        &pods,
        &[],
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (0, Amount::default()),
    );
    let mut per_node: Vec<Vec<&str>> = out
        .new_nodes
        .iter()
        .map(|n| n.pods.iter().map(String::as_str).collect())
        .collect();
    per_node.sort();
    assert_eq!(per_node, [vec!["db-0", "web"], vec!["db-1"], vec!["db-2"]]);
    // A db pod already on an in-flight node keeps the next one off it, by either side's
    // term: a resident without anti-affinity is still selected by the newcomer's.
    let bin = Bin {
        claim: "c".into(),
        free: Amount::of_node(&ResourceAmounts::default()).plus(&Amount {
            cpu: 4000,
            memory: 16 << 30,
            ..Amount::default()
        }),
        residents: vec![pod_of("db-old", "db", false)],
        ..Bin::default()
    };
    let out = pack(
        &[pod_of("db-new", "db", true)],
        &[bin],
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert!(out.placed.is_empty());
    assert_eq!(out.new_nodes.len(), 1);
}

#[test]
fn pods_spread_over_zones_alternate_between_the_zones_within_their_max_skew() {
    let spread = |key: &str| {
        let mut p = pod(key, 1000);
        p.labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        p.rules.spread = vec![Spread {
            term: PodTerm {
                key: ZONE_TOPOLOGY.into(),
                selector: LabelSelector {
                    match_labels: Some(p.labels.clone()),
                    match_expressions: None,
                },
                namespaces: Namespaces::Listed(vec!["default".into()]),
            },
            max_skew: 1,
            hard: true,
            min_domains: None,
            honor_node_affinity: true,
            honor_taints: false,
        }];
        p
    };
    let pods: Vec<PendingPod> = (0..4).map(|i| spread(&format!("w{i}"))).collect();
    let zoned = |name: &str, zone: &str| candidate(name, 4000, &[(ZONE_TOPOLOGY, zone)]);
    let out = pack(
        &pods,
        &[],
        &[zoned("small-a", "a"), zoned("small-b", "b")],
        &Limits::default(),
        (0, Amount::default()),
    );
    let per_node: Vec<(&str, usize)> = out
        .new_nodes
        .iter()
        .map(|n| (n.node_type.as_str(), n.pods.len()))
        .collect();
    // Without the constraint all four would share one 4-CPU node of zone a.
    assert_eq!(per_node, [("small-a", 2), ("small-b", 2)]);
    // A pod with no zone to go to keeps its skew: an in-flight node in zone a holding
    // two selected pods sends the next one to zone b even though a has room.
    let bin = Bin {
        claim: "in-a".into(),
        shape: NodeShape {
            labels: BTreeMap::from([(ZONE_TOPOLOGY.to_string(), "a".to_string())]),
            taints: Vec::new(),
        },
        free: Amount {
            cpu: 8000,
            memory: 16 << 30,
            pods: 110,
            ..Amount::default()
        },
        residents: vec![spread("old-0"), spread("old-1")],
        replaceable: false,
    };
    let out = pack(
        &[spread("new")],
        &[bin],
        &[zoned("small-a", "a"), zoned("small-b", "b")],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert!(out.placed.is_empty());
    assert_eq!(out.new_nodes[0].node_type, "small-b");
}

#[test]
fn pods_fitting_in_flight_nodes_need_no_new_node() {
    let pods: Vec<PendingPod> = (0..4).map(|i| pod(&format!("p{i}"), 1000)).collect();
    let bins = vec![Bin {
        claim: "c".into(),
        shape: NodeShape::default(),
        free: Amount {
            cpu: 4000,
            memory: 16 << 30,
            pods: 110,
            ..Amount::default()
        },
        residents: Vec::new(),
        replaceable: false,
    }];
    let out = pack(
        &pods,
        &bins,
        &[candidate("small", 4000, &[])],
        &Limits::default(),
        (1, Amount::default()),
    );
    assert!(out.new_nodes.is_empty());
    assert_eq!(out.placed["c"].len(), 4);
}

#[test]
fn node_selectors_choose_the_type_and_foreign_pods_are_ignored() {
    let mut gpu = pod("gpu", 1000);
    gpu.node_selector = BTreeMap::from([("kind".to_string(), "big".to_string())]);
    let mut elsewhere = pod("elsewhere", 1000);
    elsewhere.node_selector = BTreeMap::from([("kind".to_string(), "none".to_string())]);
    let out = pack(
        &[gpu, elsewhere, pod("plain", 1000)],
        &[],
        &[
            candidate("small", 4000, &[("kind", "small")]),
            candidate("big", 16000, &[("kind", "big")]),
        ],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.wanted, 2);
    let types: Vec<&str> = out.new_nodes.iter().map(|n| n.node_type.as_str()).collect();
    // The plain pod fits the room left on the large node: one node for both.
    assert_eq!(types, vec!["big"]);
    assert_eq!(out.new_nodes[0].pods, vec!["gpu", "plain"]);
}

#[test]
fn limits_stop_growth_and_name_the_blocked_pods() {
    let pods: Vec<PendingPod> = (0..12).map(|i| pod(&format!("p{i:02}"), 1000)).collect();
    let limits = Limits {
        nodes: Some(2),
        ..Limits::default()
    };
    let out = pack(
        &pods,
        &[],
        &[candidate("small", 4000, &[])],
        &limits,
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.len(), 2);
    assert_eq!(out.blocked_by_limits.len(), 4);
    let cpu_limited = pack(
        &pods,
        &[],
        &[candidate("small", 4000, &[])],
        &Limits {
            cpu: Some(4000),
            ..Limits::default()
        },
        (0, Amount::default()),
    );
    assert_eq!(cpu_limited.new_nodes.len(), 1);
}

#[test]
fn taints_need_tolerations_and_affinity_terms_are_matched() {
    let shape = NodeShape {
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        taints: vec![Taint {
            key: "dedicated".into(),
            value: Some("x".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }],
    };
    let mut p = pod("p", 100);
    assert!(!accepts(&shape, &p));
    p.tolerations = vec![Toleration {
        key: Some("dedicated".into()),
        operator: Some("Equal".into()),
        value: Some("x".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }];
    assert!(accepts(&shape, &p));
    p.required_terms = Some(vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "zone".into(),
            operator: "In".into(),
            values: Some(vec!["b".into()]),
        }]),
        match_fields: None,
    }]);
    assert!(!accepts(&shape, &p));
    p.tolerations = vec![Toleration {
        operator: Some("Exists".into()),
        ..Toleration::default()
    }];
    p.required_terms = Some(vec![NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: "zone".into(),
            operator: "NotIn".into(),
            values: Some(vec!["b".into()]),
        }]),
        match_fields: None,
    }]);
    assert!(accepts(&shape, &p));
}

#[test]
fn limits_are_described_by_what_is_set() {
    assert_eq!(Limits::default().describe(), "");
    let l = Limits {
        nodes: Some(2),
        cpu: Some(8000),
        memory: Some(16 << 30),
        ..Limits::default()
    };
    assert_eq!(l.describe(), "nodes 2, cpu 8, memory 16Gi");
}

#[test]
fn limits_read_any_resource_written_as_integers_or_strings() {
    let list: ResourceList = serde_json::from_value(serde_json::json!({
        "nodes": "10", "cpu": 64, "memory": "256Gi", "pods": 500, "nvidia.com/gpu": "4"
    }))
    .expect("limits");
    let l = Limits::from_spec(Some(&list));
    assert_eq!(l.nodes, Some(10));
    assert_eq!(l.cpu, Some(64_000));
    assert_eq!(l.memory, Some(256 << 30));
    assert_eq!(l.pods, Some(500));
    assert_eq!(l.extended.get("nvidia.com/gpu"), Some(&4000));
    assert_eq!(
        l.describe(),
        "nodes 10, cpu 64, memory 256Gi, pods 500, nvidia.com/gpu 4"
    );
    let few_pods = Amount {
        cpu: 1000,
        memory: 1 << 30,
        pods: 501,
        ..Amount::default()
    };
    assert!(!l.allow(1, &few_pods), "pods count against the limit");
}

fn pod_object(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).expect("pod")
}

#[test]
fn a_pod_is_unschedulable_only_while_unbound_unfinished_and_marked_by_the_scheduler() {
    let marked = serde_json::json!({"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]});
    let p = pod_object(
        serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}, "status": marked}),
    );
    assert!(is_unschedulable(&p));
    let bound = pod_object(
        serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": "n"}, "status": marked}),
    );
    assert!(!is_unschedulable(&bound));
    let mut failed = p.clone();
    if let Some(s) = failed.status.as_mut() {
        s.phase = Some("Failed".into());
    }
    assert!(!is_unschedulable(&failed));
    let waiting =
        pod_object(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
    assert!(!is_unschedulable(&waiting));
}

#[test]
fn daemon_set_mirror_and_finished_pods_do_not_keep_a_node_busy() {
    let plain = pod_object(serde_json::json!({"metadata": {"name": "p"}}));
    assert!(non_daemon_running(&plain));
    let daemon = pod_object(
        serde_json::json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}
        ]}}),
    );
    assert!(!non_daemon_running(&daemon));
    let mirror = pod_object(
        serde_json::json!({"metadata": {"name": "p", "annotations": {"kubernetes.io/config.mirror": "x"}}}),
    );
    assert!(!non_daemon_running(&mirror));
    let done = pod_object(
        serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}),
    );
    assert!(!non_daemon_running(&done));
}

#[test]
fn a_pending_pod_is_keyed_by_namespace_and_name_and_asks_for_its_containers_extended_resources_and_overhead(
) {
    let p = pod_object(serde_json::json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"},
                                            "limits": {"nvidia.com/gpu": "1"}}},
                {"name": "d", "resources": {"requests": {"nvidia.com/gpu": "2"},
                                            "limits": {"nvidia.com/gpu": "2"}}}
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"},
                                                           "limits": {"nvidia.com/gpu": "1"}}}],
            "overhead": {"memory": "1Gi"},
            "nodeSelector": {"kind": "big"}
        }
    }));
    let pending = PendingPod::from_pod(&p);
    assert_eq!(pending.key, "ns/web");
    assert_eq!(
        pending.request,
        Amount {
            cpu: 2000,
            memory: 2 << 30,
            pods: 1,
            extended: BTreeMap::from([("nvidia.com/gpu".to_string(), 3000)]),
        }
    );
    assert_eq!(pending.node_selector["kind"], "big");
}

#[test]
fn a_pod_with_a_native_sidecar_gets_a_type_that_holds_the_sidecar_too() {
    // 1.5 CPU of containers and a 1-CPU sidecar: 2.5 CPU, which a 2-CPU node cannot hold.
    let p = pod_object(serde_json::json!({
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "1500m"}}}],
            "initContainers": [{"name": "mesh", "restartPolicy": "Always",
                                "resources": {"requests": {"cpu": "1"}}}]
        }
    }));
    let pending = PendingPod::from_pod(&p);
    assert_eq!(pending.request.cpu, 2500);
    let mut two = candidate("two", 2000, &[]);
    two.cost = 10;
    let mut four = candidate("four", 4000, &[]);
    four.cost = 30;
    let out = pack(
        &[pending],
        &[],
        &[two, four],
        &Limits::default(),
        (0, Amount::default()),
    );
    assert_eq!(out.new_nodes.len(), 1, "{out:?}");
    assert_eq!(out.new_nodes[0].node_type, "four");
    assert_eq!(out.new_nodes[0].pods, ["default/web"]);
}
