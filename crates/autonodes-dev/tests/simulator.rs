//! The KubeVirt simulator and our KubeVirt CRDs, on real API servers: a host cluster with
//! the CRDs and a tenant cluster the simulated guests join.

#[path = "../../autonodes/tests/it/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use autonodes_core::kubeversion::KubeVersion;
use autonodes_core::userdata::{self, JoinParams, JoinTemplate, UserDataInput};
use autonodes_testenv::simulator::{
    self, kubevirt_crds, SimError, SimMode, SimOptions, Tenant, FINALIZER, JOIN_ERROR_ANNOTATION,
};
use autonodes_testenv::testenv::{install_crds, ApiServer, ServerOptions, TestEnv};
use common::*;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Taint};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

const NS: &str = "vms";
const WAIT: Duration = Duration::from_secs(60);

/// Host and tenant API servers with the KubeVirt CRDs on the host.
struct Clusters {
    env: TestEnv,
    host: Client,
    tenant: Client,
    /// The tenant's version (its `/version`), as autonodes reads it to render user data.
    version: KubeVersion,
}

impl Clusters {
    async fn start() -> Self {
        let mut env = start(&[]).await;
        let with_crds = ServerOptions {
            crds: kubevirt_crds(),
            ..ServerOptions::default()
        };
        env.add_apiserver_with("host", &with_crds)
            .await
            .expect("host, with the KubeVirt CRDs");
        env.add_apiserver("tenant").await.expect("tenant");
        let host = env
            .apiserver("host")
            .expect("host")
            .client()
            .await
            .expect("host client");
        let tenant = env
            .apiserver("tenant")
            .expect("tenant")
            .client()
            .await
            .expect("tenant client");
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("ns");
        Api::<Namespace>::all(host.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
        let info = tenant.apiserver_version().await.expect("tenant /version");
        let version = KubeVersion::parse(&info.git_version).expect("a Kubernetes version");
        Clusters {
            env,
            host,
            tenant,
            version,
        }
    }

    fn tenant_server(&self) -> &ApiServer {
        self.env.apiserver("tenant").expect("tenant")
    }

    fn tenant(&self) -> Tenant {
        let t = self.tenant_server();
        Tenant::new(self.tenant.clone(), t.url.clone(), t.ca_pem.clone())
    }

    /// `host:port` of the tenant API server.
    fn endpoint(&self) -> String {
        self.tenant_server()
            .url
            .trim_start_matches("https://")
            .to_string()
    }

    fn ca_hash(&self) -> String {
        userdata::ca_cert_hash(&self.tenant_server().ca_pem).expect("CA hash")
    }

    fn spawn(&self, mode: SimMode) -> Sim {
        Sim::spawn(self.host.clone(), vec![self.tenant()], mode)
    }

    fn vms(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.host.clone(),
            NS,
            &autonodes_api::kubevirt::virtual_machine(),
        )
    }

    fn vmis(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.host.clone(),
            NS,
            &autonodes_api::kubevirt::virtual_machine_instance(),
        )
    }

    fn dvs(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.host.clone(),
            NS,
            &autonodes_api::kubevirt::data_volume(),
        )
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.tenant.clone())
    }

    /// Writes the bootstrap token Secret `kube-system/bootstrap-token-<id>` into the tenant.
    async fn write_token(&self, token: &str, expires_in: SignedDuration) {
        let (id, secret) = token.split_once('.').expect("id.secret");
        let expiration = (Timestamp::now() + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ");
        let body: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "token-id": id,
                "token-secret": secret,
                "usage-bootstrap-authentication": "true",
                "usage-bootstrap-signing": "true",
                "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
                "expiration": expiration.to_string(),
            }
        }))
        .expect("token secret");
        Api::<Secret>::namespaced(self.tenant.clone(), "kube-system")
            .create(&PostParams::default(), &body)
            .await
            .expect("token secret created");
    }

    /// Writes the user-data Secret and then the VM, as autonodes does, and gives the Secret
    /// an ownerReference to the VM.
    async fn write_vm(&self, name: &str, user_data: &str) -> DynamicObject {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), NS);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": format!("{name}-userdata"),
                "labels": {"app.kubernetes.io/managed-by": "autonodes"},
            },
            "stringData": {"userdata": user_data},
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("user-data Secret created");
        let vm = self
            .vms()
            .create(&PostParams::default(), &vm_object(name))
            .await
            .expect("VM created");
        let owner = json!({"metadata": {"ownerReferences": [{
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "name": name, "uid": vm.uid().expect("uid"),
        }]}});
        secrets
            .patch(
                &format!("{name}-userdata"),
                &PatchParams::default(),
                &Patch::Merge(&owner),
            )
            .await
            .expect("owner set");
        vm
    }

    async fn vmi_phase(&self, name: &str) -> Option<String> {
        self.vmis()
            .get_opt(name)
            .await
            .expect("read VMI")
            .and_then(|v| {
                v.data
                    .pointer("/status/phase")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
    }

    async fn wait_vmi_running(&self, name: &str) -> DynamicObject {
        eventually("the VMI to run", WAIT, || async {
            self.vmis()
                .get_opt(name)
                .await
                .expect("read VMI")
                .filter(|v| {
                    v.data.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
                })
        })
        .await
    }

    async fn wait_join_error(&self, name: &str, what: &str) -> String {
        eventually(what, WAIT, || async {
            self.vmis()
                .get_opt(name)
                .await
                .expect("read VMI")
                .and_then(|v| v.annotations().get(JOIN_ERROR_ANNOTATION).cloned())
        })
        .await
    }

    async fn events_for(&self, vm: &str, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.host.clone(), NS)
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(vm)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }
}

