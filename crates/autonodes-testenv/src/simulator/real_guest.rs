//! Real guests instead of the simulated kubelet: for each VirtualMachine that runs, QEMU
//! boots a guest image ([`crate::qemu`]) with a NoCloud seed made from the VM's
//! `cloudInitNoCloud` user data exactly as KubeVirt makes it (`user-data` from the
//! Secret's `userdata` key, `meta-data` with `instance-id: <vmi>.<namespace>` and
//! `local-hostname: <vmi>`); the guest's own cloud-init, kubeadm and kubelet do the rest.
//! Deleting the VM (its VMI) powers the guest off. The image is chosen by the VM's
//! `containerDisk` image: one naming `prepared` boots the prepared image, any other the
//! stock one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::DynamicObject;
use kube::ResourceExt;
use serde_json::Value;

use crate::qemu::{BootOptions, Guest, GuestImage, PowerOff, Variant};

/// The real guests of one simulator run.
#[derive(Debug)]
pub struct RealGuests {
    /// Where each guest's seed, overlay disk and serial log go (`<dir>/<namespace>-<vm>`).
    pub work_dir: PathBuf,
    /// How guests are booted (memory, CPUs, the host ports they may reach).
    pub options: BootOptions,
    guests: Mutex<HashMap<String, Guest>>,
    serial_logs: Mutex<HashMap<String, PathBuf>>,
    power_offs: Arc<Mutex<HashMap<String, PowerOff>>>,
    pids: Mutex<Vec<u32>>,
}

impl RealGuests {
    /// Real guests booted with `options`, their files under `work_dir`.
    pub fn new(work_dir: PathBuf, options: BootOptions) -> Arc<Self> {
        Arc::new(RealGuests {
            work_dir,
            options,
            guests: Mutex::new(HashMap::new()),
            serial_logs: Mutex::new(HashMap::new()),
            power_offs: Arc::new(Mutex::new(HashMap::new())),
            pids: Mutex::new(Vec::new()),
        })
    }

    /// The serial console log of the guest of VM `namespace/name` (also after it stopped).
    pub fn serial_log(&self, namespace: &str, name: &str) -> Option<PathBuf> {
        self.serial_logs
            .lock()
            .ok()?
            .get(&format!("{namespace}/{name}"))
            .cloned()
    }

