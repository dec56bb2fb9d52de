//! A whole autonodes installation on real API servers: management, host and tenant
//! clusters, the controller and the KubeVirt simulator, in-process. A world is built on a
//! test environment: the default one ([`World::start_clusters`]), or one a test prepared
//! itself ([`World::on`]), e.g. with a kubeadm tenant that real guests join.

use std::time::Duration;

use autonodes::controller::config::ControllerConfig;
use autonodes_api::{NodeClaim, NodePool, NodeProvider, NodeType, LABEL_MANAGED_BY, MANAGED_BY};
use autonodes_testenv::playground::{wire, Playground, SERVICE_NAMESPACE};
use autonodes_testenv::simulator::{SimMode, SimOptions, Tenant};
use autonodes_testenv::testenv::TestEnv;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a world starts with.
pub struct WorldOptions {
    /// The NodeProvider YAML applied at start.
    pub provider: String,
    /// How the simulated VMs behave.
    pub mode: SimMode,
    /// The controller's launch timeout.
    pub launch_timeout: Duration,
    /// The controller's registration timeout.
    pub registration_timeout: Duration,
    /// The controller's initialization timeout.
    pub initialization_timeout: Duration,
    /// How long a pool's node may stay not Ready before it is replaced.
    pub node_repair_after: Option<Duration>,
    /// How often the controller's orphan sweep runs.
    pub orphan_sweep_interval: Duration,
    /// Whether the VMs' host is a cluster of its own (API server `host`, reached through
    /// the kubeconfig Secret the provider names), as for tests that stop it or look at
    /// what crosses between it and the management cluster. Otherwise autonodes runs in
    /// its host cluster, as most installations do: the provider names `local` and the
    /// world has two API servers, not three.
    pub separate_host: bool,
}

impl Default for WorldOptions {
    fn default() -> Self {
        WorldOptions {
            provider: std::fs::read_to_string(
                super::repo().join("examples/nodeprovider-advanced.yaml"),
            )
            .expect("advanced example readable"),
            mode: SimMode::Normal,
            launch_timeout: Duration::from_secs(120),
            registration_timeout: Duration::from_secs(120),
            initialization_timeout: Duration::from_secs(120),
            node_repair_after: Some(Duration::from_secs(600)),
            orphan_sweep_interval: Duration::from_secs(300),
            separate_host: false,
        }
    }
}

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
    }
}

fn stopper() -> (
    watch::Sender<bool>,
    impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (tx, mut rx) = watch::channel(false);
    (tx, async move {
        let _ = rx.wait_for(|v| *v).await;
    })
}

/// The host cluster the providers of the tests name: the playground's host, reached through
/// the kubeconfig Secret of that name, or the management cluster itself (as `local`) in a
/// world without [`WorldOptions::separate_host`].
pub const PLAYGROUND_HOST: &str = "test-kubevirt-1";

/// A NodeProvider whose VMs go to `cluster` (the playground's host is [`PLAYGROUND_HOST`]),
/// with a containerDisk base template asking `cpu` and `memory`, and the given
/// `spec.kubeVirt.nodeTypes` entries (YAML list items indented by six spaces).
pub fn provider_yaml(
    name: &str,
    cluster: &str,
    cpu: &str,
    memory: &str,
    node_types: &str,
) -> String {
    format!(
        r#"
apiVersion: autonodes.io/v1alpha1
kind: NodeProvider
metadata:
  name: {name}
spec:
  kubeVirt:
    clusterRef:
      cluster: {cluster}
      namespace: vcluster-platform
    virtualMachineTemplate:
      spec:
        template:
          spec:
            domain:
              devices:
                disks:
                  - name: root
                    disk:
                      bus: virtio
              resources:
                requests:
                  cpu: "{cpu}"
                  memory: {memory}
            volumes:
              - name: root
                containerDisk:
                  image: quay.io/containerdisks/ubuntu:22.04
    nodeTypes:
{node_types}
"#
    )
}

/// Host and tenant clients allowed to connect to 127.0.0.1, where the test clusters listen.
pub fn loopback_egress() -> autonodes::remote::egress::Egress {
    autonodes::remote::egress::Egress::allowing(&[autonodes_core::address_policy::Cidr::parse(
        "127.0.0.1",
    )
    .expect("cidr")])
}

