//! Leader election on a `coordination.k8s.io/v1` Lease in the service namespace.
//!
//! Several replicas of `autonodes run --leader-elect` share one Lease; only its holder runs
//! the controllers. The protocol is client-go's:
//!
//! - **acquire**: a replica takes the Lease when it is free (no `holderIdentity`) or when
//!   the holder has not renewed it for `leaseDurationSeconds`. Expiry is judged by this
//!   replica's own monotonic clock from the moment it last *saw the Lease change*, never by
//!   comparing the holder's wall-clock `renewTime` with ours, so clock skew between nodes
//!   cannot hand the Lease out early.
//! - **renew**: the holder rewrites `renewTime` every retry period.
//! - every write is a `replace` carrying the `resourceVersion` that was read, so two
//!   replicas racing for a free or expired Lease cannot both win: the second gets a 409
//!   Conflict and stays a follower.
//! - **lost**: a holder that cannot renew within the renew deadline (or sees another
//!   holder) has lost the Lease and must stop writing at once; `autonodes run` exits
//!   non-zero so the pod restarts as a follower.
//! - **release**: on graceful shutdown the holder clears `holderIdentity` (and sets a 1 s
//!   duration), so a follower takes over at its next retry instead of waiting for expiry.
//!
//! `kube-lease-manager` (the maintained crate for kube 5) was considered: it releases with an
//! unconditional patch and judges expiry by the holder's wall clock, both of which this
//! module avoids, in about the same amount of code.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;

/// Settings of leader election (from `autonodes run` flags).
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the service namespace).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity, written to `holderIdentity`.
    pub identity: String,
    /// How long a Lease holds after its last renewal.
    pub lease_duration: Duration,
    /// How long a holder keeps trying to renew before it gives the Lease up.
    pub renew_deadline: Duration,
    /// How often followers try to acquire and the holder renews.
    pub retry_period: Duration,
    /// Every replica acts for a share of the tenant namespaces (each renews a member Lease
    /// of its own); the leader runs what is cluster-wide and schedules
    /// (`--shard-tenants`). Off: only the leader runs the controllers.
    pub shard_tenants: bool,
}

impl LeaderConfig {
    /// Settings for `lease_duration`, with renew deadline (2/3 of it) and retry period
    /// (2/15 of it, at least 100 ms) derived as client-go's defaults are (15 s, 10 s, 2 s).
    pub fn new(namespace: &str, lease_name: &str, lease_duration: Duration) -> Self {
        let lease_duration = lease_duration.max(Duration::from_secs(1));
        LeaderConfig {
            namespace: namespace.into(),
            lease_name: lease_name.into(),
            identity: default_identity(),
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: (lease_duration * 2 / 15).max(Duration::from_millis(100)),
            shard_tenants: false,
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// `<pod name or hostname>_<random>`: unique per process, readable in `kubectl get lease`.
pub(crate) fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "autonodes".into());
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}_{}", &id[..8])
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaderError {
    /// A call to the API server failed.
    #[error("{context} Lease {namespace}/{name}: {source}")]
    Kube {
        /// What was being done.
        context: &'static str,
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The holder could not renew the Lease in time, or another replica took it.
    #[error("lost the leader Lease {namespace}/{name}: {why}")]
    Lost {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// Why.
        why: String,
    },
}

/// The outcome of one acquire-or-renew attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// This replica holds the Lease (just acquired or renewed).
    Held,
    /// Another replica holds a Lease that has not expired.
    HeldBy(String),
    /// Another replica wrote the Lease between our read and our write.
    Conflict,
}

/// One replica's view of the Lease and its writes to it.
pub(crate) struct LeaderElector {
    api: Api<Lease>,
    config: LeaderConfig,
    /// resourceVersion last seen and when (this process's clock) it was first seen.
    observed: Option<(String, Instant)>,
    /// True while this replica believes it holds the Lease.
    holding: bool,
}

impl LeaderElector {
    /// An elector for the Lease `config.namespace/config.lease_name`.
    pub(crate) fn new(client: Client, config: LeaderConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            holding: false,
        }
    }

    /// The settings.
    pub(crate) fn config(&self) -> &LeaderConfig {
        &self.config
    }