/// The simulator running in this test's runtime.
struct Sim {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), SimError>>,
}

impl Sim {
    fn spawn(host: Client, tenants: Vec<Tenant>, mode: SimMode) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = SimOptions {
            mode,
            join_retry_interval: Duration::from_millis(500),
            sweep_interval: Duration::from_secs(1),
            ..SimOptions::default()
        };
        let task = tokio::spawn(simulator::run(host, tenants, opts, async move {
            let _ = rx.await;
        }));
        Sim {
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the simulator stops within 30s")
            .expect("the simulator task did not panic");
        result.expect("the simulator ran without error");
    }
}

/// A VM as autonodes writes it (the advanced example's base template plus the forced parts).
fn vm_object(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/managed-by": "autonodes",
                "autonodes.io/nodeclaim": name,
            },
        },
        "spec": {
            "runStrategy": "Always",
            "dataVolumeTemplates": [{
                "metadata": {"name": format!("{name}-containerdisk")},
                "spec": {
                    "source": {"registry": {"url": "docker://quay.io/containerdisks/ubuntu:22.04"}},
                    "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}},
                },
            }],
            "template": {
                "metadata": {"labels": {"provider": "kubevirt", "kubevirt.io/vm": name}},
                "spec": {
                    "hostname": name,
                    "domain": {
                        "devices": {
                            "disks": [
                                {"name": "containerdisk", "disk": {"bus": "virtio"}},
                                {"name": "cloudinitdisk", "disk": {"bus": "virtio"}},
                            ],
                            "interfaces": [{"name": "default", "masquerade": {}}],
                        },
                        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                    },
                    "networks": [{"name": "default", "pod": {}}],
                    "volumes": [
                        {"name": "containerdisk", "dataVolume": {"name": format!("{name}-containerdisk")}},
                        {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": format!("{name}-userdata")}}},
                    ],
                },
            },
        },
    }))
    .expect("VM object")
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.to_string(),
        value: value.map(str::to_string),
        effect: effect.to_string(),
        time_added: None,
    }
}

/// User data rendered by autonodes' own renderer (the `kubeadm` template).
fn user_data(
    version: KubeVersion,
    name: &str,
    endpoint: &str,
    token: &str,
    ca_hash: &str,
) -> String {
    user_data_with(
        version,
        JoinTemplate::Kubeadm,
        name,
        endpoint,
        token,
        ca_hash,
    )
}

/// User data rendered by autonodes' own renderer for a tenant of `version` (which picks the
/// JoinConfiguration's apiVersion).
fn user_data_with(
    version: KubeVersion,
    template: JoinTemplate,
    name: &str,
    endpoint: &str,
    token: &str,
    ca_hash: &str,
) -> String {
    let labels = BTreeMap::from([
        (
            "autonodes.io/node-type".to_string(),
            "standard-node".to_string(),
        ),
        (
            "node.kubernetes.io/instance-type".to_string(),
            "kubevirt-provider-advanced.standard-node".to_string(),
        ),
    ]);
    let taints = [
        taint("workload", Some("high-memory"), "NoSchedule"),
        taint("autonodes.io/unregistered", None, "NoExecute"),
    ];
    let join = JoinParams {
        api_server_endpoint: endpoint.to_string(),
        token: token.to_string(),
        ca_cert_hashes: vec![ca_hash.to_string()],
        join_script_url: None,
        ca_pem: None,
        kubernetes_version: version,
        ..JoinParams::placeholder()
    };
    userdata::render_user_data(&UserDataInput {
        template,
        node_name: name,
        join: &join,
        node_labels: &labels,
        taints: &taints,
        kubelet_args: &BTreeMap::new(),
        user_cloud_config: None,
        ssh_keys: &[],
        image_prepared: false,
        download_url: None,
    })
    .expect("user data renders")
}

fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

fn has_not_ready_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"))
}

