//! What the claim lifecycle asks of a host and of a tenant cluster, as traits: [`HostApi`]
//! and [`TenantApi`]. The real clusters answer through [`Host`] and [`Tenant`] (watch
//! caches, bounded calls, metrics); the lifecycle's unit tests answer from memory
//! (`remote::memory`, built for unit tests only), with the same errors a cluster gives (409, 404,
//! timeouts, an object that vanishes).

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::DynamicObject;

use super::clients::Remote;
use super::host::{Host, VmCreate};
use super::tenant::Tenant;
use super::warm_host::WarmHost;
use crate::remote::error::Error;
use autonodes_api::kubevirt::{ObservedVm, ObservedVmi};
use autonodes_core::join::JoinInfo;
use autonodes_core::template::golden::GoldenVolume;

/// The calls the claim lifecycle makes on a KubeVirt host cluster.
pub(crate) trait HostApi: Send + Sync {
    /// The VirtualMachine `ns/name`, if it exists.
    fn vm(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<ObservedVm>>, Error>> + Send;

    /// The VirtualMachineInstance `ns/name`, if it exists.
    fn vmi(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<ObservedVmi>>, Error>> + Send;

    /// Creates the user-data Secret; an existing one of the same claim is kept, or
    /// rewritten when `rewrite`. False when a Secret of that name belongs to another claim.
    fn create_user_data(
        &self,
        ns: &str,
        secret: &Secret,
        rewrite: bool,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Creates the VirtualMachine (see [`VmCreate`] for what it may find).
    fn create_vm(
        &self,
        ns: &str,
        vm: &DynamicObject,
    ) -> impl Future<Output = Result<VmCreate, Error>> + Send;

    /// Deletes the VirtualMachine `ns/name` (only the one with `uid`, when given).
    fn delete_vm(
        &self,
        ns: &str,
        name: &str,
        uid: Option<String>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Restarts the VM `ns/name` by deleting its VirtualMachineInstance (only the one with
    /// `uid`, when given); KubeVirt starts a new one.
    fn delete_vmi(
        &self,
        ns: &str,
        name: &str,
        uid: Option<String>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Halts the VM `ns/name` (`runStrategy: Halted`), keeping it and its disks.
    fn halt_vm(&self, ns: &str, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Makes sure the host namespace `name` exists (creating it with `labels` when `create`);
    /// false when it does not.
    fn ensure_namespace(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        create: bool,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Starts the VM `ns/name` again (`runStrategy: Always`) after [`HostApi::halt_vm`].
    fn start_vm(&self, ns: &str, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Whether the host node `name` is cordoned (false when that cannot be known).
    fn host_node_cordoned(&self, name: &str) -> bool;

    /// Asks KubeVirt to live-migrate the instance of VM `vm` (with UID `vm_uid`) with a
    /// migration named `name` carrying `labels`.
    fn migrate(
        &self,
        ns: &str,
        vm: &str,
        vm_uid: &str,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the migration `ns/name`, if it exists.
    fn delete_migration(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the user-data Secret of VM `vm_name`, if it exists and is this
    /// installation's, for the claim with `claim_uid` or for the warm VM `vm_name`.
    fn delete_user_data(
        &self,
        ns: &str,
        vm_name: &str,
        claim_uid: Option<&str>,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the DataVolumes of the claim `uid` left after its VM.
    fn delete_data_volumes(
        &self,
        ns: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Makes sure the golden volume `g` of `provider` exists.
    fn ensure_golden_volume(
        &self,
        g: &GoldenVolume,
        provider: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The host's warm VMs, when it has them (the lifecycle's memory host has none).
    fn warm(&self) -> Option<WarmHost<'_>> {
        None
    }

    /// Deletes the binding and credential of the warm VM `vm` (nothing on a host without
    /// warm VMs).
    fn release_warm(&self, ns: &str, vm: &str) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            match self.warm() {
                Some(w) => w.delete_credential(ns, vm).await,
                None => Ok(()),
            }
        }
    }
}

/// The calls the claim lifecycle makes on a tenant cluster.
pub(crate) trait TenantApi: Send + Sync {
    /// The tenant's client and what its kubeconfig says (server, CA), for the join.
    fn remote(&self) -> &Remote;

    /// Where the tenant says nodes join, and its version.
    fn join_info(&self) -> impl Future<Output = Result<JoinInfo, Error>> + Send;

    /// The Node `name`, if it exists.
    fn node(&self, name: &str) -> impl Future<Output = Result<Option<Arc<Node>>, Error>> + Send;

    /// Applies the JSON `patch` to `node` (its tests make it conditional); `what` names the
    /// step in errors. Returns the Node as patched.
    fn patch_node(
        &self,
        node: &Node,
        patch: json_patch::Patch,
        what: &str,
    ) -> impl Future<Output = Result<Node, Error>> + Send;

    /// Marks the Node `name` unschedulable.
    fn cordon(&self, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Marks the Node `name` schedulable again.
    fn uncordon(&self, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes the Node `name`; false when it was gone already.
    fn delete_node(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The pods bound to the Node `name`.
    fn pods_on(&self, name: &str) -> impl Future<Output = Result<Vec<Pod>, Error>> + Send;

    /// Evicts `pod` (an eviction a PodDisruptionBudget refuses is no error).
    fn evict(&self, pod: &Pod) -> impl Future<Output = Result<(), Error>> + Send;

    /// The bootstrap-token Secrets of the claim `uid`.
    fn tokens(&self, uid: &str) -> impl Future<Output = Result<Vec<Arc<Secret>>, Error>> + Send;

    /// Creates a bootstrap-token Secret.
    fn create_token(&self, secret: &Secret) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes a bootstrap-token Secret (`what` names the step in errors).
    fn delete_token(
        &self,
        secret: &Secret,
        what: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

impl HostApi for Host<'_> {
    async fn vm(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVm>>, Error> {
        Host::vm(self, ns, name).await
    }

    async fn vmi(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVmi>>, Error> {
        Host::vmi(self, ns, name).await
    }

    async fn create_user_data(
        &self,
        ns: &str,
        secret: &Secret,
        rewrite: bool,
    ) -> Result<bool, Error> {
        Host::create_user_data(self, ns, secret, rewrite).await
    }

    async fn create_vm(&self, ns: &str, vm: &DynamicObject) -> Result<VmCreate, Error> {
        Host::create_vm(self, ns, vm).await
    }

    async fn delete_vm(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        Host::delete_vm(self, ns, name, uid).await
    }

    async fn delete_vmi(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        Host::delete_vmi(self, ns, name, uid).await
    }

    async fn halt_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        Host::set_run_strategy(self, ns, name, "Halted").await
    }

    async fn start_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        Host::set_run_strategy(self, ns, name, "Always").await
    }

    async fn ensure_namespace(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        create: bool,
    ) -> Result<bool, Error> {
        Host::ensure_namespace(self, name, labels, create).await
    }

    fn host_node_cordoned(&self, name: &str) -> bool {
        Host::host_node_cordoned(self, name)
    }

    async fn migrate(
        &self,
        ns: &str,
        vm: &str,
        vm_uid: &str,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Error> {
        Host::migrate(self, ns, vm, vm_uid, name, labels).await
    }

    async fn delete_migration(&self, ns: &str, name: &str) -> Result<(), Error> {
        Host::delete_migration(self, ns, name).await
    }

    async fn delete_user_data(
        &self,
        ns: &str,
        vm_name: &str,
        claim_uid: Option<&str>,
    ) -> Result<(), Error> {
        Host::delete_user_data(self, ns, vm_name, claim_uid).await
    }

    async fn delete_data_volumes(&self, ns: &str, uid: &str) -> Result<(), Error> {
        Host::delete_data_volumes(self, ns, uid).await
    }

    async fn ensure_golden_volume(&self, g: &GoldenVolume, provider: &str) -> Result<(), Error> {
        Host::ensure_golden_volume(self, g, provider).await
    }

    fn warm(&self) -> Option<WarmHost<'_>> {
        let (ctx, remote) = self.parts();
        Some(WarmHost::new(ctx, remote))
    }
}

impl TenantApi for Tenant<'_> {
    fn remote(&self) -> &Remote {
        Tenant::remote(self)
    }

    async fn join_info(&self) -> Result<JoinInfo, Error> {
        Tenant::join_info(self).await
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, Error> {
        Tenant::node(self, name).await
    }

    async fn patch_node(
        &self,
        node: &Node,
        patch: json_patch::Patch,
        what: &str,
    ) -> Result<Node, Error> {
        Tenant::patch_node(self, node, patch, what).await
    }

    async fn cordon(&self, name: &str) -> Result<(), Error> {
        Tenant::cordon(self, name).await
    }

    async fn uncordon(&self, name: &str) -> Result<(), Error> {
        Tenant::uncordon(self, name).await
    }

    async fn delete_node(&self, name: &str) -> Result<bool, Error> {
        Tenant::delete_node(self, name).await
    }

    async fn pods_on(&self, name: &str) -> Result<Vec<Pod>, Error> {
        Tenant::pods_on(self, name).await
    }

    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        Tenant::evict(self, pod).await
    }

    async fn tokens(&self, uid: &str) -> Result<Vec<Arc<Secret>>, Error> {
        Tenant::tokens(self, uid).await
    }

    async fn create_token(&self, secret: &Secret) -> Result<(), Error> {
        Tenant::create_token(self, secret).await
    }

    async fn delete_token(&self, secret: &Secret, what: &str) -> Result<(), Error> {
        Tenant::delete_token(self, secret, what).await
    }
}

impl<H: HostApi> HostApi for &H {
    async fn vm(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVm>>, Error> {
        (**self).vm(ns, name).await
    }

    async fn vmi(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVmi>>, Error> {
        (**self).vmi(ns, name).await
    }

    async fn create_user_data(
        &self,
        ns: &str,
        secret: &Secret,
        rewrite: bool,
    ) -> Result<bool, Error> {
        (**self).create_user_data(ns, secret, rewrite).await
    }

    async fn create_vm(&self, ns: &str, vm: &DynamicObject) -> Result<VmCreate, Error> {
        (**self).create_vm(ns, vm).await
    }

    async fn delete_vm(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        (**self).delete_vm(ns, name, uid).await
    }

    async fn delete_vmi(&self, ns: &str, name: &str, uid: Option<String>) -> Result<(), Error> {
        (**self).delete_vmi(ns, name, uid).await
    }

    async fn halt_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        (**self).halt_vm(ns, name).await
    }

    async fn start_vm(&self, ns: &str, name: &str) -> Result<(), Error> {
        (**self).start_vm(ns, name).await
    }

    async fn ensure_namespace(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        create: bool,
    ) -> Result<bool, Error> {
        (**self).ensure_namespace(name, labels, create).await
    }

    fn host_node_cordoned(&self, name: &str) -> bool {
        (**self).host_node_cordoned(name)
    }

    async fn migrate(
        &self,
        ns: &str,
        vm: &str,
        vm_uid: &str,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Error> {
        (**self).migrate(ns, vm, vm_uid, name, labels).await
    }

    async fn delete_migration(&self, ns: &str, name: &str) -> Result<(), Error> {
        (**self).delete_migration(ns, name).await
    }

    async fn delete_user_data(
        &self,
        ns: &str,
        vm_name: &str,
        claim_uid: Option<&str>,
    ) -> Result<(), Error> {
        (**self).delete_user_data(ns, vm_name, claim_uid).await
    }

    async fn delete_data_volumes(&self, ns: &str, uid: &str) -> Result<(), Error> {
        (**self).delete_data_volumes(ns, uid).await
    }

    async fn ensure_golden_volume(&self, g: &GoldenVolume, provider: &str) -> Result<(), Error> {
        (**self).ensure_golden_volume(g, provider).await
    }
}

impl<T: TenantApi> TenantApi for &T {
    fn remote(&self) -> &Remote {
        (**self).remote()
    }

    async fn join_info(&self) -> Result<JoinInfo, Error> {
        (**self).join_info().await
    }

    async fn node(&self, name: &str) -> Result<Option<Arc<Node>>, Error> {
        (**self).node(name).await
    }

    async fn patch_node(
        &self,
        node: &Node,
        patch: json_patch::Patch,
        what: &str,
    ) -> Result<Node, Error> {
        (**self).patch_node(node, patch, what).await
    }

    async fn cordon(&self, name: &str) -> Result<(), Error> {
        (**self).cordon(name).await
    }

    async fn uncordon(&self, name: &str) -> Result<(), Error> {
        (**self).uncordon(name).await
    }

    async fn delete_node(&self, name: &str) -> Result<bool, Error> {
        (**self).delete_node(name).await
    }

    async fn pods_on(&self, name: &str) -> Result<Vec<Pod>, Error> {
        (**self).pods_on(name).await
    }

    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        (**self).evict(pod).await
    }

    async fn tokens(&self, uid: &str) -> Result<Vec<Arc<Secret>>, Error> {
        (**self).tokens(uid).await
    }

    async fn create_token(&self, secret: &Secret) -> Result<(), Error> {
        (**self).create_token(secret).await
    }

    async fn delete_token(&self, secret: &Secret, what: &str) -> Result<(), Error> {
        (**self).delete_token(secret, what).await
    }
}
