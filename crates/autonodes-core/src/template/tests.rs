//! Tests of VM composition.

use super::*;
use crate::template::error::TemplateError;
use crate::template::merge::strategic_merge;
use crate::template::names::{
    managed_labels, user_data_is_ours, vm_name_for_claim, VmIdentity, DEFAULT_ROOT_DISK_SIZE,
    ROOT_DISK,
};
use proptest::prelude::*;
use serde_json::json;

fn q(s: &str) -> Quantity {
    Quantity(s.to_string())
}

fn res(entries: &[(&str, &str)]) -> ResourceList {
    entries.iter().map(|(k, v)| (k.to_string(), q(v))).collect()
}

fn yaml(s: &str) -> Value {
    crate::yaml::from_str(s).expect("test YAML parses")
}

fn advanced_base() -> Value {
    yaml(
        r#"
metadata:
  labels:
    provider: kubevirt
spec:
  dataVolumeTemplates:
    - metadata:
        name: containerdisk
      spec:
        source:
          registry:
            url: docker://quay.io/containerdisks/ubuntu:22.04
        pvc:
          accessModes: [ReadWriteOnce]
          resources:
            requests:
              storage: '20Gi'
  template:
    spec:
      domain:
        devices:
          disks:
            - name: containerdisk
              disk:
                bus: virtio
          interfaces:
            - name: default
              masquerade: {}
        resources:
          requests:
            cpu: "2"
            memory: "4Gi"
      networks:
        - name: default
          pod: {}
      volumes:
        - name: containerdisk
          dataVolume:
            name: containerdisk
"#,
    )
}

fn labels() -> BTreeMap<String, String> {
    managed_labels("claim-1", "tenant", "uid-1", "default")
}

fn id<'a>(labels: &'a BTreeMap<String, String>) -> VmIdentity<'a> {
    VmIdentity {
        name: "tenant-claim-1",
        namespace: "vcluster-platform",
        labels,
    }
}

/// Arbitrary JSON, with keys drawn from KubeVirt's merge-key paths so keyed lists are hit.
fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
    let key = prop_oneof![
        Just("spec".to_string()),
        Just("template".to_string()),
        Just("domain".to_string()),
        Just("devices".to_string()),
        Just("disks".to_string()),
        Just("volumes".to_string()),
        Just("networks".to_string()),
        Just("dataVolumeTemplates".to_string()),
        Just("metadata".to_string()),
        Just("name".to_string()),
        Just("$patch".to_string()),
        "[a-z]{1,3}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just("delete"), Just("replace"), Just("merge"), Just("a")]
            .prop_map(Value::from),
        "\\PC{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(2000))]

    #[test]
    fn merging_arbitrary_json_never_panics(base in arb_json(), patch in arb_json()) {
        let _ = strategic_merge(&base, &patch);
        // The whole composition must not panic either.
        let r = ResourceList::new();
        let _ = compose_type_template(&TypeTemplateInput {
            node_type: "p.t", base: Some(&base), merge: Some(&patch), replacement: None, resources: &r,
        });
        let l = labels();
        let _ = finalize_vm(&patch, &id(&l), "p.t");
        let _ = effective_resources("p.t", &r, &base);
    }

    #[test]
    fn merging_arbitrary_elements_into_keyed_lists_never_panics(
        items in proptest::collection::vec(
            proptest::prop_oneof![
                arb_json(),
                (proptest::prop_oneof![proptest::strategy::Just("containerdisk"), proptest::strategy::Just("default"), proptest::strategy::Just("x")], arb_json())
                    .prop_map(|(n, v)| json!({"name": n, "metadata": {"name": n}, "v": v})),
                proptest::prop_oneof![proptest::strategy::Just("containerdisk"), proptest::strategy::Just("x")]
                    .prop_map(|n| json!({"name": n, "$patch": "delete"})),
            ],
            0..6,
        )
    ) {
        let base = advanced_base();
        let list = Value::Array(items);
        for patch in [
            json!({"spec": {"template": {"spec": {"volumes": list.clone(), "networks": list.clone()}}}}),
            json!({"spec": {"dataVolumeTemplates": list.clone()}}),
            json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": list.clone(), "interfaces": list.clone()}}}}}}),
        ] {
            if let Ok(merged) = strategic_merge(&base, &patch) {
                let l = labels();
                let _ = finalize_vm(&merged, &id(&l), "p.t");
                let _ = effective_resources("p.t", &ResourceList::new(), &merged);
            }
        }
    }

    #[test]
    fn merging_a_template_with_an_empty_patch_is_the_identity(base in arb_json()) {
        let template = json!({"spec": base});
        proptest::prop_assert_eq!(strategic_merge(&template, &json!({})).ok(), Some(template.clone()));
        if base.is_object() {
            proptest::prop_assert_eq!(strategic_merge(&base, &json!({})).ok(), Some(base.clone()));
        }
    }
}

