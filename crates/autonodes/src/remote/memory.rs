//! A host and a tenant held in memory ([`MemoryHost`], [`MemoryTenant`]), for the unit
//! tests of the claim lifecycle's stages: they answer [`HostApi`] and [`TenantApi`] as a
//! live cluster does (a create of an existing name finds it and tells whose it is, deletes
//! of what is gone are no error) and fail on request as a cluster can (any status code,
//! no answer in time, an object that vanishes between a conflict and the read after it).
//! The integration tests run the same stages against real API servers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::DynamicObject;
use kube::ResourceExt;

use super::api::{HostApi, TenantApi};
use super::clients::{ClusterKey, Remote, RemoteCache};
use super::host::VmCreate;
use crate::remote::error::Error;
use autonodes_api::kubevirt::{ObservedVm, ObservedVmi};
use autonodes_api::LABEL_NODECLAIM_UID;
use autonodes_core::join::{JoinInfo, Published};
use autonodes_core::kubeversion::KubeVersion;
use autonodes_core::template::golden::GoldenVolume;
use autonodes_core::template::names::{
    labelled_for_claim, user_data_is_ours, user_data_secret_name,
};

/// How the next call of one kind fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The API server answers with this status code (409, 404, 403, 422, 500, …).
    Status(u16),
    /// No answer in time.
    Timeout,
    /// (create_vm only) the create conflicts and the object is gone when read after.
    Vanish,
}

/// Failures queued per call name (`"create_vm"`, `"tokens"`, …), taken one per call.
#[derive(Default)]
struct Failures(Mutex<BTreeMap<&'static str, VecDeque<Failure>>>);

impl Failures {
    fn push(&self, call: &'static str, f: Failure) {
        lock(&self.0).entry(call).or_default().push_back(f);
    }

    fn take(&self, call: &'static str) -> Option<Failure> {
        lock(&self.0).get_mut(call).and_then(VecDeque::pop_front)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The error a cluster call gives for `f`, as the real calls wrap it.
fn remote_error(key: &ClusterKey, call: &str, f: Failure) -> Error {
    let source = match f {
        Failure::Status(code) => kube::Error::Api(
            kube::core::Status::failure(&format!("{call} failed with {code}"), "")
                .with_code(code)
                .boxed(),
        ),
        Failure::Timeout | Failure::Vanish => {
            kube::Error::Service("no answer within 10s".to_string().into())
        }
    };
    Error::Call {
        cluster: key.to_string(),
        on_host: matches!(key, ClusterKey::Host(_)),
        context: call.to_string(),
        source: Box::new(source),
    }
}

type Key = (String, String);

fn key(ns: &str, name: &str) -> Key {
    (ns.to_string(), name.to_string())
}

/// A KubeVirt host in memory.
pub(crate) struct MemoryHost {
    key: ClusterKey,
    failures: Failures,
    /// VirtualMachines by namespace and name.
    pub vms: Mutex<BTreeMap<Key, ObservedVm>>,
    /// VirtualMachineInstances by namespace and name.
    pub vmis: Mutex<BTreeMap<Key, ObservedVmi>>,
    /// Secrets by namespace and name.
    pub secrets: Mutex<BTreeMap<Key, Secret>>,
    /// DataVolumes by namespace and name: their labels.
    pub data_volumes: Mutex<BTreeMap<Key, BTreeMap<String, String>>>,
    /// Golden volumes made, by provider and name.
    pub golden: Mutex<Vec<(String, String)>>,
    /// Host nodes that are cordoned.
    pub cordoned: Mutex<std::collections::BTreeSet<String>>,
    /// Namespaces that exist, with their labels.
    pub namespaces: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    /// Migrations asked for, by namespace and name: the instance each moves.
    pub migrations: Mutex<BTreeMap<Key, String>>,
    uids: Mutex<u64>,
}

impl MemoryHost {
    /// An empty host named `cluster`.
    pub(crate) fn new(cluster: &str) -> Self {
        MemoryHost {
            key: ClusterKey::Host(cluster.to_string()),
            failures: Failures::default(),
            vms: Default::default(),
            vmis: Default::default(),
            secrets: Default::default(),
            data_volumes: Default::default(),
            golden: Default::default(),
            cordoned: Default::default(),
            namespaces: Default::default(),
            migrations: Default::default(),
            uids: Mutex::new(0),
        }
    }

    /// The next call `call` fails with `f`.
    pub(crate) fn fail_next(&self, call: &'static str, f: Failure) {
        self.failures.push(call, f);
    }

    fn check(&self, call: &'static str) -> Result<(), Error> {
        match self.failures.take(call) {
            Some(f) => Err(remote_error(&self.key, call, f)),
            None => Ok(()),
        }
    }

    /// The VM `ns/name` starts: ready, with a running instance at `ip`.
    pub(crate) fn run_vm(&self, ns: &str, name: &str, ip: &str) {
        if let Some(vm) = lock(&self.vms).get_mut(&key(ns, name)) {
            vm.status.ready = Some(true);
            vm.status.printable_status = Some("Running".into());
        }
        let vmi: ObservedVmi = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "status": {"phase": "Running", "interfaces": [{"ipAddress": ip}]},
        }))
        .expect("a VMI");
        lock(&self.vmis).insert(key(ns, name), vmi);
    }

    /// Puts a VM of `ns/name` with `labels` on the host (another claim's, say).
    pub(crate) fn put_vm(&self, ns: &str, name: &str, labels: BTreeMap<String, String>) {
        let mut vm = ObservedVm::default();
        vm.metadata.name = Some(name.into());
        vm.metadata.namespace = Some(ns.into());
        vm.metadata.labels = Some(labels);
        vm.metadata.uid = Some(self.next_uid());
        lock(&self.vms).insert(key(ns, name), vm);
    }

    fn next_uid(&self) -> String {
        let mut n = lock(&self.uids);
        *n += 1;
        format!("vm-uid-{n}")
    }
}

