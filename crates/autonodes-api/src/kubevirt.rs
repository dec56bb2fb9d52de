//! The KubeVirt kinds autonodes reads and writes on host clusters, as dynamic objects.

use kube_core::GroupVersionKind;
use kube_core::{ApiResource, DynamicObject};

/// `kubevirt.io/v1` VirtualMachine.
pub fn virtual_machine() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    )
}

/// `kubevirt.io/v1` VirtualMachineInstance.
pub fn virtual_machine_instance() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

/// `cdi.kubevirt.io/v1beta1` DataVolume.
pub fn data_volume() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        "datavolumes",
    )
}

/// True when a VirtualMachine reports `status.ready: true`.
pub fn vm_ready(vm: &DynamicObject) -> bool {
    vm.data
        .pointer("/status/ready")
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// The phase of a VirtualMachineInstance (`Pending`, `Scheduling`, `Running`, ...).
pub fn vmi_phase(vmi: &DynamicObject) -> Option<&str> {
    vmi.data.pointer("/status/phase").and_then(|v| v.as_str())
}

/// The first IP address a VirtualMachineInstance reports.
pub fn vmi_ip(vmi: &DynamicObject) -> Option<&str> {
    vmi.data
        .pointer("/status/interfaces/0/ipAddress")
        .and_then(|v| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).expect("valid object")
    }

    #[test]
    fn readiness_is_read_from_vm_status_and_vmi_phase() {
        let vm = obj(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},"status":{"ready":true}}),
        );
        assert!(vm_ready(&vm));
        let vm = obj(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"}}),
        );
        assert!(!vm_ready(&vm));
        let vmi = obj(
            json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"a"},
            "status":{"phase":"Running","interfaces":[{"ipAddress":"10.0.0.7"}]}}),
        );
        assert_eq!(vmi_phase(&vmi), Some("Running"));
        assert_eq!(vmi_ip(&vmi), Some("10.0.0.7"));
    }
}