#[test]
fn merge_keeps_base_disks_and_adds_new_ones_by_name() {
    let base = advanced_base();
    let patch = yaml(
        r#"
spec:
  template:
    spec:
      domain:
        devices:
          disks:
            - name: containerdisk
              bootOrder: 1
            - name: scratch
              disk: {bus: sata}
"#,
    );
    let out = strategic_merge(&base, &patch).expect("merges");
    let disks = &out["spec"]["template"]["spec"]["domain"]["devices"]["disks"];
    assert_eq!(
        disks,
        &json!([
            {"name": "containerdisk", "disk": {"bus": "virtio"}, "bootOrder": 1},
            {"name": "scratch", "disk": {"bus": "sata"}}
        ])
    );
    // Interfaces untouched.
    assert_eq!(
        out["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "masquerade": {}}])
    );
}

#[test]
fn merge_by_key_covers_interfaces_networks_volumes_and_data_volume_templates() {
    let base = advanced_base();
    let patch = yaml(
        r#"
spec:
  dataVolumeTemplates:
    - metadata: {name: containerdisk}
      spec:
        source:
          registry: {url: docker://quay.io/containerdisks/fedora:40}
    - metadata: {name: data}
      spec: {pvc: {accessModes: [ReadWriteOnce]}}
  template:
    spec:
      domain:
        devices:
          interfaces:
            - name: secondary
              bridge: {}
      networks:
        - name: secondary
          multus: {networkName: vlan10}
      volumes:
        - name: data
          dataVolume: {name: data}
"#,
    );
    let out = strategic_merge(&base, &patch).expect("merges");
    let dvts = out["spec"]["dataVolumeTemplates"].as_array().expect("list");
    assert_eq!(dvts.len(), 2);
    assert_eq!(
        dvts[0]["spec"]["source"]["registry"]["url"],
        "docker://quay.io/containerdisks/fedora:40"
    );
    // The pvc of the base element is kept (maps merge inside a keyed element).
    assert_eq!(
        dvts[0]["spec"]["pvc"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    assert_eq!(dvts[1]["metadata"]["name"], "data");
    let vmi = &out["spec"]["template"]["spec"];
    assert_eq!(
        vmi["domain"]["devices"]["interfaces"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(vmi["networks"].as_array().map(Vec::len), Some(2));
    assert_eq!(vmi["volumes"].as_array().map(Vec::len), Some(2));
}

#[test]
fn plain_lists_are_replaced_not_merged() {
    let base = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "d"},
            "spec": {"pvc": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}}}]}});
    let patch = json!({"spec": {"dataVolumeTemplates": [{"metadata": {"name": "d"},
            "spec": {"pvc": {"accessModes": ["ReadWriteMany"]}}}]}});
    let out = strategic_merge(&base, &patch).expect("merges");
    assert_eq!(
        out["spec"]["dataVolumeTemplates"][0]["spec"]["pvc"]["accessModes"],
        json!(["ReadWriteMany"])
    );
    let base =
        json!({"spec": {"template": {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}}});
    let patch = json!({"spec": {"template": {"spec": {"tolerations": [{"key": "c"}]}}}});
    let out = strategic_merge(&base, &patch).expect("merges");
    assert_eq!(
        out["spec"]["template"]["spec"]["tolerations"],
        json!([{"key": "c"}])
    );
}

#[test]
fn null_in_the_patch_deletes_the_key() {
    let base = advanced_base();
    let patch = json!({"metadata": {"labels": {"provider": null}},
                           "spec": {"template": {"spec": {"networks": null}}}});
    let out = strategic_merge(&base, &patch).expect("merges");
    assert_eq!(out["metadata"]["labels"], json!({}));
    assert!(out["spec"]["template"]["spec"].get("networks").is_none());
    // Nulls inside newly added content are dropped, not stored.
    let out = strategic_merge(&json!({}), &json!({"a": {"b": null, "c": 1}})).expect("merges");
    assert_eq!(out, json!({"a": {"c": 1}}));
}

