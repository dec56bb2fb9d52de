//! Warm VMs of a node type: the NodeType controller calls [`reconcile`] for each usable
//! type; it keeps `spec.warm.replicas` warm VMs on the type's host (core [`warm::plan`]),
//! and those the NodePools that keep theirs on the type ask for (each in its own group,
//! booted with the pool's properties but the type's SSH keys and user data, after the
//! type's own under `maxCapacity`). It makes
//! each one's own credential, user data and VM; removes the ones that are not wanted,
//! drifted, silent or about to expire (the VM first, only as it was seen, then its
//! credential); removes credentials whose VM is gone; and says what it found for the
//! type's status. Claims take warm VMs from the [`crate::controller::index::warm_vms::WarmIndex`] it fills (`nodeclaim::take_warm`).

use std::time::Duration;

use kube::api::DynamicObject;
use kube::ResourceExt;

use crate::controller::context::{now, Context};
use crate::controller::error::Error;
use crate::controller::index::warm_vms::PoolWant;
use crate::remote::clients::Remote;
use crate::remote::warm_host::WarmHost;
use autonodes_api::reasons::{TypeCondition, TypeReason};
use autonodes_api::{
    NodePool, NodeProvider, NodeType, NodeTypeWarm, ANNOTATION_WARM_CREDENTIAL_EXPIRES,
    LABEL_INSTALLATION, LABEL_NODECLAIM_UID, LABEL_WARM_DEFINITION, LABEL_WARM_NODEPOOL,
    LABEL_WARM_NODETYPE,
};
use autonodes_core::catalogue::PreparedType;
use autonodes_core::userdata::warm::{render_warm_user_data, WarmUserDataInput};
use autonodes_core::warm::{self, WarmVm};
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, BTreeSet};

/// Condition of a NodeType that keeps warm VMs: True when all are ready.
pub(crate) const WARM_READY: TypeCondition = TypeCondition::WarmReady;

/// What was made for a warm VM that does not exist is removed once it is older than this
/// (a warm VM's credential and user data are made before the VM, within a reconcile).
const ORPHAN_CREDENTIAL_AGE: Duration = Duration::from_secs(30);

/// What [`reconcile`] found for the type's status.
pub(crate) struct WarmOutcome {
    /// `status.warm` (absent for a type that keeps none and has none).
    pub status: Option<NodeTypeWarm>,
    /// The `WarmReady` condition: status, reason, message.
    pub condition: Option<(bool, TypeReason, String)>,
    /// When to look again.
    pub requeue: Option<Duration>,
    /// The host's caches are not live yet: nothing is known (the status stays as it was).
    pub unknown: bool,
}

impl WarmOutcome {
    fn none() -> Self {
        WarmOutcome {
            status: None,
            condition: None,
            requeue: None,
            unknown: false,
        }
    }
}

/// A warm VM as the host's cache showed it.
struct Observed {
    vm: WarmVm,
    /// The UID of the pool it is kept for (none: the type's own).
    pool: Option<String>,
    /// Its `resourceVersion`: it is removed only as seen (not once a claim took it).
    version: Option<String>,
}

/// The warm VMs of type `t` (its VMs labelled with the type, not taken by a claim) as the
/// host's caches show them.
fn observed(remote: &Remote, t: &PreparedType, installation: &str) -> Option<Vec<Observed>> {
    let cache = remote.host_cache()?;
    let type_label = autonodes_core::names::label_value(&t.name);
    let installation = autonodes_core::names::label_value(installation);
    let vms = cache.vms.filter(|vm| {
        let l = vm.labels();
        vm.metadata.namespace.as_deref() == Some(t.vm_namespace.as_str())
            && l.get(LABEL_WARM_NODETYPE) == Some(&type_label)
            && l.get(LABEL_INSTALLATION) == Some(&installation)
            && !l.contains_key(LABEL_NODECLAIM_UID)
    })?;
    Some(
        vms.iter()
            .map(|vm| {
                let name = vm.name_any();
                let vmi = cache.vmis.get(Some(&t.vm_namespace), &name).flatten();
                let running_since = vmi
                    .as_ref()
                    .filter(|i| i.phase() == Some("Running"))
                    .and_then(|i| i.metadata.creation_timestamp.as_ref().map(|t| t.0));
                let pool = vm.labels().get(LABEL_WARM_NODEPOOL).cloned();
                let observed = WarmVm {
                    created: vm
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(now, |t| t.0),
                    definition: vm.labels().get(LABEL_WARM_DEFINITION).cloned(),
                    running_since,
                    heartbeat: None,
                    credential_expires: vm
                        .annotations()
                        .get(ANNOTATION_WARM_CREDENTIAL_EXPIRES)
                        .and_then(|t| t.parse().ok()),
                    deleting: vm.metadata.deletion_timestamp.is_some(),
                    name,
                };
                Observed {
                    version: vm.metadata.resource_version.clone(),
                    vm: observed,
                    pool,
                }
            })
            .collect(),
    )
}

