//! What warm VMs need of a host cluster: each warm VM's own credential (ServiceAccount,
//! Role, RoleBinding, heartbeat Lease, token), its heartbeat, its binding Secret, taking a
//! warm VM for a claim, and removing all of it. Every call is bounded and counted
//! ([`remote_call`]); objects already there (create) or gone (delete) are fine.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::ResourceExt;

use crate::remote::calls::{remote_call, Caller};
use crate::remote::clients::Remote;
use crate::remote::error::Error;
use crate::remote::host::ignore_not_found;
use autonodes_api::kubevirt::{self, ObservedVm};
use autonodes_api::{
    ANNOTATION_WARM_LEASE_UID, LABEL_INSTALLATION, LABEL_WARM_NODETYPE, LABEL_WARM_VM,
};
use autonodes_core::warm;

/// A warm VM's credential: its token and when the host says it expires.
pub(crate) struct Credential {
    /// The ServiceAccount token (never logged).
    pub token: String,
    /// When it expires.
    pub expires: Timestamp,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// A namespaced object of the host that is read and deleted for a warm VM.
trait HostObject:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> HostObject for K where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

/// A host cluster, for warm VMs.
pub(crate) struct WarmHost<'a> {
    caller: Caller<'a>,
    remote: &'a Remote,
}

fn meta(name: &str, ns: &str, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    }
}