#[test]
fn patch_delete_directive_removes_a_keyed_list_element() {
    let base = advanced_base();
    let patch = json!({"spec": {"template": {"spec": {"domain": {"devices": {
            "interfaces": [{"name": "default", "$patch": "delete"}]}}}}}});
    let out = strategic_merge(&base, &patch).expect("merges");
    assert_eq!(
        out["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"],
        json!([])
    );
}

#[test]
fn patch_replace_directive_replaces_an_object_instead_of_merging() {
    let base = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2, "model": "host-model"}}}}}});
    let patch = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"$patch": "replace", "cores": 4}}}}}});
    let out = strategic_merge(&base, &patch).expect("merges");
    assert_eq!(
        out["spec"]["template"]["spec"]["domain"]["cpu"],
        json!({"cores": 4})
    );
}

#[test]
fn keyed_list_elements_without_their_key_are_an_error_naming_the_path() {
    let base = advanced_base();
    let patch = json!({"spec": {"template": {"spec": {"volumes": [{"containerDisk": {}}]}}}});
    let e = strategic_merge(&base, &patch).expect_err("no key");
    assert_eq!(
        e.to_string(),
        "spec.template.spec.volumes[0]: element has no merge key name"
    );
    let patch = json!({"spec": {"dataVolumeTemplates": ["x"]}});
    let e = strategic_merge(&base, &patch).expect_err("not an object");
    assert!(e.to_string().contains("spec.dataVolumeTemplates[0]"), "{e}");
}

#[test]
fn unknown_patch_directives_are_rejected() {
    let e = strategic_merge(&json!({"a": {}}), &json!({"a": {"$patch": "explode"}}))
        .expect_err("bad directive");
    assert!(e.to_string().contains("explode"), "{e}");
}

#[test]
fn an_empty_patch_is_the_identity() {
    let base = advanced_base();
    assert_eq!(strategic_merge(&base, &json!({})).expect("merges"), base);
}

#[test]
fn both_template_fields_are_an_error_naming_the_node_type() {
    let base = advanced_base();
    let r = ResourceList::new();
    let e = compose_type_template(&TypeTemplateInput {
        node_type: "prov.both",
        base: Some(&base),
        merge: Some(&json!({})),
        replacement: Some(&json!({"spec": {}})),
        resources: &r,
    })
    .expect_err("both set");
    assert_eq!(
        e,
        TemplateError::BothTemplates {
            node_type: "prov.both".into()
        }
    );
    assert!(e.to_string().contains("prov.both"));
}

#[test]
fn a_type_without_any_template_is_an_error() {
    let r = ResourceList::new();
    let e = compose_type_template(&TypeTemplateInput {
        node_type: "p.t",
        base: None,
        merge: None,
        replacement: None,
        resources: &r,
    })
    .expect_err("no template");
    assert!(matches!(e, TemplateError::NoTemplate { .. }));
}

#[test]
fn high_memory_merge_adds_the_label_keeps_the_base_one_and_extracts_the_taint() {
    let base = advanced_base();
    let patch = yaml(
        r#"
metadata:
  labels:
    workload: memory-intensive
spec:
  template:
    spec:
      taints:
        - key: "workload"
          value: "high-memory"
          effect: "NoSchedule"
"#,
    );
    let r = res(&[("cpu", "4"), ("memory", "16Gi")]);
    let t = compose_type_template(&TypeTemplateInput {
        node_type: "kubevirt-provider-advanced.high-memory-node",
        base: Some(&base),
        merge: Some(&patch),
        replacement: None,
        resources: &r,
    })
    .expect("composes");
    assert_eq!(
        t.template["metadata"]["labels"],
        json!({"provider": "kubevirt", "workload": "memory-intensive"})
    );
    assert_eq!(t.taints.len(), 1);
    assert_eq!(t.taints[0].key, "workload");
    assert_eq!(t.taints[0].value.as_deref(), Some("high-memory"));
    assert_eq!(t.taints[0].effect, "NoSchedule");
    assert!(t.template["spec"]["template"]["spec"]
        .get("taints")
        .is_none());
    assert_eq!(
        t.template["spec"]["template"]["spec"]["domain"]["resources"]["requests"],
        json!({"cpu": "4", "memory": "16Gi"})
    );
}

