use super::*;

fn example() -> VClusterConfig {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vcluster.yaml");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&text).expect("the example parses")
}

fn pools(config: &VClusterConfig) -> Vec<NodePool> {
    node_pools("tenant", "ns", config, None)
        .into_iter()
        .map(|p| p.expect("maps"))
        .collect()
}

fn from_yaml(text: &str) -> VClusterConfig {
    parse(text.as_bytes()).expect("parses")
}

#[test]
fn the_example_maps_each_static_and_dynamic_entry_to_one_named_and_labelled_pool() {
    let pools = pools(&example());
    let names: Vec<&str> = pools
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    assert_eq!(names, ["tenant-fixed", "tenant-burst"]);
    let fixed = &pools[0];
    let labels = fixed.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels[LABEL_VCLUSTER], "tenant");
    assert_eq!(labels[LABEL_VCLUSTER_POOL], "fixed");
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(fixed.metadata.namespace.as_deref(), Some("ns"));
    let s = &fixed.spec;
    assert_eq!(s.v_cluster_ref.name, "tenant");
    assert_eq!(
        s.provider_ref.as_deref(),
        Some("kubevirt-provider-advanced")
    );
    assert_eq!(s.replicas, Some(2));
    assert_eq!(s.requirements.len(), 1);
    assert_eq!(s.requirements[0].key, "vcluster.com/node-type");
    assert_eq!(s.requirements[0].operator, Operator::In);
    assert_eq!(s.requirements[0].values, ["standard-node"]);
    assert_eq!(
        s.properties["team"], "platform",
        "the provider entry's properties"
    );
    assert_eq!(s.labels["pool"], "fixed");
    assert_eq!(s.taints[0].key, "dedicated");
    assert_eq!(s.termination_grace_period, "5m".parse().ok());
    assert!(s.limits.is_none());

    let burst = &pools[1].spec;
    assert_eq!(burst.replicas, None);
    assert_eq!(burst.properties["team"], "burst");
    let limits = burst.limits.clone().expect("limits");
    assert_eq!(limits["nodes"].0, "10");
    assert_eq!(limits["nvidia.com/gpu"].0, "4");
    let d = burst.disruption.clone().expect("disruption");
    assert_eq!(d.consolidate_after, Some(DurationOrNever::Never));
    assert_eq!(d.consolidation_policy, Some(ConsolidationPolicy::WhenEmpty));
    assert_eq!(d.budgets.len(), 2);
    assert_eq!(d.budgets[1].schedule.as_deref(), Some("0 9 * * 1-5"));
    assert_eq!(burst.expire_after, "720h".parse().ok());
    assert_eq!(burst.weight, Some(10));
}

#[test]
fn entry_properties_lie_under_the_pools_own_and_the_owner_is_set() {
    let config = from_yaml(
        "privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: p\n    properties: {a: entry, b: entry}\n    static:\n    - {name: s, quantity: 1, properties: {b: pool}}\n",
    );
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Secret".into(),
        name: "vc-config-tenant".into(),
        uid: "u".into(),
        ..OwnerReference::default()
    };
    let p = node_pools("tenant", "ns", &config, Some(&owner))
        .pop()
        .expect("one")
        .expect("maps");
    assert_eq!(p.spec.properties["a"], "entry");
    assert_eq!(p.spec.properties["b"], "pool");
    assert_eq!(p.metadata.owner_references, Some(vec![owner]));
}

#[test]
fn without_private_nodes_enabled_no_pool_is_made() {
    let config = from_yaml(
        "privateNodes:\n  autoNodes:\n  - provider: p\n    static: [{name: s, quantity: 1}]\n",
    );
    assert!(node_pools("tenant", "ns", &config, None).is_empty());
    assert!(node_pools("tenant", "ns", &from_yaml("controlPlane: {}\n"), None).is_empty());
}

#[test]
fn a_bad_entry_is_an_error_naming_its_path_and_the_other_entries_still_map() {
    let config = from_yaml(concat!(
        "privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: p\n    static:\n",
        "    - {name: good, quantity: 1}\n",
        "    - {name: bad-op, quantity: 1, nodeTypeSelector: [{property: a, operator: Matches, value: x}]}\n",
        "    - {name: both, quantity: 1, nodeTypeSelector: [{property: a, value: x, values: [y]}]}\n",
        "    - {name: good, quantity: 2}\n",
        "    - {name: Bad_Name, quantity: 1}\n",
        "    - {name: taint, quantity: 1, taints: [{key: k, effect: Sometimes}]}\n",
        "    - {name: huge, quantity: 2147483647}\n",
        "    dynamic:\n",
        "    - {name: cpu, limits: {cpu: lots}}\n",
        "    - {name: never, disruption: {consolidateAfter: soon}}\n",
        "    - {name: window, disruption: {budgets: [{nodes: '0', schedule: '@daily'}]}}\n",
        "    - {name: heavy, weight: 1000}\n",
        "  - static: [{name: orphan, quantity: 1}]\n",
    ));
    let out = node_pools("tenant", "ns", &config, None);
    let errors: Vec<String> = out
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    for e in &errors {
        println!("{e}");
    }
    assert!(out[0].is_ok());
    let expect = [
        "privateNodes.autoNodes[0].static[1].nodeTypeSelector[0]: operator \"Matches\"",
        "privateNodes.autoNodes[0].static[2].nodeTypeSelector[0]: value and values are exclusive",
        "privateNodes.autoNodes[0].static[3].name: another pool is already named \"good\"",
        "privateNodes.autoNodes[0].static[4].name: \"tenant-Bad_Name\"",
        "privateNodes.autoNodes[0].static[5].taints[0]",
        "privateNodes.autoNodes[0].static[6].quantity: 2147483647 is not a node count from 0 to 1000",
        "privateNodes.autoNodes[0].dynamic[0].limits.cpu: \"lots\" is not a quantity",
        "privateNodes.autoNodes[0].dynamic[1].disruption.consolidateAfter",
        "privateNodes.autoNodes[0].dynamic[2]: spec.disruption.budgets[0]: a schedule needs a duration",
        "privateNodes.autoNodes[0].dynamic[3].weight: 1000",
        "privateNodes.autoNodes[1].provider: a provider is required",
    ];
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    for (e, want) in errors.iter().zip(expect) {
        assert!(e.starts_with(want), "{e:?} should start with {want:?}");
    }
}

#[test]
fn an_unreadable_configuration_is_one_error_that_quotes_none_of_its_text() {
    let e = parse(b"privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: p\n    static:\n    - {name: s, quantity: \"hunter2\"}\n")
        .expect_err("a quantity is a number");
    let text = e.to_string();
    println!("{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("line"), "{text}");
    assert!(matches!(
        parse(&vec![b' '; MAX_CONFIG_BYTES + 1]),
        Err(ConfigError::TooLarge(_))
    ));
    assert!(parse(b"{[").is_err());
}

#[test]
fn every_mapped_pool_is_a_node_pool_the_schema_and_the_controller_accept() {
    for p in pools(&example()) {
        let json = serde_json::to_value(&p).expect("serializes");
        let back: NodePool = serde_json::from_value(json).expect("reads back");
        assert_eq!(back.spec, p.spec);
        assert!(crate::pool::reconcile::template_problem(&p.spec, |_| true).is_none());
    }
}
