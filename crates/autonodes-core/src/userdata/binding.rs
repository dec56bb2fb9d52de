//! The user data a warm VM gets with its binding: the claim's SSH keys and user data that
//! the VM did not boot with, for cloud-init to apply to the running VM (see
//! [`crate::warm::binding`]).

use serde_json::{Map, Value};

use super::{parse_user_cloud_config, within_limit, UserCloudConfig, UserDataError};

/// The cloud-config keys a binding can carry: cloud-init applies them to a running VM with
/// its `write_files`, `ssh` and `runcmd` modules. Any other key is applied only when a VM
/// first boots, so a claim whose user data sets one is served cold.
pub const AT_BINDING_KEYS: &[&str] = &["ssh_authorized_keys", "write_files", "runcmd"];

/// Why `user_cloud_config` (a claim's `autonodes.io/user-data`) cannot be given with a
/// warm VM's binding: it is not a cloud-config autonodes reads, or it sets a key that
/// only a VM's first boot applies. `None` when it can.
pub fn at_binding_problem(user_cloud_config: Option<&str>) -> Option<String> {
    let user = match user_cloud_config.map(parse_user_cloud_config) {
        None => return None,
        Some(Ok(user)) => user,
        Some(Err(e)) => return Some(e.to_string()),
    };
    let mut first_boot = user.extra.keys().map(|k| {
        let shown: String = k.chars().take(64).collect();
        format!("{shown:?}")
    });
    let first = first_boot.next()?;
    let more = first_boot.count();
    let others = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    Some(format!(
        "property autonodes.io/user-data sets {first}{others}, which cloud-init applies only when a VM first boots; a warm VM is given only {} with its binding",
        AT_BINDING_KEYS.join(", ")
    ))
}

/// Renders the cloud-config a warm VM gets with its binding, of what its claim has that
/// the VM did not boot with (`user_cloud_config`, the claim's user data; `ssh_keys`, its
/// SSH keys): the SSH keys (the user data's `ssh_authorized_keys` and `ssh_keys`), files
/// and commands, as JSON (which cloud-init reads as YAML; the agent writes it to
/// `/etc/autonodes/warm/binding-user-data.json`), each key only where it has entries. The
/// VM's host keys are kept. Files marked `defer` are written with the others (the VM's
/// users exist by then). At most 64 KiB; a key other than [`AT_BINDING_KEYS`] is an error
/// ([`at_binding_problem`]).
pub fn render_binding_user_data(
    user_cloud_config: Option<&str>,
    ssh_keys: &[String],
) -> Result<String, UserDataError> {
    if let Some(problem) = at_binding_problem(user_cloud_config) {
        return Err(UserDataError::InvalidUserCloudConfig(problem));
    }
    let user = match user_cloud_config {
        Some(text) => parse_user_cloud_config(text)?,
        None => UserCloudConfig::default(),
    };
    let mut keys = user.ssh_authorized_keys;
    keys.extend(ssh_keys.iter().cloned());
    let write_files: Vec<Value> = user
        .write_files
        .into_iter()
        .map(|mut f| {
            if let Value::Object(m) = &mut f {
                m.remove("defer");
            }
            f
        })
        .collect();
    // Only what is there: the agent runs a module only for its key, and an empty list would
    // not hide the boot's (cloud-init would read the VM's own files and commands again).
    let mut config = Map::new();
    if !keys.is_empty() {
        config.insert("ssh_deletekeys".into(), Value::Bool(false));
        config.insert("ssh_authorized_keys".into(), keys.into());
    }
    if !write_files.is_empty() {
        config.insert("write_files".into(), Value::Array(write_files));
    }
    if !user.runcmd.is_empty() {
        config.insert("runcmd".into(), Value::Array(user.runcmd));
    }
    within_limit(Value::Object(config).to_string())
}