#[test]
fn a_replacement_template_ignores_the_base_entirely() {
    let base = json!({"metadata": {"labels": {"foo": "bar"}}, "spec": {"template": {"spec": {
            "domain": {"resources": {"requests": {"memory": "2Gi"}}}}}}});
    let replacement = json!({"metadata": {"labels": {"foo": "baz"}}, "spec": {"template": {"spec": {
            "domain": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}}}}});
    let r = ResourceList::new();
    let t = compose_type_template(&TypeTemplateInput {
        node_type: "p.replace",
        base: Some(&base),
        merge: None,
        replacement: Some(&replacement),
        resources: &r,
    })
    .expect("composes");
    assert_eq!(t.template, replacement);
    assert_eq!(t.template["metadata"]["labels"]["foo"], "baz");
}

#[test]
fn type_resources_go_into_requests_and_into_limits_only_where_the_template_limits() {
    let mut t = json!({"spec": {"template": {"spec": {"domain": {"resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}}}}});
    apply_resources(&mut t, &res(&[("cpu", "4"), ("memory", "5Gi")]), "p.t").expect("applies");
    let r = &t["spec"]["template"]["spec"]["domain"]["resources"];
    assert_eq!(r["requests"], json!({"cpu": "4", "memory": "5Gi"}));
    assert_eq!(r["limits"], json!({"memory": "5Gi"}));
}

#[test]
fn type_resources_also_set_an_explicit_guest_topology_and_guest_memory() {
    let mut t = json!({"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 1, "sockets": 2, "model": "host-model"},
            "memory": {"guest": "2Gi"}}}}}});
    apply_resources(&mut t, &res(&[("cpu", "8"), ("memory", "32Gi")]), "p.t").expect("applies");
    let d = &t["spec"]["template"]["spec"]["domain"];
    assert_eq!(
        d["cpu"],
        json!({"cores": 8, "sockets": 1, "threads": 1, "model": "host-model"})
    );
    assert_eq!(d["memory"]["guest"], "32Gi");
}

#[test]
fn resources_into_a_template_without_a_domain_create_it() {
    let mut t = json!({"spec": {}});
    apply_resources(&mut t, &res(&[("cpu", "2")]), "p.t").expect("applies");
    assert_eq!(
        t["spec"]["template"]["spec"]["domain"]["resources"]["requests"]["cpu"],
        "2"
    );
    let mut bad = json!({"spec": {"template": {"spec": {"domain": "x"}}}});
    let e = apply_resources(&mut bad, &res(&[("cpu", "2")]), "p.t").expect_err("not an object");
    assert!(e.to_string().contains("spec.template.spec.domain"), "{e}");
}

#[test]
fn effective_resources_come_from_the_spec_first() {
    let t = advanced_base();
    let r =
        effective_resources("p.t", &res(&[("cpu", "4"), ("memory", "16Gi")]), &t).expect("found");
    assert_eq!(r, res(&[("cpu", "4"), ("memory", "16Gi")]));
}

#[test]
fn effective_resources_are_discovered_from_requests() {
    let r = effective_resources("p.t", &ResourceList::new(), &advanced_base()).expect("found");
    assert_eq!(r, res(&[("cpu", "2"), ("memory", "4Gi")]));
}

#[test]
fn effective_cpu_is_cores_times_sockets_times_threads_and_memory_the_guest_memory() {
    let t = json!({"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 2, "sockets": 2, "threads": 2},
            "memory": {"guest": "6Gi"},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}}}}});
    let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
    assert_eq!(r, res(&[("cpu", "8"), ("memory", "6Gi")]));
    // Missing topology parts count as 1.
    let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 3},
            "resources": {"requests": {"memory": 1073741824}}}}}}});
    let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
    assert_eq!(r, res(&[("cpu", "3"), ("memory", "1073741824")]));
}

#[test]
fn a_spec_with_only_cpu_still_discovers_memory_from_the_template() {
    let r = effective_resources("p.t", &res(&[("cpu", "8")]), &advanced_base()).expect("found");
    assert_eq!(r, res(&[("cpu", "8"), ("memory", "4Gi")]));
}

