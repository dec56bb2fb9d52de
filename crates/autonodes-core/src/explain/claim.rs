//! `autonodes explain nodeclaim`: each node type and every check it fails, whether a warm
//! VM served the claim or why none could, and the cheapest type left.

use std::collections::BTreeMap;

use crate::access::{provider_admits, TenantNamespace};
use crate::catalogue::Catalogue;
use crate::quota::{PreparedQuota, Usage};
use crate::scheduling::{fits, mismatches, ClaimRequest};
use autonodes_api::conditions;
use autonodes_api::{NodeClaim, NodeTypeHost, NodeTypeWarm};

use super::{condition_lines, key_of, Explanation, Finding};

/// What scheduling admits a type by, for the claim's namespace: the providers'
/// `tenantNamespaceSelector` and the NodeQuotas covering the namespace.
#[derive(Clone, Debug)]
pub struct Admission<'a> {
    /// The claim's namespace and its labels.
    pub namespace: TenantNamespace<'a>,
    /// The NodeQuotas covering it.
    pub quotas: &'a [PreparedQuota],
    /// What the namespace's claims hold.
    pub used: Usage,
    /// Each node type's room on its host as the controller last reported it
    /// (`status.host` of the NodeType, by name).
    pub hosts: BTreeMap<String, NodeTypeHost>,
    /// Each node type's warm VMs as the controller last reported them (`status.warm` of
    /// the NodeType, by name).
    pub warm: BTreeMap<String, NodeTypeWarm>,
    /// The warm VMs of the claim's pool as the controller last reported them (`status.warm`
    /// of the NodePool), if it keeps any.
    pub pool_warm: Option<autonodes_api::NodePoolWarm>,
}

/// The warm-VM line of a type the claim fits: whether a warm VM served it, or why none did
/// or would ([`crate::warm::servable`] decides, as when the claim is scheduled): of its
/// pool's own warm VMs when the pool keeps them on this type (`pool_warm`), else of the
/// type's. `None` when neither keeps warm VMs and the claim took none.
fn warm_line(
    t: &crate::catalogue::PreparedType,
    pool: Option<&autonodes_api::NodePoolSpec>,
    claim: &NodeClaim,
    warm: Option<&NodeTypeWarm>,
    pool_warm: Option<&autonodes_api::NodePoolWarm>,
    chosen: bool,
) -> Option<String> {
    let status = claim.status.as_ref();
    if let (true, Some(b)) = (chosen, status.and_then(|s| s.warm.as_ref())) {
        return Some(format!(
            "served by warm VM {} (taken at {}; binding {})",
            status.and_then(|s| s.vm_name.as_deref()).unwrap_or("?"),
            b.bound_at.0,
            match (b.written, b.released) {
                (_, true) => "read and deleted",
                (true, false) => "written",
                (false, false) => "not written yet",
            }
        ));
    }
    let launched = chosen && status.and_then(|s| s.vm_name.as_ref()).is_some();
    let pool_keeps = pool.zip(pool_warm).filter(|(p, w)| {
        crate::warm::pool::replicas(p) > 0 && w.node_type.as_deref() == Some(t.name.as_str())
    });
    if let Some((p, w)) = pool_keeps {
        let kept = format!(
            "its pool keeps {} warm VM(s) of this type, {} ready now",
            w.replicas, w.ready
        );
        return Some(
            match crate::warm::servable(&crate::warm::pool::pool_type(t, p), None, claim) {
                Err(why) => format!("{kept}; none can serve this claim: {why}"),
                Ok(()) if launched => format!(
                    "{kept}; none was ready when this claim was scheduled, so it was served cold"
                ),
                Ok(()) => format!("{kept}; a ready one would serve this claim"),
            },
        );
    }
    if t.warm_replicas <= 0 {
        return None;
    }
    let kept = match warm {
        Some(w) => format!(
            "the type keeps {} warm VM(s), {} ready now",
            t.warm_replicas, w.ready
        ),
        None => format!("the type keeps {} warm VM(s)", t.warm_replicas),
    };
    Some(match crate::warm::servable(t, pool, claim) {
        Err(why) => format!("{kept}; none can serve this claim: {why}"),
        Ok(()) if launched => {
            format!("{kept}; none was ready when this claim was scheduled (or the type kept none then), so it was served cold")
        }
        Ok(()) => format!("{kept}; a ready one would serve this claim"),
    })
}