    /// Everything the guest of VM `namespace/name` wrote to its serial console (also after
    /// it stopped); empty when it never booted.
    pub fn serial_text(&self, namespace: &str, name: &str) -> String {
        self.serial_log(namespace, name)
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// How the guest of VM `namespace/name` ended once powered off: by itself after ACPI
    /// ([`PowerOff::Clean`]) or killed after its grace period (`None` while it runs).
    pub fn power_off(&self, namespace: &str, name: &str) -> Option<PowerOff> {
        self.power_offs
            .lock()
            .ok()?
            .get(&format!("{namespace}/{name}"))
            .copied()
    }

    /// How many guests run now.
    pub fn running(&self) -> usize {
        self.guests.lock().map(|g| g.len()).unwrap_or(0)
    }

    /// The QEMU processes of every guest booted so far that still exist (not yet reaped).
    pub fn qemu_alive(&self) -> Vec<u32> {
        self.pids
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect()
    }

    /// Boots the guest of `vmi` unless it runs already, with the VM's network data (if it
    /// has any) and its first interface's MAC address (if it names one).
    pub(crate) fn ensure(
        &self,
        vm: &DynamicObject,
        vmi: &DynamicObject,
        ns: &str,
        user_data: &str,
        network_data: Option<&str>,
    ) -> Result<(), String> {
        let uid = vmi.uid().unwrap_or_default();
        let mut guests = self.guests.lock().map_err(|_| "guest table poisoned")?;
        if guests.contains_key(&uid) {
            return Ok(());
        }
        let name = vm.name_any();
        let variant = variant_of(vm);
        let image = GuestImage::cached(variant).map_err(|e| e.to_string())?;
        let meta_data = format!("instance-id: {name}.{ns}\nlocal-hostname: {name}\n");
        let dir = self
            .work_dir
            .join(format!("{ns}-{name}-{}", &uid[..uid.len().min(8)]));
        let options = BootOptions {
            mac_address: super::guest::first_mac(vm).map(str::to_string),
            ..self.options.clone()
        };
        let guest = Guest::boot_with(&image, user_data, &meta_data, network_data, &dir, &options)
            .map_err(|e| format!("booting the {} guest: {e}", variant.name()))?;
        // A VM that stopped and starts again: how its last guest ended is history now.
        if let Ok(mut p) = self.power_offs.lock() {
            p.remove(&format!("{ns}/{name}"));
        }
        tracing::info!(vm = %format!("{ns}/{name}"), image = variant.name(), pid = ?guest.pid(), "real guest booted");
        if let (Some(pid), Ok(mut pids)) = (guest.pid(), self.pids.lock()) {
            pids.push(pid);
        }
        if let Ok(mut logs) = self.serial_logs.lock() {
            logs.insert(
                format!("{ns}/{name}"),
                guest.serial_log_path().to_path_buf(),
            );
        }
        guests.insert(uid, guest);
        Ok(())
    }

    /// Powers the guest of `vmi` off in the background, as KubeVirt does: ACPI, then a kill
    /// once the VMI's `terminationGracePeriodSeconds` passed (KubeVirt's default, 30 s,
    /// when the VMI names none).
    pub(crate) fn stop(&self, vmi: &DynamicObject) {
        let uid = vmi.uid().unwrap_or_default();
        let guest = self.guests.lock().ok().and_then(|mut g| g.remove(&uid));
        if let Some(mut guest) = guest {
            let name = vmi.name_any();
            let key = format!("{}/{name}", vmi.namespace().unwrap_or_default());
            let grace = grace_period(vmi);
            let power_offs = self.power_offs.clone();
            tokio::spawn(async move {
                let how = match guest.shutdown(grace).await {
                    Ok(how) => {
                        tracing::info!(vmi = %name, ?how, "real guest powered off");
                        how
                    }
                    Err(e) => {
                        tracing::warn!(vmi = %name, error = %e, "powering the guest off failed; killed");
                        PowerOff::Killed
                    }
                };
                if let Ok(mut p) = power_offs.lock() {
                    p.insert(key, how);
                }
            });
        }
    }
}

/// KubeVirt's grace period when a VMI names none.
const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// How long a guest may take to power off after ACPI: the VMI's
/// `spec.terminationGracePeriodSeconds`, else KubeVirt's default.
fn grace_period(vmi: &DynamicObject) -> Duration {
    vmi.data
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_GRACE_PERIOD, Duration::from_secs)
}

/// The image a VM boots: `prepared` when its containerDisk image names it, else `stock`.
fn variant_of(vm: &DynamicObject) -> Variant {
    let prepared = vm
        .data
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/containerDisk/image").and_then(Value::as_str))
        .any(|image| image.contains("prepared"));
    if prepared {
        Variant::Prepared
    } else {
        Variant::Stock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(spec: Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm-1", "namespace": "ns"},
            "spec": spec,
        }))
        .expect("a VMI")
    }

    #[test]
    fn a_guest_gets_the_vmis_grace_period_and_kubevirts_thirty_seconds_without_one() {
        assert_eq!(
            grace_period(&vmi(
                serde_json::json!({"terminationGracePeriodSeconds": 5})
            )),
            Duration::from_secs(5)
        );
        assert_eq!(
            grace_period(&vmi(
                serde_json::json!({"terminationGracePeriodSeconds": 0})
            )),
            Duration::ZERO
        );
        assert_eq!(
            grace_period(&vmi(serde_json::json!({}))),
            Duration::from_secs(30)
        );
    }
}