#[test]
fn a_template_without_memory_is_an_error_not_a_panic() {
    let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}});
    let e = effective_resources("prov.nomem", &ResourceList::new(), &t).expect_err("no memory");
    assert_eq!(
        e,
        TemplateError::MemoryNotFound {
            node_type: "prov.nomem".into()
        }
    );
    assert!(e.to_string().contains("memory is not set"));
    // Even with no domain at all.
    assert!(effective_resources("p.t", &ResourceList::new(), &json!({})).is_err());
}

#[test]
fn a_template_without_cpu_gets_one_vcpu() {
    let t = json!({"spec": {"template": {"spec": {"domain": {"memory": {"guest": "1Gi"}}}}}});
    let r = effective_resources("p.t", &ResourceList::new(), &t).expect("found");
    assert_eq!(r["cpu"], q("1"));
}

#[test]
fn invalid_template_quantities_and_topologies_name_the_field() {
    let t = json!({"spec": {"template": {"spec": {"domain": {"resources": {"requests": {"memory": "lots"}}}}}}});
    let e = effective_resources("p.t", &ResourceList::new(), &t).expect_err("bad");
    assert!(
        e.to_string()
            .contains("spec.template.spec.domain.resources.requests.memory"),
        "{e}"
    );
    let t = json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": "two"}}}}}});
    let e = effective_resources("p.t", &ResourceList::new(), &t).expect_err("bad");
    assert!(e.to_string().contains("domain.cpu.cores"), "{e}");
}

#[test]
fn finalize_forces_name_namespace_labels_hostname_and_run_strategy() {
    let l = labels();
    let vm = finalize_vm(&advanced_base(), &id(&l), "p.t").expect("finalizes");
    assert_eq!(vm["apiVersion"], "kubevirt.io/v1");
    assert_eq!(vm["kind"], "VirtualMachine");
    assert_eq!(vm["metadata"]["name"], "tenant-claim-1");
    assert_eq!(vm["metadata"]["namespace"], "vcluster-platform");
    let expect_labels = json!({
        "provider": "kubevirt",
        "app.kubernetes.io/managed-by": "autonodes",
        "autonodes.io/installation": "default",
        "autonodes.io/nodeclaim": "claim-1",
        "autonodes.io/nodeclaim-namespace": "tenant",
        "autonodes.io/nodeclaim-uid": "uid-1",
    });
    assert_eq!(vm["metadata"]["labels"], expect_labels);
    for (k, v) in &l {
        assert_eq!(vm["spec"]["template"]["metadata"]["labels"][k], json!(v));
    }
    assert_eq!(vm["spec"]["template"]["spec"]["hostname"], "tenant-claim-1");
    assert_eq!(vm["spec"]["runStrategy"], "Always");
}

#[test]
fn a_template_run_strategy_or_running_is_kept() {
    let l = labels();
    let mut t = advanced_base();
    t["spec"]["runStrategy"] = json!("RerunOnFailure");
    let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    assert_eq!(vm["spec"]["runStrategy"], "RerunOnFailure");
    let mut t = advanced_base();
    t["spec"]["running"] = json!(true);
    let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    assert_eq!(vm["spec"]["running"], true);
    assert!(vm["spec"].get("runStrategy").is_none());
    t["spec"]["runStrategy"] = json!("Always");
    let e = finalize_vm(&t, &id(&l), "p.both").expect_err("both");
    assert!(e.to_string().contains("p.both"));
}