/// One group of a type's warm VMs: the type's own, or a pool's.
struct Group {
    /// Its key in the [`WarmIndex`](crate::controller::index::warm_vms::WarmIndex).
    key: String,
    /// The pool it is kept for: its UID and what it asks (none for a pool that is gone
    /// and was never planned by this process), if any.
    pool: Option<(String, Option<PoolWant>)>,
    /// The type as the group's VMs are made from (a pool's properties over the type's).
    t: PreparedType,
    /// How many it asks for.
    replicas: i64,
    /// Why it can keep none.
    problem: Option<String>,
}

/// Keeps the warm VMs of type `t` (provider `provider`, `claimed` claims): the type's own
/// and those of the pools that keep theirs on it. A type that keeps none, has none kept
/// for a pool and never had any (`had_warm`: its status shows warm VMs) costs nothing: no
/// host is looked at.
pub(crate) async fn reconcile(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    claimed: i64,
    had_warm: bool,
) -> WarmOutcome {
    let pools = ctx.index.warm.pools_of_type(&t.name);
    let asks = t.warm_replicas > 0 || pools.values().any(|w| w.replicas > 0);
    if !asks && !had_warm && pools.is_empty() {
        return WarmOutcome::none();
    }
    let installation = ctx.config.installation.as_str();
    let remote = match ctx.clients.host(&t.host_cluster).await {
        Ok(r) => r,
        Err(e) if asks => {
            return WarmOutcome {
                status: None,
                condition: Some((false, TypeReason::WarmUnavailable, e.to_string())),
                requeue: Some(Duration::from_secs(15)),
                unknown: false,
            }
        }
        Err(_) => return WarmOutcome::none(),
    };
    let Some(mut vms) = observed(&remote, t, installation) else {
        // The host's caches are not live yet: look again soon.
        return WarmOutcome {
            status: None,
            condition: None,
            requeue: asks.then_some(Duration::from_secs(5)),
            unknown: true,
        };
    };
    if !asks && vms.is_empty() {
        ctx.index.warm.set(&t.name, Vec::new(), 0, now());
        for (uid, want) in &pools {
            let key = pool_key(&t.name, uid);
            let before = ctx.index.warm.set(&key, Vec::new(), 0, now());
            if (before.current, before.granted) != (0, 0) {
                wake_pool(ctx, want);
            }
        }
        return WarmOutcome::none();
    }
    let host = WarmHost::new(ctx.caller(), &remote);
    let ns = t.vm_namespace.as_str();
    let type_label = autonodes_core::names::label_value(&t.name);
    let groups = groups(ctx, t, pools, &vms);
    match reconcile_on(ctx, t, provider, claimed, &host, &remote, &mut vms, groups).await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::warn!(nodetype = %t.name, namespace = %ns, label = %type_label, error = %e, "keeping warm VMs failed");
            WarmOutcome {
                status: None,
                condition: Some((false, TypeReason::WarmUnavailable, e.to_string())),
                requeue: Some(Duration::from_secs(10)),
                unknown: false,
            }
        }
    }
}

fn pool_key(node_type: &str, uid: &str) -> String {
    warm::pool::group_key(node_type, &autonodes_core::names::label_value(uid))
}

fn wake_pool(ctx: &Context, want: &PoolWant) {
    let _ = ctx
        .wakes
        .pools
        .unbounded_send(ObjectRef::<NodePool>::new(&want.name).within(&want.namespace));
}

