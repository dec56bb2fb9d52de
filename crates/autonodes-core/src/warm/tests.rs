//! Tests of [`super`].

use super::*;
use crate::catalogue::{prepare_type, ProviderContext};
use crate::kubeversion::KubeVersion;
use crate::userdata::warm::{read_warm_agent, render_warm_user_data, WarmUserDataInput};
use crate::userdata::DEFAULT_DOWNLOAD_URL;
use autonodes_api::NodeClaim;
use serde_json::json;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("time")
}

/// The provider `p` of the warm tests.
pub(super) fn provider() -> ProviderContext {
    ProviderContext::for_tests("p")
}

fn prepared(properties: Value) -> PreparedType {
    let spec = serde_json::from_value(json!({
        "providerRef": "p",
        "resources": {"cpu": "2", "memory": "4Gi"},
        "properties": properties,
        "warm": {"replicas": 2},
    }))
    .expect("spec");
    let t = prepare_type("p.small", &spec, Some(&provider()));
    assert!(t.problem.is_none(), "{:?}", t.problem);
    t
}

fn claim(spec: Value) -> NodeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team", "uid": "u-1"},
        "spec": spec,
    }))
    .expect("claim")
}

fn vm(name: &str, created: i64, running: Option<i64>, beat: Option<i64>) -> WarmVm {
    WarmVm {
        name: name.into(),
        created: at(created),
        definition: Some("d1".into()),
        running_since: running.map(at),
        heartbeat: beat.map(at),
        credential_expires: None,
        deleting: false,
    }
}

#[test]
fn a_type_keeps_its_replicas_and_makes_the_missing_ones() {
    let p = plan(3, None, "d1", &[vm("a", 0, Some(10), Some(95))], at(100));
    assert_eq!((p.wanted, p.create, p.ready), (3, 2, 1));
    assert!(p.remove.is_empty());
    let p = plan(0, None, "d1", &[vm("a", 0, Some(10), Some(95))], at(100));
    assert_eq!(p.create, 0);
    assert_eq!(p.remove, [("a".to_string(), Removal::Excess)]);
}

#[test]
fn max_capacity_left_by_claims_bounds_the_warm_vms_and_the_least_ready_go_first() {
    let vms = [
        vm("booting", 50, None, None),
        vm("ready", 0, Some(10), Some(95)),
        vm("young-ready", 60, Some(70), Some(99)),
    ];
    let p = plan(3, Some(2), "d1", &vms, at(100));
    assert_eq!(p.wanted, 2);
    assert_eq!(p.remove, [("booting".to_string(), Removal::Excess)]);
    assert_eq!(p.create, 0);
    assert_eq!(plan(3, Some(-1), "d1", &vms, at(100)).wanted, 0);
}

#[test]
fn drifted_silent_and_expiring_warm_vms_are_replaced() {
    let mut old = vm("old-definition", 0, Some(10), Some(95));
    old.definition = Some("d0".into());
    let day = i64::try_from(CREDENTIAL_LIFETIME.as_secs()).expect("secs");
    let vms = [
        old,
        vm("never-reported", 0, Some(10), None),
        vm("went-silent", 0, Some(10), Some(20)),
        vm("fine", 0, Some(10), Some(699)),
    ];
    let p = plan(4, None, "d1", &vms, at(700));
    assert_eq!(
        p.remove,
        [
            ("old-definition".to_string(), Removal::Drifted),
            ("never-reported".to_string(), Removal::NotReporting),
            ("went-silent".to_string(), Removal::NotReporting),
        ]
    );
    assert_eq!((p.create, p.not_reporting, p.ready), (3, 2, 1));
    let p = plan(
        1,
        None,
        "d1",
        &[vm("aging", 0, Some(10), Some(day - 3600))],
        at(day - 3590),
    );
    assert_eq!(p.remove, [("aging".to_string(), Removal::Expiring)]);
}