impl HostApi for MemoryHost {
    async fn vm(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVm>>, Error> {
        self.check("vm")?;
        Ok(lock(&self.vms).get(&key(ns, name)).cloned().map(Arc::new))
    }

    async fn vmi(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVmi>>, Error> {
        self.check("vmi")?;
        Ok(lock(&self.vmis).get(&key(ns, name)).cloned().map(Arc::new))
    }

    async fn create_user_data(
        &self,
        ns: &str,
        secret: &Secret,
        rewrite: bool,
    ) -> Result<bool, Error> {
        self.check("create_user_data")?;
        let mut secrets = lock(&self.secrets);
        let k = key(ns, &secret.name_any());
        match secrets.get(&k) {
            None => {
                secrets.insert(k, secret.clone());
                Ok(true)
            }
            Some(existing) => {
                let uid = secret
                    .labels()
                    .get(LABEL_NODECLAIM_UID)
                    .cloned()
                    .unwrap_or_default();
                if !labelled_for_claim(existing.labels(), &uid) {
                    return Ok(false);
                }
                if rewrite {
                    secrets.insert(k, secret.clone());
                }
                Ok(true)
            }
        }
    }

    async fn create_vm(&self, ns: &str, vm: &DynamicObject) -> Result<VmCreate, Error> {
        let name = vm.name_any();
        if let Some(f) = self.failures.take("create_vm") {
            if f == Failure::Vanish {
                return Ok(VmCreate::Vanished);
            }
            return Err(remote_error(&self.key, "create_vm", f));
        }
        let mut vms = lock(&self.vms);
        if let Some(existing) = vms.get(&key(ns, &name)) {
            let uid = vm
                .labels()
                .get(LABEL_NODECLAIM_UID)
                .cloned()
                .unwrap_or_default();
            return Ok(if labelled_for_claim(existing.labels(), &uid) {
                VmCreate::Existed(Arc::new(existing.clone()))
            } else {
                VmCreate::Taken
            });
        }
        let mut created = ObservedVm::from_object(vm);
        created.metadata.namespace = Some(ns.into());
        created.metadata.uid = Some(self.next_uid());
        vms.insert(key(ns, &name), created.clone());
        Ok(VmCreate::Created(Arc::new(created)))
    }

    async fn delete_vm(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        self.check("delete_vm")?;
        let mut vms = lock(&self.vms);
        let k = key(ns, name);
        if let Some(vm) = vms.get(&k) {
            if uid.is_some() && vm.metadata.uid != uid {
                return Err(remote_error(&self.key, "delete_vm", Failure::Status(409)));
            }
            vms.remove(&k);
            lock(&self.vmis).remove(&k);
        }
        Ok(())
    }

    async fn delete_vmi(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        self.check("delete_vmi")?;
        let mut vmis = lock(&self.vmis);
        let k = key(ns, name);
        if let Some(vmi) = vmis.get(&k) {
            if uid.is_some() && vmi.metadata.uid != uid {
                return Err(remote_error(&self.key, "delete_vmi", Failure::Status(409)));
            }
            vmis.remove(&k);
        }
        Ok(())
    }

    async fn halt_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.check("halt_vm")?;
        if let Some(vm) = lock(&self.vms).get_mut(&key(ns, name)) {
            vm.status.printable_status = Some("Stopped".into());
            vm.status.ready = Some(false);
            lock(&self.vmis).remove(&key(ns, name));
        }
        Ok(())
    }

    async fn ensure_namespace(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        create: bool,
    ) -> Result<bool, Error> {
        self.check("ensure_namespace")?;
        let mut namespaces = lock(&self.namespaces);
        if create && !namespaces.contains_key(name) {
            namespaces.insert(name.to_string(), labels.clone());
        }
        Ok(namespaces.contains_key(name))
    }

    async fn start_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.check("start_vm")?;
        if let Some(vm) = lock(&self.vms).get_mut(&key(ns, name)) {
            vm.status.printable_status = Some("Starting".into());
        }
        Ok(())
    }

