//! What a simulator run is told: how the VMs behave ([`SimMode`]) and the rest of its
//! options ([`SimOptions`]).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::guest;
use super::real_guest;

/// How the simulated VMs behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimMode {
    /// Boot at once and join.
    #[default]
    Normal,
    /// Never boot: the VMI stays `Scheduling`, the VM never turns ready.
    NeverBoot,
    /// Boot (VMI `Running`, VM ready) but never register a Node.
    NeverJoin,
    /// Boot only after this long (counted from the VMI's creation), then join.
    SlowBoot(Duration),
}

impl SimMode {
    /// How long after its VMI is created a guest boots; None for never.
    pub fn boot_delay(&self) -> Option<Duration> {
        match self {
            SimMode::Normal | SimMode::NeverJoin => Some(Duration::ZERO),
            SimMode::NeverBoot => None,
            SimMode::SlowBoot(d) => Some(*d),
        }
    }
}

impl FromStr for SimMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(SimMode::Normal),
            "never-boot" => Ok(SimMode::NeverBoot),
            "never-join" => Ok(SimMode::NeverJoin),
            _ => {
                let delay = s.strip_prefix("slow-boot=").ok_or_else(|| {
                    format!(
                        "unknown mode {s:?}: use normal, never-boot, never-join or slow-boot=DURATION"
                    )
                })?;
                guest::parse_duration(delay)
                    .map(SimMode::SlowBoot)
                    .ok_or_else(|| {
                        format!("slow-boot: {delay:?} is not a duration like 20s or 1m30s")
                    })
            }
        }
    }
}

impl std::fmt::Display for SimMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimMode::Normal => f.write_str("normal"),
            SimMode::NeverBoot => f.write_str("never-boot"),
            SimMode::NeverJoin => f.write_str("never-join"),
            SimMode::SlowBoot(d) => write!(f, "slow-boot={}ms", d.as_millis()),
        }
    }
}

/// Options of a simulator run.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// How the VMs behave.
    pub mode: SimMode,
    /// Only VMs in this namespace (default: all namespaces).
    pub namespace: Option<String>,
    /// The host node new VMIs run on (`status.nodeName`), unless the host has a cordoned
    /// Node of that name (then another of its Nodes).
    pub host_node_name: String,
    /// How often a failed join is retried until kubeadm's discovery timeout.
    pub join_retry_interval: Duration,
    /// How often running VMs are looked at again (Node still Ready, …).
    pub resync_interval: Duration,
    /// How often objects whose VirtualMachine is gone are swept (garbage collection).
    pub sweep_interval: Duration,
    /// Boot real guests with QEMU instead of playing the kubelet (`None`: simulated).
    pub real_guests: Option<Arc<real_guest::RealGuests>>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            mode: SimMode::Normal,
            namespace: None,
            host_node_name: "kubevirt-host-0".to_string(),
            join_retry_interval: Duration::from_secs(1),
            resync_interval: Duration::from_secs(120),
            sweep_interval: Duration::from_secs(10),
            real_guests: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_from_the_command_line() {
        assert_eq!("normal".parse::<SimMode>(), Ok(SimMode::Normal));
        assert_eq!("never-boot".parse::<SimMode>(), Ok(SimMode::NeverBoot));
        assert_eq!("never-join".parse::<SimMode>(), Ok(SimMode::NeverJoin));
        assert_eq!(
            "slow-boot=20s".parse::<SimMode>(),
            Ok(SimMode::SlowBoot(Duration::from_secs(20)))
        );
        assert!("slow-boot=soon".parse::<SimMode>().is_err());
        assert!("fast".parse::<SimMode>().is_err());
        assert_eq!(SimMode::NeverBoot.boot_delay(), None);
    }
}