#[test]
fn a_warm_vm_is_replaced_before_the_expiry_its_host_gave_its_token_not_a_day_after_creation() {
    // The host capped the token at 2 h: replaced a quarter of its life (30 min) before it
    // expires, not after 23 h.
    let mut capped = vm("capped", 0, Some(10), Some(5_390));
    capped.credential_expires = Some(at(7_200));
    assert!(
        plan(1, None, "d1", std::slice::from_ref(&capped), at(5_399))
            .remove
            .is_empty()
    );
    let p = plan(1, None, "d1", std::slice::from_ref(&capped), at(5_400));
    assert_eq!(p.remove, [("capped".to_string(), Removal::Expiring)]);
    // A 20-minute token (a host's shortest is 10 minutes) is not replaced at once.
    assert_eq!(replace_at(at(0), at(1_200)), at(900));
    assert_eq!(replace_at(at(0), at(86_400)), at(82_800));
    assert_eq!(
        replace_at(at(100), at(50)),
        at(50),
        "an expiry before issue"
    );
}

#[test]
fn a_heartbeat_is_read_from_the_lease_s_name_and_counts_from_when_it_was_seen() {
    assert_eq!(
        vm_of_lease(&credential_name("warm-small-ab12c")),
        Some("warm-small-ab12c")
    );
    assert_eq!(vm_of_lease("-warm"), None);
    assert_eq!(
        vm_of_lease("warm-small-ab12c"),
        None,
        "not a credential's name"
    );
    assert_eq!(observe_beat(None, None, at(100)), None);
    let first = observe_beat(None, Some(at(90)), at(100)).expect("beat");
    assert_eq!(
        first.seen,
        at(90),
        "a recent renewal first seen counts from its time"
    );
    // A VM that wrote a renewal far ahead and stopped goes stale as any other.
    let ahead = observe_beat(None, Some(at(1_000_000)), at(100)).expect("beat");
    assert_eq!(ahead.seen, at(100));
    let again = observe_beat(Some(ahead), Some(at(1_000_000)), at(131)).expect("beat");
    let mut vm = vm("ahead", 0, Some(10), None);
    vm.heartbeat = Some(again.seen);
    assert!(!vm.ready(at(131)), "no renewal seen for 31 s");
    // A renewal seen later counts from then, whatever time it names.
    let renewed = observe_beat(Some(again), Some(at(5)), at(140)).expect("beat");
    assert_eq!(renewed.seen, at(140));
}

#[test]
fn warm_vms_being_deleted_hold_their_place_until_gone() {
    let mut going = vm("going", 0, Some(10), Some(95));
    going.deleting = true;
    let p = plan(
        2,
        None,
        "d1",
        &[going, vm("a", 0, Some(10), Some(95))],
        at(100),
    );
    assert_eq!(p.create, 0);
}

#[test]
fn a_claim_takes_the_oldest_ready_warm_vm() {
    let vms = [
        vm("b", 5, Some(10), Some(95)),
        vm("a", 5, Some(10), Some(95)),
        vm("stale", 0, Some(10), Some(40)),
        vm("booting", 0, None, None),
    ];
    assert_eq!(pick(&vms, at(100)).map(|v| v.name.as_str()), Some("a"));
    assert!(pick(&vms[2..], at(100)).is_none());
}

