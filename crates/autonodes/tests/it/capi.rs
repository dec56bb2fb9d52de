//! The cluster-autoscaler's `clusterapi` provider contract, served by autonodes (issue 7),
//! on real API servers: management + host + tenant clusters, the controller, the KubeVirt
//! simulator and a real `kube-scheduler` on the tenant.
//!
//! The tests speak to autonodes as the provider (cluster-autoscaler 1.27, started with
//! `CAPI_GROUP=capi.autonodes.io`) does: discovery of the group version, list and watch of
//! machines, machinesets and machinepools, GET then PUT on `/scale` with the
//! resourceVersion of the GET, the `<group>/delete-machine` annotation on the Machine whose
//! `spec.providerID` matches the chosen node, node-group membership by `providerIDList`.
//!
//! Run with `--nocapture` to see the `kubectl get machinepools,machines -o wide` transcript.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use autonodes_api::capi::*;
use autonodes_api::{NodeClaimPhase, NodePool, NodeType};
use autonodes_core::capi::{AUTOSCALING, REASON_INVALID_BOUNDS};
use autonodes_core::pool::plan::{plan_claims, Allowance, ClaimView};
use autonodes_core::pool::ANNOTATION_DELETE_FIRST;
use autonodes_core::resources::{self, ResourceAmounts};
use common::pools::{kubectl, large, pool_claims, pools_provider, scheduler, small, WAIT};
use common::world::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

/// Types `small` (4 CPU, 8Gi, 500m/1Gi kubeReserved, a PreferNoSchedule taint; the
/// cheapest) and `large` (8 CPU, 32Gi).
fn provider() -> String {
    let small = small()
        + r#"
        overhead:
          kubeReserved:
            cpu: 500m
            memory: 1Gi
        taints:
          - key: example.com/tier
            value: small
            effect: PreferNoSchedule"#;
    pools_provider(&[small, large()])
}

async fn world() -> World {
    let opts = WorldOptions {
        provider: provider(),
        ..WorldOptions::default()
    };
    let mut world = World::start_clusters(&opts).await;
    world.config.capi_mirror = true;
    world.start_simulator(opts.mode).await;
    world.start_controller();
    world
}

fn machine_pools(world: &World) -> Api<MachinePool> {
    Api::namespaced(world.mgmt.clone(), NS)
}

fn machines(world: &World) -> Api<Machine> {
    Api::namespaced(world.mgmt.clone(), NS)
}

/// `kubectl get machinepools,machines -o wide -n tenant`, with a title, for the transcript.
fn snapshot(world: &World, title: &str) -> String {
    let out = kubectl(
        world,
        &["get", "machinepools,machines", "-o", "wide", "-n", NS],
    );
    format!("$ kubectl get machinepools,machines -o wide -n {NS}   # {title}\n{out}\n")
}