/// Checks `check` again and again for `window`: a bounded "stays so" assertion.
async fn stays<F, Fut>(what: &str, window: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < window {
        assert!(check().await, "{what} stopped holding");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

const TOKEN: &str = "abcdef.0123456789abcdef";

#[tokio::test]
async fn a_misspelt_user_data_secret_ref_is_pruned_while_secret_ref_survives() {
    let env = start(&["host"]).await;
    let host = env
        .apiserver("host")
        .expect("host")
        .client()
        .await
        .expect("client");
    install_crds(&host, &kubevirt_crds()).await.expect("CRDs");
    let api: Api<DynamicObject> = Api::namespaced_with(
        host.clone(),
        "default",
        &autonodes_api::kubevirt::virtual_machine(),
    );
    let mut vm = vm_object("typo");
    let volumes = vm
        .data
        .pointer_mut("/spec/template/spec/volumes")
        .and_then(Value::as_array_mut)
        .expect("volumes");
    volumes.push(
        json!({"name": "misspelt", "cloudInitNoCloud": {"userDataSecretRef": {"name": "lost"}}}),
    );
    // Unknown fields further down a structural path are pruned as well.
    vm.data["spec"]["template"]["spec"]["domain"]["resource"] = json!({"requests": {"cpu": "1"}});
    vm.data["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["masquerade"] =
        json!({"ports": [22]});
    // A data volume template as KubeVirt's VM schema has it: a misspelt claim field and the
    // fields of newer CDI types are pruned.
    let dvt = &mut vm.data["spec"]["dataVolumeTemplates"][0]["spec"];
    dvt["pvc"]["storageClass"] = json!("fast");
    dvt["serviceAccountName"] = json!("importer");
    vm.metadata.namespace = Some("default".into());
    let stored = api
        .create(&PostParams::default(), &vm)
        .await
        .expect("created");

    let volumes = stored
        .data
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .expect("volumes");
    assert_eq!(
        volumes[1]["cloudInitNoCloud"]["secretRef"]["name"], "typo-userdata",
        "secretRef must survive: {volumes:?}"
    );
    assert_eq!(
        volumes[2],
        json!({"name": "misspelt", "cloudInitNoCloud": {}}),
        "userDataSecretRef must be pruned"
    );
    let domain = &stored.data["spec"]["template"]["spec"]["domain"];
    assert!(
        domain.get("resource").is_none(),
        "domain.resource kept: {domain}"
    );
    assert_eq!(domain["devices"]["interfaces"][0]["masquerade"], json!({}));
    let dvt = &stored.data["spec"]["dataVolumeTemplates"][0]["spec"];
    assert_eq!(
        dvt["pvc"],
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}),
        "pvc.storageClass must be pruned"
    );
    assert!(dvt.get("serviceAccountName").is_none(), "{dvt}");

    // Values outside the documented run strategies are refused outright.
    let mut bad = vm_object("bad-strategy");
    bad.metadata.namespace = Some("default".into());
    bad.data["spec"]["runStrategy"] = json!("Sometimes");
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("runStrategy Sometimes was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_vm_whose_user_data_secret_reference_was_pruned_never_joins_and_says_why() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    let ud = user_data(c.version, "pruned", &c.endpoint(), TOKEN, &c.ca_hash());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "pruned-userdata",
            "labels": {"app.kubernetes.io/managed-by": "autonodes"},
        },
        "stringData": {"userdata": ud},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(c.host.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("user-data Secret created");
    // The Secret named under a key KubeVirt does not know: the API server drops it.
    let mut vm = vm_object("pruned");
    vm.data["spec"]["template"]["spec"]["volumes"][1]["cloudInitNoCloud"] =
        json!({"userDataSecretRef": {"name": "pruned-userdata"}});
    let stored = c
        .vms()
        .create(&PostParams::default(), &vm)
        .await
        .expect("VM created");
    assert_eq!(
        stored.data["spec"]["template"]["spec"]["volumes"][1]["cloudInitNoCloud"],
        json!({})
    );
    let error = c.wait_join_error("pruned", "the join error").await;
    assert!(
        error.starts_with(simulator::GAVE_UP_PREFIX) && error.contains("no secretRef"),
        "{error}"
    );
    eventually("a JoinFailed Event", WAIT, || async {
        let events = c.events_for("pruned", "JoinFailed").await;
        (!events.is_empty()).then_some(())
    })
    .await;
    assert!(c.nodes().get_opt("pruned").await.expect("read").is_none());
    sim.stop().await;
}

#[tokio::test]
async fn a_vm_built_like_the_advanced_example_round_trips_unchanged() {
    let env = start(&["host"]).await;
    let server = env.apiserver("host").expect("host");
    let host = server.client().await.expect("client");
    install_crds(&host, &kubevirt_crds()).await.expect("CRDs");
    let provider: Value = autonodes_core::yaml::from_str(
        &std::fs::read_to_string(repo().join("examples/nodeprovider-advanced.yaml"))
            .expect("example readable"),
    )
    .expect("example parses");
    let template = provider
        .pointer("/spec/kubeVirt/virtualMachineTemplate")
        .expect("template")
        .clone();
    // The base template plus what autonodes forces: name, labels, hostname, runStrategy,
    // the cloud-init volume and disk, the type's resources, DataVolume names prefixed.
    let mut spec = template["spec"].clone();
    spec["runStrategy"] = json!("Always");
    spec["dataVolumeTemplates"][0]["metadata"]["name"] = json!("adv-containerdisk");
    spec["dataVolumeTemplates"][0]["metadata"]["labels"] = json!({"autonodes.io/nodeclaim": "adv"});
    let tspec = &mut spec["template"]["spec"];
    tspec["hostname"] = json!("adv");
    tspec["volumes"][0]["dataVolume"]["name"] = json!("adv-containerdisk");
    tspec["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "adv-userdata"}}}));
    tspec["domain"]["devices"]["disks"]
        .as_array_mut()
        .expect("disks")
        .push(json!({"name": "cloudinitdisk", "disk": {"bus": "virtio"}}));
    tspec["domain"]["resources"]["requests"] = json!({"cpu": "4", "memory": "16Gi"});
    tspec["domain"]["cpu"] =
        json!({"cores": 4, "sockets": 1, "threads": 1, "model": "host-passthrough"});
    tspec["domain"]["memory"] = json!({"guest": "16Gi"});
    tspec["terminationGracePeriodSeconds"] = json!(30);
    tspec["evictionStrategy"] = json!("External");
    tspec["nodeSelector"] = json!({"kubevirt.io/schedulable": "true"});
    tspec["tolerations"] =
        json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]);
    spec["template"]["metadata"] = json!({
        "labels": {"provider": "kubevirt", "workload": "memory-intensive"},
        "annotations": {"autonodes.io/nodeclaim": "adv"},
    });
    let vm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "adv", "namespace": "default", "labels": template["metadata"]["labels"]},
        "spec": spec,
    }))
    .expect("vm");
    let api: Api<DynamicObject> = Api::namespaced_with(
        host.clone(),
        "default",
        &autonodes_api::kubevirt::virtual_machine(),
    );
    let stored = api
        .create(&PostParams::default(), &vm)
        .await
        .expect("created");
    assert_eq!(
        stored.data["spec"], vm.data["spec"],
        "the API server changed the VM spec"
    );
    assert_eq!(
        stored.labels().get("provider").map(String::as_str),
        Some("kubevirt")
    );

    // kubectl knows the short name and prints KubeVirt's columns.
    let out = kubectl_ok(&env, server, &["get", "vm", "-n", "default"]);
    let header = out.lines().next().unwrap_or_default();
    for column in ["NAME", "AGE", "STATUS", "READY"] {
        assert!(header.contains(column), "column {column} missing: {out}");
    }
}