/// The tenant namespace of the claims.
pub const NS: &str = "tenant";

/// What [`World::objects_per_claim`] counted, by label value.
pub struct ObjectsPerClaim {
    /// VirtualMachines on the host.
    pub vms: std::collections::BTreeMap<String, usize>,
    /// User-data Secrets on the host.
    pub secrets: std::collections::BTreeMap<String, usize>,
    /// Bootstrap tokens in the tenant.
    pub tokens: std::collections::BTreeMap<String, usize>,
    /// Nodes of the tenant that carry the label.
    pub nodes: std::collections::BTreeMap<String, usize>,
}

/// A running installation.
pub struct World {
    /// The clusters and the applied provider.
    pub playground: Playground,
    /// Management-cluster admin client.
    pub mgmt: Client,
    /// Host-cluster admin client.
    pub host: Client,
    /// Tenant-cluster admin client.
    pub tenant: Client,
    /// Controller settings used by [`World::start_controller`].
    pub config: ControllerConfig,
    controller: Option<Running>,
    simulator: Option<Running>,
}

impl World {
    /// [`World::start`] with `provider` and the default options otherwise.
    pub async fn with_provider(provider: String) -> World {
        World::start(WorldOptions {
            provider,
            ..WorldOptions::default()
        })
        .await
    }

    /// Starts the clusters, wires them, and runs the controller and the simulator.
    pub async fn start(opts: WorldOptions) -> World {
        let mut world = Self::start_clusters(&opts).await;
        world.start_simulator(opts.mode).await;
        world.start_controller();
        world
    }

    /// Starts the default test environment (`mgmt` and `tenant` API servers, `host` one
    /// of its own only with [`WorldOptions::separate_host`], else the management server)
    /// and wires its clusters only (no controller, no simulator).
    pub async fn start_clusters(opts: &WorldOptions) -> World {
        use autonodes_testenv::playground::{host_crds, mgmt_crds};
        let mut env = super::start(&[]).await;
        if opts.separate_host {
            super::add_server(&mut env, "mgmt", mgmt_crds()).await;
            super::add_server(&mut env, "host", host_crds()).await;
        } else {
            let mut crds = mgmt_crds();
            crds.extend(host_crds());
            super::add_server(&mut env, "mgmt", crds).await;
            env.alias("host", "mgmt").expect("host stands for mgmt");
        }
        super::add_server(&mut env, "tenant", Vec::new()).await;
        World::on(env, opts).await
    }

    /// Whether the VMs go to the management cluster itself (the provider names `local`).
    pub fn host_is_mgmt(&self) -> bool {
        let p = &self.playground;
        matches!((p.host(), p.mgmt()), (Ok(h), Ok(m)) if h.url == m.url)
    }