    fn err(&self, context: &'static str) -> impl FnOnce(kube::Error) -> LeaderError + '_ {
        move |source| LeaderError::Kube {
            context,
            namespace: self.config.namespace.clone(),
            name: self.config.lease_name.clone(),
            source,
        }
    }

    fn spec(&self, acquire_time: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(crate::controller::context::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.duration_seconds()),
            acquire_time: Some(acquire_time.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Tries once to acquire the Lease, or to renew it when this replica holds it.
    pub(crate) async fn try_acquire_or_renew(&mut self) -> Result<Attempt, LeaderError> {
        let name = self.config.lease_name.clone();
        let current = self.api.get_opt(&name).await.map_err(self.err("reading"))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.won(&created)),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(self.err("creating")(e)),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        let seen_at = match &self.observed {
            Some((old, at)) if *old == rv => *at,
            _ => {
                self.observed = Some((rv.clone(), now));
                now
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.config.identity.as_str());
        if let (Some(other), false) = (&holder, ours) {
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0).max(1)).unwrap_or(1),
            );
            if now.duration_since(seen_at) < duration {
                self.holding = false;
                return Ok(Attempt::HeldBy(other.clone()));
            }
            tracing::info!(lease = %name, previous = %other, "leader Lease expired; taking it over");
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(if ours {
            self.spec(spec.acquire_time.clone(), transitions)
        } else {
            self.spec(None, transitions + 1)
        });
        // `replace` sends the resourceVersion we read: a write by anyone since is a 409.
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => Ok(self.won(&updated)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(self.err("updating")(e)),
        }
    }

    fn won(&mut self, lease: &Lease) -> Attempt {
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        self.observed = Some((rv, Instant::now()));
        self.holding = true;
        Attempt::Held
    }

    /// Retries until this replica holds the Lease (true) or `stop` resolves (false).
    /// `on_observed` runs after the first successful read of the Lease (the replica is a
    /// working follower from then on).
    pub(crate) async fn acquire(
        &mut self,
        stop: impl Future<Output = ()>,
        mut on_observed: impl FnMut(),
    ) -> bool {
        tokio::pin!(stop);
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    on_observed();
                    tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "became the leader");
                    return true;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    on_observed();
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.config.lease_name, %holder, "another replica leads; waiting");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => on_observed(),
                Err(e) => tracing::warn!(error = %e, "leader election: trying again"),
            }
            tokio::select! {
                _ = &mut stop => return false,
                _ = tokio::time::sleep(jitter(self.config.retry_period)) => {}
            }
        }
    }

    /// Renews the Lease every retry period until `stop` resolves (Ok) or the Lease is lost
    /// (Err): not renewed within the renew deadline, or taken by another replica.
    pub(crate) async fn hold(&mut self, stop: impl Future<Output = ()>) -> Result<(), LeaderError> {
        tokio::pin!(stop);
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let left = self
                .config
                .renew_deadline
                .saturating_sub(last_renewal.elapsed())
                .max(Duration::from_millis(100));
            let attempt = tokio::time::timeout(left, self.try_acquire_or_renew()).await;
            let why = match attempt {
                Ok(Ok(Attempt::Held)) => {
                    last_renewal = Instant::now();
                    continue;
                }
                Ok(Ok(Attempt::HeldBy(other))) => {
                    self.holding = false;
                    return Err(self.lost(format!("{other} holds it now")));
                }
                Ok(Ok(Attempt::Conflict)) => "the Lease changed under us".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "renewal did not answer in time".to_string(),
            };
            tracing::warn!(lease = %self.config.lease_name, %why, "renewing the leader Lease failed");
            if last_renewal.elapsed() >= self.config.renew_deadline {
                self.holding = false;
                return Err(self.lost(format!(
                    "not renewed within {:?} ({why})",
                    self.config.renew_deadline
                )));
            }
        }
    }

    fn lost(&self, why: String) -> LeaderError {
        LeaderError::Lost {
            namespace: self.config.namespace.clone(),
            name: self.config.lease_name.clone(),
            why,
        }
    }

    /// Gives the Lease up (graceful shutdown): clears `holderIdentity` if this replica still
    /// holds it, with a conditional write, so a follower takes over at its next retry.
    pub(crate) async fn release(&mut self) -> Result<(), LeaderError> {
        if !self.holding {
            return Ok(());
        }
        self.holding = false;
        let name = self.config.lease_name.clone();
        let Some(mut lease) = self.api.get_opt(&name).await.map_err(self.err("reading"))? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(crate::controller::context::now());
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: spec.lease_transitions,
            ..Default::default()
        });
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %name, "released the leader Lease");
                Ok(())
            }
            // Someone else wrote it: it is not ours to release any more.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err("releasing")(e)),
        }
    }
}

/// `d` plus up to 20% random jitter, so followers do not poll in lockstep.
fn jitter(d: Duration) -> Duration {
    // No randomness (the OS failed to give any): no jitter.
    let r = crate::random::bytes::<2>().map_or(0, u16::from_le_bytes) % 1000;
    d + d.mul_f64(0.2 * (r as f64) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_deadline_and_retry_period_derive_from_the_lease_duration_like_client_go() {
        let c = LeaderConfig::new("ns", "autonodes", Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.duration_seconds(), 15);
    }

    #[test]
    fn identities_are_unique_per_process_start() {
        assert_ne!(default_identity(), default_identity());
    }
}