#[tokio::test]
async fn the_simulator_refuses_to_start_on_a_host_without_the_kubevirt_crds() {
    let env = start(&["host"]).await;
    let host = env
        .apiserver("host")
        .expect("host")
        .client()
        .await
        .expect("client");
    let result = simulator::run(host, vec![], SimOptions::default(), std::future::pending()).await;
    match result {
        Err(SimError::CrdsMissing(what)) => assert_eq!(what, "virtualmachines.kubevirt.io"),
        other => panic!("expected CrdsMissing, got {other:?}"),
    }
}

#[tokio::test]
async fn the_node_registers_with_the_given_name_provider_id_labels_and_taints_and_turns_ready() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    let ud = user_data(c.version, "node-a", &c.endpoint(), TOKEN, &c.ca_hash());
    c.write_vm("node-a", &ud).await;

    // The Node is created Ready with the not-ready taint the API server adds; the taint goes
    // in a second write (the node lifecycle controller's part), so both are waited for.
    let node = eventually(
        "the Node to be Ready without the not-ready taint",
        WAIT,
        || async {
            c.nodes()
                .get_opt("node-a")
                .await
                .expect("read node")
                .filter(|n| ready_status(n).as_deref() == Some("True") && !has_not_ready_taint(n))
        },
    )
    .await;
    let spec = node.spec.clone().expect("spec");
    assert_eq!(spec.provider_id.as_deref(), Some("kubevirt://node-a"));
    let labels = node.labels();
    assert_eq!(labels["autonodes.io/node-type"], "standard-node");
    assert_eq!(
        labels["node.kubernetes.io/instance-type"],
        "kubevirt-provider-advanced.standard-node"
    );
    assert_eq!(labels["kubernetes.io/hostname"], "node-a");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    let taints: Vec<(String, Option<String>, String)> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value, t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            (
                "workload".into(),
                Some("high-memory".into()),
                "NoSchedule".into()
            ),
            ("autonodes.io/unregistered".into(), None, "NoExecute".into()),
        ],
        "exactly the given taints, and no node.kubernetes.io/not-ready"
    );
    let status = node.status.clone().expect("status");
    let capacity = status.capacity.expect("capacity");
    assert_eq!(capacity["cpu"].0, "2");
    assert_eq!(capacity["memory"].0, "4Gi");
    assert_eq!(capacity["pods"].0, "110");

    // KubeVirt's side: a Running VMI with an address, a ready VM, a finished DataVolume.
    let vmi = c.wait_vmi_running("node-a").await;
    let ip = vmi.data["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .expect("ip")
        .to_string();
    assert!(ip.starts_with("10."), "{ip}");
    assert_eq!(vmi.data["status"]["nodeName"], "kubevirt-host-0");
    assert_eq!(vmi.labels()["provider"], "kubevirt");
    assert_eq!(vmi.owner_references()[0].name, "node-a");
    assert!(vmi.annotations().get(JOIN_ERROR_ANNOTATION).is_none());
    let internal_ip = status
        .addresses
        .expect("addresses")
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address);
    assert_eq!(internal_ip.as_deref(), Some(ip.as_str()));
    let vm = c.vms().get("node-a").await.expect("vm");
    assert_eq!(vm.data["status"]["ready"], true);
    assert_eq!(vm.data["status"]["created"], true);
    assert_eq!(vm.data["status"]["printableStatus"], "Running");
    assert!(vm.finalizers().iter().any(|f| f == FINALIZER));
    let dv = c
        .dvs()
        .get("node-a-containerdisk")
        .await
        .expect("DataVolume");
    assert_eq!(dv.data["status"]["phase"], "Succeeded");
    assert_eq!(dv.owner_references()[0].uid, vm.uid().expect("uid"));
    assert_eq!(
        dv.data["spec"]["source"]["registry"]["url"],
        "docker://quay.io/containerdisks/ubuntu:22.04"
    );
    sim.stop().await;
}