#[test]
fn a_claim_with_its_own_image_zone_or_first_boot_user_data_is_served_cold() {
    let t = prepared(json!({"autonodes.io/image-prepared": "true"}));
    assert_eq!(
        servable(&t, None, &claim(json!({"vClusterRef": {"name": "v"}}))),
        Ok(())
    );
    let labelled = claim(
        json!({"vClusterRef": {"name": "v"}, "labels": {"team": "a"},
        "taints": [{"key": "k", "effect": "NoSchedule"}], "kubeletArgs": {"max-pods": "50"}}),
    );
    assert_eq!(servable(&t, None, &labelled), Ok(()), "given at bind time");
    // User data and SSH keys of its own come with the binding, when cloud-init can apply
    // them to a running VM.
    let own = claim(json!({"vClusterRef": {"name": "v"},
        "properties": {"autonodes.io/user-data": "#cloud-config\nruncmd: [[true]]\n",
            "autonodes.io/ssh-keys": "ssh-ed25519 AAAA claim"}}));
    assert_eq!(servable(&t, None, &own), Ok(()), "given at bind time");
    let first_boot = claim(json!({"vClusterRef": {"name": "v"},
        "properties": {"autonodes.io/user-data": "#cloud-config\npackages: [htop]\nbootcmd: [[true]]\n"}}));
    let why = servable(&t, None, &first_boot).expect_err("cold");
    assert!(why.contains("autonodes.io/user-data"), "{why}");
    assert!(why.contains("\"bootcmd\" (and 1 more)"), "{why}");
    let image = claim(json!({"vClusterRef": {"name": "v"},
        "properties": {"kubevirt.vcluster.com/image-url": "docker://example/own:1"}}));
    let why = servable(&t, None, &image).expect_err("cold");
    assert!(why.contains("image-url"), "{why}");
    let mut zoned = claim(json!({"vClusterRef": {"name": "v"}}));
    zoned.status = Some(serde_json::from_value(json!({"zone": "a"})).expect("status"));
    assert!(servable(&t, None, &zoned)
        .expect_err("cold")
        .contains("zone"));
    let vcluster = prepared(json!({"autonodes.io/user-data-template": "vcluster"}));
    assert!(type_problem(&vcluster)
        .expect("problem")
        .contains("kubeadm"));
    let placed = prepared(json!({"autonodes.io/vm-anti-affinity": "soft"}));
    assert!(type_problem(&placed).is_some());
}

pub(super) fn join() -> JoinParams {
    JoinParams {
        api_server_endpoint: "10.0.0.1:6443".into(),
        token: "abcdef.0123456789abcdef".into(),
        ca_cert_hashes: vec![
            "sha256:2917f5ab7ab656c6c2585c6a715cfb777c242f7a357a5ba18a4c21849d401d6a".into(),
        ],
        join_script_url: None,
        ca_pem: None,
        kubernetes_version: KubeVersion::new(1, 30, 2),
        download_url: DEFAULT_DOWNLOAD_URL.into(),
    }
}

