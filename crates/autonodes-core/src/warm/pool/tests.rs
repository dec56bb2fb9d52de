//! Tests of [`super`].

use super::*;
use crate::catalogue::prepare_type;
use autonodes_api::{NodeClaim, NodePoolSpec};
use serde_json::{json, Value};

fn typed(name: &str, cost: i64, properties: Value) -> PreparedType {
    let spec = serde_json::from_value(json!({
        "providerRef": "p",
        "cost": cost,
        "resources": {"cpu": "2", "memory": "4Gi"},
        "properties": properties,
    }))
    .expect("spec");
    let t = prepare_type(
        &format!("p.{name}"),
        &spec,
        Some(&crate::warm::tests::provider()),
    );
    assert!(t.problem.is_none(), "{:?}", t.problem);
    t
}

fn pool(spec: Value) -> NodePoolSpec {
    let mut spec = spec;
    spec["vClusterRef"] = json!({"name": "t"});
    serde_json::from_value(spec).expect("pool")
}

fn room(nodes: i64) -> NamespaceRoom {
    NamespaceRoom {
        nodes,
        bound: "the controller allows namespace team 5 claims".into(),
    }
}

#[test]
fn a_pools_warm_vm_boots_with_its_types_ssh_keys_and_the_pools_image_settings_and_drifts_only_with_those(
) {
    let t = typed(
        "small",
        1,
        json!({"autonodes.io/ssh-keys": "ssh-ed25519 OPS ops"}),
    );
    let p = pool(json!({
        "properties": {
            "autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool",
            "autonodes.io/user-data": "#cloud-config\nruncmd: [[touch, /pool]]\n",
            "autonodes.io/image-prepared": "true",
            "example.com/team": "a",
        },
        "warm": {"replicas": 2},
    }));
    let pt = pool_type(&t, &p);
    // The tenant's keys and user data are not booted with: they come with the binding.
    assert_eq!(
        pt.properties
            .get("autonodes.io/ssh-keys")
            .map(String::as_str),
        Some("ssh-ed25519 OPS ops")
    );
    assert!(!pt.properties.contains_key("autonodes.io/user-data"));
    assert_eq!(
        pt.properties
            .get("autonodes.io/image-prepared")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(pt.name, t.name);
    assert_eq!(pt.warm_replicas, 2);
    assert_ne!(pt.definition, t.definition);
    // Another label-like property changes nothing a warm VM boots with, nor do new keys.
    let mut relabelled = p.clone();
    relabelled
        .properties
        .insert("example.com/team".into(), "b".into());
    assert_eq!(pool_type(&t, &relabelled).definition, pt.definition);
    let mut rekeyed = p.clone();
    rekeyed.properties.insert(
        "autonodes.io/ssh-keys".into(),
        "ssh-ed25519 BBBB pool".into(),
    );
    assert_eq!(pool_type(&t, &rekeyed).definition, pt.definition);
    // An image setting does.
    let mut unprepared = p.clone();
    unprepared
        .properties
        .insert("autonodes.io/image-prepared".into(), "false".into());
    assert_ne!(pool_type(&t, &unprepared).definition, pt.definition);
    assert_eq!(pool_problem(&t, &p), None);
}

#[test]
fn a_pool_that_boots_an_image_of_its_own_or_user_data_only_a_first_boot_applies_keeps_no_warm_vms()
{
    for (properties, said) in [
        (
            json!({"kubevirt.vcluster.com/image-url": "docker://tenant.example/own:1"}),
            "its type's image",
        ),
        (
            json!({"autonodes.io/user-data": "#cloud-config\npackages: [htop]\n"}),
            "\"packages\"",
        ),
    ] {
        let t = typed("small", 1, json!({}));
        let p = pool(json!({"properties": properties, "warm": {"replicas": 1}}));
        let why = pool_problem(&t, &p).expect("refused");
        assert!(why.contains(said), "{why}");
        let catalogue = Catalogue::new(vec![t]);
        let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(10), |_, _| Ok(()));
        assert_eq!(plan.node_type, None);
        assert!(
            plan.unavailable
                .as_deref()
                .is_some_and(|u| u.contains(said)),
            "{plan:?}"
        );
    }
}