/// The groups of type `t`'s warm VMs: its own first, then the pools that keep theirs on it
/// (`pools`, by UID), then pools whose warm VMs of `t` are left over (they now keep theirs
/// on another type, or none: all of them go). Warm VMs of a pool this process has not
/// planned yet are left as they are.
fn groups(
    ctx: &Context,
    t: &PreparedType,
    pools: BTreeMap<String, PoolWant>,
    vms: &[Observed],
) -> Vec<Group> {
    let mut out = vec![Group {
        key: t.name.clone(),
        pool: None,
        t: t.clone(),
        replicas: t.warm_replicas,
        problem: warm::type_problem(t),
    }];
    let mut planned: BTreeSet<String> = BTreeSet::new();
    for (uid, want) in pools {
        let pt = warm::pool::pool_type(t, &want.spec);
        planned.insert(autonodes_core::names::label_value(&uid));
        // A pool that is gone keeps none (it is forgotten once they are gone too).
        let replicas = if pool_exists(ctx, &want, &uid) {
            want.replicas
        } else {
            0
        };
        out.push(Group {
            key: pool_key(&t.name, &uid),
            problem: warm::pool::pool_problem(t, &want.spec),
            replicas,
            t: pt,
            pool: Some((uid, Some(want))),
        });
    }
    let left: BTreeSet<&String> = vms
        .iter()
        .filter_map(|o| o.pool.as_ref())
        .filter(|p| !planned.contains(*p))
        .collect();
    for uid in left {
        let want = match ctx.index.warm.pool_want(uid) {
            Some(w) => Some(Some(w)),
            None => unplanned_want(ctx, uid),
        };
        if let Some(want) = want {
            out.push(Group {
                key: pool_key(&t.name, uid),
                pool: Some((uid.clone(), want)),
                t: t.clone(),
                replicas: 0,
                problem: None,
            });
        }
    }
    out
}

/// For warm VMs of a pool this process has not planned: `Some` (they all go) when the pool
/// asks for none (its `replicas` went to 0 while no controller ran), with the pool, or is
/// gone (once the pool store has listed), without; `None` (left alone until the pool is
/// planned) when it asks for some.
fn unplanned_want(ctx: &Context, uid: &str) -> Option<Option<PoolWant>> {
    let store = &ctx.reflectors.pools;
    if !store.is_synced() {
        return None;
    }
    let pool = store
        .store()
        .find(|p| p.metadata.uid.as_deref() == Some(uid));
    match pool {
        Some(p) if warm::pool::replicas(&p.spec) > 0 => None,
        Some(p) => Some(Some(PoolWant {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            node_type: None,
            replicas: 0,
            spec: p.spec.clone(),
        })),
        None => Some(None),
    }
}

/// How many claims of type `t` are about to launch (core `warm::about_to_launch`) and could
/// take a warm VM of one of its `groups`: the type's own (the claim asks for nothing they
/// were not booted with) or their pool's.
fn about_to_take(ctx: &Context, t: &PreparedType, groups: &[Group]) -> usize {
    let pools: BTreeSet<&str> = groups
        .iter()
        .filter_map(|g| g.pool.as_ref().map(|(uid, _)| uid.as_str()))
        .collect();
    // The type a claim holds, as this process scheduled it (its status may not say so yet).
    let claims = ctx.claims().state();
    let held: Vec<std::sync::Arc<autonodes_api::NodeClaim>> = ctx.ledger(|l| {
        claims
            .into_iter()
            .filter(|c| {
                c.metadata
                    .uid
                    .as_deref()
                    .and_then(|uid| l.holding(uid))
                    .is_some_and(|(held, _)| held == t.name)
            })
            .collect()
    });
    held.iter()
        .filter(|c| warm::about_to_launch(c))
        .filter(|c| {
            let of_pool = pools
                .iter()
                .any(|uid| autonodes_core::pool::owned_by(c, uid));
            of_pool || (t.warm_replicas > 0 && warm::servable(t, None, c).is_ok())
        })
        .count()
}

/// Whether the pool `want` names still exists with UID `uid`.
fn pool_exists(ctx: &Context, want: &PoolWant, uid: &str) -> bool {
    ctx.reflectors
        .pools
        .store()
        .get(&ObjectRef::<NodePool>::new(&want.name).within(&want.namespace))
        .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid))
}

