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

/// Runs `cloud-init devel net-convert` on `network_data` for `distro`, rendering it as
/// `output` (`eni`, `networkd`, `sysconfig`); returns every file it wrote, concatenated.
fn net_convert(dir: &Path, network_data: &str, output: &str, distro: &str) -> String {
    let input = dir.join(format!("network-{output}.yaml"));
    std::fs::write(&input, network_data).expect("network data written");
    let out_dir = dir.join(format!("out-{output}"));
    let out = Command::new("cloud-init")
        .args(["devel", "net-convert", "--kind", "yaml", "--network-data"])
        .arg(&input)
        .args(["--output-kind", output, "--distro", distro, "--directory"])
        .arg(&out_dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cloud-init does not run ({e}): run scripts/test-tools.sh (Debian's cloud-init)")
        });
    assert!(
        out.status.success(),
        "cloud-init refused the network data for {output}:\n{}{}\n{network_data}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = Vec::new();
    let mut dirs = vec![out_dir];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("output directory") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(std::fs::read_to_string(&path).expect("output file"));
            }
        }
    }
    files.join("\n")
}

#[test]
fn the_network_data_of_a_static_address_is_read_by_cloud_init_s_eni_networkd_and_sysconfig_renderers(
) {
    use autonodes_core::address_pool::{mac_for, PreparedAddressPool};
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = PreparedAddressPool::new(&autonodes_api::AddressPool {
        cidr: "10.20.0.0/24".into(),
        gateway: Some("10.20.0.1".into()),
        dns_servers: vec!["10.20.0.2".into()],
        exclude: vec![],
    })
    .expect("pool");
    let ip = pool.allocate(|_| false).expect("an address");
    let mac = mac_for(ip);
    let data = pool.network_data(ip);
    for (output, distro, wants) in [
        (
            "eni",
            "debian",
            vec![
                "iface eth0 inet static".to_string(),
                format!("address {ip}/24"),
                "route add default gw 10.20.0.1".to_string(),
                "dns-nameservers 10.20.0.2".to_string(),
                format!("ATTR{{address}}==\"{mac}\", NAME=\"eth0\""),
            ],
        ),
        (
            "networkd",
            "debian",
            vec![
                format!("MACAddress={mac}"),
                format!("Address={ip}/24"),
                "Gateway=10.20.0.1".to_string(),
                "DHCP=no".to_string(),
            ],
        ),
        (
            "sysconfig",
            "rhel",
            vec![
                format!("IPADDR={ip}"),
                "NETMASK=255.255.255.0".to_string(),
                "GATEWAY=10.20.0.1".to_string(),
                format!("HWADDR={mac}"),
                "BOOTPROTO=none".to_string(),
            ],
        ),
    ] {
        let rendered = net_convert(dir.path(), &data, output, distro);
        for want in wants {
            assert!(
                rendered.contains(&want),
                "{output}: no {want:?} in\n{rendered}\nfrom\n{data}"
            );
        }
        println!("cloud-init net-convert {output}: {ip} on {mac}, default route via 10.20.0.1");
    }

    // IPv6: the address and default route, no DHCP or router advertisements.
    let pool = PreparedAddressPool::new(&autonodes_api::AddressPool {
        cidr: "fd00:20::/64".into(),
        gateway: Some("fd00:20::1".into()),
        dns_servers: vec![],
        exclude: vec![],
    })
    .expect("pool");
    let ip = pool.allocate(|_| false).expect("an address");
    let rendered = net_convert(dir.path(), &pool.network_data(ip), "networkd", "debian");
    assert!(rendered.contains(&format!("Address={ip}/64")), "{rendered}");
    assert!(rendered.contains("Gateway=fd00:20::1"), "{rendered}");
}
