//! Golden files for `autonodes render`: what a claim gets (NodeType, Secret, VirtualMachine)
//! for the vCluster reference examples and a few claims that use every user-facing knob.
//!
//! Run with `UPDATE_GOLDEN=1` to rewrite the files in `tests/golden/` after an intended
//! change, then review the diff.

use std::path::{Path, PathBuf};

use autonodes::render::{format_documents, render_documents, OutputFormat};
use autonodes_core::userdata::JoinParams;

/// The workspace root (this crate lives in `crates/autonodes`).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The golden files, next to this test.
fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A NodeClaim in namespace `tenant` with a fixed UID, so output is stable.
fn claim(name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: autonodes.io/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: {name}\n  namespace: tenant\n  uid: 6f1c1b8e-0d5e-4c1a-9a57-2b7f0c3e9d11\nspec:\n  vClusterRef:\n    name: tenant\n{spec_extra}"
    )
}

fn check_golden(
    name: &str,
    provider: &str,
    claim_text: &str,
    pin: Option<&str>,
    format: OutputFormat,
) {
    let provider_path = root().join("examples").join(provider);
    let docs = render_documents(
        &read(&provider_path),
        provider,
        claim_text,
        "claim.yaml",
        pin,
        &JoinParams::placeholder(),
    )
    .unwrap_or_else(|e| panic!("{name}: render failed: {e:#}"));
    let got = format_documents(&docs, format).expect("formats");
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("has parent")).expect("creates dir");
        std::fs::write(&path, &got).expect("writes golden");
        return;
    }
    let want = read(&path);
    assert!(
        got == want,
        "{name} differs from {} (run with UPDATE_GOLDEN=1 to accept):\n--- got ---\n{got}",
        path.display()
    );
}

#[test]
fn advanced_example_high_memory_node_matches_golden() {
    check_golden(
        "advanced-high-memory-node.yaml",
        "nodeprovider-advanced.yaml",
        &read(&root().join("examples/nodeclaim.yaml")),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn advanced_example_without_requirements_gets_the_standard_node_golden() {
    check_golden(
        "advanced-standard-node.yaml",
        "nodeprovider-advanced.yaml",
        &claim("standard-1", ""),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn minimal_example_matches_golden_in_json() {
    check_golden(
        "minimal-small-ubuntu-vm.json",
        "nodeprovider-minimal.yaml",
        &claim("small-1", ""),
        None,
        OutputFormat::Json,
    );
}

#[test]
fn types_example_resource_override_matches_golden() {
    check_golden(
        "types-mid-ubuntu-vm-2.yaml",
        "nodeprovider-types.yaml",
        &claim("mid-1", "  desiredCapacity:\n    cpu: 3\n"),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn types_example_merge_with_label_and_taint_matches_golden() {
    check_golden(
        "types-high-memory-node.yaml",
        "nodeprovider-types.yaml",
        &claim(
            "merge-1",
            "  requirements:\n    - key: vcluster.com/node-type\n      operator: In\n      values: [high-memory-node]\n",
        ),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn types_example_full_replacement_matches_golden_without_the_base_label() {
    let name = "types-different-vm-with-different-template-2.yaml";
    check_golden(
        name,
        "nodeprovider-types.yaml",
        &claim("replace-1", ""),
        Some("different-vm-with-different-template-2"),
        OutputFormat::Yaml,
    );
    let golden = read(&golden_dir().join(name));
    assert!(golden.contains("foo: baz"));
    assert!(
        !golden.contains("foo: bar"),
        "the base label must be absent"
    );
}

#[test]
fn claim_with_user_data_ssh_keys_labels_and_startup_taints_matches_golden() {
    let extra = r#"  properties:
    autonodes.io/user-data-template: vcluster
    autonodes.io/ssh-keys: |
      ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyOnly ops@example
    autonodes.io/user-data: |
      #cloud-config
      packages: [nfs-common]
      runcmd:
        - modprobe br_netfilter
        - [sysctl, -w, "net.ipv4.ip_forward=1"]
  labels:
    node-role.kubernetes.io/worker: ""
    team: "payments"
  taints:
    - key: dedicated
      value: "payments.v2_x-1"
      effect: NoSchedule
  startupTaints:
    - key: example.com/cni-not-ready
      effect: NoSchedule
  kubeletArgs:
    max-pods: "50"
"#;
    check_golden(
        "minimal-with-user-data.yaml",
        "nodeprovider-minimal.yaml",
        &claim("custom-1", extra),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn kubevirt_native_storage_node_gets_a_root_disk_on_its_class_data_disks_and_secondary_networks_golden(
) {
    check_golden(
        "kubevirt-native-storage-node.yaml",
        "nodeprovider-kubevirt-native.yaml",
        &read(&root().join("examples/nodeclaim-storage.yaml")),
        None,
        OutputFormat::Yaml,
    );
}

#[test]
fn kubevirt_native_isolated_node_has_a_tenant_network_instead_of_the_pod_network_golden() {
    check_golden(
        "kubevirt-native-isolated-node.yaml",
        "nodeprovider-kubevirt-native.yaml",
        &claim("isolated-1", ""),
        Some("isolated-node"),
        OutputFormat::Yaml,
    );
}

#[test]
fn kubevirt_native_static_address_node_gets_its_address_as_network_data_on_its_tenant_network_golden(
) {
    check_golden(
        "kubevirt-native-static-address-node.yaml",
        "nodeprovider-kubevirt-native.yaml",
        &claim("static-1", ""),
        Some("static-address-node"),
        OutputFormat::Yaml,
    );
}

#[test]
fn kubevirt_native_spread_node_of_a_pool_gets_anti_affinity_within_its_pool_and_host_node_presets_golden(
) {
    let claim_text = "apiVersion: autonodes.io/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: workers-x7k2p\n  namespace: tenant\n  uid: 6f1c1b8e-0d5e-4c1a-9a57-2b7f0c3e9d11\n  labels:\n    autonodes.io/nodepool: workers\nspec:\n  vClusterRef:\n    name: tenant\n";
    check_golden(
        "kubevirt-native-spread-node.yaml",
        "nodeprovider-kubevirt-native.yaml",
        claim_text,
        Some("spread-node"),
        OutputFormat::Yaml,
    );
}

#[test]
fn kubevirt_native_instancetype_node_names_its_instancetype_and_preference_golden() {
    check_golden(
        "kubevirt-native-instancetype-node.yaml",
        "nodeprovider-kubevirt-native.yaml",
        &claim("instancetype-1", ""),
        Some("instancetype-node"),
        OutputFormat::Yaml,
    );
}