    fn host_node_cordoned(&self, name: &str) -> bool {
        lock(&self.cordoned).contains(name)
    }

    async fn migrate(
        &self,
        ns: &str,
        vm: &str,
        _vm_uid: &str,
        name: &str,
        _labels: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        self.check("migrate")?;
        lock(&self.migrations).insert(key(ns, name), vm.to_string());
        Ok(())
    }

    async fn delete_migration(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.check("delete_migration")?;
        lock(&self.migrations).remove(&key(ns, name));
        Ok(())
    }

    async fn delete_user_data(
        &self,
        ns: &str,
        vm_name: &str,
        claim_uid: Option<&str>,
    ) -> Result<(), Error> {
        self.check("delete_user_data")?;
        // As the real host: only a Secret of the default installation's, for this claim or
        // warm VM.
        lock(&self.secrets).retain(|(n, name), secret| {
            *n != ns
                || *name != user_data_secret_name(vm_name)
                || !user_data_is_ours(
                    secret.labels(),
                    autonodes_api::DEFAULT_INSTALLATION,
                    vm_name,
                    claim_uid,
                )
        });
        Ok(())
    }

    async fn delete_data_volumes(&self, ns: &str, uid: &str) -> Result<(), Error> {
        self.check("delete_data_volumes")?;
        lock(&self.data_volumes)
            .retain(|(n, _), labels| n != ns || !labelled_for_claim(labels, uid));
        Ok(())
    }

    async fn ensure_golden_volume(&self, g: &GoldenVolume, provider: &str) -> Result<(), Error> {
        self.check("ensure_golden_volume")?;
        let mut golden = lock(&self.golden);
        let entry = (provider.to_string(), g.name.clone());
        if !golden.contains(&entry) {
            golden.push(entry);
        }
        Ok(())
    }
}

/// A tenant cluster in memory.
pub(crate) struct MemoryTenant {
    remote: Remote,
    failures: Failures,
    /// What the tenant publishes for joins, and its version.
    pub join: Mutex<JoinInfo>,
    /// Nodes by name.
    pub nodes: Mutex<BTreeMap<String, Node>>,
    /// Pods by namespace and name.
    pub pods: Mutex<BTreeMap<Key, Pod>>,
    /// Pods whose eviction a PodDisruptionBudget refuses (they stay).
    pub protected: Mutex<Vec<Key>>,
    /// Bootstrap-token Secrets by name.
    pub tokens: Mutex<BTreeMap<String, Secret>>,
}

/// The CA of the tenant's kubeconfig (the core's test CA).
const TENANT_CA: &[u8] = include_bytes!("../../../autonodes-core/src/kubeconfig/testdata/ca.pem");

