//! Prometheus metrics, prefixed `autonodes_`.

use crate::remote::calls::ClusterRequests;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The `result` label values of `autonodes_reconcile_total`: done, retried soon because it
/// read a stale copy or waits for something that takes time (not a failure), failed.
pub(crate) const RECONCILE_RESULTS: [&str; 3] = ["ok", "requeued", "error"];

/// The `controller` label values of `autonodes_reconcile_total`.
pub(crate) const CONTROLLERS: [&str; 5] = [
    "nodeclaim",
    "nodetype",
    "nodeprovider",
    "nodepool",
    "machinepool",
];

/// What the `*_cost` metrics count in, said in their HELP and on the metrics page: a node's
/// cost as the catalogue gives it.
pub(crate) const COST_UNIT: &str = "in cost units: a node type's spec.cost, else 10 per CPU + 2 per GiB of memory + 10000 per unit of another resource; a price per node in whatever unit the catalogue's author chose (per hour, say), which autonodes compares and sums but never converts";

/// The `namespace`, `nodepool` (empty for a claim of no pool) and `nodetype` (empty
/// before one is chosen) labels of a claim's counters.
pub(crate) fn claim_labels(claim: &autonodes_api::NodeClaim) -> [String; 3] {
    use kube::ResourceExt;
    let pool = claim
        .labels()
        .get(autonodes_api::LABEL_NODEPOOL)
        .cloned()
        .unwrap_or_default();
    let node_type = claim
        .status
        .as_ref()
        .and_then(|s| s.type_ref.clone())
        .or_else(|| claim.spec.type_ref.clone())
        .unwrap_or_default();
    [claim.namespace().unwrap_or_default(), pool, node_type]
}

