//! The host interface: what the claim lifecycle asks of a KubeVirt host cluster. Reads come
//! from the host's watch caches while they are live ([`super::caches`]), else from the API
//! server; every call is bounded in time and counted ([`crate::remote::calls::remote_call`]); what
//! this process creates is remembered until the watch shows it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::ResourceExt;

use crate::remote::calls::{claim_selector, get_opt, read, remote_call, Caller};
use crate::remote::clients::Remote;
use crate::remote::error::Error;
use autonodes_api::kubevirt::{self, ObservedVm, ObservedVmi};
use autonodes_api::{LABEL_MANAGED_BY, LABEL_NODECLAIM_UID, MANAGED_BY};
use autonodes_core::template::golden::{self, GoldenVolume};

/// Background deletion of an object, of the one with `uid` only when given (one made again
/// under the same name meanwhile is left alone).
pub(crate) fn delete_this(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    }
}

/// What creating a VirtualMachine found.
pub(crate) enum VmCreate {
    /// The VM was created now.
    Created(Arc<ObservedVm>),
    /// The VM existed already (an earlier attempt created it).
    Existed(Arc<ObservedVm>),
    /// The VM existed when created and was gone when read: look again shortly.
    Vanished,
    /// A VM of that name exists and belongs to another claim (its claim-UID label differs):
    /// it is left alone.
    Taken,
}

/// Whether two label sets name the same claim: both carry the claim-UID label, equal.
fn same_claim(
    a: &std::collections::BTreeMap<String, String>,
    b: &std::collections::BTreeMap<String, String>,
) -> bool {
    b.get(LABEL_NODECLAIM_UID)
        .is_some_and(|uid| autonodes_core::template::names::labelled_for_claim(a, uid))
}

/// A KubeVirt host cluster.
pub(crate) struct Host<'a> {
    caller: Caller<'a>,
    remote: &'a Remote,
}

impl<'a> Host<'a> {
    /// The host behind `remote`.
    pub(crate) fn new(caller: Caller<'a>, remote: &'a Remote) -> Self {
        Host { caller, remote }
    }

    /// Who calls, and the cluster this host talks through.
    pub(crate) fn parts(&self) -> (Caller<'a>, &'a Remote) {
        (self.caller, self.remote)
    }