#[tokio::test]
async fn a_wrong_bootstrap_token_does_not_join_and_leaves_the_join_error_and_an_event() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    let ud = user_data(
        c.version,
        "wrong-token",
        &c.endpoint(),
        "abcdef.ffffffffffffffff",
        &c.ca_hash(),
    );
    c.write_vm("wrong-token", &ud).await;

    let error = c.wait_join_error("wrong-token", "the join error").await;
    assert!(error.contains("401"), "{error}");
    let events = eventually("a JoinFailed Event", WAIT, || async {
        let events = c.events_for("wrong-token", "JoinFailed").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(events[0]
        .note
        .as_deref()
        .unwrap_or_default()
        .contains("401"));
    // The guest keeps retrying (as kubeadm does) and never registers.
    stays("no Node", Duration::from_secs(3), || async {
        c.nodes()
            .get_opt("wrong-token")
            .await
            .expect("read")
            .is_none()
    })
    .await;
    assert_eq!(c.vmi_phase("wrong-token").await.as_deref(), Some("Running"));
    sim.stop().await;
}

#[tokio::test]
async fn a_tenant_that_publishes_a_join_address_is_joined_there_and_not_at_its_kubeconfig_server() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    // kube-system/kubeadm-config names another address of the same API server.
    let port = c
        .endpoint()
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .expect("port");
    let published = format!("localhost:{port}");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": format!(
            "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\ncontrolPlaneEndpoint: {published}\n")},
    }))
    .expect("configmap");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.tenant.clone(), "kube-system")
        .create(&Default::default(), &cm)
        .await
        .expect("kubeadm-config");
    let sim = c.spawn(SimMode::Normal);
    c.write_vm(
        "at-kubeconfig",
        &user_data(
            c.version,
            "at-kubeconfig",
            &c.endpoint(),
            TOKEN,
            &c.ca_hash(),
        ),
    )
    .await;
    for (name, template) in [
        ("kubeadm-join", JoinTemplate::Kubeadm),
        ("vcluster-join", JoinTemplate::Vcluster),
    ] {
        c.write_vm(
            name,
            &user_data_with(c.version, template, name, &published, TOKEN, &c.ca_hash()),
        )
        .await;
    }
    let error = c.wait_join_error("at-kubeconfig", "the join error").await;
    println!("at-kubeconfig: {error}");
    assert!(
        error.contains("not the join address it publishes"),
        "{error}"
    );
    for name in ["kubeadm-join", "vcluster-join"] {
        let node = eventually(&format!("{name} to register"), WAIT, || async {
            c.nodes().get_opt(name).await.expect("read node")
        })
        .await;
        println!(
            "{name}: registered through {published}: {:?}",
            node.metadata.name
        );
    }
    assert!(c
        .nodes()
        .get_opt("at-kubeconfig")
        .await
        .expect("read")
        .is_none());
    sim.stop().await;
}

