//! What a pod asks of its node, counted the way the kube-scheduler counts it (Kubernetes'
//! `PodRequests` rule of `k8s.io/component-helpers/resource`, 1.32 and later), so that a
//! node sized by autonodes is a node the scheduler will bind the pod to:
//!
//! - regular containers add up;
//! - a native sidecar (an init container with `restartPolicy: Always`) runs for the pod's
//!   whole life: it adds to the regular containers, and to every init container after it,
//!   which runs while the sidecars started before it run;
//! - the pod needs at least the most any one init-container step needs;
//! - pod-level `spec.resources` (cpu, memory, hugepages; a request defaults to the
//!   limit) replace what the containers add up to, resource by resource;
//! - a pod being resized in place asks for the larger of its spec, the resources its
//!   status reports and those allocated to it (only the status and allocated ones when
//!   the resize was found infeasible);
//! - the pod's `overhead` comes on top.
//!
//! On servers before these features the fields are absent (an API server drops fields it
//! does not know), and the rule is the older one: the containers' sum or the largest init
//! container. A request the API server would default from a limit (a container or a pod
//! with limits only, as in a DaemonSet's template, which is not defaulted) counts as that
//! limit. Every caller — packing, DaemonSet overhead, consolidation, host room and
//! `explain` — reads pods through [`pod_requests`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, PodSpec, PodStatus};

use crate::resources::{parse_quantity, ResourceAmounts, CPU, MEMORY};

/// Resource name → amount in milli-units.
type List = BTreeMap<String, i128>;

/// The prefix of the hugepages resources, which pod-level resources may set too.
const HUGEPAGES_PREFIX: &str = "hugepages-";

/// The pod condition a kubelet sets while a resize waits, and its reason when the node can
/// never hold it (Kubernetes 1.33 and later).
const RESIZE_PENDING: &str = "PodResizePending";
/// The reason (and, before 1.33, the `status.resize` value) of a resize the node cannot
/// hold.
const INFEASIBLE: &str = "Infeasible";

/// What the pod of `spec` (and, once it runs, `status`) asks of its node, in milli-units
/// by resource name. A quantity that does not parse counts as zero, a negative one too.
pub fn pod_requests(spec: &PodSpec, status: Option<&PodStatus>) -> ResourceAmounts {
    let statuses: BTreeMap<&str, &ContainerStatus> = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|cs| (cs.name.as_str(), cs))
        .collect();
    let infeasible = status.is_some_and(resize_infeasible);
    let of = |c: &Container| {
        let spec = container_requests(c);
        match statuses.get(c.name.as_str()) {
            Some(cs) if cs.resources.is_some() => resized(&spec, cs, infeasible),
            _ => spec,
        }
    };

    let mut sum = List::new();
    for c in &spec.containers {
        add(&mut sum, &of(c));
    }
    let mut sidecars = List::new();
    let mut init_peak = List::new();
    for c in spec.init_containers.iter().flatten() {
        if is_sidecar(c) {
            let r = of(c);
            add(&mut sum, &r);
            add(&mut sidecars, &r);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut step = container_requests(c);
            add(&mut step, &sidecars);
            max_into(&mut init_peak, &step);
        }
    }
    max_into(&mut sum, &init_peak);

    if let Some(pod_level) = spec.resources.as_ref() {
        let requests = pod_level.requests.as_ref().map(list).unwrap_or_default();
        let limits = pod_level.limits.as_ref().map(list).unwrap_or_default();
        for (name, v) in requests {
            if pod_level_resource(&name) {
                sum.insert(name, v);
            }
        }
        // The API server defaults a pod-level request from its limit (a template is not
        // defaulted, so do it here).
        for (name, v) in limits {
            let set = pod_level
                .requests
                .as_ref()
                .is_some_and(|r| r.contains_key(&name));
            if pod_level_resource(&name) && !set {
                sum.insert(name, v);
            }
        }
    }

    if let Some(overhead) = spec.overhead.as_ref() {
        add(&mut sum, &list(overhead));
    }
    ResourceAmounts::from_milli(sum)
}

/// Whether an init container is a native sidecar (`restartPolicy: Always`).
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// A container's requests, each defaulted from its limit where absent (as the API server
/// defaults a pod's containers).
fn container_requests(c: &Container) -> List {
    let Some(r) = c.resources.as_ref() else {
        return List::new();
    };
    let mut out = r.limits.as_ref().map(list).unwrap_or_default();
    out.extend(r.requests.as_ref().map(list).unwrap_or_default());
    out
}

/// What a running container being resized asks for: the larger of its spec, its status
/// resources and what is allocated to it; without the spec when the resize is infeasible.
fn resized(spec: &List, cs: &ContainerStatus, infeasible: bool) -> List {
    let mut out = if infeasible {
        List::new()
    } else {
        spec.clone()
    };
    if let Some(r) = cs.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        max_into(&mut out, &list(r));
    }
    if let Some(a) = cs.allocated_resources.as_ref() {
        max_into(&mut out, &list(a));
    }
    out
}

/// Whether the pod's resize was found infeasible: the `PodResizePending` condition's
/// reason (1.33 and later) or `status.resize` (before).
fn resize_infeasible(status: &PodStatus) -> bool {
    let by_condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == RESIZE_PENDING)
        .map(|c| c.reason.as_deref() == Some(INFEASIBLE));
    by_condition.unwrap_or(status.resize.as_deref() == Some(INFEASIBLE))
}

/// Whether pod-level resources may set `name` (cpu, memory, hugepages).
fn pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

fn list(l: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> List {
    l.iter()
        .map(|(name, q)| (name.clone(), parse_quantity(&q.0).unwrap_or(0).max(0)))
        .collect()
}

fn add(into: &mut List, other: &List) {
    for (name, v) in other {
        *into.entry(name.clone()).or_insert(0) += v;
    }
}

fn max_into(into: &mut List, other: &List) {
    for (name, v) in other {
        let have = into.entry(name.clone()).or_insert(0);
        *have = (*have).max(*v);
    }
}

#[cfg(test)]
mod tests;