    /// VirtualMachines to write.
    fn vms(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::virtual_machine())
    }

    /// VirtualMachines to read.
    fn observed_vms(&self, ns: &str) -> Api<ObservedVm> {
        Api::namespaced(self.remote.client.clone(), ns)
    }

    fn secrets(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.remote.client.clone(), ns)
    }

    /// The VirtualMachine `ns/name`, if it exists.
    pub(crate) async fn vm(&self, ns: &str, name: &str) -> Result<Option<Arc<ObservedVm>>, Error> {
        let cache = self.remote.host_cache().map(|c| &c.vms);
        let what = "reading the VirtualMachine";
        read(
            self.caller.requests,
            self.remote,
            cache,
            &self.observed_vms(ns),
            Some(ns),
            name,
            what,
        )
        .await
    }

    /// The VirtualMachineInstance `ns/name`, if it exists.
    pub(crate) async fn vmi(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<ObservedVmi>>, Error> {
        let cache = self.remote.host_cache().map(|c| &c.vmis);
        let api = Api::<ObservedVmi>::namespaced(self.remote.client.clone(), ns);
        let what = "reading the VirtualMachineInstance";
        read(
            self.caller.requests,
            self.remote,
            cache,
            &api,
            Some(ns),
            name,
            what,
        )
        .await
    }

    /// Creates a user-data Secret. One that exists already is an earlier attempt's: it is
    /// kept (with the token it carries), unless `rewrite` says that token was re-minted
    /// since — then the Secret is replaced, so the VM boots with a token that still works.
    /// A Secret of the same name labelled with another claim's UID is never touched or
    /// used: the answer is `false` then.
    pub(crate) async fn create_user_data(
        &self,
        ns: &str,
        secret: &Secret,
        rewrite: bool,
    ) -> Result<bool, Error> {
        let api = self.secrets(ns);
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating the user-data Secret",
            api.create(&PostParams::default(), secret),
        )
        .await;
        match created {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() => {
                let name = secret.name_any();
                let existing = remote_call(
                    self.caller.requests,
                    self.remote,
                    "reading the user-data Secret",
                    api.get_opt(&name),
                )
                .await?;
                let Some(existing) = existing else {
                    return Err(Error::Waiting(format!(
                        "user-data Secret {ns}/{name} went while it was rewritten"
                    )));
                };
                if !same_claim(existing.labels(), secret.labels()) {
                    return Ok(false);
                }
                if !rewrite {
                    return Ok(true);
                }
                let mut replacement = secret.clone();
                replacement.metadata.resource_version = existing.metadata.resource_version;
                remote_call(
                    self.caller.requests,
                    self.remote,
                    "rewriting the user-data Secret with a re-minted token",
                    api.replace(&name, &PostParams::default(), &replacement),
                )
                .await?;
                tracing::info!(secret = %format!("{ns}/{name}"), cluster = %self.remote.key, "user-data Secret rewritten: its bootstrap token was re-minted");
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a VirtualMachine, or reads the one an earlier attempt created.
    pub(crate) async fn create_vm(&self, ns: &str, vm: &DynamicObject) -> Result<VmCreate, Error> {
        let api = self.vms(ns);
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating the VirtualMachine",
            api.create(&PostParams::default(), vm),
        )
        .await;
        match created {
            Ok(vm) => {
                let vm = ObservedVm::from_object(&vm);
                if let Some(cache) = self.remote.host_cache() {
                    cache.vms.wrote(vm.clone());
                }
                Ok(VmCreate::Created(Arc::new(vm)))
            }
            Err(e) if e.is_conflict() => {
                let name = vm.name_any();
                let found = get_opt(
                    self.caller.requests,
                    self.remote,
                    &self.observed_vms(ns),
                    &name,
                    "reading the VirtualMachine",
                )
                .await?;
                Ok(match found {
                    None => VmCreate::Vanished,
                    Some(found) if !same_claim(found.labels(), vm.labels()) => VmCreate::Taken,
                    Some(found) => VmCreate::Existed(Arc::new(found)),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the VirtualMachine `ns/name` whose UID is `uid` (in the background: its VMI
    /// goes with it). The UID is a precondition: a VM made since under the same name (by
    /// another claim or installation) is not deleted.
    pub(crate) async fn delete_vm(
        &self,
        ns: &str,
        name: &str,
        uid: Option<String>,
    ) -> Result<(), Error> {
        let params = delete_this(uid);
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            "deleting the VirtualMachine",
            self.vms(ns).delete(name, &params),
        )
        .await;
        if let (Ok(answer), Some(cache)) = (&deleted, self.remote.host_cache()) {
            // Still there (KubeVirt's finalizer holds it), now marked deleted: the next
            // reconcile reads that, not the cache's copy from before, which would drain and
            // delete again.
            if let Some(vm) = answer.as_ref().left() {
                cache.vms.wrote(ObservedVm::from_object(vm));
            }
        }
        ignore_not_found(deleted)
    }

    /// Restarts the VM `ns/name` as `virtctl restart` does: deletes its
    /// VirtualMachineInstance (only the one with `uid`, when given), and KubeVirt starts a
    /// new one (the VM's `runStrategy` is `Always`). Gone already: nothing to do.
    pub(crate) async fn delete_vmi(
        &self,
        ns: &str,
        name: &str,
        uid: Option<String>,
    ) -> Result<(), Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.remote.client.clone(),
            ns,
            &kubevirt::virtual_machine_instance(),
        );
        let params = delete_this(uid);
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            "deleting the VirtualMachineInstance",
            api.delete(name, &params),
        )
        .await;
        ignore_not_found(deleted)
    }

    /// Makes sure the host namespace `name` exists for the VMs of tenant namespace `tenant`:
    /// with `create`, creates it labelled as this installation's (`labels`) unless it exists;
    /// without, only looks. False when it does not exist (and was not to be created).
    pub(crate) async fn ensure_namespace(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
        create: bool,
    ) -> Result<bool, Error> {
        use k8s_openapi::api::core::v1::Namespace;
        let api: Api<Namespace> = Api::all(self.remote.client.clone());
        if !create {
            let found = get_opt(
                self.caller.requests,
                self.remote,
                &api,
                name,
                "reading the VM namespace",
            )
            .await?;
            return Ok(found.is_some());
        }
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.to_string());
        ns.metadata.labels = Some(labels.clone());
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating the VM namespace",
            api.create(&PostParams::default(), &ns),
        )
        .await;
        match created {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Whether the host node `name` is cordoned, as the host's Node watch shows it; false
    /// when the watch is not live (autonodes may not watch the host's Nodes) or has no
    /// such node.
    pub(crate) fn host_node_cordoned(&self, name: &str) -> bool {
        self.remote
            .host_cache()
            .and_then(|c| c.nodes.get(None, name))
            .flatten()
            .is_some_and(|n| crate::remote::watches::node_cordoned(&n))
    }

    /// Asks KubeVirt to live-migrate the instance of VM `vm` (a
    /// VirtualMachineInstanceMigration `name`, owned by the VM of `vm_uid`, so it goes with
    /// the VM, and carrying `labels`). One of that name that exists and has finished (an
    /// earlier maintenance's) is deleted, to be created again at the next reconcile.
    pub(crate) async fn migrate(
        &self,
        ns: &str,
        vm: &str,
        vm_uid: &str,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let api = self.migrations(ns);
        let body: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "name": vm, "uid": vm_uid,
                }],
            },
            "spec": {"vmiName": vm},
        }))
        .map_err(|e| Error::Internal(format!("migration {ns}/{name}: {e}")))?;
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating the VirtualMachineInstanceMigration",
            api.create(&PostParams::default(), &body),
        )
        .await;
        match created {
            Ok(_) => Ok(()),
            Err(e) if e.status_code() == Some(409) => {
                let existing = get_opt(
                    self.caller.requests,
                    self.remote,
                    &api,
                    name,
                    "reading the VirtualMachineInstanceMigration",
                )
                .await?;
                let finished = existing.as_ref().is_some_and(|m| {
                    matches!(
                        m.data.pointer("/status/phase").and_then(|p| p.as_str()),
                        Some("Succeeded" | "Failed")
                    )
                });
                if finished {
                    self.delete_migration(ns, name).await?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the VirtualMachineInstanceMigration `ns/name`; gone already is no error.
    pub(crate) async fn delete_migration(&self, ns: &str, name: &str) -> Result<(), Error> {
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            "deleting the VirtualMachineInstanceMigration",
            self.migrations(ns)
                .delete(name, &DeleteParams::background()),
        )
        .await;
        ignore_not_found(deleted)
    }

    /// VirtualMachineInstanceMigrations to write.
    fn migrations(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.remote.client.clone(),
            ns,
            &kubevirt::virtual_machine_instance_migration(),
        )
    }

    /// Sets the `runStrategy` of the VM `ns/name`: `Halted` stops it (it keeps its disks and
    /// labels, and KubeVirt removes its instance), `Always` starts it again. Gone already:
    /// nothing to do.
    pub(crate) async fn set_run_strategy(
        &self,
        ns: &str,
        name: &str,
        strategy: &str,
    ) -> Result<(), Error> {
        // `running` goes: KubeVirt refuses a VM that sets it beside `runStrategy`.
        let patch = serde_json::json!({"spec": {"runStrategy": strategy, "running": null}});
        let what = format!("setting the VirtualMachine's runStrategy to {strategy}");
        let halted = remote_call(
            self.caller.requests,
            self.remote,
            &what,
            self.vms(ns).patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            ),
        )
        .await;
        if let (Ok(vm), Some(cache)) = (&halted, self.remote.host_cache()) {
            cache.vms.wrote(ObservedVm::from_object(vm));
        }
        ignore_not_found(halted)
    }

    /// Deletes the user-data Secret of VM `vm_name`, by its name: the VM's name is a
    /// function of the claim ([`autonodes_core::template::names::vm_name_for_claim`]),
    /// written to the claim's status before anything is created, so every attempt used that
    /// one name. The Secret is read first and deleted (only that one, by its UID) when its
    /// labels say it is this installation's, for the claim with `claim_uid` or for the warm
    /// VM `vm_name` ([`autonodes_core::template::names::user_data_is_ours`]); a Secret of
    /// that name that is someone else's is left alone. A Secret labelled with the claim
    /// under another name is the orphan sweep's once the claim is gone.
    pub(crate) async fn delete_user_data(
        &self,
        ns: &str,
        vm_name: &str,
        claim_uid: Option<&str>,
    ) -> Result<(), Error> {
        let name = autonodes_core::template::names::user_data_secret_name(vm_name);
        let api = self.secrets(ns);
        let found = remote_call(
            self.caller.requests,
            self.remote,
            "reading the user-data Secret",
            api.get_metadata_opt(&name),
        )
        .await?;
        let Some(found) = found else {
            return Ok(());
        };
        let installation = &self.caller.installation;
        if !autonodes_core::template::names::user_data_is_ours(
            found.labels(),
            installation,
            vm_name,
            claim_uid,
        ) {
            tracing::warn!(secret = %format!("{ns}/{name}"), cluster = %self.remote.key, "a user-data Secret of this name is not this claim's or this installation's: left alone");
            return Ok(());
        }
        ignore_not_found(
            remote_call(
                self.caller.requests,
                self.remote,
                "deleting the user-data Secret",
                api.delete(&name, &delete_this(found.metadata.uid.clone())),
            )
            .await,
        )
    }

    /// Deletes the DataVolumes the claim's UID labels (a host without CDI has none): from
    /// the host's DataVolume cache while its watch is live, else listed from the API
    /// server's watch cache.
    pub(crate) async fn delete_data_volumes(&self, ns: &str, uid: &str) -> Result<(), Error> {
        let dvs: Api<DynamicObject> =
            Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::data_volume());
        let ours = |dv: &kubevirt::ObservedDataVolume| {
            dv.metadata.namespace.as_deref() == Some(ns)
                && autonodes_core::template::names::labelled_for_claim(dv.labels(), uid)
        };
        let cached = self
            .remote
            .host_cache()
            .and_then(|c| c.data_volumes.filter(ours));
        let names: Vec<String> = match cached {
            Some(found) => found.iter().map(|dv| dv.name_any()).collect(),
            None => match remote_call(
                self.caller.requests,
                self.remote,
                "listing DataVolumes",
                dvs.list_metadata(&by_claim(uid)),
            )
            .await
            {
                Ok(list) => list.items.iter().map(|dv| dv.name_any()).collect(),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        self.delete_each(&dvs, names.into_iter(), "deleting a DataVolume")
            .await
    }

    /// DataVolumes to write.
    fn data_volumes(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::data_volume())
    }

    /// Makes sure the golden volume `g` of `provider` exists: created (labelled
    /// `managed-by` and with the provider) unless the DataVolume cache shows it; one that
    /// exists already is kept (a golden volume is never rewritten).
    pub(crate) async fn ensure_golden_volume(
        &self,
        g: &GoldenVolume,
        provider: &str,
    ) -> Result<(), Error> {
        let cached = self
            .remote
            .host_cache()
            .and_then(|c| c.data_volumes.get(Some(&g.namespace), &g.name));
        if matches!(cached, Some(Some(_))) {
            return Ok(());
        }
        let body: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {
                "name": g.name,
                "namespace": g.namespace,
                "labels": {
                    LABEL_MANAGED_BY: MANAGED_BY,
                    golden::LABEL_GOLDEN_IMAGE: autonodes_core::names::label_value(provider),
                },
            },
            "spec": g.spec,
        }))
        .map_err(|e| Error::Internal(format!("the golden DataVolume {}: {e}", g.name)))?;
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating a golden DataVolume",
            self.data_volumes(&g.namespace)
                .create(&PostParams::default(), &body),
        )
        .await;
        match created {
            Ok(dv) => {
                if let Some(cache) = self.remote.host_cache() {
                    cache
                        .data_volumes
                        .wrote(kubevirt::ObservedDataVolume::from_object(&dv));
                }
                Ok(())
            }
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The golden volumes of `provider` on this host, as `(namespace, name)`: from the
    /// DataVolume cache while its watch is live, else listed by label.
    pub(crate) async fn golden_volumes(
        &self,
        provider: &str,
    ) -> Result<Vec<(String, String)>, Error> {
        let label = autonodes_core::names::label_value(provider);
        let ours = |dv: &kubevirt::ObservedDataVolume| {
            dv.labels().get(golden::LABEL_GOLDEN_IMAGE) == Some(&label)
        };
        let key =
            |dv: &kubevirt::ObservedDataVolume| (dv.namespace().unwrap_or_default(), dv.name_any());
        if let Some(found) = self
            .remote
            .host_cache()
            .and_then(|c| c.data_volumes.filter(ours))
        {
            return Ok(found.iter().map(|dv| key(dv)).collect());
        }
        let all: Api<kubevirt::ObservedDataVolume> = Api::all(self.remote.client.clone());
        let selector = format!("{}={label}", golden::LABEL_GOLDEN_IMAGE);
        match remote_call(
            self.caller.requests,
            self.remote,
            "listing golden DataVolumes",
            all.list(&ListParams::default().labels(&selector)),
        )
        .await
        {
            Ok(list) => Ok(list.items.iter().map(key).collect()),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the DataVolume `ns/name` (one already gone is done).
    pub(crate) async fn delete_data_volume(&self, ns: &str, name: &str) -> Result<(), Error> {
        self.delete_each(
            &self.data_volumes(ns),
            std::iter::once(name.to_string()),
            "deleting a golden DataVolume",
        )
        .await
    }

    /// Deletes the objects `names` of `api`, one at a time (those already gone are done).
    async fn delete_each<K>(
        &self,
        api: &Api<K>,
        names: impl Iterator<Item = String>,
        what: &str,
    ) -> Result<(), Error>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for name in names {
            ignore_not_found(
                remote_call(
                    self.caller.requests,
                    self.remote,
                    what,
                    api.delete(&name, &DeleteParams::default()),
                )
                .await,
            )?;
        }
        Ok(())
    }
}

/// Objects autonodes made for the claim with `uid`, from the API server's watch cache.
fn by_claim(uid: &str) -> ListParams {
    ListParams::default()
        .labels(&claim_selector(uid))
        .match_any()
}

/// A delete that found nothing to delete is done.
pub(crate) fn ignore_not_found<T>(result: Result<T, Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