#[test]
fn the_binding_is_the_claims_join_for_the_warm_vms_name() {
    let t = prepared(json!({"autonodes.io/image-prepared": "true"}));
    let c = claim(
        json!({"vClusterRef": {"name": "v"}, "labels": {"team": "a"},
        "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}),
    );
    let b = binding(&t, None, &c, "warm-small-x1", &join(), "prod").expect("binding");
    assert!(b.join_configuration.contains("kind: JoinConfiguration"));
    assert!(
        b.join_configuration.contains("\"warm-small-x1\""),
        "node name"
    );
    assert!(
        b.join_configuration.contains("kubevirt://warm-small-x1"),
        "provider ID"
    );
    assert!(b.join_configuration.contains("team=a"), "claim labels");
    assert!(b.join_configuration.contains("\"gpu\""), "claim taints");
    assert!(b.join_configuration.contains("abcdef.0123456789abcdef"));
    assert!(b.prepare_script.starts_with("#!/bin/sh"));
    assert_eq!(b.user_data, None, "nothing of the claim's own to apply");
    assert!(
        !format!("{b:?}").contains("abcdef"),
        "Debug hides the token"
    );
}

#[test]
fn a_binding_carries_the_claims_ssh_keys_files_and_commands_where_the_vm_did_not_boot_with_them() {
    let t = prepared(json!({"autonodes.io/ssh-keys": "ssh-ed25519 OPS ops"}));
    let own = claim(json!({"vClusterRef": {"name": "v"}, "properties": {
        "autonodes.io/ssh-keys": "ssh-ed25519 AAAA claim",
        "autonodes.io/user-data": "#cloud-config\nssh_authorized_keys: [ssh-ed25519 BBBB data]\nwrite_files:\n  - {path: /etc/x, content: y, defer: true}\nruncmd:\n  - [touch, /ran]\n",
    }}));
    let b = binding(&t, None, &own, "warm-small-x1", &join(), "prod").expect("binding");
    let text = b.user_data.expect("the claim's own");
    let config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        config["ssh_authorized_keys"],
        json!(["ssh-ed25519 BBBB data", "ssh-ed25519 AAAA claim"])
    );
    assert_eq!(
        config["write_files"],
        json!([{"path": "/etc/x", "content": "y"}])
    );
    assert_eq!(config["runcmd"], json!([["touch", "/ran"]]));
    assert_eq!(config["ssh_deletekeys"], json!(false), "host keys kept");
    // The join itself is as without them.
    assert!(b.join_configuration.contains("kind: JoinConfiguration"));
    // Only what differs from the type's comes again: keys of its own with the type's user
    // data bring the keys alone (the type's commands ran at boot already).
    let typed = prepared(
        json!({"autonodes.io/user-data": "#cloud-config\nruncmd:\n  - touch /type\npackages:\n  - jq\n"}),
    );
    let keyed = claim(json!({"vClusterRef": {"name": "v"}, "properties": {
        "autonodes.io/ssh-keys": "ssh-ed25519 AAAA claim",
    }}));
    assert_eq!(
        servable(&typed, None, &keyed),
        Ok(()),
        "the type's packages ran at boot"
    );
    let b = binding(&typed, None, &keyed, "warm-small-x1", &join(), "prod").expect("binding");
    let config: serde_json::Value =
        serde_json::from_str(&b.user_data.expect("the keys")).expect("JSON");
    assert_eq!(
        config["ssh_authorized_keys"],
        json!(["ssh-ed25519 AAAA claim"])
    );
    assert!(config.get("runcmd").is_none(), "{config}");
    // What only a first boot applies is refused, not left out.
    let first_boot = claim(json!({"vClusterRef": {"name": "v"}, "properties": {
        "autonodes.io/user-data": "#cloud-config\nusers: [default]\n",
    }}));
    let err =
        binding(&t, None, &first_boot, "warm-small-x1", &join(), "prod").expect_err("refused");
    assert!(err.to_string().contains("\"users\""), "{err}");
}

#[test]
fn warm_user_data_carries_the_agent_and_its_own_credential_and_no_join() {
    let keys = vec!["ssh-ed25519 AAAA test".to_string()];
    let text = render_warm_user_data(&WarmUserDataInput {
        vm_name: "warm-small-x1",
        server: "https://10.0.2.2:6443",
        host_ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        token: "eyJhbGciOi.token",
        namespace: "vms",
        binding: &binding_name("warm-small-x1"),
        lease: &credential_name("warm-small-x1"),
        user_cloud_config: Some("#cloud-config\nruncmd:\n  - [echo, hi]\n"),
        ssh_keys: &keys,
    })
    .expect("rendered");
    assert!(text.starts_with("#cloud-config\n"));
    assert!(!text.contains("kubeadm join --config /etc/kubernetes/kubeadm-join.yaml\"]"));
    assert!(text.contains("autonodes-warm.service"));
    assert!(text.contains("ssh-ed25519 AAAA test"));
    let doc: Value = crate::yaml::from_str(&text).expect("YAML");
    let runcmd = doc.get("runcmd").and_then(Value::as_array).expect("runcmd");
    assert_eq!(
        runcmd[0],
        json!(["echo", "hi"]),
        "the type's own commands first"
    );
    let agent = read_warm_agent(&text).expect("agent config");
    assert_eq!(agent.server, "https://10.0.2.2:6443");
    assert_eq!(agent.token, "eyJhbGciOi.token");
    assert_eq!(agent.binding, "warm-small-x1-binding");
    assert_eq!(agent.lease, "warm-small-x1-warm");
    assert!(
        !format!("{agent:?}").contains("eyJ"),
        "Debug hides the token"
    );
    assert!(read_warm_agent("#cloud-config\nwrite_files: []\n").is_none());
}

#[test]
fn a_warm_vms_role_reads_only_its_own_binding_renews_only_its_own_lease_and_deletes_only_its_own_service_account(
) {
    let rules = role_rules("warm-a-1");
    let rules = rules.as_array().expect("rules");
    assert_eq!(rules.len(), 3);
    let deletes: Vec<&serde_json::Value> = rules
        .iter()
        .filter(|r| {
            r["verbs"]
                .as_array()
                .is_some_and(|v| v.contains(&json!("delete")))
        })
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0]["resources"], json!(["serviceaccounts"]));
    assert_eq!(deletes[0]["resourceNames"], json!(["warm-a-1-warm"]));
    assert_eq!(deletes[0]["verbs"], json!(["delete"]));
    for r in rules {
        let names = r["resourceNames"].as_array().expect("names");
        assert_eq!(names.len(), 1);
        assert!(names[0].as_str().expect("name").starts_with("warm-a-1-"));
        assert!(!r["verbs"]
            .as_array()
            .expect("verbs")
            .contains(&json!("list")));
    }
}