#[test]
fn a_claim_of_the_pool_is_servable_by_the_pools_warm_vm_and_gets_the_pools_keys_with_its_binding() {
    let t = typed("small", 1, json!({}));
    let p = pool(json!({
        "properties": {"autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool", "kubevirt.vcluster.com/root-disk-size": "30Gi"},
        "warm": {"replicas": 1},
    }));
    // A pool's claim carries the pool's properties (its template).
    let claim: NodeClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "team", "uid": "u-1"},
        "spec": crate::pool::template_spec(&p),
    }))
    .expect("claim");
    // The type's VMs boot with another root disk; the pool's with the pool's.
    assert!(super::super::servable(&t, None, &claim).is_err());
    let pt = pool_type(&t, &p);
    assert_eq!(super::super::servable(&pt, None, &claim), Ok(()));
    let b = super::super::binding(
        &pt,
        None,
        &claim,
        "warm-small-x",
        &crate::warm::tests::join(),
        "prod",
    )
    .expect("binding");
    let user_data: Value =
        serde_json::from_str(b.user_data.as_deref().expect("the pool's keys")).expect("JSON");
    assert_eq!(
        user_data["ssh_authorized_keys"],
        json!(["ssh-ed25519 AAAA pool"])
    );
}

#[test]
fn a_pool_keeps_warm_vms_of_the_cheapest_type_that_can_keep_them() {
    let cheap_zoned = typed("zoned", 1, json!({"topology.kubernetes.io/zone": "a,b"}));
    let small = typed("small", 2, json!({}));
    let big = typed("big", 3, json!({}));
    let catalogue = Catalogue::new(vec![cheap_zoned, small, big]);
    let p = pool(json!({"warm": {"replicas": 3}}));
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(10), |_, _| Ok(()));
    assert_eq!(plan.node_type.as_deref(), Some("p.small"));
    assert_eq!((plan.asked, plan.wanted), (3, 3));
    assert_eq!((plan.limited, plan.unavailable), (None, None));
    // The pool's requirements narrow the types as for its claims.
    let p = pool(json!({
        "warm": {"replicas": 1},
        "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["big"]}],
    }));
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(10), |_, _| Ok(()));
    assert_eq!(plan.node_type.as_deref(), Some("p.big"));
}

#[test]
fn a_pool_whose_only_type_keeps_no_warm_vms_says_why() {
    let catalogue = Catalogue::new(vec![typed(
        "zoned",
        1,
        json!({"topology.kubernetes.io/zone": "a,b"}),
    )]);
    let p = pool(json!({"warm": {"replicas": 1}}));
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(10), |_, _| Ok(()));
    assert_eq!((plan.node_type, plan.wanted), (None, 0));
    let why = plan.unavailable.expect("why");
    assert!(why.contains("p.zoned keeps no warm VMs"), "{why}");
    // No warm VMs asked for: nothing to say.
    let plan = plan_pool(
        &pool(json!({})),
        &catalogue,
        &BTreeMap::new(),
        &room(10),
        |_, _| Ok(()),
    );
    assert_eq!(plan, PoolWarmPlan::default());
}

#[test]
fn the_namespaces_room_and_quota_bound_a_pools_warm_vms() {
    let catalogue = Catalogue::new(vec![typed("small", 1, json!({}))]);
    let p = pool(json!({"warm": {"replicas": 4}}));
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(2), |_, _| Ok(()));
    assert_eq!(plan.wanted, 2);
    let why = plan.limited.expect("limited");
    assert!(
        why.starts_with("2 of 4 warm VM(s): the controller allows namespace team 5 claims"),
        "{why}"
    );
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(-3), |_, _| Ok(()));
    assert_eq!(plan.wanted, 0);
    let plan = plan_pool(&p, &catalogue, &BTreeMap::new(), &room(10), |t, k| {
        if k < 1 {
            Ok(())
        } else {
            Err(format!("NodeQuota q: {} would exceed cpu", t.name))
        }
    });
    assert_eq!(plan.wanted, 1);
    assert_eq!(
        plan.limited.as_deref(),
        Some("1 of 4 warm VM(s): NodeQuota q: p.small would exceed cpu")
    );
}