#[test]
fn an_image_url_gives_a_template_without_a_disk_a_data_volume_root_disk_and_leaves_others_alone() {
    let mut bare = yaml("spec:\n  template:\n    spec:\n      domain:\n        resources: {requests: {memory: 1Gi}}\n      volumes:\n      - name: cloudinitdisk\n        cloudInitNoCloud: {userData: x}\n");
    let added = add_root_disk(
        &mut bare,
        "docker://quay.io/containerdisks/ubuntu:22.04",
        Some("15Gi"),
        None,
        "p.t",
    )
    .expect("adds");
    assert!(added);
    assert_eq!(
        bare["spec"]["dataVolumeTemplates"][0],
        json!({"metadata": {"name": ROOT_DISK}, "spec": {
                "source": {"registry": {"url": "docker://quay.io/containerdisks/ubuntu:22.04"}},
                "storage": {"resources": {"requests": {"storage": "15Gi"}}}}})
    );
    let volumes = bare["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    assert!(volumes
        .iter()
        .any(|v| v == &json!({"name": ROOT_DISK, "dataVolume": {"name": ROOT_DISK}})));
    assert_eq!(
        bare["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["name"],
        ROOT_DISK
    );
    // Over HTTP, with the default size.
    let mut http = json!({"spec": {"template": {"spec": {}}}});
    assert!(add_root_disk(
        &mut http,
        "https://images.example.com/jammy.qcow2",
        None,
        Some("fast-ssd"),
        "p.t"
    )
    .expect("adds"));
    assert_eq!(
        http["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["http"]["url"],
        "https://images.example.com/jammy.qcow2"
    );
    assert_eq!(
        http["spec"]["dataVolumeTemplates"][0]["spec"]["storage"]["resources"]["requests"]
            ["storage"],
        DEFAULT_ROOT_DISK_SIZE
    );
    assert_eq!(
        http["spec"]["dataVolumeTemplates"][0]["spec"]["storage"]["storageClassName"],
        "fast-ssd"
    );
    // A template with a disk keeps it.
    let mut advanced = advanced_base();
    let before = advanced.clone();
    assert!(
        !add_root_disk(&mut advanced, "docker://x/y", Some("10Gi"), None, "p.t").expect("reads")
    );
    assert_eq!(advanced, before);
    // What cannot be used is an error naming the property.
    for (url, size, class, says) in [
        ("ftp://x/y", None, None, "image-url"),
        ("docker://x y", None, None, "image-url"),
        ("docker://x/y", Some("big"), None, "root-disk-size"),
        ("docker://x/y", Some("0"), None, "root-disk-size"),
        (
            "docker://x/y",
            None,
            Some("Fast SSD"),
            "root-disk-storage-class",
        ),
    ] {
        let e = add_root_disk(&mut json!({}), url, size, class, "p.t").expect_err("refused");
        assert!(e.to_string().contains(says), "{url} {size:?}: {e}");
    }
}

#[test]
fn data_volume_names_are_prefixed_with_the_vm_name_and_volumes_follow() {
    let l = labels();
    let mut t = advanced_base();
    t["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .expect("list")
        .push(json!({"name": "pvc", "persistentVolumeClaim": {"claimName": "containerdisk"}}));
    let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
        "tenant-claim-1-containerdisk"
    );
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["metadata"]["labels"]["autonodes.io/nodeclaim"],
        "claim-1"
    );
    let vols = &vm["spec"]["template"]["spec"]["volumes"];
    assert_eq!(
        vols[0]["dataVolume"]["name"],
        "tenant-claim-1-containerdisk"
    );
    assert_eq!(
        vols[1]["persistentVolumeClaim"]["claimName"],
        "tenant-claim-1-containerdisk"
    );
    // The base volume name itself (what the disk refers to) is unchanged.
    assert_eq!(vols[0]["name"], "containerdisk");
}

#[test]
fn the_cloudinitdisk_volume_and_disk_replace_any_template_cloud_init() {
    let l = labels();
    let mut t = advanced_base();
    let spec = &mut t["spec"]["template"]["spec"];
    spec["volumes"]
        .as_array_mut()
        .expect("list")
        .push(json!({"name": "seed", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}));
    spec["volumes"]
        .as_array_mut()
        .expect("list")
        .push(json!({"name": "cfg", "cloudInitConfigDrive": {"userData": "x"}}));
    let disks = spec["domain"]["devices"]["disks"]
        .as_array_mut()
        .expect("list");
    disks.push(json!({"name": "seed", "disk": {"bus": "sata"}}));
    disks.push(json!({"name": "cfg", "cdrom": {}}));
    let vm = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    let vmi = &vm["spec"]["template"]["spec"];
    assert_eq!(
        vmi["volumes"],
        json!([
            {"name": "containerdisk", "dataVolume": {"name": "tenant-claim-1-containerdisk"}},
            {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "tenant-claim-1-userdata"}}}
        ])
    );
    assert_eq!(
        vmi["domain"]["devices"]["disks"],
        json!([
            {"name": "containerdisk", "disk": {"bus": "virtio"}},
            {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}
        ])
    );
    assert_eq!(
        vmi["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "masquerade": {}}])
    );
}