    /// Wires the clusters of `env`, which has `mgmt`, `host` and `tenant` API servers, and
    /// applies the provider of `opts` (no controller, no simulator).
    pub async fn on(env: TestEnv, opts: &WorldOptions) -> World {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
            )
            .try_init();
        let playground = wire(env, &opts.provider, NS, "tenant")
            .await
            .expect("wiring the clusters");
        let mgmt = playground
            .mgmt()
            .expect("mgmt")
            .client()
            .await
            .expect("mgmt client");
        let host = playground
            .host()
            .expect("host")
            .client()
            .await
            .expect("host client");
        let tenant = playground
            .tenant()
            .expect("tenant")
            .client()
            .await
            .expect("tenant client");
        let config = ControllerConfig {
            namespace: SERVICE_NAMESPACE.into(),
            launch_timeout: opts.launch_timeout,
            registration_timeout: opts.registration_timeout,
            initialization_timeout: opts.initialization_timeout,
            node_repair_after: opts.node_repair_after,
            drain_timeout: Duration::from_secs(20),
            orphan_sweep_interval: opts.orphan_sweep_interval,
            // Every cluster here listens on loopback, which the address policy refuses by
            // default: allowed as a lab would (the management API server stays refused).
            egress: loopback_egress(),
            management_server: Some(format!(
                "127.0.0.1:{}",
                playground.mgmt().expect("mgmt").port
            )),
            // As `autonodes run` takes them from its kubeconfig: for warm VMs on a `local`
            // host.
            local_host: autonodes::remote::clients::LocalHost {
                server: playground.mgmt().expect("mgmt").url.clone(),
                ca_pem: Some(playground.mgmt().expect("mgmt").ca_pem.clone()),
            },
            ..Default::default()
        };
        World {
            playground,
            mgmt,
            host,
            tenant,
            config,
            controller: None,
            simulator: None,
        }
    }

    /// Runs the controller in this process.
    pub fn start_controller(&mut self) {
        let (stop, stopped) = stopper();
        let client = self.mgmt.clone();
        let config = self.config.clone();
        let task = tokio::spawn(async move {
            let addr = "127.0.0.1:0".parse().expect("address");
            if let Err(e) = autonodes::run::run_with(client, config, addr, stopped).await {
                panic!("controller failed: {e:#}");
            }
        });
        self.controller = Some(Running { stop, task });
    }

    /// Starts `autonodes run` (the binary at `exe`) as its own process against the
    /// management cluster, logging to `controller-<n>.log` in the environment's directory.
    pub fn spawn_controller_process(
        &self,
        n: u32,
        exe: &str,
    ) -> autonodes_testenv::testenv::ManagedProcess {
        self.spawn_controller_process_on(n, exe, "127.0.0.1:0")
    }

    /// [`World::spawn_controller_process`] serving its metrics on `metrics_addr`.
    pub fn spawn_controller_process_on(
        &self,
        n: u32,
        exe: &str,
        metrics_addr: &str,
    ) -> autonodes_testenv::testenv::ManagedProcess {
        self.spawn_controller_process_with(n, exe, metrics_addr, &[])
    }

    /// [`World::spawn_controller_process_on`] with `extra` flags.
    pub fn spawn_controller_process_with(
        &self,
        n: u32,
        exe: &str,
        metrics_addr: &str,
        extra: &[&str],
    ) -> autonodes_testenv::testenv::ManagedProcess {
        let mgmt = self.playground.mgmt().expect("mgmt");
        let log = self.playground.env.dir.join(format!("controller-{n}.log"));
        let args: Vec<String> = [
            "run",
            "--kubeconfig",
            super::path_str(&mgmt.kubeconfig_path),
            "--namespace",
            SERVICE_NAMESPACE,
            "--metrics-addr",
            metrics_addr,
            "--launch-timeout",
            "5m",
            "--registration-timeout",
            "5m",
            "--tenant-allow-cidrs",
            "127.0.0.1",
            "--host-allow-cidrs",
            "127.0.0.1",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        autonodes_testenv::testenv::ManagedProcess::spawn(
            &format!("autonodes-{n}"),
            std::path::Path::new(exe),
            &args,
            &log,
        )
        .expect("controller process starts")
    }

    /// Stops the in-process controller (graceful).
    pub async fn stop_controller(&mut self) {
        if let Some(r) = self.controller.take() {
            r.stop().await;
        }
    }

    /// Runs the simulator in this process, playing the guests that join the tenant.
    pub async fn start_simulator(&mut self, mode: SimMode) {
        let tenant = Tenant::from_kubeconfig_file(
            &self.playground.tenant().expect("tenant").kubeconfig_path,
        )
        .await
        .expect("tenant for the simulator");
        let opts = SimOptions {
            mode,
            join_retry_interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(2),
            ..Default::default()
        };
        self.start_simulator_with(vec![tenant], opts);
    }

    /// Runs the simulator in this process with `opts`, playing the guests that join
    /// `tenants` (none where real guests join with their own kubelet).
    pub fn start_simulator_with(&mut self, tenants: Vec<Tenant>, opts: SimOptions) {
        let (stop, stopped) = stopper();
        let host = self.host.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = autonodes_testenv::simulator::run(host, tenants, opts, stopped).await {
                panic!("simulator failed: {e}");
            }
        });
        self.simulator = Some(Running { stop, task });
    }

    /// Stops the simulator.
    pub async fn stop_simulator(&mut self) {
        if let Some(r) = self.simulator.take() {
            r.stop().await;
        }
    }

    /// The NodeClaim API of the tenant namespace.
    pub fn claims(&self) -> Api<NodeClaim> {
        Api::namespaced(self.mgmt.clone(), NS)
    }

    /// The NodePool API of the tenant namespace.
    pub fn pools(&self) -> Api<autonodes_api::NodePool> {
        Api::namespaced(self.mgmt.clone(), NS)
    }

    /// Creates a NodePool in [`NS`] from its spec (`vClusterRef` defaults to the tenant).
    pub async fn create_pool(
        &self,
        name: &str,
        mut spec: serde_json::Value,
    ) -> autonodes_api::NodePool {
        if spec["vClusterRef"].is_null() {
            spec["vClusterRef"] = serde_json::json!({"name": "tenant"});
        }
        let pool: autonodes_api::NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }))
        .expect("valid NodePool");
        self.pools()
            .create(&PostParams::default(), &pool)
            .await
            .expect("pool created")
    }

    /// Creates the NodeQuota `name` from its spec and waits until the controller says it
    /// enforces it (`Ready=True`, reason `Enforced`): from then on every claim and pool is
    /// counted against it. A controller whose watch never delivered the quota fails here,
    /// with the quota's status, not later as a pool that went past it.
    pub async fn create_node_quota(
        &self,
        name: &str,
        spec: serde_json::Value,
    ) -> autonodes_api::NodeQuota {
        let quota: autonodes_api::NodeQuota = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1",
            "kind": "NodeQuota",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("valid NodeQuota");
        let api = Api::<autonodes_api::NodeQuota>::all(self.mgmt.clone());
        api.create(&PostParams::default(), &quota)
            .await
            .expect("quota created");
        wait_object(api, name, "Ready=True (Enforced)", |q| {
            q.status.as_ref().is_some_and(|s| {
                find_condition(&s.conditions, "Ready")
                    .is_some_and(|(status, reason, _)| status == "True" && reason == "Enforced")
            })
        })
        .await
    }

    /// Creates a claim from JSON (`metadata.namespace` defaults to [`NS`]).
    pub async fn create_claim(&self, mut body: serde_json::Value) -> NodeClaim {
        body["apiVersion"] = "autonodes.io/v1alpha1".into();
        body["kind"] = "NodeClaim".into();
        if body["spec"]["vClusterRef"].is_null() {
            body["spec"]["vClusterRef"] = serde_json::json!({"name": "tenant"});
        }
        let claim: NodeClaim = serde_json::from_value(body).expect("valid NodeClaim");
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .expect("claim created")
    }

    /// A claim for the advanced provider's `type_` (by requirement on the node type).
    pub async fn claim_type(&self, name: &str, type_: &str) -> NodeClaim {
        self.create_claim(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"requirements": [{"key": "autonodes.io/node-type", "operator": "In", "values": [type_]}]}
        }))
        .await
    }

    /// Waits until the claim satisfies `pred`.
    pub async fn wait_claim(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&NodeClaim) -> bool,
    ) -> NodeClaim {
        let api = self.claims();
        let mut last = None;
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(c)) = api.get_opt(name).await {
                if pred(&c) {
                    return c;
                }
                last = Some(c);
            }
            if start.elapsed() > timeout {
                panic!(
                    "claim {name}: timed out after {timeout:?} waiting for {what}; last seen status: {}",
                    serde_json::to_string_pretty(&last.and_then(|c| c.status)).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the NodeProvider `name` satisfies `pred` (up to [`OBJECT_WAIT`]).
    pub async fn wait_provider(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&NodeProvider) -> bool,
    ) -> NodeProvider {
        wait_object(Api::all(self.mgmt.clone()), name, what, pred).await
    }

    /// Waits until the NodePool `name` in [`NS`] satisfies `pred` (up to [`OBJECT_WAIT`]).
    pub async fn wait_pool(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&NodePool) -> bool,
    ) -> NodePool {
        wait_object(self.pools(), name, what, pred).await
    }

    /// Waits until the claim's phase is `phase`.
    pub async fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> NodeClaim {
        self.wait_claim(name, &format!("phase {phase}"), timeout, |c| {
            c.status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"))
                == Some(phase.to_string())
        })
        .await
    }

    /// Waits until the claim is gone.
    pub async fn wait_claim_gone(&self, name: &str, timeout: Duration) {
        let what = format!("claim {name} to be gone");
        super::wait_gone(&what, &self.claims(), name, timeout).await
    }

    /// Deletes a claim (the finalizer runs the cleanup).
    pub async fn delete_claim(&self, name: &str) {
        self.claims()
            .delete(name, &DeleteParams::default())
            .await
            .expect("claim deletion accepted");
    }

    /// Every VirtualMachine autonodes manages on the host.
    pub async fn vms(&self) -> Vec<DynamicObject> {
        let api: Api<DynamicObject> = Api::all_with(
            self.host.clone(),
            &autonodes_api::kubevirt::virtual_machine(),
        );
        api.list(&managed()).await.expect("list VMs").items
    }

    /// The VirtualMachine of `claim` (its `status.vmName`) on the host.
    pub async fn vm_of(&self, claim: &NodeClaim) -> DynamicObject {
        let name = claim
            .status
            .as_ref()
            .and_then(|s| s.vm_name.clone())
            .unwrap_or_else(|| panic!("claim {} has no status.vmName", claim.name_any()));
        self.vms()
            .await
            .into_iter()
            .find(|v| v.name_any() == name)
            .unwrap_or_else(|| panic!("no VirtualMachine {name} of claim {}", claim.name_any()))
    }

    /// Every DataVolume on the host.
    pub async fn data_volumes(&self) -> Vec<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::all_with(self.host.clone(), &autonodes_api::kubevirt::data_volume());
        api.list(&ListParams::default())
            .await
            .expect("list DataVolumes")
            .items
    }

    /// Every Secret autonodes manages on the host.
    pub async fn host_secrets(&self) -> Vec<Secret> {
        let api: Api<Secret> = Api::all(self.host.clone());
        api.list(&managed()).await.expect("list host Secrets").items
    }

    /// Every bootstrap token autonodes made in the tenant.
    pub async fn tokens(&self) -> Vec<Secret> {
        let api: Api<Secret> = Api::namespaced(self.tenant.clone(), "kube-system");
        api.list(&managed()).await.expect("list tokens").items
    }

    /// Every Node of the tenant.
    pub async fn nodes(&self) -> Vec<Node> {
        let api: Api<Node> = Api::all(self.tenant.clone());
        api.list(&ListParams::default())
            .await
            .expect("list Nodes")
            .items
    }

    /// How many VMs, user-data Secrets, bootstrap tokens and Nodes carry each value of
    /// `label` (a claim's name or UID label); objects without it count under `""`, but for
    /// Nodes, which are left out (the tenant may have Nodes of its own).
    pub async fn objects_per_claim(&self, label: &str) -> ObjectsPerClaim {
        let count = |labels: Vec<Option<std::collections::BTreeMap<String, String>>>| {
            let mut m: std::collections::BTreeMap<String, usize> = Default::default();
            for l in labels {
                *m.entry(
                    l.unwrap_or_default()
                        .get(label)
                        .cloned()
                        .unwrap_or_default(),
                )
                .or_default() += 1;
            }
            m
        };
        let vms = self.vms().await.into_iter().map(|o| o.metadata.labels);
        let secrets = self
            .host_secrets()
            .await
            .into_iter()
            .map(|o| o.metadata.labels);
        let tokens = self.tokens().await.into_iter().map(|o| o.metadata.labels);
        let nodes = self
            .nodes()
            .await
            .into_iter()
            .map(|o| o.metadata.labels)
            .filter(|l| l.as_ref().is_some_and(|l| l.contains_key(label)));
        ObjectsPerClaim {
            vms: count(vms.collect()),
            secrets: count(secrets.collect()),
            tokens: count(tokens.collect()),
            nodes: count(nodes.collect()),
        }
    }

    /// A NodeType by name.
    pub async fn node_type(&self, name: &str) -> NodeType {
        Api::<NodeType>::all(self.mgmt.clone())
            .get(name)
            .await
            .expect("NodeType exists")
    }

    /// Waits until a NodeType satisfies `pred`.
    pub async fn wait_node_type(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&NodeType) -> bool,
    ) -> NodeType {
        let api = Api::<NodeType>::all(self.mgmt.clone());
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(t)) = api.get_opt(name).await {
                if pred(&t) {
                    return t;
                }
            }
            if start.elapsed() > Duration::from_secs(60) {
                panic!("NodeType {name}: timed out waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until a NodeType's phase is `phase` and returns its `Ready` condition.
    pub async fn wait_type_phase(
        &self,
        name: &str,
        phase: &str,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        let t = self
            .wait_node_type(name, phase, |t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    == Some(phase.into())
            })
            .await;
        t.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned())
            .unwrap_or_else(|| panic!("NodeType {name} has no Ready condition"))
    }

    /// Applies a NodeProvider from YAML; one naming the playground's host
    /// ([`PLAYGROUND_HOST`]) names `local` instead where the host is the management cluster.
    pub async fn apply_provider(&self, yaml: &str) -> NodeProvider {
        let mut p: NodeProvider = autonodes_core::yaml::from_str(yaml).expect("provider YAML");
        if self.host_is_mgmt() && p.spec.kube_virt.cluster_ref.cluster == PLAYGROUND_HOST {
            p.spec.kube_virt.cluster_ref.cluster = autonodes_api::LOCAL_HOST_CLUSTER.to_string();
        }
        let name = p.name_any();
        Api::<NodeProvider>::all(self.mgmt.clone())
            .patch(
                &name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&p),
            )
            .await
            .expect("provider applied")
    }

    /// Events (events.k8s.io/v1) about an object, as `reason: note` lines.
    pub async fn events_for(&self, namespace: &str, name: &str) -> Vec<String> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.mgmt.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default()
                )
            })
            .collect()
    }

    /// The Events about the cluster-scoped object `name`: recorded in `default` where the
    /// API server takes them there (current servers), else in `kube-system` (1.20).
    pub async fn cluster_events_for(&self, name: &str) -> Vec<String> {
        let mut events = self.events_for("default", name).await;
        events.extend(self.events_for("kube-system", name).await);
        events
    }

    /// Creates a namespace on the management cluster.
    pub async fn mgmt_namespace(&self, name: &str) {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns");
        let _ = Api::<Namespace>::all(self.mgmt.clone())
            .create(&PostParams::default(), &ns)
            .await;
    }

    /// Stops everything in order.
    pub async fn shutdown(mut self) {
        self.stop_controller().await;
        self.stop_simulator().await;
    }
}