/// Polls `f` every 250ms until it returns Some, failing after [`WAIT`] with `what` and the
/// last state `f` described.
async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        let last = match f().await {
            Ok(v) => return v,
            Err(last) => last,
        };
        if start.elapsed() > WAIT {
            panic!("timed out after {WAIT:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The provider's node-group construction (cluster-autoscaler 1.27 `clusterapi`): every
/// MachinePool with both size annotations is a group; an unparsable, negative or
/// max-below-min value is an error that hides *every* group; `max − min < 1` skips the
/// group. Returns the groups' names, or the error.
fn node_groups(mps: &[MachinePool]) -> Result<Vec<String>, String> {
    let mut groups = Vec::new();
    for mp in mps {
        let a = mp.annotations();
        let (Some(min), Some(max)) = (a.get(ANNOTATION_MIN_SIZE), a.get(ANNOTATION_MAX_SIZE))
        else {
            continue;
        };
        let min: i64 = min
            .parse()
            .map_err(|e| format!("{}: min {min:?}: {e}", mp.name_any()))?;
        let max: i64 = max
            .parse()
            .map_err(|e| format!("{}: max {max:?}: {e}", mp.name_any()))?;
        if min < 0 || max < 0 || max < min {
            return Err(format!("{}: bad bounds min {min} max {max}", mp.name_any()));
        }
        if max - min < 1 {
            continue;
        }
        groups.push(mp.name_any());
    }
    Ok(groups)
}

/// The provider's providerID normalisation: the part after the last `/`.
fn normalized(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn provider_id(n: &Node) -> String {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default()
}

/// Discovery as the provider does it: the group's preferred version, and the resources of
/// `/apis/capi.autonodes.io/<version>`.
async fn discover(world: &World) -> (String, BTreeSet<String>) {
    let groups = world.mgmt.list_api_groups().await.expect("API groups");
    let group = groups
        .groups
        .iter()
        .find(|g| g.name == CAPI_GROUP)
        .expect("the capi.autonodes.io group is served");
    let version = group
        .preferred_version
        .as_ref()
        .map(|v| v.version.clone())
        .expect("a preferred version");
    let resources = world
        .mgmt
        .list_api_group_resources(&format!("{CAPI_GROUP}/{version}"))
        .await
        .expect("group version resources");
    (
        version,
        resources.resources.into_iter().map(|r| r.name).collect(),
    )
}

/// The provider's informers: list+watch of machinepools, machines and machinesets as
/// unstructured objects; returns the machinepools cache and the informer tasks (abort them
/// before the API servers go).
async fn informers(
    world: &World,
    version: &str,
) -> (Store<DynamicObject>, Vec<tokio::task::JoinHandle<()>>) {
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for (kind, plural) in [
        ("MachinePool", "machinepools"),
        ("Machine", "machines"),
        ("MachineSet", "machinesets"),
    ] {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(CAPI_GROUP, version, kind),
            plural,
        );
        let api: Api<DynamicObject> = Api::all_with(world.mgmt.clone(), &ar);
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        tasks.push(tokio::spawn(
            reflector::reflector(
                writer,
                watcher(api, watcher::Config::default()).default_backoff(),
            )
            .applied_objects()
            .for_each(|_| async {}),
        ));
        // The provider starts only once every informer completed its first list.
        tokio::time::timeout(WAIT, store.wait_until_ready())
            .await
            .unwrap_or_else(|_| panic!("the {plural} informer never synced"))
            .unwrap_or_else(|e| panic!("the {plural} informer: {e}"));
        stores.push(store);
    }
    (stores.swap_remove(0), tasks)
}

fn cached_replicas(cache: &Store<DynamicObject>, version: &str, name: &str) -> Option<i64> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPI_GROUP, version, "MachinePool"),
        "machinepools",
    );
    cache
        .get(&ObjectRef::new_with(name, ar).within(NS))
        .and_then(|o| o.data["spec"]["replicas"].as_i64())
}

/// The provider's SetSize: GET `/scale`, then PUT it back with the new replicas and the
/// resourceVersion of the GET.
async fn set_size(world: &World, name: &str, replicas: i32) -> i32 {
    let api = machine_pools(world);
    let mut scale = api.get_scale(name).await.expect("GET /scale");
    assert_eq!(scale.metadata.name.as_deref(), Some(name));
    assert!(
        scale.metadata.resource_version.is_some(),
        "the Scale carries a resourceVersion"
    );
    let before = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    scale.spec.get_or_insert_with(Default::default).replicas = Some(replicas);
    let put = api
        .replace_scale(name, &PostParams::default(), &scale)
        .await
        .expect("PUT /scale");
    assert_eq!(put.spec.and_then(|s| s.replicas).unwrap_or(0), replicas);
    before
}