#[allow(clippy::too_many_arguments)]
async fn reconcile_on(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    claimed: i64,
    host: &WarmHost<'_>,
    remote: &Remote,
    vms: &mut [Observed],
    groups: Vec<Group>,
) -> Result<WarmOutcome, Error> {
    let ns = t.vm_namespace.as_str();
    let type_label = autonodes_core::names::label_value(&t.name);
    let leases = host.heartbeats(ns, &type_label).await?;
    let at = now();
    let beats = ctx.index.warm.observe_beats(&t.name, &leases, at);
    for Observed { vm, .. } in vms.iter_mut() {
        vm.heartbeat = beats.get(&vm.name).map(|b| b.seen);
    }
    // Claims first, then the type's own warm VMs, then the pools' in turn. A claim about to
    // take one of the ready warm VMs is not counted twice.
    let taking = match t.max_capacity {
        Some(_) => {
            let ready = vms.iter().filter(|o| o.vm.ready(at)).count();
            about_to_take(ctx, t, &groups).min(ready)
        }
        None => 0,
    };
    let mut room = t
        .max_capacity
        .map(|m| m - claimed + i64::try_from(taking).unwrap_or(0));
    // The type's own: wanted, current, ready.
    let mut own = (0, 0, 0);
    let (mut pools_current, mut ready_total, mut wanted_total, mut not_reporting) = (0, 0, 0, 0);
    let mut made = 0;
    let mut removed_any = false;
    for group in &groups {
        let uid = group
            .pool
            .as_ref()
            .map(|(uid, _)| autonodes_core::names::label_value(uid));
        let mine: Vec<WarmVm> = vms
            .iter()
            .filter(|o| o.pool == uid)
            .map(|o| o.vm.clone())
            .collect();
        let replicas = if group.problem.is_some() {
            0
        } else {
            group.replicas
        };
        let plan = warm::plan(replicas, room, &group.t.definition, &mine, at);
        room = room.map(|r| r - plan.wanted);
        for (name, why) in &plan.remove {
            let version = vms
                .iter()
                .find(|o| o.vm.name == *name)
                .and_then(|o| o.version.as_deref());
            if !remove(host, ns, name, version).await? {
                tracing::info!(nodetype = %t.name, vm = %format!("{ns}/{name}"), "a warm VM changed since it was seen (a claim took it): not removed");
                continue;
            }
            removed_any = true;
            ctx.metrics
                .warm_vms_removed
                .with_label_values(&[&t.name, why.label()])
                .inc();
            tracing::info!(nodetype = %t.name, pool = ?group.pool.as_ref().map(|(uid, _)| uid), vm = %format!("{ns}/{name}"), why = why.as_str(), "removing a warm VM");
        }
        for _ in 0..plan.create {
            create(ctx, &group.t, provider, host, remote, uid.as_deref()).await?;
            made += 1;
        }
        let removed: Vec<&str> = plan.remove.iter().map(|(n, _)| n.as_str()).collect();
        let kept: Vec<WarmVm> = mine
            .into_iter()
            .filter(|v| !v.deleting && !removed.contains(&v.name.as_str()))
            .collect();
        let current = kept.len() as i64;
        let before = ctx.index.warm.set(&group.key, kept, plan.wanted, at);
        ready_total += plan.ready;
        wanted_total += plan.wanted;
        not_reporting += plan.not_reporting;
        match &group.pool {
            None => own = (plan.wanted, current, plan.ready),
            Some((uid, want)) => {
                pools_current += current;
                let exists = want.as_ref().is_some_and(|w| pool_exists(ctx, w, uid));
                if current == 0 && !exists {
                    ctx.index.warm.forget_pool(uid);
                }
                // The pool's status shows its warm VMs.
                if let Some(want) = want
                    .as_ref()
                    .filter(|_| before != ctx.index.warm.counts(&group.key, at))
                {
                    wake_pool(ctx, want);
                }
            }
        }
    }
    // Credentials whose VM is gone (a removal or creation cut short).
    let live: std::collections::BTreeSet<&str> = vms.iter().map(|o| o.vm.name.as_str()).collect();
    let taken = |vm: &str| {
        remote
            .host_cache()
            .and_then(|c| c.vms.get(Some(ns), vm))
            .flatten()
            .is_some()
    };
    for (vm, made) in host.made_for(ns, &type_label).await? {
        let old = made.is_some_and(|m| {
            Duration::try_from(at.duration_since(m)).unwrap_or_default() > ORPHAN_CREDENTIAL_AGE
        });
        if old && !live.contains(vm.as_str()) && !taken(&vm) {
            host.delete_credential(ns, &vm).await?;
            host.host().delete_user_data(ns, &vm, None).await?;
            host.delete_data_volumes(ns, &vm).await?;
            tracing::info!(nodetype = %t.name, vm = %format!("{ns}/{vm}"), "removed what was left of a warm VM that is gone");
        }
    }
    let (wanted, current, ready) = own;
    let status = NodeTypeWarm {
        replicas: wanted,
        current,
        ready,
        pools: pools_current,
        cost: (current + pools_current) * t.cost,
        bound: ctx.index.warm.bound(&t.name),
    };
    let m = &ctx.metrics;
    let all = current + pools_current;
    for (state, value) in [("ready", ready_total), ("starting", all - ready_total)] {
        m.warm_vms
            .with_label_values(&[&t.name, &t.provider, state])
            .set(value);
    }
    // Each reason's series from 0, so a rate has a series before the first removal.
    for removal in warm::REMOVALS {
        m.warm_vms_removed
            .with_label_values(&[&t.name, removal.label()]);
    }
    let server = guest_server(provider, remote);
    let problem = groups
        .first()
        .filter(|g| g.replicas > 0)
        .and_then(|g| g.problem.clone());
    let condition = match (problem, not_reporting) {
        (Some(p), _) => (false, TypeReason::WarmUnavailable, p),
        (None, n) if n > 0 => (
            false,
            TypeReason::WarmNotReporting,
            format!(
                "{n} warm VM(s) ran for {}s without reporting to the host API server at {server}; they are replaced, and claims are served cold meanwhile. The VMs must reach that address (NodeProvider spec.kubeVirt.guestApiServer)",
                warm::REPORT_WITHIN.as_secs()
            ),
        ),
        (None, _) if ready_total >= wanted_total => (
            true,
            TypeReason::WarmReady,
            format!("{ready_total} warm VM(s) ready"),
        ),
        (None, _) => (
            false,
            TypeReason::WarmStarting,
            format!(
                "{ready_total} of {wanted_total} warm VM(s) ready; the others are booting (their agents report to {server})"
            ),
        ),
    };
    let settled = condition.0 && made == 0 && !removed_any;
    let keeps = t.warm_replicas > 0 || groups.len() > 1;
    Ok(WarmOutcome {
        status: (keeps || all > 0).then_some(status),
        condition: Some(condition),
        requeue: Some(if settled {
            Duration::from_secs(10)
        } else {
            Duration::from_secs(2)
        }),
        unknown: false,
    })
}

