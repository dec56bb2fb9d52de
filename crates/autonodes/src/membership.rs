//! Member Leases (`autonodes run --shard-tenants`): each replica renews a
//! `coordination.k8s.io/v1` Lease of its own, `autonodes-member-<member>` in the service
//! namespace (label `autonodes.io/member`), and lists the others' every retry period. What
//! the lists show feeds [`autonodes_core::shards`] (which members are live, which
//! namespaces this one acts for) through [`Shards::listed`].
//!
//! A member that could neither renew nor list for the renew deadline acts for nothing from
//! then on ([`Shards::acts_for`] checks the time of the last good round) and this loop
//! returns an error: `autonodes run` stops and its pod restarts as a new member. On a
//! graceful stop the Lease is released (no `holderIdentity`): the others take its
//! namespaces at their next list. The leader deletes Leases that expired a minute ago or
//! were released.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::Client;

use crate::controller::shards::Shards;
use crate::leader::{LeaderConfig, LeaderError};
use crate::metrics::Metrics;
use autonodes_core::shards::{LeaseSeen, MemberClock};

/// The label every member Lease carries.
pub(crate) const LABEL_MEMBER: &str = "autonodes.io/member";
/// The prefix of member Lease names.
pub(crate) const MEMBER_LEASE_PREFIX: &str = "autonodes-member-";
/// How long past its expiry the leader keeps a member's Lease before deleting it.
const GONE_FOR: Duration = Duration::from_secs(60);

/// The member name of a replica identity (`<pod>_<random>`): lower case, `_` as `-`, so
/// that `autonodes-member-<member>` is a valid Lease name.
pub(crate) fn member_name(identity: &str) -> String {
    let name: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .take(253 - MEMBER_LEASE_PREFIX.len())
        .collect();
    name.trim_matches(|c| c == '-' || c == '.').to_string()
}

/// Keeps this replica's member Lease and reads the others' until `stop` resolves (then
/// releases the Lease), or until it could neither renew nor list for the renew deadline
/// (an error; [`Shards::lose`] was called).
pub(crate) async fn keep(
    client: Client,
    config: LeaderConfig,
    shards: Arc<Shards>,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> Result<(), LeaderError> {
    let member = member_name(&config.identity);
    let name = format!("{MEMBER_LEASE_PREFIX}{member}");
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let err = |context: &'static str| {
        let (namespace, name) = (config.namespace.clone(), name.clone());
        move |source| LeaderError::Kube {
            context,
            namespace,
            name,
            source,
        }
    };
    let lost = |why: String| LeaderError::Lost {
        namespace: config.namespace.clone(),
        name: name.clone(),
        why,
    };
    let spec = |config: &LeaderConfig| LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(
            i32::try_from(config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
        ),
        renew_time: Some(MicroTime(crate::controller::context::now())),
        ..Default::default()
    };
    let mut lease = api
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(config.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        LABEL_MEMBER.to_string(),
                        "true".to_string(),
                    )])),
                    ..Default::default()
                },
                spec: Some(spec(&config)),
            },
        )
        .await
        .map_err(err("creating"))?;
    tracing::info!(lease = %name, %member, "member Lease created; acting for no tenant namespace for one Lease duration");
    let mut clock = MemberClock::default();
    let mut last_ok = Instant::now();
    tokio::pin!(stop);
    loop {
        let round = async {
            lease.spec = Some(spec(&config));
            let renewed = api
                .replace(&name, &PostParams::default(), &lease)
                .await
                .map_err(err("renewing"))?;
            let listed = api
                .list(&ListParams::default().labels(LABEL_MEMBER))
                .await
                .map_err(err("listing"))?;
            Ok::<_, LeaderError>((renewed, listed.items))
        };
        // A slow round still counts while the renew deadline has not passed.
        let left = config
            .renew_deadline
            .saturating_sub(last_ok.elapsed())
            .max(config.retry_period);
        let outcome = tokio::time::timeout(left, round).await;
        let answered = Instant::now();
        match outcome {
            Ok(Ok((renewed, listed)))
                if answered.duration_since(last_ok) <= config.renew_deadline =>
            {
                lease = renewed;
                last_ok = answered;
                let seen: Vec<LeaseSeen> = listed.iter().filter_map(seen).collect();
                let live = clock.observe(answered, &seen);
                shards.listed(answered, |o| o.observe(answered, live));
                metrics
                    .shard_members
                    .set(i64::try_from(shards.members().len()).unwrap_or(i64::MAX));
                if shards.leads() {
                    delete_gone(&api, &clock, &listed, &member, answered).await;
                }
            }
            Ok(Err(LeaderError::Kube {
                source: kube::Error::Api(s),
                ..
            })) if s.code == 409 || s.code == 404 => {
                // A renewal whose answer was lost (a round that timed out) leaves the
                // version read behind: still ours, it is read again and renewed next
                // round. Held by another identity, or gone, it is lost.
                match api.get_opt(&name).await {
                    Ok(Some(current)) if held_by(&current, &config.identity) => {
                        lease = current;
                    }
                    Ok(_) => {
                        lose(&shards, &metrics);
                        return Err(lost(format!(
                            "its member Lease was changed or deleted by someone else ({})",
                            s.code
                        )));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the member Lease after a conflict failed; retrying")
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "member Lease round failed; retrying"),
            Ok(Ok(_)) | Err(_) => tracing::warn!("member Lease round took too long; retrying"),
        }
        if answered.duration_since(last_ok) > config.renew_deadline {
            lose(&shards, &metrics);
            return Err(lost(format!(
                "could not renew its member Lease and list the others for {:?}",
                config.renew_deadline
            )));
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(config.retry_period) => {}
        }
    }
    lose(&shards, &metrics);
    // Released: the others take this member's namespaces at their next list.
    if let Some(s) = lease.spec.as_mut() {
        s.holder_identity = None;
    }
    match api.replace(&name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %name, "member Lease released"),
        Err(e) => {
            tracing::warn!(lease = %name, error = %e, "releasing the member Lease failed; it expires by itself")
        }
    }
    Ok(())
}