/// The host-room line of a type, and whether the host has no room left for it (in the zone
/// the claim asks for, when it asks for one and the type lists zones).
fn host_room(host: Option<&NodeTypeHost>, zones: &[String]) -> (String, bool) {
    let Some(h) = host else {
        return ("the host's room is not reported".to_string(), false);
    };
    let why = h
        .message
        .as_deref()
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    let asked: Vec<(&String, &i64)> = h.zones.iter().filter(|(z, _)| zones.contains(z)).collect();
    if !asked.is_empty() {
        let text: Vec<String> = asked.iter().map(|(z, n)| format!("{n} in {z}")).collect();
        let full = asked.iter().all(|(_, n)| **n <= 0);
        return (
            format!("host room for {} more VM(s){why}", text.join(", ")),
            full,
        );
    }
    match h.headroom {
        Some(n) => (format!("host room for {n} more VM(s){why}"), n <= 0),
        None => (format!("the host's room is not known{why}"), false),
    }
}

/// Why the claim got (or would get) each node type of `catalogue`: not considered (another
/// provider, another pinned type), does not fit (each requirement, resource or extended
/// resource that fails, as scheduling checks them), full at `maxCapacity` (`claimed` counts
/// each type's claims), not allowed (the provider does not serve the namespace), over a
/// quota, no room on its host (in the claim's zone) as the NodeType last reported it, or
/// fits — the cheapest fitting type left is the one scheduling picks (the claim's
/// `Scheduled` condition says what the controller decided). `pool` is the claim's pool's
/// spec, whose requirements it also meets.
pub fn nodeclaim(
    claim: &NodeClaim,
    pool: Option<&autonodes_api::NodePoolSpec>,
    catalogue: &Catalogue,
    claimed: &BTreeMap<String, i64>,
    admission: &Admission,
) -> Explanation {
    let status = claim.status.clone().unwrap_or_default();
    let mut summary = vec![format!(
        "phase {}{}",
        status
            .phase
            .map_or("Pending".to_string(), |p| format!("{p:?}")),
        status
            .reason
            .as_deref()
            .map(|r| format!(", reason {r}"))
            .unwrap_or_default()
    )];
    if let Some(t) = &status.type_ref {
        summary.push(format!("scheduled to node type {t}"));
    }
    summary.extend(condition_lines(&status.conditions));
    let mut findings = Vec::new();
    let req = match ClaimRequest::new(&claim.spec, pool) {
        Ok(r) => r,
        Err(e) => {
            findings.push(Finding::new(
                "requirements",
                "cannot be read",
                vec![e.to_string()],
            ));
            return Explanation {
                kind: "NodeClaim",
                name: key_of(&claim.metadata),
                summary,
                findings,
            };
        }
    };
    let mut cheapest_seen = false;
    for t in catalogue.types() {
        let subject = format!("node type {} (cost {})", t.name, t.cost);
        if !req.considers(t) {
            let why = match (&claim.spec.type_ref, &claim.spec.provider_ref) {
                (Some(pinned), _) => format!("the claim asks for node type {pinned}"),
                (None, Some(p)) => format!("the claim asks for provider {p}"),
                (None, None) => "its pool's provider or type differs".to_string(),
            };
            findings.push(Finding::new(subject, "not considered", vec![why]));
            continue;
        }
        if !fits(t, &req) {
            let reasons = mismatches(t, &req)
                .iter()
                .map(ToString::to_string)
                .collect();
            findings.push(Finding::new(subject, "does not fit", reasons));
            continue;
        }
        let zones: Vec<String> = claim
            .spec
            .requirements
            .iter()
            .chain(pool.map(|p| p.requirements.as_slice()).unwrap_or_default())
            .filter(|r| r.key == "topology.kubernetes.io/zone")
            .flat_map(|r| r.values.clone())
            .chain(status.zone.clone())
            .collect();
        let count = claimed.get(&t.name).copied().unwrap_or(0);
        if !t.has_capacity(count) {
            let reasons = vec![format!(
                "{count} of maxCapacity {} claimed",
                t.max_capacity.unwrap_or_default()
            )];
            findings.push(Finding::new(subject, "full", reasons));
            continue;
        }
        if let Err(refused) = provider_admits(t, &admission.namespace) {
            findings.push(Finding::new(subject, "not allowed", vec![refused.message]));
            continue;
        }
        if let Err(message) = crate::quota::admits(
            admission.quotas,
            admission.namespace.name,
            &admission.used,
            t,
        ) {
            findings.push(Finding::new(subject, "over quota", vec![message]));
            continue;
        }
        let (room, host_full) = host_room(admission.hosts.get(&t.name), &zones);
        if host_full {
            findings.push(Finding::new(subject, "no host room", vec![room]));
            continue;
        }
        let verdict = if status.type_ref.as_deref() == Some(t.name.as_str()) {
            "chosen"
        } else if !cheapest_seen {
            "fits (cheapest with room)"
        } else {
            "fits (a cheaper type comes first)"
        };
        cheapest_seen = true;
        let mut reasons = vec![
            "requirements and resources met; below maxCapacity; allowed and within quota"
                .to_string(),
            room,
        ];
        reasons.extend(warm_line(
            t,
            pool,
            claim,
            admission.warm.get(&t.name),
            admission.pool_warm.as_ref(),
            verdict == "chosen",
        ));
        if verdict.starts_with("fits (cheapest") {
            if let Some(s) = conditions::get(&status.conditions, "Scheduled")
                .filter(|c| c.status == conditions::FALSE)
            {
                reasons.push(format!("not chosen yet: {} ({})", s.reason, s.message));
            }
        }
        findings.push(Finding::new(subject, verdict, reasons));
    }
    Explanation {
        kind: "NodeClaim",
        name: key_of(&claim.metadata),
        summary,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::reconcile::tests::catalogue_of;
    use serde_json::json;

    /// What admits types in namespace `t` (with `labels`): no quotas, nothing used, no
    /// host room or warm VMs reported.
    fn admission_in_t(labels: &BTreeMap<String, String>) -> Admission<'_> {
        Admission {
            namespace: TenantNamespace {
                name: "t",
                labels: Some(labels),
            },
            quotas: &[],
            used: Usage::default(),
            hosts: BTreeMap::new(),
            warm: BTreeMap::new(),
            pool_warm: None,
        }
    }

    #[test]
    fn a_pending_claim_names_each_node_type_and_why_it_was_not_chosen() {
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1, "maxCapacity": 1},
            {"name": "big", "resources": {"cpu": "8", "memory": "16Gi"}, "cost": 4},
            {"name": "gpu", "resources": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"}, "cost": 9},
        ]));
        let claim: NodeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "t"},
            "spec": {"vClusterRef": {"name": "t"}, "desiredCapacity": {"cpu": "2"}},
            "status": {"conditions": [{"type": "Scheduled", "status": "False", "reason": "QuotaExceeded",
                "message": "quota q allows 0 more", "lastTransitionTime": "2026-11-25T10:00:00Z"}]},
        }))
        .expect("claim");
        let claimed = BTreeMap::from([("p.small".to_string(), 1)]);
        let labels = BTreeMap::new();
        let admission = Admission {
            hosts: BTreeMap::from([(
                "p.big".to_string(),
                NodeTypeHost {
                    headroom: Some(3),
                    ..NodeTypeHost::default()
                },
            )]),
            ..admission_in_t(&labels)
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        let verdicts: Vec<(&str, &str)> = e
            .findings
            .iter()
            .map(|f| (f.subject.as_str(), f.verdict.as_str()))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("node type p.small (cost 1)", "full"),
                ("node type p.big (cost 4)", "fits (cheapest with room)"),
                ("node type p.gpu (cost 9)", "does not fit"),
            ]
        );
        assert!(e.findings[2].reasons[0].contains("nvidia.com/gpu"), "{e:?}");
        assert_eq!(
            e.findings[1].reasons[1], "host room for 3 more VM(s)",
            "{e:?}"
        );
        assert!(e.findings[1].reasons[2].contains("QuotaExceeded"), "{e:?}");
        assert!(e
            .text()
            .contains("node type p.small (cost 1): full\n    - 1 of maxCapacity 1 claimed"));
        // A quota of 4 CPUs for the namespace: the big type is over it.
        let spec: autonodes_api::NodeQuotaSpec =
            serde_json::from_value(json!({"limits": {"cpu": "4"}})).expect("quota");
        let quotas = [PreparedQuota::new("q", &spec)];
        let admission = Admission {
            quotas: &quotas,
            ..admission
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        assert_eq!(e.findings[1].verdict, "over quota", "{e:?}");
        // Without a quota, a host with no room left for the big type.
        let admission = Admission {
            quotas: &[],
            hosts: BTreeMap::from([(
                "p.big".to_string(),
                NodeTypeHost {
                    headroom: Some(0),
                    message: Some("every eligible host node is full".into()),
                    ..NodeTypeHost::default()
                },
            )]),
            ..admission
        };
        let e = nodeclaim(&claim, None, &catalogue, &claimed, &admission);
        assert_eq!(e.findings[1].verdict, "no host room", "{e:?}");
        assert!(
            e.findings[1].reasons[0].contains("host room for 0 more"),
            "{e:?}"
        );
    }

    #[test]
    fn a_claim_says_whether_a_warm_vm_served_it_and_why_none_could() {
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1, "warm": {"replicas": 2}},
        ]));
        let labels = BTreeMap::new();
        let admission = Admission {
            warm: BTreeMap::from([(
                "p.small".to_string(),
                NodeTypeWarm {
                    replicas: 2,
                    current: 2,
                    ready: 1,
                    ..NodeTypeWarm::default()
                },
            )]),
            ..admission_in_t(&labels)
        };
        let claim = |spec: serde_json::Value, status: serde_json::Value| -> NodeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "t"},
                "spec": spec,
                "status": status,
            }))
            .expect("claim")
        };
        let warm_reason = |c: &NodeClaim| {
            let e = nodeclaim(c, None, &catalogue, &BTreeMap::new(), &admission);
            e.findings[0]
                .reasons
                .iter()
                .find(|r| r.contains("warm"))
                .cloned()
                .unwrap_or_default()
        };
        let spec = json!({"vClusterRef": {"name": "t"}});
        let taken = claim(
            spec.clone(),
            json!({"typeRef": "p.small", "vmName": "warm-small-abcde",
                "warm": {"boundAt": "2026-11-25T10:00:00Z", "written": true}}),
        );
        assert_eq!(
            warm_reason(&taken),
            "served by warm VM warm-small-abcde (taken at 2026-11-25T10:00:00Z; binding written)"
        );
        let cold = claim(
            spec.clone(),
            json!({"typeRef": "p.small", "vmName": "t-c-12345"}),
        );
        assert_eq!(
            warm_reason(&cold),
            "the type keeps 2 warm VM(s), 1 ready now; none was ready when this claim was scheduled (or the type kept none then), so it was served cold"
        );
        let pending = claim(spec, json!({}));
        assert!(
            warm_reason(&pending).ends_with("a ready one would serve this claim"),
            "{}",
            warm_reason(&pending)
        );
        let own_image = claim(
            json!({"vClusterRef": {"name": "t"},
                "properties": {"kubevirt.vcluster.com/image-url": "docker://example/own:1"}}),
            json!({}),
        );
        let why = warm_reason(&own_image);
        assert!(
            why.contains("none can serve this claim") && why.contains("image-url"),
            "{why}"
        );
        let first_boot = claim(
            json!({"vClusterRef": {"name": "t"},
                "properties": {"autonodes.io/user-data": "#cloud-config\npackages: [htop]\n"}}),
            json!({}),
        );
        let why = warm_reason(&first_boot);
        assert!(
            why.contains("none can serve this claim") && why.contains("\"packages\""),
            "{why}"
        );
    }

    #[test]
    fn a_pools_claim_says_whether_its_pools_warm_vms_can_serve_it() {
        // The type keeps none; the pool keeps its own (its claims get its SSH key with their
        // binding).
        let catalogue = catalogue_of(json!([
            {"name": "small", "resources": {"cpu": "2", "memory": "4Gi"}, "cost": 1},
        ]));
        let pool: autonodes_api::NodePoolSpec = serde_json::from_value(json!({
            "vClusterRef": {"name": "t"},
            "properties": {"autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool"},
            "warm": {"replicas": 2},
        }))
        .expect("pool");
        let labels = BTreeMap::new();
        let admission = Admission {
            pool_warm: Some(autonodes_api::NodePoolWarm {
                node_type: Some("p.small".into()),
                replicas: 2,
                current: 2,
                ready: 2,
            }),
            ..admission_in_t(&labels)
        };
        let warm_reason = |properties: serde_json::Value| {
            let c: NodeClaim = serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "t"},
                "spec": {"vClusterRef": {"name": "t"}, "properties": properties},
            }))
            .expect("claim");
            nodeclaim(&c, Some(&pool), &catalogue, &BTreeMap::new(), &admission).findings[0]
                .reasons
                .iter()
                .find(|r| r.contains("warm"))
                .cloned()
                .unwrap_or_default()
        };
        // A claim of the pool carries its properties.
        assert_eq!(
            warm_reason(json!({"autonodes.io/ssh-keys": "ssh-ed25519 AAAA pool"})),
            "its pool keeps 2 warm VM(s) of this type, 2 ready now; a ready one would serve this claim"
        );
        // SSH keys of its own come with the binding too.
        assert_eq!(
            warm_reason(json!({"autonodes.io/ssh-keys": "ssh-ed25519 BBBB own"})),
            "its pool keeps 2 warm VM(s) of this type, 2 ready now; a ready one would serve this claim"
        );
        let why = warm_reason(json!({"autonodes.io/preference": "own"}));
        assert!(
            why.starts_with("its pool keeps 2 warm VM(s) of this type, 2 ready now; none can serve this claim: property autonodes.io/preference"),
            "{why}"
        );
    }
}