/// The host API server as the provider's VMs reach it.
fn guest_server(provider: Option<&NodeProvider>, remote: &Remote) -> String {
    provider
        .and_then(|p| p.spec.kube_virt.guest_api_server.clone())
        .unwrap_or_else(|| remote.server.clone())
}

/// Removes a warm VM as it was seen (`version`, its `resourceVersion`; a claim's take
/// changes it, so a VM a claim just took is never removed: `false`): the VM first, then its
/// credential (its agent can read nothing more), its user-data Secret and its DataVolumes.
async fn remove(
    host: &WarmHost<'_>,
    ns: &str,
    vm: &str,
    version: Option<&str>,
) -> Result<bool, Error> {
    if !host.delete_warm_vm(ns, vm, version).await? {
        return Ok(false);
    }
    host.delete_credential(ns, vm).await?;
    host.host().delete_user_data(ns, vm, None).await?;
    host.delete_data_volumes(ns, vm).await?;
    Ok(true)
}

/// Makes one warm VM of `t`: its credential, its user data (with the credential's token),
/// the golden volumes it clones, and the VM.
async fn create(
    ctx: &Context,
    t: &PreparedType,
    provider: Option<&NodeProvider>,
    host: &WarmHost<'_>,
    remote: &Remote,
    pool_uid: Option<&str>,
) -> Result<(), Error> {
    let ns = t.vm_namespace.as_str();
    let installation = ctx.config.installation.as_str();
    let suffix: String = crate::random::bytes::<5>()
        .map_err(|e| Error::Internal(format!("no random bytes: {e}")))?
        .iter()
        .map(|b| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[usize::from(*b) % 36]))
        .collect();
    let name = warm::vm_name(&t.short_name, &suffix);
    let labels = warm::credential_labels(&t.name, &name, installation);
    let credential = host.make_credential(ns, &name, &labels).await?;
    let token = credential.token.as_str();
    let server = guest_server(provider, remote);
    let ca = remote
        .ca_pem
        .as_deref()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .ok_or_else(|| {
            Error::Internal(format!(
                "the kubeconfig of host cluster {} has no certificate-authority-data: warm VMs could not verify it",
                t.host_cluster
            ))
        })?;
    let properties = &t.properties;
    let ssh_keys = autonodes_core::node_config::ssh_keys(properties);
    let user_data = render_warm_user_data(&WarmUserDataInput {
        vm_name: &name,
        server: &server,
        host_ca_pem: &ca,
        token,
        namespace: ns,
        binding: &warm::binding_name(&name),
        lease: &warm::credential_name(&name),
        user_cloud_config: autonodes_core::node_config::user_cloud_config(properties),
        ssh_keys: &ssh_keys,
    })
    .map_err(|e| Error::Internal(format!("warm VM user data for {}: {e}", t.name)))?;
    let objects = warm::render_vm(
        t,
        &name,
        user_data,
        installation,
        pool_uid,
        credential.expires,
    )
    .map_err(|e| Error::Internal(format!("warm VM of {}: {e}", t.name)))?;
    host.create_user_data(ns, &objects.secret).await?;
    let remote_host = host.host();
    for golden in &t.golden {
        remote_host
            .ensure_golden_volume(golden, &t.provider)
            .await?;
    }
    let vm: DynamicObject = serde_json::from_value(objects.vm)
        .map_err(|e| Error::Internal(format!("rendered warm VM is not an object: {e}")))?;
    host.create_vm(ns, &vm).await?;
    tracing::info!(nodetype = %t.name, pool = ?pool_uid, vm = %format!("{ns}/{name}"), "created a warm VM");
    Ok(())
}