/// A pause pod in the tenant's `default` namespace requesting 1 CPU.
fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9",
                 "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}]}
    }))
    .expect("pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_autoscaler_scales_a_pool_up_from_zero_by_put_and_removes_exactly_the_node_it_marked() {
    let world = world().await;
    let _scheduler = scheduler(&world);
    let mut transcript = String::new();

    // Discovery and informers, before anything exists: empty lists are fine.
    let (version, resources) = discover(&world).await;
    assert_eq!(version, CAPI_VERSION);
    for r in [
        "machines",
        "machinesets",
        "machinepools",
        "machinepools/scale",
    ] {
        assert!(resources.contains(r), "discovery lists {r}: {resources:?}");
    }
    let (cache, informer_tasks) = informers(&world, &version).await;

    world.create_pool("workers",
        json!({"providerRef": "pools", "replicas": 0,
               "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["small"]}],
               "labels": {"team": "blue"},
               "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}),
    )
    .await;
    // The size annotations come with the pool; the scale-from-zero ones once its node type
    // has been evaluated (the provider may still be checking its host at that moment).
    let mp = until(
        "the MachinePool with its size and capacity annotations",
        || async {
            match machine_pools(&world).get_opt("workers").await {
                Ok(Some(mp))
                    if mp.annotations().contains_key(ANNOTATION_MAX_SIZE)
                        && mp.annotations().contains_key(CAPACITY_CPU) =>
                {
                    Ok(mp)
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        node_groups(std::slice::from_ref(&mp)),
        Ok(vec!["workers".to_string()]),
        "the provider makes a node group of it"
    );
    assert_eq!(mp.annotations()[ANNOTATION_MIN_SIZE], "0");
    assert_eq!(mp.annotations()[ANNOTATION_MAX_SIZE], "4");
    assert_eq!(mp.spec.replicas, Some(0));
    assert!(
        mp.annotations().contains_key(CAPACITY_CPU)
            && mp.annotations().contains_key(CAPACITY_MEMORY),
        "a group at 0 replicas needs the scale-from-zero annotations to be a node group at all"
    );
    let raw = serde_json::to_value(&mp).expect("json");
    assert!(raw["spec"]["template"]["spec"]["infrastructureRef"].is_null());
    transcript.push_str(&snapshot(&world, "replicas 0"));

    // A pod waits for a node.
    Api::<Pod>::namespaced(world.tenant.clone(), "default")
        .create(&PostParams::default(), &pod("app-0"))
        .await
        .expect("pod created");

    // Scale-up from 0 by PUT on /scale.
    let started = Instant::now();
    let before = set_size(&world, "workers", 2).await;
    assert_eq!(before, 0);
    println!("PUT machinepools/workers/scale replicas 0 → 2");
    let np = until(
        "the NodePool to take the MachinePool's replicas",
        || async {
            let p = world
                .pools()
                .get("workers")
                .await
                .map_err(|e| e.to_string())?;
            (p.spec.replicas == Some(2))
                .then_some(p.clone())
                .ok_or(format!("{:?}", p.spec.replicas))
        },
    )
    .await;
    assert_eq!(np.annotations()[ANNOTATION_SYNCED_REPLICAS], "2");
    transcript.push_str(&snapshot(&world, "scaling up 0 → 2, just after the PUT"));
    until("the Machines on their way", || async {
        let ms = machines(&world)
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        (!ms.items.is_empty())
            .then_some(())
            .ok_or(format!("{} machines", ms.items.len()))
    })
    .await;
    transcript.push_str(&snapshot(&world, "scaling up 0 → 2, Machines appear"));

    let (mp, nodes) = until(
        "2 Ready nodes in providerIDList and Machines with nodeRef",
        || async {
            let mp = machine_pools(&world)
                .get("workers")
                .await
                .map_err(|e| e.to_string())?;
            let nodes: Vec<Node> = world.nodes().await.into_iter().filter(node_ready).collect();
            let ms = machines(&world)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            let s = mp.status.clone().unwrap_or_default();
            let linked = ms
                .iter()
                .filter(|m| {
                    m.status
                        .as_ref()
                        .and_then(|s| s.node_ref.as_ref())
                        .is_some()
                        && m.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .count();
            if nodes.len() == 2
                && mp.spec.provider_id_list.len() == 2
                && s.ready_replicas == 2
                && s.replicas == 2
                && linked == 2
            {
                Ok((mp, nodes))
            } else {
                Err(format!(
                    "{} ready nodes, providerIDList {:?}, status {}/{}, {linked} linked machines",
                    nodes.len(),
                    mp.spec.provider_id_list,
                    s.ready_replicas,
                    s.replicas
                ))
            }
        },
    )
    .await;
    println!(
        "scale-up 0 → 2: both nodes Ready {:.1}s after the PUT",
        started.elapsed().as_secs_f64()
    );
    // Node mapping exactly as the provider does it.
    let ids: BTreeSet<String> = nodes.iter().map(provider_id).collect();
    let listed: BTreeSet<String> = mp.spec.provider_id_list.iter().cloned().collect();
    assert_eq!(
        ids, listed,
        "providerIDList equals the Nodes' providerIDs exactly"
    );
    for n in &nodes {
        assert!(provider_id(n).starts_with("kubevirt://"));
        assert!(mp
            .spec
            .provider_id_list
            .iter()
            .any(|id| normalized(id) == normalized(&provider_id(n))));
    }
    let ms = machines(&world)
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items;
    for m in &ms {
        let node = nodes
            .iter()
            .find(|n| Some(provider_id(n)) == m.spec.provider_id)
            .unwrap_or_else(|| panic!("Machine {} matches no Node by providerID", m.name_any()));
        assert_eq!(
            m.status
                .as_ref()
                .and_then(|s| s.node_ref.as_ref())
                .and_then(|r| r.name.clone()),
            Some(node.name_any())
        );
        assert_eq!(m.labels()[LABEL_POOL_NAME], "workers");
    }
    // The scale-from-zero labels and taints are the ones the nodes really carry.
    let a = mp.annotations();
    for n in &nodes {
        let labels = n.labels();
        for kv in a[CAPACITY_LABELS].split(',') {
            let (k, v) = kv.split_once('=').expect("k=v");
            assert_eq!(
                labels.get(k).map(String::as_str),
                Some(v),
                "node {} label {k}",
                n.name_any()
            );
        }
        let taints: BTreeSet<String> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .iter()
            .map(autonodes_core::capi::format_taint)
            .collect();
        for t in a[CAPACITY_TAINTS].split(',') {
            assert!(
                taints.contains(t),
                "node {} lacks taint {t}: {taints:?}",
                n.name_any()
            );
        }
    }
    // The waiting pod runs on one of them.
    let bound = until("the pending pod bound to a new node", || async {
        let p = Api::<Pod>::namespaced(world.tenant.clone(), "default")
            .get("app-0")
            .await
            .map_err(|e| e.to_string())?;
        p.spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| "unbound".to_string())
    })
    .await;
    assert!(nodes.iter().any(|n| n.name_any() == bound));
    println!("pod app-0 bound to {bound}");
    transcript.push_str(&snapshot(&world, "after scale-up to 2"));

    // Scale-down of a chosen node: the one the pool would NOT have removed by itself.
    let claims = pool_claims(&world, "workers").await;
    assert_eq!(claims.len(), 2);
    let views: Vec<ClaimView> = claims
        .iter()
        .map(|c| ClaimView {
            name: c.name_any(),
            created_ms: c
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_millisecond()),
            available: true,
            terminating: false,
            failed: false,
            has_node: true,
            outdated: false,
            expired: false,
            held: false,
            replaces: None,
            delete_first: false,
            repair: false,
            host_maintenance: false,
            powered_off: false,
        })
        .collect();
    let default_victim = plan_claims(&views, Some(1), Allowance::uniform(1)).delete[0]
        .0
        .clone();
    let chosen = claims
        .iter()
        .find(|c| c.name_any() != default_victim)
        .expect("another claim")
        .clone();
    let survivor = default_victim;
    let chosen_status = chosen.status.clone().unwrap_or_default();
    let chosen_node = nodes
        .iter()
        .find(|n| Some(n.name_any()) == chosen_status.node_name)
        .expect("the chosen claim's node");
    let survivor_claim = claims
        .iter()
        .find(|c| c.name_any() == survivor)
        .expect("survivor");
    let survivor_vm = survivor_claim
        .status
        .as_ref()
        .and_then(|s| s.vm_name.clone())
        .expect("vm");
    let survivor_id = survivor_claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .expect("id");
    println!(
        "autoscaler removes node {} (claim {}); left alone, the pool would have removed {survivor}",
        chosen_node.name_any(),
        chosen.name_any()
    );

    // findMachineByProviderID, MarkMachineForDeletion (GET + PUT), then SetSize(replicas − 1).
    let m_api = machines(&world);
    let target = normalized(&provider_id(chosen_node)).to_string();
    let machine = m_api
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .find(|m| m.spec.provider_id.as_deref().map(normalized) == Some(target.as_str()))
        .expect("a Machine with the node's providerID");
    let mut marked = m_api.get(&machine.name_any()).await.expect("GET machine");
    marked.annotations_mut().insert(
        ANNOTATION_DELETE_MACHINE.into(),
        "2024-05-01 10:00:00 +0000 UTC".into(),
    );
    m_api
        .replace(&marked.name_any(), &PostParams::default(), &marked)
        .await
        .expect("PUT machine with delete-machine");
    let before = set_size(&world, "workers", 1).await;
    assert_eq!(before, 2);
    let started = Instant::now();

    let mut survivor_touched = false;
    let mut shown = false;
    loop {
        let claims = pool_claims(&world, "workers").await;
        if let Some(s) = claims.iter().find(|c| c.name_any() == survivor) {
            survivor_touched |= s.metadata.deletion_timestamp.is_some();
        }
        if !shown
            && claims.iter().any(|c| {
                c.name_any() == chosen.name_any() && c.metadata.deletion_timestamp.is_some()
            })
        {
            transcript.push_str(&snapshot(
                &world,
                "scaling down 2 → 1 (marked node draining)",
            ));
            shown = true;
        }
        let names: Vec<String> = claims.iter().map(|c| c.name_any()).collect();
        let vms: Vec<String> = world.vms().await.iter().map(|v| v.name_any()).collect();
        let nodes: Vec<String> = world.nodes().await.iter().map(|n| n.name_any()).collect();
        let ms: Vec<String> = machines(&world)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(|m| m.name_any()).collect())
            .unwrap_or_default();
        if names == [survivor.clone()]
            && vms == [survivor_vm.clone()]
            && ms == [survivor.clone()]
            && nodes
                == [survivor_claim
                    .status
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default()]
        {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "timed out waiting for exactly the marked node's claim, VM and Node to go: claims {names:?}, VMs {vms:?}, nodes {nodes:?}, machines {ms:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !survivor_touched,
        "the claim the autoscaler did not choose was never deleted"
    );
    println!(
        "scale-down 2 → 1: marked node's claim, VM and Node gone {:.1}s after the PUT",
        started.elapsed().as_secs_f64()
    );
    let mp = until("the MachinePool at 1 with one providerID", || async {
        let mp = machine_pools(&world)
            .get("workers")
            .await
            .map_err(|e| e.to_string())?;
        let s = mp.status.clone().unwrap_or_default();
        (mp.spec.provider_id_list == [survivor_id.clone()]
            && s.replicas == 1
            && s.ready_replicas == 1)
            .then_some(mp.clone())
            .ok_or(format!("{:?} {:?}", mp.spec.provider_id_list, s))
    })
    .await;
    assert_eq!(mp.spec.replicas, Some(1));
    assert_eq!(
        world
            .pools()
            .get("workers")
            .await
            .expect("pool")
            .spec
            .replicas,
        Some(1)
    );
    let survivor_now = world.claims().get(&survivor).await.expect("survivor claim");
    assert!(!survivor_now
        .annotations()
        .contains_key(ANNOTATION_DELETE_FIRST));
    assert_eq!(
        survivor_now.status.and_then(|s| s.phase),
        Some(NodeClaimPhase::Available)
    );
    transcript.push_str(&snapshot(&world, "after scale-down to 1"));

    // The other direction: `kubectl scale npool` shows on the MachinePool, in the
    // provider's watch cache and on GET /scale.
    let out = kubectl(
        &world,
        &["scale", "-n", NS, "npool/workers", "--replicas=0"],
    );
    transcript.push_str(&format!(
        "$ kubectl scale -n {NS} npool/workers --replicas=0\n{out}\n"
    ));
    until("the watch cache to show replicas 0", || async {
        match cached_replicas(&cache, &version, "workers") {
            Some(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let scale = machine_pools(&world)
        .get_scale("workers")
        .await
        .expect("GET /scale");
    // autoscaling/v1 omits `replicas: 0`.
    assert_eq!(scale.spec.and_then(|s| s.replicas).unwrap_or(0), 0);
    until("every claim, VM, Node and Machine gone", || async {
        let c = pool_claims(&world, "workers").await.len();
        let v = world.vms().await.len();
        let n = world.nodes().await.len();
        let m = machines(&world)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(99);
        (c + v + n + m == 0)
            .then_some(())
            .ok_or(format!("{c} claims, {v} VMs, {n} nodes, {m} machines"))
    })
    .await;
    transcript.push_str(&snapshot(&world, "after kubectl scale npool --replicas=0"));

    // Without spec.autoscaling the mirror goes.
    world
        .pools()
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": null}})),
        )
        .await
        .expect("autoscaling removed");
    until("the MachinePool gone", || async {
        match machine_pools(&world).get_opt("workers").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!("{transcript}");
    for t in informer_tasks {
        t.abort();
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_from_zero_annotations_equal_the_node_type_capacity_less_kube_reserved_with_its_labels_and_taints(
) {
    let world = world().await;
    world.create_pool("ci",
        json!({"providerRef": "pools", "replicas": 0,
               "requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": ["small"]}],
               "labels": {"team": "blue"},
               "taints": [{"key": "dedicated", "value": "ci", "effect": "NoSchedule"}],
               "startupTaints": [{"key": "example.com/cni", "effect": "NoSchedule"}],
               "autoscaling": {"minReplicas": 0, "maxReplicas": 3}}),
    )
    .await;
    let t: NodeType = world
        .wait_node_type("pools.small", "effective resources", |t| {
            t.status.as_ref().is_some_and(|s| !s.resources.is_empty())
        })
        .await;
    let resources = ResourceAmounts::from_list(&t.status.clone().unwrap_or_default().resources)
        .expect("type resources");
    let reserved =
        ResourceAmounts::from_list(&t.spec.overhead.clone().expect("overhead").kube_reserved)
            .expect("kubeReserved");
    let want_cpu = resources.cpu_millis() - reserved.cpu_millis();
    let want_memory = resources.memory_bytes() - reserved.memory_bytes();

    let mp = until("the MachinePool with capacity annotations", || async {
        match machine_pools(&world).get_opt("ci").await {
            Ok(Some(mp)) if mp.annotations().contains_key(CAPACITY_CPU) => Ok(mp),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let a: BTreeMap<String, String> = mp.annotations().clone();
    let capacity: BTreeMap<&String, &String> = a
        .iter()
        .filter(|(k, _)| k.starts_with("capacity.cluster-autoscaler.kubernetes.io/"))
        .collect();
    println!("MachinePool ci scale-from-zero annotations:");
    for (k, v) in &capacity {
        println!("  {k}: {v}");
    }
    println!(
        "NodeType pools.small: resources {:?}, kubeReserved {:?}",
        t.status.as_ref().map(|s| &s.resources),
        t.spec.overhead.as_ref().map(|o| &o.kube_reserved)
    );
    assert_eq!(
        resources::cpu_millis(&Quantity(a[CAPACITY_CPU].clone())).expect("cpu quantity"),
        want_cpu
    );
    assert_eq!(
        resources::memory_bytes(&Quantity(a[CAPACITY_MEMORY].clone())).expect("memory quantity"),
        want_memory
    );
    assert_eq!(a[CAPACITY_CPU], "3500m");
    assert_eq!(a[CAPACITY_MEMORY], "7Gi");
    assert_eq!(a[CAPACITY_MAX_PODS], "110");
    assert!(!a.contains_key(CAPACITY_GPU_COUNT));
    let labels: BTreeMap<&str, &str> = a[CAPACITY_LABELS]
        .split(',')
        .map(|kv| kv.split_once('=').expect("k=v"))
        .collect();
    for (k, v) in [
        ("team", "blue"),
        ("autonodes.io/node-type", "small"),
        ("autonodes.io/provider", "pools"),
        ("node.kubernetes.io/instance-type", "pools.small"),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
    ] {
        assert_eq!(labels.get(k), Some(&v), "label {k} in {labels:?}");
    }
    let taints: BTreeSet<&str> = a[CAPACITY_TAINTS].split(',').collect();
    assert_eq!(
        taints,
        BTreeSet::from([
            "example.com/tier=small:PreferNoSchedule",
            "dedicated=ci:NoSchedule"
        ]),
        "type and pool taints; the startup taint goes once the node is ready"
    );
    assert_eq!(node_groups(&[mp]), Ok(vec!["ci".to_string()]));

    // A pool choosing the large type (which has no taints), without taints of its own, gets
    // the large type's capacity and no taints annotation: the mirror wrote the MachinePool's
    // status in between, and the annotation it no longer applies still goes.
    world
        .pools()
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [], "requirements": [
                {"key": "autonodes.io/node-type", "operator": "In", "values": ["large"]}]}})),
        )
        .await
        .expect("pool retargeted");
    until("the large type's capacity, without taints", || async {
        let mp = machine_pools(&world)
            .get("ci")
            .await
            .map_err(|e| e.to_string())?;
        let a = mp.annotations();
        (a.get(CAPACITY_CPU).map(String::as_str) == Some("8")
            && a.get(CAPACITY_MEMORY).map(String::as_str) == Some("32Gi")
            && !a.contains_key(CAPACITY_TAINTS))
        .then_some(())
        .ok_or(format!(
            "{:?} {:?} {:?}",
            a.get(CAPACITY_CPU),
            a.get(CAPACITY_MEMORY),
            a.get(CAPACITY_TAINTS)
        ))
    })
    .await;
    world.shutdown().await;
}

fn autoscaling_condition(p: &NodePool) -> Option<(String, String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == AUTOSCALING)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_condition(world: &World, name: &str, status: &str, reason: &str) -> String {
    until(
        &format!("{name}: Autoscaling={status} {reason}"),
        || async {
            let p = world.pools().get(name).await.map_err(|e| e.to_string())?;
            match autoscaling_condition(&p) {
                Some((s, r, m)) if s == status && r == reason => Ok(m),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_autoscaling_bounds_are_refused_with_a_condition_and_never_hide_the_other_groups() {
    let world = world().await;
    world
        .create_pool(
            "good",
            json!({"providerRef": "pools", "replicas": 0,
               "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}),
        )
        .await;
    // A server that applies the CRDs' CEL rules (1.25 and later) refuses such bounds at
    // once, naming the field; an older one (1.20 in CI) stores them, and the controller
    // refuses them with a condition.
    let minor = autonodes_testenv::testenv::server_minor(&world.mgmt)
        .await
        .expect("version");
    let cel = minor >= autonodes_api::crdgen::FIRST_MINOR_WITH_CEL;
    if cel {
        let bad = |min: i32, max: i32| {
            serde_json::from_value::<NodePool>(json!({
                "apiVersion": "autonodes.io/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "bad", "namespace": NS},
                "spec": {"vClusterRef": {"name": "tenant"}, "providerRef": "pools", "replicas": 0,
                         "autoscaling": {"minReplicas": min, "maxReplicas": max}}}))
            .expect("pool")
        };
        for (min, max) in [(3, 2), (2, 2)] {
            match world
                .pools()
                .create(&Default::default(), &bad(min, max))
                .await
            {
                Err(kube::Error::Api(s)) => {
                    println!(
                        "bad (min {min}, max {max}) refused by the API server: {}",
                        s.message
                    );
                    assert_eq!(s.code, 422);
                    assert!(
                        s.message.contains("spec.autoscaling")
                            && s.message.contains("maxReplicas must exceed minReplicas"),
                        "{}",
                        s.message
                    );
                }
                other => panic!("bounds {min}..{max} not refused: {other:?}"),
            }
        }
        world
            .pools()
            .create(&Default::default(), &bad(0, 2))
            .await
            .expect("pool created");
    } else {
        world
            .create_pool(
                "bad",
                json!({"providerRef": "pools", "replicas": 0,
                   "autoscaling": {"minReplicas": 3, "maxReplicas": 2}}),
            )
            .await;
        let message = wait_condition(&world, "bad", "False", REASON_INVALID_BOUNDS).await;
        println!("bad (min 3, max 2): Autoscaling=False {REASON_INVALID_BOUNDS}: {message}");
        assert!(message.contains("below minReplicas 3"), "{message}");
        wait_condition(&world, "good", "True", "MachinePoolMirrored").await;
        let groups = until("both MachinePools, only the good one annotated", || async {
            let mps = machine_pools(&world)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            let bad = mps.iter().find(|m| m.name_any() == "bad");
            if mps.len() == 2
                && bad.is_some_and(|b| {
                    !b.annotations().contains_key(ANNOTATION_MIN_SIZE)
                        && !b.annotations().contains_key(ANNOTATION_MAX_SIZE)
                })
            {
                node_groups(&mps).map_err(|e| format!("the provider fails: {e}"))
            } else {
                Err(format!(
                    "{:?}",
                    mps.iter()
                        .map(|m| (m.name_any(), m.annotations().clone()))
                        .collect::<Vec<_>>()
                ))
            }
        })
        .await;
        assert_eq!(
            groups,
            vec!["good".to_string()],
            "the bad pool hides no other group"
        );
        let events = world.events_for(NS, "bad").await;
        println!("events of NodePool bad: {events:?}");
        assert!(
            events
                .iter()
                .any(|e| e.starts_with(&format!("{REASON_INVALID_BOUNDS}:"))),
            "{events:?}"
        );

        // max == min: the provider would ignore the group; refused the same way.
        world
            .pools()
            .patch(
                "bad",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"autoscaling": {"minReplicas": 2, "maxReplicas": 2}}}),
                ),
            )
            .await
            .expect("patched");
        let message = until("the equal-bounds message", || async {
            let p = world.pools().get("bad").await.map_err(|e| e.to_string())?;
            match autoscaling_condition(&p) {
                Some((s, r, m))
                    if s == "False" && r == REASON_INVALID_BOUNDS && m.contains("at least 1") =>
                {
                    Ok(m)
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        println!("bad (min 2, max 2): Autoscaling=False {REASON_INVALID_BOUNDS}: {message}");
    }

    // Negative bounds never get past the API server's schema.
    let err = world
        .pools()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": {"minReplicas": -1, "maxReplicas": 2}}})),
        )
        .await
        .expect_err("a negative minReplicas is rejected");
    match &err {
        kube::Error::Api(s) => {
            println!("minReplicas -1: {} {}", s.code, s.message);
            assert_eq!(s.code, 422);
        }
        e => panic!("unexpected error {e}"),
    }

    // Fixed bounds: annotations appear, the condition turns True.
    world
        .pools()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}})),
        )
        .await
        .expect("patched");
    wait_condition(&world, "bad", "True", "MachinePoolMirrored").await;
    let groups = until("both groups", || async {
        let mps = machine_pools(&world)
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        match node_groups(&mps) {
            Ok(g) if g.len() == 2 => Ok((g, mps)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let bad = groups
        .1
        .iter()
        .find(|m| m.name_any() == "bad")
        .expect("bad");
    assert_eq!(bad.annotations()[ANNOTATION_MIN_SIZE], "1");
    assert_eq!(bad.annotations()[ANNOTATION_MAX_SIZE], "3");
    println!("{}", snapshot(&world, "both pools valid"));

    // Deleting the NodePool removes its MachinePool (no garbage collector needed).
    world
        .pools()
        .delete("good", &Default::default())
        .await
        .expect("deleted");
    until("good's MachinePool gone", || async {
        match machine_pools(&world).get_opt("good").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // A pool without replicas cannot be driven by the autoscaler: refused by a server
    // with the CEL rules, else by the controller.
    let removed = world
        .pools()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": null}})),
        )
        .await;
    if cel {
        match removed {
            Err(kube::Error::Api(s)) => {
                println!(
                    "bad without replicas refused by the API server: {}",
                    s.message
                );
                assert!(
                    s.message.contains("autoscaling needs replicas"),
                    "{}",
                    s.message
                );
            }
            other => panic!("replicas removed: {other:?}"),
        }
        world
            .pools()
            .delete("bad", &Default::default())
            .await
            .expect("deleted");
    } else {
        removed.expect("replicas removed");
        let message = wait_condition(&world, "bad", "False", "ReplicasRequired").await;
        println!("bad without replicas: Autoscaling=False ReplicasRequired: {message}");
    }
    until("bad's MachinePool gone", || async {
        match machine_pools(&world).get_opt("bad").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    world.shutdown().await;
}
