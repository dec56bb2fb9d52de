//! Every user data autonodes renders is a cloud-config that cloud-init itself accepts:
//! Debian's `cloud-init schema` (installed by `scripts/test-tools.sh`) checks each
//! template, for a prepared and a stock image, for tenants that need each kubeadm API
//! version, with and without a user cloud-config and SSH keys, and the user data of every
//! golden file.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use autonodes_core::kubeversion::KubeVersion;
use autonodes_core::userdata::{self, JoinParams, JoinTemplate, UserDataInput};
use common::repo;
use k8s_openapi::api::core::v1::Taint;
use serde_json::Value;

/// Runs `cloud-init schema` on `user_data`; returns its verdict and output.
fn schema(dir: &Path, name: &str, user_data: &str) -> (bool, String) {
    let file = dir.join(name);
    std::fs::write(&file, user_data).expect("user data written");
    let out = Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cloud-init does not run ({e}): run scripts/test-tools.sh (Debian's cloud-init)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    }
}

#[test]
fn every_template_image_kind_and_kubeadm_version_renders_a_cloud_config_cloud_init_accepts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let labels = BTreeMap::from([
        ("autonodes.io/node-type".to_string(), "standard".to_string()),
        (
            "workload".to_string(),
            "a \"quoted\" value: yes".to_string(),
        ),
    ]);
    let taints = [
        taint("autonodes.io/unregistered", "NoExecute"),
        taint("dedicated", "NoSchedule"),
    ];
    let args = BTreeMap::from([("max-pods".to_string(), "50".to_string())]);
    let keys = vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample ops@example".to_string()];
    let user = "#cloud-config\npackages: [htop]\nruncmd:\n  - echo first\nwrite_files:\n  - path: /etc/motd\n    content: hello\n    permissions: '0644'\n";
    let mut checked = 0;
    for template in [JoinTemplate::Kubeadm, JoinTemplate::Vcluster] {
        for prepared in [false, true] {
            for version in [
                KubeVersion::new(1, 20, 2),
                KubeVersion::new(1, 27, 3),
                KubeVersion::new(1, 33, 1),
            ] {
                for user_config in [None, Some(user)] {
                    let join = JoinParams {
                        kubernetes_version: version,
                        ..JoinParams::placeholder()
                    };
                    let input = UserDataInput {
                        template,
                        node_name: "tenant-node-1",
                        join: &join,
                        node_labels: &labels,
                        taints: &taints,
                        kubelet_args: &args,
                        user_cloud_config: user_config,
                        ssh_keys: if user_config.is_some() { &keys } else { &[] },
                        image_prepared: prepared,
                        download_url: user_config.map(|_| "http://10.0.2.2:8080/k8s"),
                    };
                    let ud = userdata::render_user_data(&input).expect("renders");
                    let name = format!(
                        "{}-{}-{version}-{}.yaml",
                        template.name(),
                        if prepared { "prepared" } else { "stock" },
                        if user_config.is_some() {
                            "user"
                        } else {
                            "plain"
                        }
                    );
                    let (ok, shown) = schema(dir.path(), &name, &ud);
                    assert!(ok, "{name}: cloud-init schema refuses it:\n{shown}\n{ud}");
                    checked += 1;
                }
            }
        }
    }
    println!("cloud-init schema: {checked} rendered user data, all valid");
    assert_eq!(checked, 24);
}

#[test]
fn the_user_data_of_every_golden_file_is_a_cloud_config_cloud_init_accepts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let golden = repo().join("crates/autonodes/tests/golden");
    let mut checked = 0;
    let mut files: Vec<_> = std::fs::read_dir(&golden)
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("golden readable");
        let docs: Vec<Value> = if file.extension().is_some_and(|e| e == "json") {
            let list: Value = serde_json::from_str(&text).expect("golden JSON");
            list["items"].as_array().cloned().unwrap_or_default()
        } else {
            autonodes_core::yaml::from_multiple(&text).expect("golden YAML")
        };
        for doc in docs.iter().filter(|d| d["kind"] == "Secret") {
            let ud = doc["stringData"]["userdata"]
                .as_str()
                .expect("the Secret holds the user data");
            let name = file
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string();
            let (ok, shown) = schema(dir.path(), &name, ud);
            assert!(ok, "{name}: cloud-init schema refuses it:\n{shown}");
            println!("cloud-init schema: {name}: {}", shown.trim());
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} golden user data found");
}

#[test]
fn a_warm_vms_user_data_is_a_cloud_config_cloud_init_accepts_and_its_agent_is_python_that_compiles()
{
    use autonodes_core::userdata::warm::{render_warm_user_data, WarmUserDataInput, AGENT_PATH};
    let dir = tempfile::tempdir().expect("temp dir");
    let keys = vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC0 test".to_string()];
    for user in [
        None,
        Some("#cloud-config\nruncmd:\n  - [echo, hello]\npackages: [jq]\n"),
    ] {
        let text = render_warm_user_data(&WarmUserDataInput {
            vm_name: "warm-small-abcde",
            server: "https://10.96.0.1:443",
            host_ca_pem: "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBADAKBggqhkjOPQQDAjAjMSEwHwYDVQQDDBhrM3Mtc2Vy\n-----END CERTIFICATE-----\n",
            token: "eyJhbGciOiJSUzI1NiJ9.e30.c2ln",
            namespace: "vms",
            binding: "warm-small-abcde-binding",
            lease: "warm-small-abcde-warm",
            user_cloud_config: user,
            ssh_keys: &keys,
        })
        .expect("rendered");
        let (ok, out) = schema(dir.path(), "warm.yaml", &text);
        assert!(ok, "cloud-init refused the warm user data:\n{out}\n{text}");
        // The agent as cloud-init writes it compiles with the guest's Python 3.
        let doc: Value = autonodes_core::yaml::from_str(&text).expect("YAML");
        let agent = doc["write_files"]
            .as_array()
            .expect("write_files")
            .iter()
            .find(|f| f["path"] == AGENT_PATH)
            .and_then(|f| f["content"].as_str())
            .expect("the agent");
        let file = dir.path().join("agent.py");
        std::fs::write(&file, agent).expect("agent written");
        let out = Command::new("python3")
            .args(["-m", "py_compile"])
            .arg(&file)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_user_data_a_warm_vms_binding_carries_is_a_cloud_config_cloud_init_accepts() {
    use autonodes_core::userdata::binding::render_binding_user_data;
    let dir = tempfile::tempdir().expect("temp dir");
    let keys = vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC0 claim".to_string()];
    for user in [
        None,
        Some("#cloud-config\nruncmd:\n  - [echo, hello]\n  - 'echo \"a: b\"'\nwrite_files:\n  - path: /etc/example\n    content: x\n    permissions: '0600'\n    defer: true\nssh_authorized_keys: [ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC1 data]\n"),
    ] {
        // cloud-init reads it with --file; `schema` checks the same keys in a cloud-config.
        let json = render_binding_user_data(user, &keys).expect("rendered");
        let (ok, out) = schema(dir.path(), "binding.yaml", &format!("#cloud-config\n{json}\n"));
        assert!(ok, "cloud-init refused the binding's user data:\n{out}\n{json}");
    }
}
