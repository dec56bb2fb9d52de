//! The controllers' settings (from `autonodes run` flags) and their defaults.

use std::time::Duration;

use autonodes_core::kubeconfig::KubeconfigPolicy;

/// Settings of the controllers (from `autonodes run` flags).
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Namespace holding host-cluster kubeconfig Secrets (and the leader Lease).
    pub namespace: String,
    /// How long a VM may take to run before its claim fails.
    pub launch_timeout: Duration,
    /// How long a running VM's Node may take to join before its claim fails.
    pub registration_timeout: Duration,
    /// How long a joined Node may take to be Ready without startup taints before its
    /// claim fails.
    pub initialization_timeout: Duration,
    /// How long an initialized Node may stay not Ready before a pool replaces it (`None`:
    /// never).
    pub node_repair_after: Option<Duration>,
    /// How long draining a Node may take before it is deleted anyway.
    pub drain_timeout: Duration,
    /// The longest any drain waits, whatever the pool's `terminationGracePeriod`
    /// (`--max-drain-duration`).
    pub max_drain_duration: Duration,
    /// How dynamic pools batch bursts of pending pods (`--batch-idle-duration`,
    /// `--batch-max-duration`).
    pub batch: autonodes_core::pool::dynamic::Batch,
    /// What kubeconfig Secrets may contain beyond the defaults.
    pub kubeconfig_policy: KubeconfigPolicy,
    /// How often the orphan sweep looks for objects whose claim is gone.
    pub orphan_sweep_interval: Duration,
    /// Which namespaces' vCluster configurations (`vc-config-*` Secrets) become NodePools.
    pub vcluster_import: ImportScope,
    /// Where stock images download the kubelet and kubeadm (`--kubernetes-download-url`).
    pub kubernetes_download_url: String,
    /// The most claims (being deleted included) pools may bring one namespace to
    /// (`--max-claims-per-namespace`).
    pub max_claims_per_namespace: usize,
    /// Whether a namespace needs a NodeQuota covering it to claim anything
    /// (`--require-quota`).
    pub require_quota: bool,
    /// Whether the `capi.autonodes.io` mirror runs (`--capi-mirror`).
    pub capi_mirror: bool,
    /// How many tenant clusters a namespace may use and how many bytes of tenant answers
    /// this process holds at once (`--max-tenant-clusters-per-namespace`,
    /// `--tenant-answer-budget`, `--tenant-answer-budget-per-namespace`).
    pub tenant_limits: crate::remote::clients::TenantLimits,
    /// This installation's id (`--installation-id`): the value of the
    /// `autonodes.io/installation` label on everything it creates in host and tenant
    /// clusters. Empty: the UID of the namespace in `namespace`, read at start.
    pub installation: String,
    /// Where host and tenant clients may connect ([`crate::remote::egress`]); the management
    /// cluster's API server (its `kubernetes` Service, that Service's endpoints, and
    /// `management_server`) is added at start.
    pub egress: crate::remote::egress::Egress,
    /// The management cluster's API server as this process reaches it (`host:port`), also
    /// refused to host and tenant clients.
    pub management_server: Option<String>,
    /// The management cluster's URL and CA, for warm VMs on a `local` host.
    pub local_host: crate::remote::clients::LocalHost,
}

/// The installation id of [`ControllerConfig::default`] (tests and the playground).
pub(crate) const DEFAULT_INSTALLATION: &str = autonodes_api::DEFAULT_INSTALLATION;

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: "autonodes-system".into(),
            launch_timeout: Duration::from_secs(600),
            registration_timeout: Duration::from_secs(900),
            initialization_timeout: Duration::from_secs(900),
            node_repair_after: Some(Duration::from_secs(600)),
            drain_timeout: Duration::from_secs(120),
            max_drain_duration: Duration::from_secs(24 * 3600),
            batch: autonodes_core::pool::dynamic::Batch::default(),
            kubeconfig_policy: KubeconfigPolicy::default(),
            orphan_sweep_interval: Duration::from_secs(300),
            vcluster_import: ImportScope::Off,
            kubernetes_download_url: autonodes_core::userdata::DEFAULT_DOWNLOAD_URL.to_string(),
            max_claims_per_namespace:
                autonodes_core::pool::limits::DEFAULT_MAX_CLAIMS_PER_NAMESPACE,
            require_quota: false,
            capi_mirror: false,
            tenant_limits: Default::default(),
            installation: DEFAULT_INSTALLATION.to_string(),
            egress: crate::remote::egress::Egress::default(),
            management_server: None,
            local_host: Default::default(),
        }
    }
}

/// Which namespaces' vCluster configurations are imported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ImportScope {
    /// None: the import is off.
    #[default]
    Off,
    /// Every namespace.
    All,
    /// These namespaces.
    Namespaces(Vec<String>),
}

impl ImportScope {
    /// Reads the flag: empty or `off` is off, `*` every namespace, else a comma-separated
    /// list of namespaces.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s == "off" {
            return Ok(ImportScope::Off);
        }
        if s == "*" {
            return Ok(ImportScope::All);
        }
        let namespaces: Vec<String> = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(bad) = namespaces
            .iter()
            .find(|n| !autonodes_core::names::is_dns_label(n))
        {
            return Err(format!("{bad:?} is not a namespace name"));
        }
        Ok(ImportScope::Namespaces(namespaces))
    }
}