/// Every metric autonodes exports.
pub struct Metrics {
    /// The registry the metrics live in.
    pub registry: Registry,
    /// The process's own series (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
    /// open file descriptors, start time), unprefixed as every Prometheus client exports
    /// them.
    pub process_registry: Registry,
    /// `autonodes_reconcile_total{controller,result}`.
    pub reconcile_total: IntCounterVec,
    /// `autonodes_reconcile_errors_total{controller,error}`: reconciles that returned an
    /// error, by its kind ([`crate::controller::error::Error::metric_label`]).
    pub reconcile_errors: IntCounterVec,
    /// `autonodes_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: HistogramVec,
    /// `autonodes_nodetype_capacity{nodetype,provider}`: the type's `maxCapacity`; absent
    /// when unlimited.
    pub nodetype_capacity: IntGaugeVec,
    /// `autonodes_nodetype_claimed{nodetype,provider}`: nodes of the type claims hold.
    pub nodetype_claimed: IntGaugeVec,
    /// `autonodes_nodetype_available{nodetype,provider}`: nodes of the type still free
    /// (capacity minus claimed); absent when unlimited.
    pub nodetype_available: IntGaugeVec,
    /// `autonodes_nodetype_cost{nodetype,provider}`, in [`COST_UNIT`].
    pub nodetype_cost: IntGaugeVec,
    /// `autonodes_nodetype_host_headroom{nodetype,provider}`: how many more of the type's
    /// VMs its host cluster's nodes have room for; absent while unknown.
    pub nodetype_host_headroom: IntGaugeVec,
    /// `autonodes_nodetype_addresses_free{nodetype,provider}`: addresses the type's
    /// `addressPool` can still hand out; absent for a type without one.
    pub nodetype_addresses_free: IntGaugeVec,
    /// `autonodes_warm_vms{nodetype,provider,state}`: a type's warm VMs that are `ready`
    /// (a claim may take them) or `starting`.
    pub warm_vms: IntGaugeVec,
    /// `autonodes_warm_bindings_total{nodetype}`: claims served by a warm VM.
    pub warm_bindings: IntCounterVec,
    /// `autonodes_warm_vms_removed_total{nodetype,reason}`: warm VMs removed, by
    /// [`autonodes_core::warm::Removal::label`]; all but `Excess` are replaced.
    pub warm_vms_removed: IntCounterVec,
    /// `autonodes_nodeclaims{phase,nodetype,provider}`.
    pub nodeclaims: IntGaugeVec,
    /// `autonodes_nodeclaims_cost{namespace,vcluster,provider}`, in [`COST_UNIT`].
    pub nodeclaims_cost: IntGaugeVec,
    /// `autonodes_nodeclaims_oldest_seconds{phase}`: how long the oldest claim of each phase
    /// on the way (`Pending`, `Provisioning`, `Joining`, `Terminating`) has been there —
    /// since its creation, or for `Terminating` since its deletion was asked. Absent for a
    /// phase no claim is in.
    pub nodeclaims_oldest: IntGaugeVec,
    /// `autonodes_nodeclaims_created_total{namespace,nodepool,nodetype}`: `nodepool` empty
    /// for a claim of no pool.
    pub nodeclaims_created: IntCounterVec,
    /// `autonodes_nodeclaims_terminated_total{namespace,nodepool,nodetype,reason}`.
    pub nodeclaims_terminated: IntCounterVec,
    /// `autonodes_nodeclaims_disrupted_total{namespace,nodepool,reason}`: serving claims a
    /// pool deleted, by [`autonodes_core::pool::plan::DeleteReason::disruption`].
    pub nodeclaims_disrupted: IntCounterVec,
    /// `autonodes_vm_migrations_total{namespace,nodepool,result}`: live migrations of claims'
    /// VMs off host nodes being drained, `started` (asked for by autonodes), `succeeded`,
    /// `failed`.
    pub vm_migrations: IntCounterVec,
    /// `autonodes_nodeclaim_duration_seconds{stage,start}`, measured from claim creation;
    /// `start` is `warm` (a warm VM served the claim) or `cold`.
    pub nodeclaim_duration: HistogramVec,
    /// `autonodes_cluster_requests_total{kind,namespace,cluster,code}`
    /// ([`ClusterRequests`]).
    pub(crate) cluster_requests: ClusterRequests,
    /// `autonodes_nodepool_desired_replicas{namespace,nodepool}`: the claims a pool should
    /// have (`spec.replicas`, or the live claims of a dynamic pool).
    pub nodepool_desired: IntGaugeVec,
    /// `autonodes_nodepool_ready_replicas{namespace,nodepool}`: the pool's Available claims.
    pub nodepool_ready: IntGaugeVec,
    /// `autonodes_nodepool_registration_failures{namespace,nodepool}`: the pool's claims that
    /// failed in a row before their node was ready (`status.registration`).
    pub nodepool_registration_failures: IntGaugeVec,
    /// `autonodes_orphans_removed_total{kind}`: objects the orphan sweep removed.
    pub orphans_removed: IntCounterVec,
    /// `autonodes_kube_requests_total{cluster,verb,resource,code}`: every request of the
    /// controller's clients ([`crate::remote::request_metrics`]).
    pub kube_requests: IntCounterVec,
    /// `autonodes_leader`: 1 while this replica holds the leader Lease (and runs the
    /// controllers), else 0.
    pub leader: prometheus::IntGauge,
    /// `autonodes_shard_members`: the live members (replicas) this replica sees, with
    /// `--shard-tenants` (0 without).
    pub shard_members: prometheus::IntGauge,
    /// `autonodes_tenant_namespaces`: namespaces with NodeClaims or NodePools.
    pub tenant_namespaces: prometheus::IntGauge,
    /// `autonodes_tenant_namespaces_owned`: those of them this replica acts for.
    pub tenant_namespaces_owned: prometheus::IntGauge,
    /// `autonodes_tenant_namespace_owner{namespace,member}`: 1 for each namespace this
    /// replica acts for (`member` is its member name, empty without `--shard-tenants`).
    pub tenant_namespace_owner: IntGaugeVec,
    /// `autonodes_build_info{version,revision}`: always 1; the labels say which build runs.
    pub build_info: IntGaugeVec,
}

/// The git revision the binary was built from (`AUTONODES_REVISION` at build time, which
/// `scripts/image.sh` sets), else `unknown`.
pub const REVISION: &str = match option_env!("AUTONODES_REVISION") {
    Some(r) => r,
    None => "unknown",
};

/// The Prometheus type of a metric, for the metrics page.
pub trait Typed {
    /// `counter`, `gauge` or `histogram`.
    const TYPE: &'static str;
}
impl Typed for IntCounterVec {
    const TYPE: &'static str = "counter";
}
impl Typed for IntGaugeVec {
    const TYPE: &'static str = "gauge";
}
impl Typed for prometheus::IntGauge {
    const TYPE: &'static str = "gauge";
}
impl Typed for HistogramVec {
    const TYPE: &'static str = "histogram";
}

