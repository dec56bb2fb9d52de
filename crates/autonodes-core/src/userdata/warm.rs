//! The user data of a warm VM: no join at boot, an agent that waits for the VM's binding
//! (`templates/warm.hbs`, `templates/warm-agent.py`; see [`crate::warm`]).

use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    parse_user_cloud_config, registry, within_limit, written_file, UserCloudConfig, UserDataError,
};

const AGENT: &str = include_str!("../../templates/warm-agent.py");

/// Where the agent's configuration is written.
pub const CONFIG_PATH: &str = "/etc/autonodes/warm/config.json";
/// Where the VM's token is written (the agent deletes it once bound).
pub const TOKEN_PATH: &str = "/etc/autonodes/warm/token";
/// Where the host API server's CA is written.
pub const HOST_CA_PATH: &str = "/etc/autonodes/warm/host-ca.crt";
/// Where the agent is written.
pub const AGENT_PATH: &str = "/etc/autonodes/warm/agent.py";
/// Where the agent's systemd unit is written.
pub const UNIT_PATH: &str = "/etc/systemd/system/autonodes-warm.service";

const UNIT: &str = "[Unit]
Description=autonodes warm-VM agent: waits for this VM's binding, then joins
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/python3 /etc/autonodes/warm/agent.py
Restart=on-failure
RestartSec=5
StandardOutput=journal+console
StandardError=journal+console
";

/// What a warm VM's user data says. Its `Debug` leaves the token out.
#[derive(Clone, Copy)]
pub struct WarmUserDataInput<'a> {
    /// The VM's name.
    pub vm_name: &'a str,
    /// The host API server as the VM reaches it (`https://host:port`).
    pub server: &'a str,
    /// The host API server's CA (PEM).
    pub host_ca_pem: &'a str,
    /// The VM's own ServiceAccount token.
    pub token: &'a str,
    /// The VM's namespace on the host.
    pub namespace: &'a str,
    /// Name of the VM's binding Secret.
    pub binding: &'a str,
    /// Name of the VM's Lease and of its ServiceAccount (which the agent deletes once it
    /// read its binding, revoking its token).
    pub lease: &'a str,
    /// The type's cloud-config (property `autonodes.io/user-data`).
    pub user_cloud_config: Option<&'a str>,
    /// The type's SSH keys.
    pub ssh_keys: &'a [String],
}

impl std::fmt::Debug for WarmUserDataInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmUserDataInput")
            .field("vm_name", &self.vm_name)
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("binding", &self.binding)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct WarmData<'a> {
    ssh_authorized_keys: Vec<String>,
    user_extra: Map<String, Value>,
    user_write_files: Vec<Value>,
    user_runcmd: Vec<Value>,
    config_path: &'static str,
    config: String,
    token_path: &'static str,
    token: &'a str,
    host_ca_path: &'static str,
    host_ca: &'a str,
    agent_path: &'static str,
    agent: &'static str,
    unit_path: &'static str,
    unit: &'static str,
}

/// Renders the user data of a warm VM (at most 64 KiB).
pub fn render_warm_user_data(input: &WarmUserDataInput<'_>) -> Result<String, UserDataError> {
    let user = match input.user_cloud_config {
        Some(text) => parse_user_cloud_config(text)?,
        None => UserCloudConfig::default(),
    };
    let mut ssh_authorized_keys = user.ssh_authorized_keys;
    ssh_authorized_keys.extend(input.ssh_keys.iter().cloned());
    let config = serde_json::json!({
        "server": input.server,
        "namespace": input.namespace,
        "binding": input.binding,
        "lease": input.lease,
        "account": input.lease,
        "vm": input.vm_name,
        "heartbeatSeconds": crate::warm::HEARTBEAT_INTERVAL.as_secs(),
        "pollSeconds": crate::warm::BINDING_POLL_INTERVAL.as_secs(),
    })
    .to_string();
    let data = WarmData {
        ssh_authorized_keys,
        user_extra: user.extra,
        user_write_files: user.write_files,
        user_runcmd: user.runcmd,
        config_path: CONFIG_PATH,
        config,
        token_path: TOKEN_PATH,
        token: input.token,
        host_ca_path: HOST_CA_PATH,
        host_ca: input.host_ca_pem,
        agent_path: AGENT_PATH,
        agent: AGENT,
        unit_path: UNIT_PATH,
        unit: UNIT,
    };
    let text = registry()?
        .render("warm", &data)
        .map_err(|e| UserDataError::Template {
            template: "warm",
            message: e.to_string(),
        })?;
    within_limit(text)
}

/// What a warm VM's agent is configured with, read back from its user data (the simulator
/// and tests act as the agent with it).
#[derive(Clone, PartialEq, Eq)]
pub struct WarmAgent {
    /// The host API server.
    pub server: String,
    /// The host's CA (PEM).
    pub host_ca_pem: String,
    /// The VM's token.
    pub token: String,
    /// The VM's namespace.
    pub namespace: String,
    /// Its binding Secret.
    pub binding: String,
    /// Its Lease.
    pub lease: String,
}

impl std::fmt::Debug for WarmAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmAgent")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("binding", &self.binding)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The agent's configuration in a warm VM's user data; `None` when the user data is not a
/// warm VM's.
pub fn read_warm_agent(user_data: &str) -> Option<WarmAgent> {
    let file = |path: &str| written_file(user_data, path);
    let config: Value = serde_json::from_str(&file(CONFIG_PATH)?).ok()?;
    let text = |k: &str| config.get(k).and_then(Value::as_str).map(str::to_string);
    Some(WarmAgent {
        server: text("server")?,
        host_ca_pem: file(HOST_CA_PATH)?,
        token: file(TOKEN_PATH)?,
        namespace: text("namespace")?,
        binding: text("binding")?,
        lease: text("lease")?,
    })
}