/// How long [`World::wait_provider`] and [`World::wait_pool`] wait.
pub const OBJECT_WAIT: Duration = Duration::from_secs(150);

/// Polls `name` until `pred` holds; on timeout fails with the last status seen.
async fn wait_object<K>(api: Api<K>, name: &str, what: &str, pred: impl Fn(&K) -> bool) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let start = std::time::Instant::now();
    let mut last = serde_json::Value::Null;
    loop {
        if let Ok(Some(o)) = api.get_opt(name).await {
            if pred(&o) {
                return o;
            }
            last = serde_json::to_value(&o)
                .map(|v| v["status"].clone())
                .unwrap_or_default();
        }
        if start.elapsed() > OBJECT_WAIT {
            panic!(
                "{kind} {name}: timed out after {OBJECT_WAIT:?} waiting for {what}; last status: {}",
                serde_json::to_string_pretty(&last).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The condition `type_` of a NodeProvider as `(status, reason, message)`.
pub fn provider_condition(p: &NodeProvider, type_: &str) -> Option<(String, String, String)> {
    find_condition(&p.status.as_ref()?.conditions, type_)
}

/// The condition `type_` of a NodePool as `(status, reason, message)`.
pub fn pool_condition(p: &NodePool, type_: &str) -> Option<(String, String, String)> {
    find_condition(&p.status.as_ref()?.conditions, type_)
}

/// Objects labelled `app.kubernetes.io/managed-by=autonodes`.
pub fn managed() -> ListParams {
    ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"))
}

/// The condition `type_` in a list of conditions, as `(status, reason, message)`.
pub fn find_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<(String, String, String)> {
    conditions
        .iter()
        .find(|x| x.type_ == type_)
        .map(|x| (x.status.clone(), x.reason.clone(), x.message.clone()))
}

/// The condition `type_` of a claim as `(status, reason, message)`.
pub fn condition(c: &NodeClaim, type_: &str) -> Option<(String, String, String)> {
    find_condition(&c.status.as_ref()?.conditions, type_)
}

/// An object reference to a NodeType, for readability in tests.
pub fn ntype(name: &str) -> ObjectRef<NodeType> {
    ObjectRef::new(name)
}
