//! The request rule, case by case as the kube-scheduler's own tests of `PodRequests` set
//! them out (sidecars before and after init containers, pod-level resources, resizes,
//! overhead), and properties against the rule before sidecars.

use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn spec(v: Value) -> PodSpec {
    serde_json::from_value(v).expect("pod spec")
}

fn status(v: Value) -> PodStatus {
    serde_json::from_value(v).expect("pod status")
}

fn c(name: &str, cpu: &str) -> Value {
    json!({"name": name, "resources": {"requests": {"cpu": cpu}}})
}

fn sidecar(name: &str, cpu: &str) -> Value {
    json!({"name": name, "restartPolicy": "Always", "resources": {"requests": {"cpu": cpu}}})
}

fn cpu(spec: &PodSpec) -> i128 {
    pod_requests(spec, None).cpu_millis()
}

#[test]
fn regular_containers_add_up_and_an_init_container_sets_a_floor() {
    let s = spec(json!({"containers": [c("a", "1"), c("b", "500m")],
        "initContainers": [c("i", "2")]}));
    assert_eq!(cpu(&s), 2000);
    let s = spec(json!({"containers": [c("a", "1"), c("b", "500m")],
        "initContainers": [c("i", "1")]}));
    assert_eq!(cpu(&s), 1500);
}

#[test]
fn a_sidecar_adds_to_the_containers_for_the_pods_whole_life() {
    // The pod: 1.5 CPU and a 1-CPU native sidecar asks for 2.5 CPU.
    let s = spec(json!({"containers": [c("app", "1500m")],
        "initContainers": [sidecar("mesh", "1")]}));
    assert_eq!(cpu(&s), 2500);
}

#[test]
fn a_sidecar_before_a_larger_init_container_runs_beside_it() {
    // The init container runs while the sidecar does: 1 + 3 = 4 > 1 + 1.
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [sidecar("mesh", "1"), c("migrate", "3")]}));
    assert_eq!(cpu(&s), 4000);
}

#[test]
fn a_sidecar_after_an_init_container_does_not_run_beside_it() {
    // The init container runs alone (3), later the app and the sidecar (2).
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [c("migrate", "3"), sidecar("mesh", "1")]}));
    assert_eq!(cpu(&s), 3000);
}

#[test]
fn two_sidecars_add_up_and_count_against_each_later_init_container() {
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [sidecar("a", "1"), sidecar("b", "2")]}));
    assert_eq!(cpu(&s), 4000);
    // The init container after both runs beside 3 CPU of sidecars: 3 + 2.5 > 1 + 3.
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [sidecar("a", "1"), sidecar("b", "2"), c("late", "2500m")]}));
    assert_eq!(cpu(&s), 5500);
    // Between them it runs beside the first alone: 1 + 2.5 < 1 + 3 + 1.
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [sidecar("a", "1"), c("mid", "2500m"), sidecar("b", "2")]}));
    assert_eq!(cpu(&s), 4000);
}

#[test]
fn pod_level_requests_replace_what_the_containers_add_up_to() {
    let s = spec(json!({
    "resources": {"requests": {"cpu": "3"}},
    "containers": [
        {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    ]}));
    let r = pod_requests(&s, None);
    assert_eq!(r.cpu_millis(), 3000);
    // Memory is not set at pod level: the containers' sum stands.
    assert_eq!(r.memory_bytes(), 2 << 30);
}

#[test]
fn a_pod_level_limit_without_a_request_counts_as_the_request() {
    let s = spec(json!({
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"memory": "3Gi"}},
        "containers": [{"name": "a"}]}));
    let r = pod_requests(&s, None);
    assert_eq!(r.cpu_millis(), 2000);
    assert_eq!(r.memory_bytes(), 3 << 30);
}

#[test]
fn pod_level_resources_do_not_set_extended_resources() {
    let s = spec(json!({
        "resources": {"requests": {"example.com/foo": "5"}},
        "containers": [{"name": "a", "resources": {"limits": {"example.com/foo": "1"}}}]}));
    assert_eq!(pod_requests(&s, None).milli("example.com/foo"), 1000);
}

#[test]
fn a_pod_being_resized_asks_for_the_larger_of_spec_status_and_allocated() {
    let s = spec(json!({"containers": [c("app", "1")]}));
    let running = |requests: &str, allocated: &str| {
        status(
            json!({"containerStatuses": [{"name": "app", "image": "", "imageID": "",
            "ready": true, "restartCount": 0,
            "resources": {"requests": {"cpu": requests}},
            "allocatedResources": {"cpu": allocated}}]}),
        )
    };
    // Growing: the spec asks for more than the container has.
    assert_eq!(
        pod_requests(&s, Some(&running("500m", "500m"))).cpu_millis(),
        1000
    );
    // Shrinking: the container still has more than the spec.
    assert_eq!(
        pod_requests(&s, Some(&running("2", "2"))).cpu_millis(),
        2000
    );
    // Allocated but not yet applied.
    assert_eq!(
        pod_requests(&s, Some(&running("500m", "3"))).cpu_millis(),
        3000
    );
}