#[test]
fn a_pools_replicas_are_bounded() {
    let p = pool(json!({"warm": {"replicas": 1_000_000}}));
    assert_eq!(replicas(&p), i64::from(MAX_POOL_WARM_REPLICAS));
    let p = pool(json!({"warm": {"replicas": -4}}));
    assert_eq!(replicas(&p), 0);
}

#[test]
fn a_namespaces_claims_its_other_pools_warm_vms_and_its_quota_leave_the_room() {
    let ns = |live, quota_nodes, quota_missing| NamespaceClaims {
        namespace: "team",
        live,
        max: 10,
        quota_nodes,
        quota_missing,
    };
    let room = namespace_room(&ns(4, None, false), 3);
    assert_eq!(room.nodes, 3);
    assert_eq!(
        room.bound,
        "the controller allows namespace team 10 nodes (--max-claims-per-namespace)"
    );
    let room = namespace_room(&ns(4, Some(("q", 6)), false), 1);
    assert_eq!(room.nodes, 1);
    assert_eq!(room.bound, "NodeQuota q limits namespace team to 6 nodes");
    assert_eq!(namespace_room(&ns(7, Some(("q", 6)), false), 0).nodes, -1);
    assert_eq!(namespace_room(&ns(0, None, true), 0).nodes, 0);
}

fn planned(asked: i64, wanted: i64) -> PoolWarmPlan {
    PoolWarmPlan {
        node_type: Some("p.small".into()),
        wanted,
        asked,
        ..PoolWarmPlan::default()
    }
}

fn kept(current: i64, ready: i64, granted: i64) -> GroupCounts {
    GroupCounts {
        current,
        ready,
        granted,
        kept: true,
    }
}

#[test]
fn a_pools_warm_status_says_ready_starting_or_what_limits_it() {
    // Not kept by the type yet: starting, not limited.
    let (status, condition) = pool_status(&planned(2, 2), GroupCounts::default(), 0);
    assert_eq!(status.map(|s| (s.replicas, s.current)), Some((0, 0)));
    assert_eq!(
        condition.map(|c| (c.0, c.1)),
        Some((false, PoolReason::WarmStarting))
    );
    let (status, condition) = pool_status(&planned(2, 2), kept(2, 2, 2), 0);
    assert_eq!(
        status,
        Some(NodePoolWarm {
            node_type: Some("p.small".into()),
            replicas: 2,
            current: 2,
            ready: 2,
        })
    );
    assert_eq!(
        condition,
        Some((
            true,
            PoolReason::WarmReady,
            "2 warm VM(s) of node type p.small ready for the pool's claims".into()
        ))
    );
    // Warm VMs left on a type the pool moved away from: not ready yet.
    let (_, condition) = pool_status(&planned(2, 2), kept(2, 2, 2), 1);
    assert_eq!(condition.map(|c| c.1), Some(PoolReason::WarmStarting));
    // The type's maxCapacity grants fewer, and the group holds what it grants.
    let (status, condition) = pool_status(&planned(3, 3), kept(1, 1, 1), 0);
    assert_eq!(status.map(|s| s.replicas), Some(1));
    let (ok, reason, message) = condition.expect("condition");
    assert_eq!((ok, reason), (false, PoolReason::WarmLimited));
    assert!(
        message.contains("node type p.small's maxCapacity"),
        "{message}"
    );
    // The namespace's room, as the plan says.
    let mut limited = planned(3, 1);
    limited.limited =
        Some("1 of 3 warm VM(s): NodeQuota q limits namespace team to 4 nodes".into());
    let (_, condition) = pool_status(&limited, kept(1, 1, 1), 0);
    assert_eq!(
        condition.map(|c| (c.1, c.2)),
        Some((
            PoolReason::WarmLimited,
            "1 of 3 warm VM(s): NodeQuota q limits namespace team to 4 nodes".into()
        ))
    );
}

#[test]
fn a_pool_that_asks_for_none_shows_what_it_still_has_and_no_condition() {
    let (status, condition) = pool_status(&PoolWarmPlan::default(), kept(0, 0, 0), 2);
    assert_eq!(status.map(|s| (s.current, s.node_type)), Some((2, None)));
    assert_eq!(condition, None);
    assert_eq!(
        pool_status(&PoolWarmPlan::default(), kept(0, 0, 0), 0),
        (None, None)
    );
}