/// A create that found the object there already is done.
fn ignore_exists<T>(result: Result<T, Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

impl<'a> WarmHost<'a> {
    /// The host behind `remote`.
    pub(crate) fn new(caller: Caller<'a>, remote: &'a Remote) -> Self {
        WarmHost { caller, remote }
    }

    /// The same host, for the calls warm VMs share with claims' VMs.
    pub(crate) fn host(&self) -> crate::remote::host::Host<'a> {
        crate::remote::host::Host::new(self.caller, self.remote)
    }

    fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.remote.client.clone(), ns)
    }

    /// Creates `obj` with `api` (one there already is kept).
    async fn create_kept<K>(&self, api: Api<K>, obj: &K, what: &str) -> Result<(), Error>
    where
        K: Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        ignore_exists(
            remote_call(
                self.caller.requests,
                self.remote,
                what,
                api.create(&PostParams::default(), obj),
            )
            .await,
        )
    }

    /// Deletes `name` with `api`, in the background (one gone already is done).
    async fn delete_gone<K>(&self, api: Api<K>, name: &str, what: &str) -> Result<(), Error>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        ignore_not_found(
            remote_call(
                self.caller.requests,
                self.remote,
                what,
                api.delete(name, &kube::api::DeleteParams::background()),
            )
            .await,
        )
    }

    /// The VM `ns/name` as the host's cache shows it (`None` also while the cache is not
    /// live: warm VMs are taken only from a live cache).
    pub(crate) fn cached_vm(&self, ns: &str, name: &str) -> Option<std::sync::Arc<ObservedVm>> {
        self.remote.host_cache()?.vms.get(Some(ns), name).flatten()
    }

    /// The warm VM the claim `uid` took already (a take whose claim status was not
    /// written): from the host's VM cache while it is live, else listed by label from the
    /// API server (a controller that just started must not take the claim for a cold one).
    pub(crate) async fn taken_by(
        &self,
        ns: &str,
        uid: &str,
    ) -> Result<Option<std::sync::Arc<ObservedVm>>, Error> {
        let ours = |vm: &ObservedVm| {
            vm.metadata.namespace.as_deref() == Some(ns)
                && vm.labels().contains_key(LABEL_WARM_VM)
                && autonodes_core::template::names::labelled_for_claim(vm.labels(), uid)
        };
        if let Some(found) = self.remote.host_cache().and_then(|c| c.vms.filter(ours)) {
            return Ok(found.into_iter().next());
        }
        let selector = format!(
            "{},{LABEL_WARM_VM}",
            crate::remote::calls::claim_selector(uid)
        );
        let listed = remote_call(
            self.caller.requests,
            self.remote,
            "listing the warm VM a claim took",
            Api::<ObservedVm>::namespaced(self.remote.client.clone(), ns)
                .list(&ListParams::default().labels(&selector)),
        )
        .await?;
        Ok(listed.items.into_iter().next().map(std::sync::Arc::new))
    }

    /// Makes the credential of the warm VM `vm` (labelled `labels`): its heartbeat Lease, a
    /// ServiceAccount and a Role (both annotated with the Lease's UID; the Role reads only
    /// the VM's binding, renews only its Lease and deletes only its ServiceAccount), their
    /// RoleBinding; returns a token of the
    /// ServiceAccount asked for [`warm::CREDENTIAL_LIFETIME`] and bound to the host API
    /// server's own audiences, with when the host says it expires (deleting the
    /// ServiceAccount revokes it).
    pub(crate) async fn make_credential(
        &self,
        ns: &str,
        vm: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Credential, Error> {
        let name = warm::credential_name(vm);
        let pp = PostParams::default();
        let lease = self.made_lease(ns, vm, labels).await?;
        let mut sa_meta = meta(&name, ns, labels);
        sa_meta.annotations = Some(BTreeMap::from([(
            ANNOTATION_WARM_LEASE_UID.to_string(),
            lease.clone(),
        )]));
        let sa = ServiceAccount {
            metadata: sa_meta,
            automount_service_account_token: Some(false),
            ..ServiceAccount::default()
        };
        self.create_kept(
            self.api::<ServiceAccount>(ns),
            &sa,
            "creating a warm VM's ServiceAccount",
        )
        .await?;
        // The Lease's UID is recorded on the Role too: the agent deletes its ServiceAccount
        // once bound, and the VM can change neither.
        let mut role_meta = meta(&name, ns, labels);
        role_meta.annotations = Some(BTreeMap::from([(
            ANNOTATION_WARM_LEASE_UID.to_string(),
            lease,
        )]));
        let role: Role = serde_json::from_value(serde_json::json!({
            "metadata": role_meta,
            "rules": warm::role_rules(vm),
        }))
        .map_err(|e| Error::Internal(format!("a warm VM's Role: {e}")))?;
        self.create_kept(self.api::<Role>(ns), &role, "creating a warm VM's Role")
            .await?;
        let binding: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": meta(&name, ns, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        }))
        .map_err(|e| Error::Internal(format!("a warm VM's RoleBinding: {e}")))?;
        self.create_kept(
            self.api::<RoleBinding>(ns),
            &binding,
            "creating a warm VM's RoleBinding",
        )
        .await?;
        // No audiences asked: the host binds the token to its own (a token for another
        // audience would not be accepted by it).
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: i64::try_from(warm::CREDENTIAL_LIFETIME.as_secs()).ok(),
                bound_object_ref: None,
            },
            ..TokenRequest::default()
        };
        let answer = remote_call(
            self.caller.requests,
            self.remote,
            "requesting a warm VM's token",
            self.api::<ServiceAccount>(ns)
                .create_token_request(&name, &pp, &request),
        )
        .await?;
        let status = answer
            .status
            .filter(|s| !s.token.is_empty())
            .ok_or_else(|| Error::Internal("the host returned an empty token".into()))?;
        Ok(Credential {
            token: status.token,
            expires: status.expiration_timestamp.0,
        })
    }

    /// Creates the warm VM `vm`'s heartbeat Lease and returns its UID (of one there
    /// already, an earlier attempt's, when it is labelled as this VM's).
    async fn made_lease(
        &self,
        ns: &str,
        vm: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<String, Error> {
        let name = warm::credential_name(vm);
        let api = self.api::<Lease>(ns);
        let lease = Lease {
            metadata: meta(&name, ns, labels),
            ..Lease::default()
        };
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating a warm VM's Lease",
            api.create(&PostParams::default(), &lease),
        )
        .await;
        let lease = match created {
            Ok(lease) => lease,
            Err(e) if e.is_conflict() => {
                let found = remote_call(
                    self.caller.requests,
                    self.remote,
                    "reading a warm VM's Lease",
                    api.get_opt(&name),
                )
                .await?;
                match found {
                    Some(l) if self.made_for_vm(&l.metadata, vm) => l,
                    _ => {
                        return Err(Error::Internal(format!(
                            "Lease {ns}/{name} is there already and is not this warm VM's"
                        )))
                    }
                }
            }
            Err(e) => return Err(e),
        };
        lease
            .metadata
            .uid
            .ok_or_else(|| Error::Internal(format!("Lease {ns}/{name} has no UID")))
    }

    /// Whether the labels of `meta` are those of an object this installation made for the
    /// warm VM `vm`.
    fn made_for_vm(&self, meta: &ObjectMeta, vm: &str) -> bool {
        let installation = autonodes_core::names::label_value(self.caller.installation);
        let labels = meta.labels.as_ref();
        labels.and_then(|l| l.get(LABEL_INSTALLATION)) == Some(&installation)
            && labels
                .and_then(|l| l.get(LABEL_WARM_VM))
                .map(String::as_str)
                == Some(vm)
    }

    /// The last heartbeat of each warm VM of the type labelled `type_label` in `ns`, by VM
    /// name (`None`: its Lease was never renewed). A Lease stands for the VM its name is
    /// of ([`warm::vm_of_lease`]), whatever its labels say: a warm VM may write those of
    /// its own Lease, and only its own.
    pub(crate) async fn heartbeats(
        &self,
        ns: &str,
        type_label: &str,
    ) -> Result<BTreeMap<String, Option<Timestamp>>, Error> {
        let leases = remote_call(
            self.caller.requests,
            self.remote,
            "listing warm VMs' Leases",
            self.api::<Lease>(ns).list(
                &ListParams::default().labels(&format!("{LABEL_WARM_NODETYPE}={type_label}")),
            ),
        )
        .await?;
        Ok(leases
            .items
            .into_iter()
            .filter_map(|l| {
                let name = l.metadata.name.as_deref()?;
                let vm = warm::vm_of_lease(name)?.to_string();
                let renewed = l.spec.and_then(|s| s.renew_time).map(|t| t.0);
                Some((vm, renewed))
            })
            .collect())
    }

    /// The warm VMs of the type labelled `type_label` in `ns` that have a credential (its
    /// Lease, made first, or its ServiceAccount) or a Secret (user data, binding) not taken
    /// by a claim, with when the youngest of those was made (to find what is left of warm
    /// VMs that are gone, such as a Lease whose ServiceAccount a killed controller never
    /// made). A Lease counts for the VM its name is of, whatever its labels say.
    pub(crate) async fn made_for(
        &self,
        ns: &str,
        type_label: &str,
    ) -> Result<BTreeMap<String, Option<Timestamp>>, Error> {
        let lp = ListParams::default().labels(&format!("{LABEL_WARM_NODETYPE}={type_label}"));
        let accounts = remote_call(
            self.caller.requests,
            self.remote,
            "listing warm VMs' ServiceAccounts",
            self.api::<ServiceAccount>(ns).list_metadata(&lp),
        )
        .await?;
        let secrets = remote_call(
            self.caller.requests,
            self.remote,
            "listing warm VMs' Secrets",
            self.api::<Secret>(ns).list_metadata(&lp),
        )
        .await?;
        let leases = remote_call(
            self.caller.requests,
            self.remote,
            "listing warm VMs' Leases",
            self.api::<Lease>(ns).list_metadata(&lp),
        )
        .await?;
        let labelled = |meta: &ObjectMeta| {
            meta.labels
                .as_ref()
                .and_then(|l| l.get(LABEL_WARM_VM))
                .cloned()
        };
        let named = |meta: &ObjectMeta| {
            meta.name
                .as_deref()
                .and_then(warm::vm_of_lease)
                .map(str::to_string)
        };
        let mut out: BTreeMap<String, Option<Timestamp>> = BTreeMap::new();
        let metas = accounts
            .items
            .into_iter()
            .map(|o| o.metadata)
            .chain(secrets.items.into_iter().map(|o| o.metadata))
            .map(|m| (labelled(&m), m))
            .chain(
                leases
                    .items
                    .into_iter()
                    .map(|o| (named(&o.metadata), o.metadata)),
            );
        for (vm, meta) in metas {
            let Some(vm) = vm else {
                continue;
            };
            let made = meta.creation_timestamp.map(|t| t.0);
            let entry = out.entry(vm).or_insert(made);
            *entry = match (*entry, made) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        Ok(out)
    }

    /// Deletes the warm VM `ns/vm` if it is still at `version` (its `resourceVersion` as the
    /// caller saw it; any, when `None`): `false` when it changed since (a claim took it),
    /// `true` when it is deleted or gone.
    pub(crate) async fn delete_warm_vm(
        &self,
        ns: &str,
        vm: &str,
        version: Option<&str>,
    ) -> Result<bool, Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::virtual_machine());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: version.map(str::to_string),
                uid: None,
            }),
            ..DeleteParams::background()
        };
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            "deleting a warm VirtualMachine",
            api.delete(vm, &dp),
        )
        .await;
        match deleted {
            Ok(answer) => {
                // Marked deleted (KubeVirt's finalizer may hold it): the next reconcile reads
                // that, not the cache's copy from before.
                if let (Some(vm), Some(cache)) = (answer.left(), self.remote.host_cache()) {
                    cache.vms.wrote(ObservedVm::from_object(&vm));
                }
                Ok(true)
            }
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the warm VM `vm`'s binding Secret, RoleBinding, Role, Lease and
    /// ServiceAccount (its token stops working), each only when it is this installation's,
    /// made for `vm` (its labels; the Lease, which the VM may write itself, by the UID its
    /// ServiceAccount recorded), and at the UID it was read with.
    pub(crate) async fn delete_credential(&self, ns: &str, vm: &str) -> Result<(), Error> {
        let name = warm::credential_name(vm);
        let recorded = |m: Option<ObjectMeta>| {
            m.filter(|m| self.made_for_vm(m, vm)).and_then(|m| {
                m.annotations
                    .as_ref()?
                    .get(ANNOTATION_WARM_LEASE_UID)
                    .cloned()
            })
        };
        // On its Role (the agent deletes its ServiceAccount once bound), else on its
        // ServiceAccount (made by an older version).
        let mut lease_uid = recorded(
            self.read_meta::<Role>(ns, &name, "reading a warm VM's Role")
                .await?,
        );
        if lease_uid.is_none() {
            lease_uid = recorded(
                self.read_meta::<ServiceAccount>(ns, &name, "reading a warm VM's ServiceAccount")
                    .await?,
            );
        }
        self.delete_made_for::<Secret>(ns, &warm::binding_name(vm), vm, "a warm VM's binding")
            .await?;
        self.delete_made_for::<RoleBinding>(ns, &name, vm, "a warm VM's RoleBinding")
            .await?;
        self.delete_made_for::<Role>(ns, &name, vm, "a warm VM's Role")
            .await?;
        let lease = self
            .read_meta::<Lease>(ns, &name, "reading a warm VM's Lease")
            .await?;
        if let Some(lease) = lease {
            let uid = lease.uid.clone();
            // Its UID as recorded; without a record (its Role and ServiceAccount gone, or
            // made by an older version), its labels.
            let ours = match &lease_uid {
                Some(recorded) => uid.as_ref() == Some(recorded),
                None => self.made_for_vm(&lease, vm),
            };
            if ours {
                self.delete_at_uid::<Lease>(ns, &name, uid, "deleting a warm VM's Lease")
                    .await?;
            } else {
                tracing::warn!(lease = %format!("{ns}/{name}"), "a Lease of a warm VM's name is not the one made for it: left alone");
            }
        }
        self.delete_made_for::<ServiceAccount>(ns, &name, vm, "a warm VM's ServiceAccount")
            .await
    }

    /// The metadata of `ns/name`, if it exists.
    async fn read_meta<K>(
        &self,
        ns: &str,
        name: &str,
        what: &str,
    ) -> Result<Option<ObjectMeta>, Error>
    where
        K: HostObject,
        <K as kube::Resource>::DynamicType: Default,
    {
        let found = remote_call(
            self.caller.requests,
            self.remote,
            what,
            self.api::<K>(ns).get_metadata_opt(name),
        )
        .await?;
        Ok(found.map(|o| o.metadata))
    }

    /// Deletes `ns/name` when its labels say this installation made it for the warm VM
    /// `vm` (else it is left alone, with a warning), at the UID it was read with.
    async fn delete_made_for<K>(
        &self,
        ns: &str,
        name: &str,
        vm: &str,
        what: &str,
    ) -> Result<(), Error>
    where
        K: HostObject,
        <K as kube::Resource>::DynamicType: Default,
    {
        let Some(found) = self
            .read_meta::<K>(ns, name, &format!("reading {what}"))
            .await?
        else {
            return Ok(());
        };
        if !self.made_for_vm(&found, vm) {
            tracing::warn!(object = %format!("{ns}/{name}"), what, "an object of a warm VM's name is not labelled as made for it: left alone");
            return Ok(());
        }
        self.delete_at_uid::<K>(ns, name, found.uid, &format!("deleting {what}"))
            .await
    }

    /// Deletes `ns/name` in the background if its UID is still `uid` (gone, or replaced by
    /// another object since: done).
    async fn delete_at_uid<K>(
        &self,
        ns: &str,
        name: &str,
        uid: Option<String>,
        what: &str,
    ) -> Result<(), Error>
    where
        K: HostObject,
        <K as kube::Resource>::DynamicType: Default,
    {
        let deleted = remote_call(
            self.caller.requests,
            self.remote,
            what,
            self.api::<K>(ns)
                .delete(name, &crate::remote::host::delete_this(uid)),
        )
        .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a warm VM's user-data Secret (one there already is an earlier attempt's,
    /// with a token of the same ServiceAccount: kept).
    pub(crate) async fn create_user_data(&self, ns: &str, secret: &Secret) -> Result<(), Error> {
        self.create_kept(
            self.api::<Secret>(ns),
            secret,
            "creating a warm VM's user-data Secret",
        )
        .await
    }

    /// Creates a warm VM (one there already is an earlier attempt's: kept).
    pub(crate) async fn create_vm(&self, ns: &str, vm: &DynamicObject) -> Result<(), Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::virtual_machine());
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "creating a warm VirtualMachine",
            api.create(&PostParams::default(), vm),
        )
        .await;
        if let (Ok(vm), Some(cache)) = (&created, self.remote.host_cache()) {
            cache.vms.wrote(ObservedVm::from_object(vm));
        }
        ignore_exists(created)
    }

    /// Takes the warm VM `vm` for a claim: its labels become `labels` (a merge patch that
    /// also names the resource version the claim saw, so of two claims taking one VM at
    /// once only one succeeds). When the VM changed since the cache showed it (KubeVirt
    /// updates a VM that just started), it is read again and taken at its new version if
    /// `takeable` still says so. `None` when another claim took it first, or it cannot be
    /// taken any more.
    pub(crate) async fn take(
        &self,
        ns: &str,
        vm: &ObservedVm,
        labels: &serde_json::Value,
        takeable: impl Fn(&ObservedVm) -> bool,
    ) -> Result<Option<ObservedVm>, Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::virtual_machine());
        let name = vm.name_any();
        let mut version = vm.metadata.resource_version.clone();
        for _ in 0..10 {
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": version,
                "labels": labels,
            }});
            let taken = remote_call(
                self.caller.requests,
                self.remote,
                "taking a warm VirtualMachine",
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await;
            match taken {
                Ok(obj) => {
                    let observed = ObservedVm::from_object(&obj);
                    if let Some(cache) = self.remote.host_cache() {
                        cache.vms.wrote(observed.clone());
                    }
                    return Ok(Some(observed));
                }
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) if e.is_conflict() => {
                    let fresh = remote_call(
                        self.caller.requests,
                        self.remote,
                        "reading a warm VirtualMachine again",
                        Api::<ObservedVm>::namespaced(self.remote.client.clone(), ns)
                            .get_opt(&name),
                    )
                    .await?;
                    match fresh {
                        Some(f) if takeable(&f) => version = f.metadata.resource_version.clone(),
                        _ => return Ok(None),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Puts `labels` (a merge patch of labels) on the warm VM `vm`'s user-data Secret and
    /// DataVolumes, once a claim took it.
    pub(crate) async fn relabel_parts(
        &self,
        ns: &str,
        vm: &str,
        labels: &serde_json::Value,
    ) -> Result<(), Error> {
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        let secret = autonodes_core::template::names::user_data_secret_name(vm);
        ignore_not_found(
            remote_call(
                self.caller.requests,
                self.remote,
                "labelling a taken warm VM's user-data Secret",
                self.api::<Secret>(ns).patch(
                    &secret,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ),
            )
            .await,
        )?;
        let dvs = self.data_volumes(ns);
        let names = self.data_volume_names(ns, vm).await?;
        for name in names {
            ignore_not_found(
                remote_call(
                    self.caller.requests,
                    self.remote,
                    "labelling a taken warm VM's DataVolume",
                    dvs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await,
            )?;
        }
        Ok(())
    }

    fn data_volumes(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.remote.client.clone(), ns, &kubevirt::data_volume())
    }

    /// The names of the warm VM `vm`'s DataVolumes (none on a host without CDI).
    async fn data_volume_names(&self, ns: &str, vm: &str) -> Result<Vec<String>, Error> {
        let listed = remote_call(
            self.caller.requests,
            self.remote,
            "listing a warm VM's DataVolumes",
            self.data_volumes(ns)
                .list_metadata(&ListParams::default().labels(&format!("{LABEL_WARM_VM}={vm}"))),
        )
        .await;
        match listed {
            Ok(list) => Ok(list.items.iter().map(|d| d.name_any()).collect()),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the DataVolumes of the warm VM `vm` (those its labels name).
    pub(crate) async fn delete_data_volumes(&self, ns: &str, vm: &str) -> Result<(), Error> {
        let dvs = self.data_volumes(ns);
        let names = self.data_volume_names(ns, vm).await?;
        for name in names {
            self.delete_gone(dvs.clone(), &name, "deleting a warm VM's DataVolume")
                .await?;
        }
        Ok(())
    }

    /// Writes the binding of the warm VM `vm`: the Secret its agent reads (an existing one
    /// is replaced: only the claim that took the VM writes it).
    pub(crate) async fn write_binding(
        &self,
        ns: &str,
        vm: &str,
        binding: &warm::Binding,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), Error> {
        let mut data = BTreeMap::from([
            (
                warm::BINDING_JOIN_KEY.to_string(),
                k8s_openapi::ByteString(binding.join_configuration.clone().into_bytes()),
            ),
            (
                warm::BINDING_PREPARE_KEY.to_string(),
                k8s_openapi::ByteString(binding.prepare_script.clone().into_bytes()),
            ),
        ]);
        if let Some(user_data) = &binding.user_data {
            data.insert(
                warm::BINDING_USER_DATA_KEY.to_string(),
                k8s_openapi::ByteString(user_data.clone().into_bytes()),
            );
        }
        let secret = Secret {
            metadata: meta(&warm::binding_name(vm), ns, labels),
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Secret::default()
        };
        let api = self.api::<Secret>(ns);
        let created = remote_call(
            self.caller.requests,
            self.remote,
            "writing a warm VM's binding",
            api.create(&PostParams::default(), &secret),
        )
        .await;
        match created {
            Ok(_) => Ok(()),
            Err(e) if e.is_conflict() => {
                let patch = serde_json::json!({"data": secret.data});
                remote_call(
                    self.caller.requests,
                    self.remote,
                    "rewriting a warm VM's binding",
                    api.patch(
                        &warm::binding_name(vm),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    ),
                )
                .await
                .map(|_| ())
            }
            Err(e) => Err(e),
        }
    }
}