/// This replica acts for nothing from now on, and its metrics say so while it stops.
fn lose(shards: &Shards, metrics: &Metrics) {
    shards.lose();
    metrics.tenant_namespace_owner.reset();
    metrics.tenant_namespaces_owned.set(0);
}

/// Whether `lease` is held by `identity`.
fn held_by(lease: &Lease, identity: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(identity)
}

/// A listed member Lease as the clock reads it.
fn seen(lease: &Lease) -> Option<LeaseSeen> {
    let name = lease.metadata.name.as_deref()?;
    let member = name.strip_prefix(MEMBER_LEASE_PREFIX)?;
    let spec = lease.spec.clone().unwrap_or_default();
    Some(LeaseSeen {
        member: member.to_string(),
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
        duration: Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(1).max(1)).unwrap_or(1),
        ),
        released: spec.holder_identity.as_deref().is_none_or(str::is_empty),
    })
}

/// Deletes the member Leases that expired [`GONE_FOR`] ago or were released (each on the
/// version listed: one renewed since stays).
async fn delete_gone(
    api: &Api<Lease>,
    clock: &MemberClock,
    listed: &[Lease],
    me: &str,
    at: Instant,
) {
    for lease in listed {
        let Some(s) = seen(lease) else { continue };
        if s.member == me || !(s.released || clock.long_gone(&s.member, at, GONE_FOR)) {
            continue;
        }
        let Some(name) = lease.metadata.name.as_deref() else {
            continue;
        };
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => tracing::info!(lease = %name, "deleted the Lease of a member that is gone"),
            Err(e) => tracing::debug!(lease = %name, error = %e, "deleting a gone member's Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_make_valid_lease_names() {
        assert_eq!(
            member_name("autonodes-7d9f-x2_1a2b3c4d"),
            "autonodes-7d9f-x2-1a2b3c4d"
        );
        assert_eq!(member_name("Laptop_AB"), "laptop-ab");
        let long = member_name(&"x".repeat(400));
        assert_eq!(long.len() + MEMBER_LEASE_PREFIX.len(), 253);
    }

    #[test]
    fn a_lease_is_ours_only_while_it_names_this_identity() {
        let lease = |holder: Option<&str>| Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                ..Default::default()
            }),
        };
        assert!(held_by(&lease(Some("a_1")), "a_1"));
        assert!(!held_by(&lease(Some("b_2")), "a_1"));
        assert!(!held_by(&lease(None), "a_1"));
    }

    #[test]
    fn a_lease_without_holder_reads_as_released() {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(format!("{MEMBER_LEASE_PREFIX}a")),
                resource_version: Some("5".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
        };
        let s = seen(&lease).expect("a member Lease");
        assert!(s.released && s.member == "a" && s.duration == Duration::from_secs(15));
        let mut other = lease.clone();
        other.metadata.name = Some("autonodes".into());
        assert_eq!(seen(&other), None, "the leader Lease is no member's");
    }
}