#[test]
fn warm_vm_names_are_dns_labels() {
    assert_eq!(vm_name("small", "x7k2q"), "warm-small-x7k2q");
    let long = vm_name(&"A_very.long-type".repeat(10), "abcde");
    assert!(
        long.len() <= 63 && crate::names::is_dns_label(&long),
        "{long}"
    );
    assert_eq!(vm_name("--", "abcde"), "warm-abcde");
}

#[test]
fn a_claim_is_about_to_launch_until_its_vm_is_made_or_a_warm_one_taken() {
    let mut c = claim(json!({"vClusterRef": {"name": "t"}}));
    assert!(about_to_launch(&c), "no status yet");
    let condition = |reason: &str| {
        json!({"type": "Provisioned", "status": "False", "reason": reason, "message": "",
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    c.status = serde_json::from_value(json!({"conditions": [condition("Creating")]})).ok();
    assert!(about_to_launch(&c), "scheduled, the VM not made yet");
    c.status = serde_json::from_value(json!({"conditions": [condition("Booting")]})).ok();
    assert!(!about_to_launch(&c), "its VM is made");
    c.status = serde_json::from_value(json!({
        "conditions": [condition("Creating")],
        "warm": {"boundAt": "2026-01-01T00:00:00Z"},
    }))
    .ok();
    assert!(!about_to_launch(&c), "it took a warm VM");
    let mut gone = claim(json!({"vClusterRef": {"name": "t"}}));
    gone.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)));
    assert!(!about_to_launch(&gone));
}

#[test]
fn every_reason_a_warm_vm_is_removed_for_has_a_metric_label_of_its_own() {
    let labels: std::collections::BTreeSet<&str> = REMOVALS.iter().map(|r| r.label()).collect();
    assert_eq!(labels.len(), REMOVALS.len());
    for r in REMOVALS {
        // Each variant is listed: the match in `label` and this list move together.
        assert!(!r.as_str().is_empty() && !r.label().contains(' '), "{r:?}");
    }
}

#[test]
fn a_type_with_an_address_pool_keeps_no_warm_vms() {
    let mut spec: autonodes_api::NodeTypeSpec = serde_json::from_value(json!({
        "providerRef": "p",
        "resources": {"cpu": "2", "memory": "4Gi"},
        "warm": {"replicas": 2},
    }))
    .expect("spec");
    assert!(type_problem(&prepare_type("p.small", &spec, Some(&provider()))).is_none());
    spec.address_pool = Some(autonodes_api::AddressPool {
        cidr: "10.1.0.0/24".into(),
        ..Default::default()
    });
    let t = prepare_type("p.small", &spec, Some(&provider()));
    let why = type_problem(&t).expect("no warm VMs");
    assert!(why.contains("a warm VM booted before its claim"), "{why}");
}

#[test]
fn a_type_whose_provider_places_vms_per_tenant_keeps_no_warm_vms() {
    let spec: autonodes_api::NodeTypeSpec = serde_json::from_value(json!({
        "providerRef": "p",
        "resources": {"cpu": "2", "memory": "4Gi"},
        "warm": {"replicas": 2},
    }))
    .expect("spec");
    let mut split = provider();
    split.per_tenant = Some(crate::catalogue::PerTenantNamespaces {
        prefix: "vms-".into(),
        create: true,
    });
    let t = prepare_type("p.small", &spec, Some(&split));
    let why = type_problem(&t).expect("no warm VMs");
    assert!(why.contains("vmNamespacePerTenant"), "{why}");
}