#[tokio::test]
async fn an_expired_bootstrap_token_does_not_join() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(-1)).await;
    let sim = c.spawn(SimMode::Normal);
    c.write_vm(
        "expired",
        &user_data(c.version, "expired", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    let error = c.wait_join_error("expired", "the join error").await;
    assert!(error.contains("401"), "{error}");
    assert!(c.nodes().get_opt("expired").await.expect("read").is_none());
    sim.stop().await;
}

#[tokio::test]
async fn a_join_configuration_the_tenants_kubeadm_cannot_read_does_not_join() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    // What autonodes writes for 1.22 to 1.30 (v1beta3) and from 1.31 (v1beta4), sent to a
    // tenant whose kubeadm is older; and v1beta2 written with v1beta4's kubeletExtraArgs.
    let newer = |minor| KubeVersion::new(1, minor, 0);
    assert!(
        c.version < newer(22),
        "the tests' tenants are older than 1.22: {:?}",
        c.version
    );
    let v1beta4 = user_data(newer(31), "v1beta4", &c.endpoint(), TOKEN, &c.ca_hash());
    let list_args = user_data(newer(31), "list-args", &c.endpoint(), TOKEN, &c.ca_hash())
        .replace("kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta2");
    assert!(list_args.contains("- name: \"provider-id\""), "{list_args}");
    let cases = [
        (
            "v1beta3",
            user_data(newer(22), "v1beta3", &c.endpoint(), TOKEN, &c.ca_hash()),
            "kubeadm.k8s.io/v1beta3",
        ),
        ("v1beta4", v1beta4, "kubeadm.k8s.io/v1beta4"),
        ("list-args", list_args, "cannot unmarshal array"),
    ];
    for (name, ud, _) in &cases {
        c.write_vm(name, ud).await;
    }
    for (name, _, why) in &cases {
        let error = c.wait_join_error(name, "the join error").await;
        println!("{name}: {error}");
        assert!(
            error.starts_with(simulator::GAVE_UP_PREFIX) && error.contains(why),
            "{error}"
        );
    }
    // The same token and tenant with what autonodes writes for the tenant's version joins.
    c.write_vm(
        "readable",
        &user_data(c.version, "readable", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    eventually("the readable one to register", WAIT, || async {
        c.nodes().get_opt("readable").await.expect("read node")
    })
    .await;
    for (name, _, _) in &cases {
        assert!(c.nodes().get_opt(name).await.expect("read").is_none());
    }
    sim.stop().await;
}

#[tokio::test]
async fn a_wrong_ca_hash_does_not_join() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    let wrong = format!("sha256:{}", "0".repeat(64));
    c.write_vm(
        "wrong-ca",
        &user_data(c.version, "wrong-ca", &c.endpoint(), TOKEN, &wrong),
    )
    .await;
    let error = c.wait_join_error("wrong-ca", "the join error").await;
    assert!(
        error.starts_with(simulator::GAVE_UP_PREFIX) && error.contains("pinned"),
        "{error}"
    );
    assert!(c.nodes().get_opt("wrong-ca").await.expect("read").is_none());
    // The Event follows the join error written on the VMI.
    eventually("a JoinFailed Event", WAIT, || async {
        let events = c.events_for("wrong-ca", "JoinFailed").await;
        (!events.is_empty()).then_some(())
    })
    .await;
    sim.stop().await;
}

#[tokio::test]
async fn never_boot_leaves_the_vmi_scheduling_and_the_vm_not_ready() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::NeverBoot);
    c.write_vm(
        "stuck",
        &user_data(c.version, "stuck", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    eventually("the VM to report Starting", WAIT, || async {
        let vm = c.vms().get("stuck").await.expect("vm");
        (vm.data["status"]["printableStatus"] == "Starting").then_some(())
    })
    .await;
    stays(
        "the VMI Scheduling and the VM not ready",
        Duration::from_secs(3),
        || async {
            let vm = c.vms().get("stuck").await.expect("vm");
            c.vmi_phase("stuck").await.as_deref() == Some("Scheduling")
                && vm.data["status"]["ready"] == false
        },
    )
    .await;
    assert!(c.nodes().get_opt("stuck").await.expect("read").is_none());
    sim.stop().await;
}

#[tokio::test]
async fn never_join_gives_a_running_vmi_and_no_node() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::NeverJoin);
    c.write_vm(
        "lonely",
        &user_data(c.version, "lonely", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    c.wait_vmi_running("lonely").await;
    eventually("the VM to be ready", WAIT, || async {
        let vm = c.vms().get("lonely").await.expect("vm");
        (vm.data["status"]["ready"] == true).then_some(())
    })
    .await;
    stays("no Node", Duration::from_secs(3), || async {
        c.nodes()
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .is_empty()
    })
    .await;
    sim.stop().await;
}

#[tokio::test]
async fn slow_boot_keeps_the_vmi_scheduling_until_the_delay_has_passed() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::SlowBoot(Duration::from_secs(5)));
    c.write_vm(
        "slow",
        &user_data(c.version, "slow", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    eventually("the VMI to be Scheduling", WAIT, || async {
        (c.vmi_phase("slow").await.as_deref() == Some("Scheduling")).then_some(())
    })
    .await;
    let seen = Instant::now();
    eventually("the Node to be Ready", WAIT, || async {
        c.nodes()
            .get_opt("slow")
            .await
            .expect("read")
            .filter(|n| ready_status(n).as_deref() == Some("True"))
    })
    .await;
    // creationTimestamp has second precision, so allow a second less than the delay.
    assert!(
        seen.elapsed() >= Duration::from_secs(3),
        "booted after {:?}",
        seen.elapsed()
    );
    sim.stop().await;
}

#[tokio::test]
async fn deleting_the_vm_removes_its_vmi_and_data_volumes_and_the_vm_disappears() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    c.write_vm(
        "doomed",
        &user_data(c.version, "doomed", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    eventually("the Node to be Ready", WAIT, || async {
        c.nodes()
            .get_opt("doomed")
            .await
            .expect("read")
            .filter(|n| ready_status(n).as_deref() == Some("True"))
    })
    .await;
    assert!(c
        .dvs()
        .get_opt("doomed-containerdisk")
        .await
        .expect("read")
        .is_some());

    c.vms()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete VM");
    eventually("the VM to be gone", WAIT, || async {
        c.vms()
            .get_opt("doomed")
            .await
            .expect("read")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(c.vmis().get_opt("doomed").await.expect("read").is_none());
    assert!(c
        .dvs()
        .get_opt("doomed-containerdisk")
        .await
        .expect("read")
        .is_none());
    // The stopped kubelet leaves its Node NotReady; the garbage collector's part (the
    // user-data Secret owned by the VM) goes too.
    let node = c.nodes().get("doomed").await.expect("node still there");
    assert_eq!(ready_status(&node).as_deref(), Some("Unknown"));
    eventually(
        "the owned user-data Secret to be collected",
        WAIT,
        || async {
            Api::<Secret>::namespaced(c.host.clone(), NS)
                .get_opt("doomed-userdata")
                .await
                .expect("read")
                .is_none()
                .then_some(())
        },
    )
    .await;
    sim.stop().await;
}

#[tokio::test]
async fn restarting_the_simulator_creates_nothing_twice() {
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let sim = c.spawn(SimMode::Normal);
    c.write_vm(
        "first",
        &user_data(c.version, "first", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    let node = eventually("the first Node", WAIT, || async {
        c.nodes()
            .get_opt("first")
            .await
            .expect("read")
            .filter(|n| ready_status(n).as_deref() == Some("True"))
    })
    .await;
    let vmi = c.vmis().get("first").await.expect("vmi");
    let dv = c.dvs().get("first-containerdisk").await.expect("dv");
    sim.stop().await;

    let sim = c.spawn(SimMode::Normal);
    c.write_vm(
        "second",
        &user_data(c.version, "second", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    eventually("the second Node", WAIT, || async {
        c.nodes()
            .get_opt("second")
            .await
            .expect("read")
            .filter(|n| ready_status(n).as_deref() == Some("True"))
    })
    .await;
    let same_uid = |a: Option<String>, b: Option<String>| a.is_some() && a == b;
    assert!(same_uid(
        c.vmis().get("first").await.expect("vmi").uid(),
        vmi.uid()
    ));
    assert!(same_uid(
        c.dvs().get("first-containerdisk").await.expect("dv").uid(),
        dv.uid()
    ));
    assert!(same_uid(
        c.nodes().get("first").await.expect("node").uid(),
        node.uid()
    ));
    assert_eq!(
        c.vmis()
            .list(&ListParams::default())
            .await
            .expect("vmis")
            .items
            .len(),
        2
    );
    assert_eq!(
        c.dvs()
            .list(&ListParams::default())
            .await
            .expect("dvs")
            .items
            .len(),
        2
    );
    assert_eq!(
        c.nodes()
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .len(),
        2
    );
    let vm = c.vms().get("first").await.expect("vm");
    assert_eq!(
        vm.finalizers().iter().filter(|f| *f == FINALIZER).count(),
        1
    );
    sim.stop().await;
}

#[tokio::test]
async fn the_simulate_command_plays_kubevirt_until_it_is_interrupted() {
    let c = Clusters::start().await;
    let host = c.env.apiserver("host").expect("host");
    let tenant = c.tenant_server();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_autonodes-dev"))
        .arg("simulate")
        .arg("--host-kubeconfig")
        .arg(&host.kubeconfig_path)
        .arg("--tenant-kubeconfig")
        .arg(&tenant.kubeconfig_path)
        .args(["--mode", "never-join", "--namespace", NS])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("autonodes-dev simulate starts");
    autonodes_testenv::testenv::record_pid(child.id(), "autonodes-dev simulate");
    let mut child = KillOnDrop(child);
    c.write_vm(
        "cli",
        &user_data(c.version, "cli", &c.endpoint(), TOKEN, &c.ca_hash()),
    )
    .await;
    let vmi = c.wait_vmi_running("cli").await;
    assert!(vmi.data["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .is_some_and(|ip| ip.starts_with("10.")));
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exited = eventually("autonodes-dev simulate to exit", WAIT, || {
        let done = child.0.try_wait().expect("wait");
        async move { done }
    })
    .await;
    assert!(exited.success(), "exit status {exited}");
    assert!(c.nodes().get_opt("cli").await.expect("read").is_none());
}

/// A child process that is killed if the test ends early.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests an API server counted (`apiserver_request_total`), by verb and
/// resource[/subresource] (`-` for non-resource paths such as `/api`).
type Counts = BTreeMap<(String, String), f64>;

async fn request_counts(client: &Client) -> Counts {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(request).await.expect("GET /metrics");
    let mut counts = Counts::new();
    for line in text.lines() {
        let Some((labels, value)) = line
            .strip_prefix("apiserver_request_total{")
            .and_then(|rest| rest.rsplit_once("} "))
        else {
            continue;
        };
        let label = |name: &str| -> String {
            let key = format!("{name}=\"");
            labels
                .split("\",")
                .find_map(|pair| pair.strip_prefix(key.as_str()))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let resource = match (label("resource"), label("subresource")) {
            (r, _) if r.is_empty() => "-".to_string(),
            (r, s) if s.is_empty() => r,
            (r, s) => format!("{r}/{s}"),
        };
        let n: f64 = value.trim().parse().expect("a number");
        *counts.entry((label("verb"), resource)).or_default() += n;
    }
    counts
}

#[tokio::test]
async fn fifty_vms_boot_and_join_with_no_list_and_no_node_read_per_vm() {
    const VMS: usize = 50;
    let c = Clusters::start().await;
    c.write_token(TOKEN, SignedDuration::from_mins(15)).await;
    let before = [
        ("host", request_counts(&c.host).await),
        ("tenant", request_counts(&c.tenant).await),
    ];
    let sim = c.spawn(SimMode::Normal);
    // The test's own requests: per VM a POST and a PATCH of its Secret and a POST of the VM
    // (host), and one watch of the tenant's Nodes (a LIST and a WATCH).
    futures::future::join_all((0..VMS).map(|i| {
        let c = &c;
        async move {
            let name = format!("vm-{i:02}");
            let ud = user_data(c.version, &name, &c.endpoint(), TOKEN, &c.ca_hash());
            c.write_vm(&name, &ud).await;
        }
    }))
    .await;
    let ready = tokio::time::timeout(Duration::from_secs(180), async {
        use futures::StreamExt;
        let mut ready = std::collections::BTreeSet::new();
        let nodes = kube::runtime::watcher(c.nodes(), kube::runtime::watcher::Config::default());
        let mut nodes = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(nodes));
        while let Some(node) = nodes.next().await {
            let node = node.expect("watching Nodes");
            if ready_status(&node).as_deref() == Some("True") {
                ready.insert(node.name_any());
            }
            if ready.len() == VMS {
                break;
            }
        }
        ready.len()
    })
    .await
    .expect("every Node turns Ready within 180s");
    assert_eq!(ready, VMS);
    // Let the last annotations and Events land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = [
        ("host", request_counts(&c.host).await),
        ("tenant", request_counts(&c.tenant).await),
    ];
    sim.stop().await;

    println!("requests per VM ({VMS} VMs; the test's own included):");
    let mut grown = BTreeMap::new();
    for ((cluster, after), (_, before)) in after.iter().zip(&before) {
        for ((verb, resource), total) in after {
            let n = total
                - before
                    .get(&(verb.clone(), resource.clone()))
                    .unwrap_or(&0.0);
            if n <= 0.0 {
                continue;
            }
            println!(
                "  {cluster:<6} {verb:<6} {resource:<40} {:>6.2}",
                n / VMS as f64
            );
            grown.insert((*cluster, verb.as_str(), resource.as_str()), n);
        }
    }
    let count = |cluster: &str, verb: &str, resource: &str| -> f64 {
        grown
            .iter()
            .filter(|((c, v, r), _)| (*c, *v, *r) == (cluster, verb, resource))
            .map(|(_, n)| *n)
            .sum()
    };
    let lists: f64 = grown
        .iter()
        .filter(|((_, v, _), _)| *v == "LIST")
        .map(|(_, n)| *n)
        .sum();
    // Each cache lists once at the start (plus the start-up check and the test's watch):
    // a LIST per VM would be 50 or more. kube-apiserver 1.20 counts a GET of a custom
    // resource as a LIST, so this bounds the GETs of VMs, VMIs and DataVolumes as well.
    assert!(
        lists <= 16.0,
        "{lists} LISTs for {VMS} VMs: something lists per VM"
    );
    for (cluster, resource) in [
        ("host", "virtualmachineinstances"),
        ("host", "virtualmachines"),
        ("host", "secrets"),
        ("tenant", "nodes"),
        ("tenant", "secrets"),
    ] {
        assert!(
            count(cluster, "LIST", resource) <= 2.0,
            "{cluster} LIST {resource} grows with the VMs"
        );
    }
    assert!(
        count("tenant", "GET", "nodes") <= 2.0,
        "the simulator reads Nodes per VM: {}",
        count("tenant", "GET", "nodes")
    );
    assert_eq!(count("tenant", "PUT", "nodes"), 0.0, "Nodes are patched");
    // The user data comes from the Secret cache (a GET only when the watch had not
    // delivered the Secret yet).
    assert!(
        count("host", "GET", "secrets") <= VMS as f64 / 2.0,
        "the simulator reads the user-data Secret per VM: {}",
        count("host", "GET", "secrets")
    );
    // Joins that worked record no Event; nothing here failed.
    assert_eq!(
        count("host", "POST", "events"),
        0.0,
        "Events for joins that worked"
    );
    // Nothing is written on the VMI after its creation to remember the join.
    assert_eq!(
        count("host", "PATCH", "virtualmachineinstances"),
        0.0,
        "the VMI is patched after its creation"
    );
}