/// Removes the warm VMs (and their credentials) of types and pools that are gone: the
/// host's VMs labelled with a warm type no NodeType has, or a pool no NodePool has. Called
/// by the orphan sweep.
pub(crate) async fn sweep_gone_types(ctx: &Context, types: &[std::sync::Arc<NodeType>]) -> usize {
    let known: std::collections::BTreeSet<String> = types
        .iter()
        .map(|t| autonodes_core::names::label_value(&t.name_any()))
        .collect();
    let pools_listed = ctx.reflectors.pools.is_synced();
    let pools: BTreeSet<String> = ctx
        .reflectors
        .pools
        .store()
        .state()
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .map(autonodes_core::names::label_value)
        .collect();
    let installation = autonodes_core::names::label_value(&ctx.config.installation);
    let mut removed = 0;
    let hosts = ctx.clients.cached().await;
    for remote in hosts
        .iter()
        .filter(|r| matches!(r.key, crate::remote::clients::ClusterKey::Host(_)))
    {
        let Some(cache) = remote.host_cache() else {
            continue;
        };
        let Some(orphans) = cache.vms.filter(|vm| {
            let l = vm.labels();
            // (Pools are known once their store holds its first list.)
            let gone = l
                .get(LABEL_WARM_NODETYPE)
                .is_some_and(|t| !known.contains(t))
                || l.get(LABEL_WARM_NODEPOOL)
                    .is_some_and(|p| pools_listed && !pools.contains(p));
            l.get(LABEL_INSTALLATION) == Some(&installation)
                && !l.contains_key(LABEL_NODECLAIM_UID)
                && gone
                && vm.metadata.deletion_timestamp.is_none()
        }) else {
            continue;
        };
        let host = WarmHost::new(ctx.caller(), remote);
        for vm in orphans {
            let ns = vm.namespace().unwrap_or_default();
            let name = vm.name_any();
            match remove(&host, &ns, &name, vm.metadata.resource_version.as_deref()).await {
                Ok(true) => {
                    removed += 1;
                    tracing::info!(vm = %format!("{ns}/{name}"), "removed a warm VM whose node type or pool is gone");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(vm = %format!("{ns}/{name}"), error = %e, "removing a warm VM whose node type or pool is gone failed")
                }
            }
        }
    }
    removed
}