#[test]
fn an_infeasible_resize_counts_what_the_container_has_not_the_spec() {
    let s = spec(json!({"containers": [c("app", "4")]}));
    let cs = json!([{"name": "app", "image": "", "imageID": "", "ready": true,
        "restartCount": 0, "resources": {"requests": {"cpu": "1"}},
        "allocatedResources": {"cpu": "1"}}]);
    let by_condition = status(json!({"containerStatuses": cs,
        "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]}));
    assert_eq!(pod_requests(&s, Some(&by_condition)).cpu_millis(), 1000);
    let before_1_33 = status(json!({"containerStatuses": cs, "resize": "Infeasible"}));
    assert_eq!(pod_requests(&s, Some(&before_1_33)).cpu_millis(), 1000);
    let deferred = status(json!({"containerStatuses": cs,
        "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]}));
    assert_eq!(pod_requests(&s, Some(&deferred)).cpu_millis(), 4000);
}

#[test]
fn a_resized_sidecar_counts_its_status_and_a_plain_init_container_its_spec() {
    let s = spec(json!({"containers": [c("app", "1")],
        "initContainers": [c("migrate", "1"), sidecar("mesh", "1")]}));
    let st = status(json!({"initContainerStatuses": [
        {"name": "migrate", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "resources": {"requests": {"cpu": "5"}}},
        {"name": "mesh", "image": "", "imageID": "", "ready": true, "restartCount": 0,
            "resources": {"requests": {"cpu": "2"}}}]}));
    assert_eq!(pod_requests(&s, Some(&st)).cpu_millis(), 3000);
}

#[test]
fn overhead_comes_on_top_of_everything() {
    let s = spec(json!({"overhead": {"cpu": "250m", "memory": "100Mi"},
        "resources": {"requests": {"cpu": "1"}},
        "containers": [c("app", "500m")]}));
    let r = pod_requests(&s, None);
    assert_eq!(r.cpu_millis(), 1250);
    assert_eq!(r.memory_bytes(), 100 << 20);
}

#[test]
fn a_container_with_limits_only_requests_its_limits() {
    let s = spec(json!({"containers": [{"name": "a", "resources": {
        "limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}}]}));
    let r = pod_requests(&s, None);
    assert_eq!(r.cpu_millis(), 1000);
    assert_eq!(r.memory_bytes(), 1 << 30);
}

#[test]
fn quantities_that_do_not_parse_or_are_negative_count_as_zero() {
    let s = spec(json!({"containers": [c("a", "lots"), c("b", "-1"), c("c", "1")]}));
    assert_eq!(cpu(&s), 1000);
}

/// A container of the property tests: cpu millicores and whether it is a sidecar.
fn containers() -> impl Strategy<Value = Vec<(u16, bool)>> {
    prop::collection::vec((0u16..4000, any::<bool>()), 0..6)
}

fn pod_of(regular: &[(u16, bool)], init: &[(u16, bool)]) -> PodSpec {
    let regular: Vec<Value> = regular
        .iter()
        .enumerate()
        .map(|(i, (m, _))| c(&format!("c{i}"), &format!("{m}m")))
        .collect();
    let init: Vec<Value> = init
        .iter()
        .enumerate()
        .map(|(i, (m, side))| {
            let name = format!("i{i}");
            if *side {
                sidecar(&name, &format!("{m}m"))
            } else {
                c(&name, &format!("{m}m"))
            }
        })
        .collect();
    spec(json!({"containers": regular, "initContainers": init}))
}

proptest! {
    #[test]
    fn without_sidecars_the_rule_is_the_one_before_sidecars(
        regular in containers(),
        init in containers(),
    ) {
        let init: Vec<(u16, bool)> = init.into_iter().map(|(m, _)| (m, false)).collect();
        let sum: i128 = regular.iter().map(|(m, _)| i128::from(*m)).sum();
        let largest = init.iter().map(|(m, _)| i128::from(*m)).max().unwrap_or(0);
        prop_assert_eq!(cpu(&pod_of(&regular, &init)), sum.max(largest));
    }

    #[test]
    fn a_pod_asks_at_least_for_its_containers_and_sidecars_and_for_each_init_step(
        regular in containers(),
        init in containers(),
    ) {
        let got = cpu(&pod_of(&regular, &init));
        let running: i128 = regular.iter().map(|(m, _)| i128::from(*m)).sum::<i128>()
            + init.iter().filter(|(_, s)| *s).map(|(m, _)| i128::from(*m)).sum::<i128>();
        prop_assert!(got >= running);
        let mut sidecars = 0;
        for (m, side) in &init {
            if *side {
                sidecars += i128::from(*m);
            } else {
                prop_assert!(got >= sidecars + i128::from(*m));
            }
        }
        // And never more than everything at once.
        let all: i128 = regular.iter().chain(&init).map(|(m, _)| i128::from(*m)).sum();
        prop_assert!(got <= all.max(0));
    }

    #[test]
    fn turning_an_init_container_into_a_sidecar_never_asks_for_less(
        regular in containers(),
        init in containers(),
        pick in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!init.is_empty());
        let i = pick.index(init.len());
        let mut more = init.clone();
        more[i].1 = true;
        prop_assert!(cpu(&pod_of(&regular, &more)) >= cpu(&pod_of(&regular, &init)));
    }

    #[test]
    fn the_order_of_regular_containers_does_not_matter(
        regular in containers(),
        init in containers(),
    ) {
        let mut reversed = regular.clone();
        reversed.reverse();
        prop_assert_eq!(cpu(&pod_of(&regular, &init)), cpu(&pod_of(&reversed, &init)));
    }
}