impl MemoryTenant {
    /// The tenant `namespace/vcluster` on Kubernetes `version`, reached at `server`.
    pub(crate) fn new(namespace: &str, vcluster: &str, version: &str) -> Self {
        MemoryTenant {
            remote: Remote {
                key: ClusterKey::Tenant {
                    namespace: namespace.into(),
                    vcluster: vcluster.into(),
                },
                client: crate::remote::clients::unreachable_client(),
                server: "https://tenant.example:443".into(),
                ca_pem: Some(TENANT_CA.to_vec()),
                via: None,
                cache: RemoteCache::None,
            },
            failures: Failures::default(),
            join: Mutex::new(JoinInfo {
                published: Published::default(),
                version: KubeVersion::parse(version),
            }),
            nodes: Default::default(),
            pods: Default::default(),
            protected: Default::default(),
            tokens: Default::default(),
        }
    }

    /// The next call `call` fails with `f`.
    pub(crate) fn fail_next(&self, call: &'static str, f: Failure) {
        self.failures.push(call, f);
    }

    fn check(&self, call: &'static str) -> Result<(), Error> {
        match self.failures.take(call) {
            Some(f) => Err(remote_error(&self.remote.key, call, f)),
            None => Ok(()),
        }
    }
}

impl TenantApi for MemoryTenant {
    fn remote(&self) -> &Remote {
        &self.remote
    }

    async fn join_info(&self) -> Result<JoinInfo, Error> {
        self.check("join_info")?;
        Ok(lock(&self.join).clone())
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, Error> {
        self.check("node")?;
        Ok(lock(&self.nodes).get(name).cloned().map(Arc::new))
    }

    async fn patch_node(
        &self,
        node: &Node,
        patch: json_patch::Patch,
        what: &str,
    ) -> Result<Node, Error> {
        self.check("patch_node")?;
        let mut nodes = lock(&self.nodes);
        let name = node.name_any();
        let current = nodes
            .get(&name)
            .ok_or_else(|| remote_error(&self.remote.key, what, Failure::Status(404)))?;
        let mut doc = serde_json::to_value(current).map_err(|e| Error::Internal(e.to_string()))?;
        // A failed test of the patch is the API server's 422.
        json_patch::patch(&mut doc, &patch)
            .map_err(|_| remote_error(&self.remote.key, what, Failure::Status(422)))?;
        let patched: Node =
            serde_json::from_value(doc).map_err(|e| Error::Internal(e.to_string()))?;
        nodes.insert(name, patched.clone());
        Ok(patched)
    }

    async fn uncordon(&self, name: &str) -> Result<(), Error> {
        self.check("uncordon")?;
        if let Some(n) = lock(&self.nodes).get_mut(name) {
            n.spec.get_or_insert_with(Default::default).unschedulable = None;
        }
        Ok(())
    }

    async fn cordon(&self, name: &str) -> Result<(), Error> {
        self.check("cordon")?;
        if let Some(n) = lock(&self.nodes).get_mut(name) {
            n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
        }
        Ok(())
    }

    async fn delete_node(&self, name: &str) -> Result<bool, Error> {
        self.check("delete_node")?;
        Ok(lock(&self.nodes).remove(name).is_some())
    }

    async fn pods_on(&self, name: &str) -> Result<Vec<Pod>, Error> {
        self.check("pods_on")?;
        Ok(lock(&self.pods)
            .values()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
            .cloned()
            .collect())
    }

    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        self.check("evict")?;
        let k = key(&pod.namespace().unwrap_or_default(), &pod.name_any());
        if !lock(&self.protected).contains(&k) {
            lock(&self.pods).remove(&k);
        }
        Ok(())
    }

    async fn tokens(&self, uid: &str) -> Result<Vec<Arc<Secret>>, Error> {
        self.check("tokens")?;
        Ok(lock(&self.tokens)
            .values()
            .filter(|s| labelled_for_claim(s.labels(), uid))
            .cloned()
            .map(Arc::new)
            .collect())
    }

    async fn create_token(&self, secret: &Secret) -> Result<(), Error> {
        self.check("create_token")?;
        let mut tokens = lock(&self.tokens);
        let name = secret.name_any();
        if tokens.contains_key(&name) {
            return Err(remote_error(
                &self.remote.key,
                "create_token",
                Failure::Status(409),
            ));
        }
        tokens.insert(name, secret.clone());
        Ok(())
    }

    async fn delete_token(&self, secret: &Secret, what: &str) -> Result<(), Error> {
        if let Some(f) = self.failures.take("delete_token") {
            return Err(remote_error(&self.remote.key, what, f));
        }
        lock(&self.tokens).remove(&secret.name_any());
        Ok(())
    }
}
