//! `autonodes explain` on real API servers: the binary, pointed at the management cluster by
//! `KUBECONFIG`, explains a claim no node type fits, a pool with a held and an unhealthy
//! node, one of its nodes, and a pod the kube-scheduler found no node for; the test checks the reasons it names and keeps the output in
//! `docs/src/explain.md` (`AUTONODES_UPDATE_DOCS=1` rewrites it; otherwise the page must
//! show what the command prints, names and times aside).

use crate::common;

use std::process::Command;

use autonodes_api::{NodeClaim, NodeType};
use common::pools::*;
use common::world::*;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

/// Runs `autonodes explain ARGS` against the management cluster, letting it reach the
/// tenant on loopback (`--tenant-allow-cidrs 127.0.0.1`, as the test's controller does);
/// returns its stdout.
fn explain(world: &World, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--tenant-allow-cidrs", "127.0.0.1"]);
    let (ok, stdout, stderr) = explain_as_is(world, &all);
    assert!(ok, "autonodes explain {args:?} failed: {stdout}{stderr}");
    stdout
}

/// Runs `autonodes explain ARGS` as given: whether it succeeded, its stdout and stderr.
fn explain_as_is(world: &World, args: &[&str]) -> (bool, String, String) {
    let mgmt = world.playground.mgmt().expect("mgmt");
    let out = Command::new(env!("CARGO_BIN_EXE_autonodes"))
        .arg("explain")
        .args(args)
        .env("KUBECONFIG", &mgmt.kubeconfig_path)
        .output()
        .expect("autonodes explain runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The output with the run's random names and times replaced by fixed ones, and a pool's
/// claims in a fixed order (by what they show).
fn normalized(text: &str, names: &[(String, &str)]) -> String {
    let mut t = text.to_string();
    for (real, alias) in names {
        t = t.replace(real.as_str(), alias);
    }
    // RFC 3339 times, moved so that the earliest is 2026-11-29T10:00:00Z (whole seconds).
    let mut times: Vec<(usize, usize, Timestamp)> = Vec::new();
    let bytes = t.as_bytes();
    let mut i = 0;
    while i + 20 <= bytes.len() {
        let is_time = bytes[i + 4] == b'-'
            && bytes[i + 10] == b'T'
            && bytes[i + 13] == b':'
            && bytes[i..i + 4].iter().all(u8::is_ascii_digit);
        if is_time {
            let mut end = i + 19;
            while end < bytes.len() && (bytes[end].is_ascii_digit() || bytes[end] == b'.') {
                end += 1;
            }
            if end < bytes.len() && bytes[end] == b'Z' {
                end += 1;
                if let Ok(ts) = t[i..end].parse::<Timestamp>() {
                    times.push((i, end, ts));
                    i = end;
                    continue;
                }
            }
        }
        i += 1;
    }
    let base: Timestamp = "2026-11-29T10:00:00Z".parse().expect("time");
    let earliest = times.iter().map(|(_, _, ts)| ts.as_second()).min();
    let mut out = String::new();
    let mut at = 0;
    for (start, end, ts) in &times {
        out.push_str(&t[at..*start]);
        let moved = base.as_second() + ts.as_second() - earliest.unwrap_or_default();
        out.push_str(&Timestamp::from_second(moved).expect("time").to_string());
        at = *end;
    }
    out.push_str(&t[at..]);

    // Claim blocks sorted by their text; the blocks before them stay in place.
    let mut blocks: Vec<String> = Vec::new();
    for line in out.lines() {
        if !line.starts_with(' ') || blocks.is_empty() {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    let (mut claims, others): (Vec<String>, Vec<String>) =
        blocks.into_iter().partition(|b| b.starts_with("claim "));
    claims.sort();
    others.into_iter().chain(claims).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_why_a_claim_fits_no_type_what_holds_repairs_or_budgets_a_pools_nodes_and_which_pool_could_serve_a_pod(
) {
    // `quick` costs more than `small`, so the pools choose `small`; it keeps a warm VM,
    // which the claim `fast` takes.
    let quick = format!(
        "{}\n        cost: 500\n        warm:\n          replicas: 1",
        node_type("quick", "2", "4Gi")
    );
    let world = World::start(WorldOptions {
        provider: pools_provider(&[small(), quick]),
        ..WorldOptions::default()
    })
    .await;
    let _scheduler = scheduler(&world);
    world
        .create_pool(
            "workers",
            json!({"providerRef": "pools", "replicas": 2,
                   "disruption": {"budgets": [{"nodes": "0", "reasons": ["Drifted"]}]},
                   "repair": {"conditions": [{"type": "KernelDeadlock", "status": "True",
                                              "tolerationDuration": "1h"}]}}),
        )
        .await;
    let claims = common::eventually("2 Available workers", WAIT, || async {
        let claims = pool_claims(&world, "workers").await;
        (claims.len() == 2 && claims.iter().all(available)).then_some(claims)
    })
    .await;
    let (held, sick) = (claims[0].clone(), claims[1].clone());
    let node_of = |c: &NodeClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("node")
    };
    let (held_node, sick_node) = (node_of(&held), node_of(&sick));
    world
        .claims()
        .patch(
            &held.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
            ),
        )
        .await
        .expect("claim marked");
    set_node_condition(&world, &sick_node, "KernelDeadlock", "True").await;
    world
        .wait_pool("workers", "one unhealthy node", |p| {
            pool_condition(p, "NodeRepair").is_some_and(|(_, _, m)| m.starts_with("1 of 2"))
        })
        .await;
    // A claim asking for more than any type has.
    world
        .create_claim(json!({
            "metadata": {"name": "huge"},
            "spec": {"vClusterRef": {"name": "tenant"}, "desiredCapacity": {"cpu": "64"}},
        }))
        .await;
    world
        .wait_claim("huge", "Scheduled=False", WAIT, |c| {
            c.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NoMatchingNodeType")
        })
        .await;

    // A claim served by the warm VM of `quick` (once it is ready), after its binding is gone.
    let types: Api<NodeType> = Api::all(world.mgmt.clone());
    common::eventually("a ready warm VM of pools.quick", WAIT, || async {
        let t = types.get("pools.quick").await.ok()?;
        (t.status?.warm?.ready >= 1).then_some(())
    })
    .await;
    world
        .create_claim(json!({
            "metadata": {"name": "fast"},
            "spec": {"vClusterRef": {"name": "tenant"}, "requirements": [
                {"key": "autonodes.io/node-type", "operator": "In", "values": ["quick"]}]},
        }))
        .await;
    let fast = world
        .wait_claim(
            "fast",
            "Available on its warm VM, binding released",
            WAIT,
            |c| {
                available(c)
                    && c.status
                        .as_ref()
                        .and_then(|s| s.warm.as_ref())
                        .is_some_and(|w| w.released)
            },
        )
        .await;
    let warm_vm = fast
        .status
        .as_ref()
        .and_then(|s| s.vm_name.clone())
        .expect("VM");
    let warm_text = explain(&world, &["nodeclaim", "tenant/fast"]);
    assert!(
        warm_text.contains(
            "node type pools.quick (cost 500): chosen\n    - requirements and resources met"
        ) && warm_text.contains(&format!("    - served by warm VM {warm_vm} (taken at ")),
        "{warm_text}"
    );
    assert!(
        warm_text.contains("binding read and deleted"),
        "{warm_text}"
    );

    // A pod only a dynamic pool's nodes may take, and that pool may make no node (made
    // once every node of the page has joined, so its condition counts them all).
    world
        .create_pool(
            "burst",
            json!({"providerRef": "pools", "labels": {"team": "burst"}, "limits": {"nodes": 0}}),
        )
        .await;
    // `web` must also run beside `cache` (required pod affinity on the hostname).
    let mut cache = pod("cache", Some(("team", "burst")));
    cache.metadata.labels = Some([("app".to_string(), "cache".to_string())].into());
    let mut web = pod("web", Some(("team", "burst")));
    if let Some(spec) = web.spec.as_mut() {
        spec.affinity = serde_json::from_value(json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": "cache"}}}]}}))
        .expect("affinity");
    }
    create_pods(&world, [cache, web]).await;
    world
        .wait_pool("burst", "LimitReached", |p| {
            pool_condition(p, "LimitReached").is_some_and(|(s, _, _)| s == "True")
        })
        .await;

    let claim_text = explain(&world, &["nodeclaim", "tenant/huge"]);
    assert!(
        claim_text.contains("node type pools.small (cost "),
        "{claim_text}"
    );
    assert!(
        claim_text.contains("): does not fit\n    - desiredCapacity not covered"),
        "{claim_text}"
    );
    assert!(
        claim_text.contains("Scheduled=False (NoMatchingNodeType)"),
        "{claim_text}"
    );

    // kubectl's way: NAME with -n, --kubeconfig instead of KUBECONFIG, -o yaml (the same
    // explanation as -o json).
    let mgmt = world.playground.mgmt().expect("mgmt");
    let kubectl_style = Command::new(env!("CARGO_BIN_EXE_autonodes"))
        .args(["explain", "nodeclaim", "huge", "-n", "tenant", "-o", "yaml"])
        .arg("--kubeconfig")
        .arg(&mgmt.kubeconfig_path)
        .args(["--tenant-allow-cidrs", "127.0.0.1"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("autonodes explain runs");
    let yaml = String::from_utf8_lossy(&kubectl_style.stdout).into_owned();
    assert!(
        kubectl_style.status.success(),
        "explain with -n and --kubeconfig: {yaml}{}",
        String::from_utf8_lossy(&kubectl_style.stderr)
    );
    let from_yaml: serde_json::Value = autonodes_core::yaml::from_str(&yaml).expect("YAML");
    let from_json: serde_json::Value = serde_json::from_str(&explain(
        &world,
        &["nodeclaim", "tenant/huge", "-o", "json"],
    ))
    .expect("JSON");
    let keys = |v: &serde_json::Value| {
        v.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert!(!keys(&from_yaml).is_empty(), "{yaml}");
    assert_eq!(keys(&from_yaml), keys(&from_json));
    assert!(yaml.contains("NoMatchingNodeType"), "{yaml}");
    let (ok, _, stderr) = explain_as_is(&world, &["nodeclaim", "huge"]);
    assert!(!ok);
    assert!(
        stderr.contains("is not NAMESPACE/NAME (or NAME with -n NAMESPACE)"),
        "{stderr}"
    );

    let pool_text = explain(&world, &["nodepool", "tenant/workers"]);
    for expected in [
        "static pool of 2 replicas",
        "Drifted: 0 of 2 node(s) may be disrupted now (0 allowed, 0 draining)",
        "Empty: no active budget limits it",
        "unhealthy: KernelDeadlock=True for 3600s",
        &format!(
            "claim {} (node {held_node}): available\n    - do-not-disrupt on the claim",
            held.name_any()
        ),
        &format!(
            "claim {} (node {sick_node}): unhealthy\n    - unhealthy since ",
            sick.name_any()
        ),
        "KernelDeadlock=True; due at ",
        "repair is blocked: 1 of 2 nodes are unhealthy, more than maxUnhealthy (20 %)",
    ] {
        assert!(
            pool_text.contains(expected),
            "{expected:?} not in:\n{pool_text}"
        );
    }
    let pool_json: serde_json::Value = serde_json::from_str(&explain(
        &world,
        &["nodepool", "tenant/workers", "-o", "json"],
    ))
    .expect("JSON");
    assert_eq!(pool_json["kind"], "NodePool");
    assert_eq!(pool_json["findings"][1]["subject"], "repair policy");

    // On the unhealthy node: a pod marked do-not-disrupt, which a PodDisruptionBudget covers.
    let mut db = pod("db", None);
    db.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
    db.metadata.annotations = Some(
        [(
            "karpenter.sh/do-not-disrupt".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    if let Some(spec) = db.spec.as_mut() {
        spec.node_name = Some(sick_node.clone());
    }
    create_pods(&world, [db]).await;
    let pdbs: Api<kube::api::DynamicObject> = Api::namespaced_with(
        world.tenant.clone(),
        "default",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    );
    let pdb: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .expect("PDB");
    pdbs.create(&Default::default(), &pdb)
        .await
        .expect("PDB created");
    let node_text = explain(&world, &["node", &sick_node, "--vcluster", "tenant/tenant"]);
    for expected in [
        "in the tenant: held",
        "do-not-disrupt pod default/db for good",
        "PodDisruptionBudget default/db allows no eviction of pod default/db now",
    ] {
        assert!(
            node_text.contains(expected),
            "{expected:?} not in:\n{node_text}"
        );
    }
    assert!(
        node_text.starts_with(&format!("Node {sick_node}\n")),
        "{node_text}"
    );
    assert!(node_text.contains(&format!(
        "claim {} (node {sick_node}): unhealthy",
        sick.name_any()
    )));
    assert!(
        !node_text.contains(&held.name_any()),
        "only its own claim: {node_text}"
    );

    // The kube-scheduler tries the pod again as nodes join: its condition counts them all
    // (the page shows the same count on every run) once it names as many as there are.
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(world.tenant.clone(), "default");
    common::eventually(
        "web's condition to count every tenant node",
        WAIT,
        || async {
            let nodes = world.nodes().await.len();
            let web = pods.get("web").await.ok()?;
            let message = web
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?
                .message?;
            message
                .starts_with(&format!("0/{nodes} nodes are available"))
                .then_some(())
        },
    )
    .await;
    let pod_text = explain(
        &world,
        &["pod", "default/web", "--vcluster", "tenant/tenant"],
    );
    // Without the allowance the controller has, a tenant on loopback is refused, as the
    // controller refuses it: the pod cannot be explained, the node is without the tenant.
    let (ok, out, err) = explain_as_is(
        &world,
        &["pod", "default/web", "--vcluster", "tenant/tenant"],
    );
    println!("explain pod, loopback tenant refused: {err}");
    assert!(!ok, "{out}");
    assert!(err.contains("address is refused"), "{err}");
    let (ok, out, err) =
        explain_as_is(&world, &["node", &sick_node, "--vcluster", "tenant/tenant"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("the tenant could not be read") && out.contains("address is refused"),
        "{out}"
    );
    for expected in [
        "the kube-scheduler found no node for it",
        "pool tenant/burst (weight 0): could serve it\n    - pools.small: takes it\n",
        "the pool says LimitReached=True",
        "pool tenant/workers (weight 0): static",
        "must share one node with default/cache (required pod affinity on the hostname): together they ask for cpu 2, memory 512Mi",
        "the group needs a node that holds all its pods: the cheapest type that does is",
    ] {
        assert!(
            pod_text.contains(expected),
            "{expected:?} not in:\n{pod_text}"
        );
    }

    let names = [
        (sick_node.clone(), "tenant-workers-x9d4t-5e1f0a"),
        (held_node.clone(), "tenant-workers-7kq2m-c3b9d2"),
        (sick.name_any(), "workers-x9d4t"),
        (held.name_any(), "workers-7kq2m"),
        (warm_vm.clone(), "warm-quick-h3n8w"),
    ];
    // The warm VM's address and the host's room (which the refill VM may or may not take
    // yet) vary from run to run too.
    let after = |text: &str, marker: &str| -> String {
        text.split_once(marker)
            .map(|(_, rest)| {
                rest.chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect()
            })
            .unwrap_or_default()
    };
    let warm_names = [
        names.to_vec(),
        vec![
            (
                format!(" runs at {} ", after(&warm_text, " runs at ")),
                " runs at 10.128.4.17 ",
            ),
            (
                format!("host room for {} more", after(&warm_text, "host room for ")),
                "host room for 40 more",
            ),
        ],
    ]
    .concat();
    let page = format!(
        "# Explaining decisions: `autonodes explain`\n\n\
         <!-- Written by `cargo test -p autonodes --test it explain::` (AUTONODES_UPDATE_DOCS=1); the\n\
         test checks that this page shows what the command prints, names and times aside. -->\n\n\
         `autonodes explain` says why a NodeClaim, a NodePool, a tenant Node or a tenant pod is\n\
         where it is, from the rules the controller decides with. It reads the management cluster\n\
         as kubectl finds it (`--kubeconfig FILE`, else `KUBECONFIG`, else `~/.kube/config`;\n\
         `--context NAME`), needs get and list on NodeClaims, NodePools, NodeProviders,\n\
         NodeTypes and NodeQuotas and get on Namespaces (for a pod also get on the vCluster's\n\
         `vc-NAME` Secret), and writes nothing. A claim, a pool or a `--vcluster` is\n\
         `NAMESPACE/NAME`, or `NAME` with `-n NAMESPACE` (`autonodes explain nodeclaim huge -n\n\
         tenant`). `-o json` and `-o yaml` print the same as data (`kind`, `name`, `summary`,\n\
         `findings[]` of `subject`, `verdict`, `reasons[]`); `--node-repair-after` is the\n\
         controller's, for pools whose repair lists no conditions. Where replicas share the\n\
         tenants (`--shard-tenants`), a claim's and a pool's summary ends with the replica that\n\
         serves their namespace (`served by replica autonodes-1-3c4d… (member 2 of 3 live; the\n\
         leader schedules its claims)`), from the member Leases in `--controller-namespace`\n\
         (default `autonodes-system`, or `AUTONODES_NAMESPACE`; list on Leases there).\n\n\
         A claim names each node type and every check it fails (requirements, resources,\n\
         extended resources), a type at `maxCapacity`, one whose provider does not serve the\n\
         claim's namespace, one over a NodeQuota, one whose host has no room left (in the\n\
         claim's zone) as its NodeType's `status.host` says, and the cheapest type left:\n\n```\n$ autonodes explain nodeclaim tenant/huge\n{}```\n\n\
         For the type chosen (or the cheapest that fits), it says whether a warm VM served the\n\
         claim, or why none did: the type keeps none, none was ready when the claim was\n\
         scheduled, or the claim asks for what a warm VM cannot give it ([warm VMs](warm.md)):\n\n\
         ```\n$ autonodes explain nodeclaim tenant/fast\n{}```\n\n\
         A pool: what each disruption reason may disrupt now under the budgets, the repair policy,\n\
         and for each claim what holds, consolidates, rolls or repairs it (here one claim is\n\
         marked do-not-disrupt and the other's Node reports `KernelDeadlock=True`):\n\n\
         ```\n$ autonodes explain nodepool tenant/workers\n{}```\n\n\
         A tenant Node: the same for its own claim, and what holds it in the tenant (its own\n\
         do-not-disrupt mark, pods marked so, PodDisruptionBudgets that allow no eviction of a\n\
         pod on it now); the tenant is read as for a pod, below:\n\n\
         ```\n$ autonodes explain node tenant-workers-x9d4t-5e1f0a --vcluster tenant/tenant\n{}```\n\n\
         A pod of the tenant (read through the vCluster's `vc-NAME` Secret or\n\
         `--tenant-kubeconfig FILE`, either checked as the controller checks tenant\n\
         kubeconfigs: no commands, files, proxies or impersonation; a Secret naming the\n\
         vCluster's own `https://localhost:8443` is followed to the vCluster's Service as the\n\
         controller follows it, which answers from inside the cluster — from a laptop, give\n\
         `--tenant-kubeconfig` a kubeconfig for a port-forward instead, with\n\
         `--tenant-allow-cidrs 127.0.0.1`; the tenant is reached as the controller reaches it:\n\
         loopback and link-local refused unless `--tenant-allow-cidrs` allows them, the\n\
         management API server always (explain stops when it cannot read its addresses),\n\
         answers capped, every read within 30 s): each of\n\
         the tenant's pools in\n\
         the order they get pending pods, whether one of its node types would take the pod (the\n\
         pool's requirements, the pod's node selector, required node affinity and tolerations,\n\
         its requests against what a node leaves after `kubeReserved` and DaemonSets,\n\
         `maxCapacity`), and what holds a pool that could (limits, registration back-off, pod\n\
         rules it cannot meet). A pod bound to others by required pod affinity on the hostname\n\
         is told with them: the node of the running pods it can only follow, or the pending pods\n\
         it must share one node with, what they ask for together, and for each pool the\n\
         cheapest type that holds them all (and the smaller one that would have taken the pod\n\
         alone), or that none does. Here the pod selects `team=burst`, which only the dynamic\n\
         pool `burst` labels its nodes with, and that pool's limits allow no node; it must also\n\
         run beside `cache`:\n\n\
         ```\n$ autonodes explain pod default/web --vcluster tenant/tenant\n{}```\n",
        normalized(&claim_text, &names),
        normalized(&warm_text, &warm_names),
        normalized(&pool_text, &names),
        normalized(&node_text, &names),
        normalized(&pod_text, &names),
    );
    let path = common::repo().join("docs/src/explain.md");
    if std::env::var_os("AUTONODES_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &page).expect("page written");
    } else {
        let committed = std::fs::read_to_string(&path).expect("docs/src/explain.md");
        assert_eq!(
            committed, page,
            "docs/src/explain.md is stale; run `AUTONODES_UPDATE_DOCS=1 cargo test -p autonodes --test it explain::`"
        );
    }
    println!("{claim_text}\n{warm_text}\n{pool_text}\n{node_text}\n{pod_text}");
    delete_pods_now(&world).await;
    world.shutdown().await;
}