#[test]
fn finalize_is_deterministic_and_idempotent_on_its_template() {
    let l = labels();
    let t = advanced_base();
    let a = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    let b = finalize_vm(&t, &id(&l), "p.t").expect("finalizes");
    assert_eq!(a, b);
    assert_eq!(t, advanced_base(), "the template is not modified");
}

#[test]
fn finalize_rejects_a_vm_name_that_is_not_a_dns_label() {
    let l = labels();
    for bad in ["Upper", "with.dot", "", "-lead", &"a".repeat(64)] {
        let vm = VmIdentity {
            name: bad,
            namespace: "ns",
            labels: &l,
        };
        assert!(finalize_vm(&advanced_base(), &vm, "p.t").is_err(), "{bad}");
    }
}

#[test]
fn vm_names_are_dns_labels_without_dots_and_stable() {
    let plain = vm_name_for_claim("tenant", "high-memory-1", "u");
    assert!(plain.starts_with("tenant-high-memory-1-"), "{plain}");
    assert_eq!(plain.len(), "tenant-high-memory-1-".len() + 6);
    assert_eq!(plain, vm_name_for_claim("tenant", "high-memory-1", "u"));
    let dotted = vm_name_for_claim("team.a", "Node_1", "u");
    assert!(crate::names::is_dns_label(&dotted), "{dotted}");
    assert!(!dotted.contains('.'));
    assert_ne!(
        vm_name_for_claim("team-a", "node-1", "u"),
        vm_name_for_claim("team", "a-node-1", "u"),
        "namespace/name splits that read the same get different names"
    );
    assert_ne!(
        vm_name_for_claim("t", "n", "uid-1"),
        vm_name_for_claim("t", "n", "uid-2"),
        "a recreated claim gets a new VM name"
    );
    let long = vm_name_for_claim(&"n".repeat(63), &"c".repeat(63), "uid");
    assert!(crate::names::is_dns_label(&long), "{long}");
    assert_eq!(long.len(), 63);
    assert!(crate::names::is_dns_label(&vm_name_for_claim(
        "---", "...", "u"
    )));
}

#[test]
fn malformed_template_taints_are_an_error_naming_the_type() {
    let mut t =
        json!({"spec": {"template": {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}}}});
    let e = take_taints(&mut t, "p.bad").expect_err("bad effect");
    assert!(
        e.to_string().contains("p.bad") && e.to_string().contains("Sometimes"),
        "{e}"
    );
    let mut t = json!({"spec": {"template": {"spec": {"taints": "nope"}}}});
    assert!(take_taints(&mut t, "p.bad").is_err());
}

#[test]
fn a_user_data_secret_is_ours_to_delete_only_with_our_installation_and_its_claim_or_warm_vm() {
    let ours = managed_labels("c", "tenant", "uid-1", "default");
    assert!(user_data_is_ours(&ours, "default", "vm-1", Some("uid-1")));
    assert!(
        !user_data_is_ours(&ours, "default", "vm-1", Some("uid-2")),
        "another claim's"
    );
    assert!(
        !user_data_is_ours(&ours, "blue", "vm-1", Some("uid-1")),
        "another installation's"
    );
    assert!(
        !user_data_is_ours(&ours, "default", "vm-1", None),
        "no claim named"
    );
    let mut by_hand = ours.clone();
    by_hand.remove(autonodes_api::LABEL_MANAGED_BY);
    assert!(
        !user_data_is_ours(&by_hand, "default", "vm-1", Some("uid-1")),
        "not autonodes'"
    );
    let warm = crate::warm::credential_labels("p.small", "warm-small-x", "default");
    assert!(user_data_is_ours(&warm, "default", "warm-small-x", None));
    assert!(
        user_data_is_ours(&warm, "default", "warm-small-x", Some("uid-1")),
        "a claim took it"
    );
    assert!(
        !user_data_is_ours(&warm, "default", "warm-small-y", None),
        "another warm VM's"
    );
    assert!(!user_data_is_ours(
        &BTreeMap::new(),
        "default",
        "vm-1",
        Some("uid-1")
    ));
}