/// Removes every series of `vec` whose labels have the values `matching` (Prometheus removes
/// series only by all their values, so they are read off a collection first).
fn remove_where(vec: &IntCounterVec, matching: &[(&str, &str)]) {
    use prometheus::core::Collector;
    let names: Vec<String> = vec
        .desc()
        .first()
        .map(|d| d.variable_labels.clone())
        .unwrap_or_default();
    for family in vec.collect() {
        for metric in family.get_metric() {
            let pairs = metric.get_label();
            let value = |name: &str| {
                pairs
                    .iter()
                    .find(|p| p.name() == name)
                    .map_or("", |p| p.value())
            };
            if matching.iter().all(|(n, v)| value(n) == *v) {
                let values: Vec<&str> = names.iter().map(|n| value(n)).collect();
                let _ = vec.remove_label_values(&values);
            }
        }
    }
}

fn register<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<T>,
) -> prometheus::Result<T> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new_custom(Some("autonodes".into()), None)?;
        let r = &registry;
        Ok(Metrics {
            reconcile_total: register(r, IntCounterVec::new(
                Opts::new("reconcile_total", "Reconciles by controller and result (ok; requeued: a stale read or a wait, retried; error)."),
                &["controller", "result"],
            ))?,
            reconcile_errors: register(r, IntCounterVec::new(
                Opts::new("reconcile_errors_total", "Reconciles that returned an error, by controller and kind of error: conflict (a stale read), waiting (a cleanup waits for something to go) and kept (a cleanup held on purpose) are retried soon and not failures; kube, remote, client, finalizer, cleanup_blocked, missing and internal are."),
                &["controller", "error"],
            ))?,
            reconcile_duration: register(r, HistogramVec::new(
                HistogramOpts::new("reconcile_duration_seconds", "Time one reconcile takes, by controller.")
                    .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
                &["controller"],
            ))?,
            nodetype_capacity: register(r, IntGaugeVec::new(
                Opts::new("nodetype_capacity", "Nodes a node type offers at most (its maxCapacity); absent when unlimited."),
                &["nodetype", "provider"],
            ))?,
            nodetype_claimed: register(r, IntGaugeVec::new(
                Opts::new("nodetype_claimed", "Nodes of a node type that claims hold."),
                &["nodetype", "provider"],
            ))?,
            nodetype_available: register(r, IntGaugeVec::new(
                Opts::new("nodetype_available", "Nodes of a node type still free (capacity minus claimed); absent when unlimited."),
                &["nodetype", "provider"],
            ))?,
            nodetype_addresses_free: register(r, IntGaugeVec::new(
                Opts::new("nodetype_addresses_free", "Addresses the node type's address pool can still hand out; absent for a type without one."),
                &["nodetype", "provider"],
            ))?,
            nodetype_cost: register(r, IntGaugeVec::new(
                Opts::new("nodetype_cost", format!("Effective cost of one node of the type, {COST_UNIT}.")),
                &["nodetype", "provider"],
            ))?,
            nodetype_host_headroom: register(r, IntGaugeVec::new(
                Opts::new("nodetype_host_headroom", "How many more VMs of the node type the nodes of its host cluster have room for."),
                &["nodetype", "provider"],
            ))?,
            warm_vms: register(r, IntGaugeVec::new(
                Opts::new("warm_vms", "Warm VMs of a node type, ready (a claim may take them) or starting."),
                &["nodetype", "provider", "state"],
            ))?,
            warm_bindings: register(r, IntCounterVec::new(
                Opts::new("warm_bindings_total", "Claims served by a warm VM of the node type."),
                &["nodetype"],
            ))?,
            warm_vms_removed: register(r, IntCounterVec::new(
                Opts::new("warm_vms_removed_total", "Warm VMs removed before a claim took them, by node type and reason: Excess (more than wanted), and the ones replaced by a new warm VM: Drifted (made from an older definition of the type), NotReporting (its agent did not report to the host API server in time), Expiring (its credential expires soon)."),
                &["nodetype", "reason"],
            ))?,
            nodeclaims: register(r, IntGaugeVec::new(
                Opts::new("nodeclaims", "Node claims by phase, node type and provider."),
                &["phase", "nodetype", "provider"],
            ))?,
            nodeclaims_cost: register(r, IntGaugeVec::new(
                Opts::new("nodeclaims_cost", format!("Sum of the cost of live (not failed) node claims, by tenant (namespace and vCluster) and provider, {COST_UNIT}.")),
                &["namespace", "vcluster", "provider"],
            ))?,
            nodeclaims_oldest: register(r, IntGaugeVec::new(
                Opts::new("nodeclaims_oldest_seconds", "Seconds the oldest claim of each phase on the way (Pending, Provisioning, Joining, Terminating) has been there: since its creation, for Terminating since its deletion."),
                &["phase"],
            ))?,
            nodeclaims_created: register(r, IntCounterVec::new(
                Opts::new("nodeclaims_created_total", "Node claims whose VirtualMachine autonodes created (a claim a warm VM served is not counted), by namespace, node pool (empty for a claim of no pool) and node type."),
                &["namespace", "nodepool", "nodetype"],
            ))?,
            nodeclaims_terminated: register(r, IntCounterVec::new(
                Opts::new("nodeclaims_terminated_total", "Node claims that ended, by namespace, node pool, node type and reason: deleted (its remote objects were removed) or failed (it turned Failed)."),
                &["namespace", "nodepool", "nodetype", "reason"],
            ))?,
            nodeclaims_disrupted: register(r, IntCounterVec::new(
                Opts::new("nodeclaims_disrupted_total", "Claims with a serving node that their pool deleted, by namespace, node pool and reason: Empty, Underutilized (consolidation), Drifted, Expired (replaced once their replacement was Available), Repaired (unhealthy, replaced), ScaledDown (more claims than replicas), HostMaintenance (its VM had to leave a drained host node and could not live-migrate; replaced)."),
                &["namespace", "nodepool", "reason"],
            ))?,
            vm_migrations: register(r, IntCounterVec::new(
                Opts::new("vm_migrations_total", "Live migrations of claims' VMs off host nodes being drained, by namespace, node pool and result: started (autonodes asked KubeVirt for one), succeeded, failed."),
                &["namespace", "nodepool", "result"],
            ))?,
            nodeclaim_duration: register(r, HistogramVec::new(
                HistogramOpts::new("nodeclaim_duration_seconds", "Time from claim creation until a stage (scheduled, provisioned, joined, ready) was reached, by how the claim started: warm (a warm VM served it) or cold (its VM was created for it).")
                    .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0]),
                &["stage", "start"],
            ))?,
            cluster_requests: {
                let requests = ClusterRequests::new()?;
                r.register(Box::new(requests.counter().clone()))?;
                requests
            },
            leader: register(r, prometheus::IntGauge::new(
                "leader",
                "1 while this replica holds the leader Lease and runs the controllers, else 0.",
            ))?,
            shard_members: register(r, prometheus::IntGauge::new(
                "shard_members",
                "Live members (replicas sharing the tenant namespaces) this replica sees; 0 without --shard-tenants.",
            ))?,
            tenant_namespaces: register(r, prometheus::IntGauge::new(
                "tenant_namespaces",
                "Namespaces with NodeClaims or NodePools.",
            ))?,
            tenant_namespaces_owned: register(r, prometheus::IntGauge::new(
                "tenant_namespaces_owned",
                "Namespaces with NodeClaims or NodePools that this replica acts for.",
            ))?,
            tenant_namespace_owner: register(r, IntGaugeVec::new(
                Opts::new("tenant_namespace_owner", "1 for each namespace this replica acts for; member is its member name (empty without --shard-tenants)."),
                &["namespace", "member"],
            ))?,
            nodepool_desired: register(r, IntGaugeVec::new(
                Opts::new("nodepool_desired_replicas", "Claims a node pool should have: spec.replicas, or the live claims of a dynamic pool."),
                &["namespace", "nodepool"],
            ))?,
            nodepool_ready: register(r, IntGaugeVec::new(
                Opts::new("nodepool_ready_replicas", "Available claims of a node pool."),
                &["namespace", "nodepool"],
            ))?,
            nodepool_registration_failures: register(r, IntGaugeVec::new(
                Opts::new("nodepool_registration_failures", "Claims of a node pool that failed in a row before their node was ready (launch, registration or initialization timeout, VM lost); from 3 on the pool backs off and NodeRegistrationHealthy is False."),
                &["namespace", "nodepool"],
            ))?,
            orphans_removed: register(r, IntCounterVec::new(
                Opts::new("orphans_removed_total", "Objects autonodes made whose NodeClaim no longer exists, removed by the orphan sweep, by kind (VirtualMachine, Secret, DataVolume, BootstrapToken, Node)."),
                &["kind"],
            ))?,
            kube_requests: register(r, Ok(crate::remote::request_metrics::KUBE_REQUESTS.clone()))?,
            build_info: register(r, IntGaugeVec::new(
                Opts::new("build_info", "Always 1: the version and git revision of the running build."),
                &["version", "revision"],
            ))?,
            registry,
            process_registry: {
                let p = Registry::new();
                p.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
                p
            },
        }
        .with_zero_series())
    }

    /// Every counter series that is known in advance starts at 0, so a rate or an alert on
    /// it has a series before its first event (`result="error"` of a healthy controller,
    /// `reason="failed"`, each kind the orphan sweep removes).
    fn with_zero_series(self) -> Self {
        for controller in CONTROLLERS {
            for result in RECONCILE_RESULTS {
                self.reconcile_total
                    .with_label_values(&[controller, result]);
            }
            for error in crate::controller::error::ERROR_LABELS {
                self.reconcile_errors
                    .with_label_values(&[controller, error]);
            }
        }
        // Without a pool or type yet: the series alerts sum over exist before the first claim.
        for reason in ["deleted", "failed"] {
            self.nodeclaims_terminated
                .with_label_values(&["", "", "", reason]);
        }
        for kind in [
            "VirtualMachine",
            "Secret",
            "DataVolume",
            "BootstrapToken",
            "Node",
        ] {
            self.orphans_removed.with_label_values(&[kind]);
        }
        self.nodeclaims_created.with_label_values(&["", "", ""]);
        self.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), REVISION])
            .set(1);
        self
    }

    /// Every metric's descriptor (name without the `autonodes_` prefix, help, labels), also
    /// of metrics that have no sample yet; for checks of dashboards and alerts.
    pub fn descs(&self) -> Vec<prometheus::core::Desc> {
        self.catalogue().into_iter().map(|(d, _)| d).collect()
    }

    /// Every metric's descriptor with its type (`counter`, `gauge`, `histogram`), in the
    /// order the metrics page lists them.
    pub fn catalogue(&self) -> Vec<(prometheus::core::Desc, &'static str)> {
        use prometheus::core::Collector;
        fn entry<C: Collector + Typed>(c: &C) -> (&dyn Collector, &'static str) {
            (c, C::TYPE)
        }
        let collectors: [(&dyn Collector, &'static str); 32] = [
            entry(&self.nodeclaims),
            entry(&self.nodeclaims_created),
            entry(&self.nodeclaims_terminated),
            entry(&self.nodeclaims_disrupted),
            entry(&self.vm_migrations),
            entry(&self.nodeclaim_duration),
            entry(&self.nodeclaims_oldest),
            entry(&self.nodeclaims_cost),
            entry(&self.nodepool_desired),
            entry(&self.nodepool_ready),
            entry(&self.nodepool_registration_failures),
            entry(&self.nodetype_capacity),
            entry(&self.nodetype_claimed),
            entry(&self.nodetype_available),
            entry(&self.nodetype_cost),
            entry(&self.nodetype_host_headroom),
            entry(&self.nodetype_addresses_free),
            entry(&self.warm_vms),
            entry(&self.warm_bindings),
            entry(&self.warm_vms_removed),
            entry(&self.orphans_removed),
            entry(&self.reconcile_total),
            entry(&self.reconcile_errors),
            entry(&self.reconcile_duration),
            entry(self.cluster_requests.counter()),
            entry(&self.kube_requests),
            entry(&self.leader),
            entry(&self.shard_members),
            entry(&self.tenant_namespaces),
            entry(&self.tenant_namespaces_owned),
            entry(&self.tenant_namespace_owner),
            entry(&self.build_info),
        ];
        collectors
            .iter()
            .flat_map(|(c, t)| c.desc().into_iter().map(|d| (d.clone(), *t)))
            .collect()
    }

    /// Drops the series of a pool that no longer exists: its disruptions and the claims it
    /// created and ended (one tenant's deleted pools leave nothing behind in `/metrics`).
    pub(crate) fn forget_pool(&self, namespace: &str, pool: &str) {
        let of_pool = [("namespace", namespace), ("nodepool", pool)];
        remove_where(&self.nodeclaims_disrupted, &of_pool);
        remove_where(&self.vm_migrations, &of_pool);
        remove_where(&self.nodeclaims_created, &of_pool);
        remove_where(&self.nodeclaims_terminated, &of_pool);
    }

    /// The metrics in Prometheus text format.
    pub(crate) fn encode(&self) -> String {
        let mut families = self.registry.gather();
        families.extend(self.process_registry.gather());
        TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
    }

    /// Counts one reconcile as `outcome` (one of [`RECONCILE_RESULTS`]), the kind of error
    /// it returned if any, and its duration.
    pub(crate) fn observe_reconcile(
        &self,
        controller: &str,
        started: std::time::Instant,
        outcome: &str,
        error: Option<&str>,
    ) {
        self.reconcile_total
            .with_label_values(&[controller, outcome])
            .inc();
        if let Some(error) = error {
            self.reconcile_errors
                .with_label_values(&[controller, error])
                .inc();
        }
        self.reconcile_duration
            .with_label_values(&[controller])
            .observe(started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_but_the_process_series_is_prefixed_and_has_help_text() {
        let m = Metrics::new().expect("metrics register");
        m.reconcile_total
            .with_label_values(&["nodeclaim", "ok"])
            .inc();
        m.nodeclaims_created
            .with_label_values(&["team-a", "workers", "small"])
            .inc();
        let text = m.encode();
        assert!(
            text.contains("autonodes_reconcile_total{controller=\"nodeclaim\",result=\"ok\"} 1"),
            "{text}"
        );
        // Known series exist at 0 before their first event.
        for series in [
            "autonodes_reconcile_total{controller=\"nodepool\",result=\"error\"} 0",
            "autonodes_nodeclaims_terminated_total{namespace=\"\",nodepool=\"\",nodetype=\"\",reason=\"failed\"} 0",
            "autonodes_orphans_removed_total{kind=\"BootstrapToken\"} 0",
            "autonodes_orphans_removed_total{kind=\"Node\"} 0",
        ] {
            assert!(text.contains(series), "{series}: {text}");
        }
        assert!(
            text.contains("# HELP autonodes_nodeclaims_created_total "),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "autonodes_build_info{{revision=\"{REVISION}\",version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.starts_with("autonodes_") || line.starts_with("process_"),
                "unprefixed metric: {line}"
            );
            assert!(
                !line.contains("instance=") && !line.contains("job="),
                "reserved label in {line}"
            );
        }
    }

    #[test]
    fn a_deleted_pools_series_go_and_other_pools_series_stay() {
        let m = Metrics::new().expect("metrics register");
        for (ns, pool) in [("team-a", "workers"), ("team-b", "workers")] {
            m.nodeclaims_created
                .with_label_values(&[ns, pool, "small"])
                .inc();
            m.nodeclaims_terminated
                .with_label_values(&[ns, pool, "small", "deleted"])
                .inc();
            m.nodeclaims_disrupted
                .with_label_values(&[ns, pool, "Empty"])
                .inc();
        }
        m.forget_pool("team-a", "workers");
        let text = m.encode();
        assert!(!text.contains("namespace=\"team-a\""), "{text}");
        for series in [
            "autonodes_nodeclaims_created_total{namespace=\"team-b\",nodepool=\"workers\",nodetype=\"small\"} 1",
            "autonodes_nodeclaims_disrupted_total{namespace=\"team-b\",nodepool=\"workers\",reason=\"Empty\"} 1",
            "autonodes_nodeclaims_terminated_total{namespace=\"\",nodepool=\"\",nodetype=\"\",reason=\"failed\"} 0",
        ] {
            assert!(text.contains(series), "{series}: {text}");
        }
    }

    #[test]
    fn every_cost_metric_says_its_unit() {
        let m = Metrics::new().expect("metrics register");
        let costs: Vec<_> = m
            .descs()
            .into_iter()
            .filter(|d| d.fq_name.ends_with("cost"))
            .collect();
        assert_eq!(costs.len(), 2);
        for d in costs {
            assert!(
                d.help.contains("in cost units"),
                "{}: {}",
                d.fq_name,
                d.help
            );
        }
    }
}
