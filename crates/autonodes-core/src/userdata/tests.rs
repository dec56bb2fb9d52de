//! Tests of [`super`].

use super::*;
use serde_json::json;

/// An EC test CA (also read by the controller's render tests); its hash was computed with
/// kubeadm's documented pipeline:
/// `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum`.
const TEST_CA: &str = include_str!("test-ca.pem");
const TEST_CA_HASH: &str =
    "sha256:2917f5ab7ab656c6c2585c6a715cfb777c242f7a357a5ba18a4c21849d401d6a";

fn join() -> JoinParams {
    JoinParams {
        api_server_endpoint: "10.0.0.1:6443".into(),
        token: "abcdef.0123456789abcdef".into(),
        ca_cert_hashes: vec![TEST_CA_HASH.into()],
        join_script_url: None,
        ca_pem: None,
        kubernetes_version: KubeVersion::new(1, 30, 2),
        download_url: DEFAULT_DOWNLOAD_URL.into(),
    }
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(str::to_string),
        effect: effect.into(),
        time_added: None,
    }
}

struct Fixture {
    join: JoinParams,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    args: BTreeMap<String, String>,
    keys: Vec<String>,
}

impl Fixture {
    fn new() -> Self {
        Self {
            join: join(),
            labels: BTreeMap::from([
                (
                    "autonodes.io/node-type".to_string(),
                    "high-memory-node".to_string(),
                ),
                ("workload".to_string(), "memory-intensive".to_string()),
            ]),
            taints: vec![
                taint("workload", Some("high-memory"), "NoSchedule"),
                taint("autonodes.io/unregistered", None, "NoExecute"),
            ],
            args: BTreeMap::from([("max-pods".to_string(), "50".to_string())]),
            keys: vec![],
        }
    }

    fn input<'a>(&'a self, user: Option<&'a str>) -> UserDataInput<'a> {
        UserDataInput {
            template: JoinTemplate::Kubeadm,
            node_name: "tenant-node-1",
            join: &self.join,
            node_labels: &self.labels,
            taints: &self.taints,
            kubelet_args: &self.args,
            user_cloud_config: user,
            ssh_keys: &self.keys,
            image_prepared: false,
            download_url: None,
        }
    }
}

/// Parses user data as cloud-init would (YAML) and the join config inside it.
fn parse(user_data: &str) -> (Value, Value) {
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    let doc: Value = crate::yaml::from_str(user_data)
        .unwrap_or_else(|e| panic!("user data is not YAML: {e}\n{user_data}"));
    let files = doc["write_files"].as_array().expect("write_files");
    let file = files
        .iter()
        .find(|f| f["path"] == JOIN_CONFIG_PATH)
        .expect("join config written");
    let content = file["content"].as_str().expect("content");
    let join: Value = crate::yaml::from_str(content)
        .unwrap_or_else(|e| panic!("join config is not YAML: {e}\n{content}"));
    (doc, join)
}

#[test]
fn ca_hash_is_sha256_of_the_certificate_public_key_info() {
    assert_eq!(
        ca_cert_hash(TEST_CA.as_bytes()),
        Ok(TEST_CA_HASH.to_string())
    );
    // Other PEM blocks before the certificate are skipped.
    let with_key =
        format!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{TEST_CA}");
    assert_eq!(
        ca_cert_hash(with_key.as_bytes()),
        Ok(TEST_CA_HASH.to_string())
    );
}

#[test]
fn ca_hash_of_something_that_is_not_a_certificate_is_an_error() {
    assert_eq!(ca_cert_hash(b"hello"), Err(CaHashError::NoCertificate));
    let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
    assert!(matches!(
        ca_cert_hash(garbage.as_bytes()),
        Err(CaHashError::Invalid(_))
    ));
}

#[test]
fn kubeadm_user_data_writes_a_join_configuration_and_runs_the_join() {
    let f = Fixture::new();
    let ud = render_user_data(&f.input(None)).expect("renders");
    let (doc, join) = parse(&ud);
    assert_eq!(join["apiVersion"], "kubeadm.k8s.io/v1beta3");
    assert_eq!(join["kind"], "JoinConfiguration");
    let bt = &join["discovery"]["bootstrapToken"];
    assert_eq!(bt["apiServerEndpoint"], "10.0.0.1:6443");
    assert_eq!(bt["token"], "abcdef.0123456789abcdef");
    assert_eq!(bt["caCertHashes"], json!([TEST_CA_HASH]));
    let reg = &join["nodeRegistration"];
    assert_eq!(reg["name"], "tenant-node-1");
    assert_eq!(
        reg["kubeletExtraArgs"],
        json!({
            "cgroup-driver": "systemd",
            "max-pods": "50",
            "node-labels": "autonodes.io/node-type=high-memory-node,workload=memory-intensive",
            "provider-id": "kubevirt://tenant-node-1",
        })
    );
    assert_eq!(reg["criSocket"], CRI_SOCKET);
    assert_eq!(
        reg["ignorePreflightErrors"],
        json!(["FileExisting-crictl", "CRI"])
    );
    assert_eq!(
        reg["taints"],
        json!([
            {"key": "workload", "value": "high-memory", "effect": "NoSchedule"},
            {"key": "autonodes.io/unregistered", "effect": "NoExecute"},
        ])
    );
    assert_eq!(
            doc["runcmd"],
            json!([[
                "sh",
                "-c",
                "/etc/autonodes/prepare-node.sh && kubeadm join --config /etc/kubernetes/kubeadm-join.yaml"
            ]])
        );
    assert_eq!(doc["write_files"][0]["permissions"], "0600");
    assert_eq!(doc["write_files"][1]["path"], PREPARE_SCRIPT_PATH);
    assert_eq!(doc["write_files"][1]["permissions"], "0755");
    assert!(doc.get("ssh_authorized_keys").is_none());
}

#[test]
fn the_users_runcmd_runs_before_the_join_and_other_keys_are_kept() {
    let user = "#cloud-config\npackages: [htop]\nruncmd:\n  - echo first\n  - [touch, /tmp/x]\nwrite_files:\n  - path: /etc/motd\n    content: hi\nssh_authorized_keys: [ssh-ed25519 AAAA user]\n";
    let mut f2 = Fixture::new();
    f2.keys = parse_ssh_keys("ssh-ed25519 BBBB ops\n\n# comment\n");
    let ud = render_user_data(&f2.input(Some(user))).expect("renders");
    let (doc, _) = parse(&ud);
    assert_eq!(
            doc["runcmd"],
            json!([
                "echo first",
                ["touch", "/tmp/x"],
                [
                    "sh",
                    "-c",
                    "/etc/autonodes/prepare-node.sh && kubeadm join --config /etc/kubernetes/kubeadm-join.yaml"
                ]
            ])
        );
    assert_eq!(doc["packages"], json!(["htop"]));
    assert_eq!(
        doc["write_files"][0],
        json!({"path": "/etc/motd", "content": "hi"})
    );
    assert_eq!(doc["write_files"][1]["path"], JOIN_CONFIG_PATH);
    assert_eq!(
        doc["ssh_authorized_keys"],
        json!(["ssh-ed25519 AAAA user", "ssh-ed25519 BBBB ops"])
    );
}

#[test]
fn a_user_data_that_is_not_a_cloud_config_mapping_is_an_error() {
    let f = Fixture::new();
    for (bad, why) in [
        ("#!/bin/sh\necho hi\n", "must be a cloud-config"),
        ("#cloud-config\n- a\n- b\n", "must be a YAML mapping"),
        ("#cloud-config\nruncmd: echo\n", "runcmd must be a list"),
        ("#cloud-config\nfoo: [unclosed\n", "not valid YAML"),
    ] {
        let e = render_user_data(&f.input(Some(bad))).expect_err(bad);
        assert!(
            e.to_string()
                .starts_with("property autonodes.io/user-data:"),
            "{e}"
        );
        assert!(e.to_string().contains(why), "{bad}: {e}");
    }
    // Empty user data is no user data.
    assert!(render_user_data(&f.input(Some("  \n"))).is_ok());
}

#[test]
fn hostile_labels_taints_and_user_values_cannot_break_the_yaml() {
    let nasty = [
        "quote\"s and 'single'",
        "colon: space",
        "# not a comment",
        "- dash",
        "new\nline",
        "back\\slash",
        "tab\there",
        "{{handlebars}}",
        "&anchor *alias !tag |pipe >fold %percent @at `tick",
        "unicode ünïcødé 日本語 🚀",
        "nel\u{85}ls\u{2028}ps\u{2029}",
        "ctrl\u{1}\u{7f}\u{9b}bom\u{feff}",
        "  leading and trailing  ",
        "",
        "null",
        "true",
        "0x1F",
        "...",
        "---",
    ];
    for s in nasty {
        let mut f = Fixture::new();
        f.taints = vec![taint(s, Some(s), "NoSchedule")];
        f.args = BTreeMap::from([(format!("x{s}"), s.to_string())]);
        f.keys = vec![s.to_string()];
        f.labels = BTreeMap::from([("k".to_string(), s.to_string())]);
        let user = format!(
            "#cloud-config\nruncmd:\n  - {}\nbootcmd: [{}]\n",
            to_flow_yaml(&json!(s)),
            to_flow_yaml(&json!(s))
        );
        // A kubelet argument that could break kubeadm's flag line is refused outright; the
        // rest must still come through the YAML unchanged.
        if crate::kubelet_args::checked(&f.args).is_err() {
            assert!(
                matches!(
                    render_user_data(&f.input(Some(&user))),
                    Err(UserDataError::KubeletArg(_))
                ),
                "{s:?}"
            );
            f.args = BTreeMap::new();
        }
        let ud = render_user_data(&f.input(Some(&user))).expect("renders");
        let (doc, join) = parse(&ud);
        assert_eq!(
            join["nodeRegistration"]["taints"][0]["key"],
            json!(s),
            "{s:?}"
        );
        if !f.args.is_empty() {
            assert_eq!(
                join["nodeRegistration"]["kubeletExtraArgs"]
                    [crate::kubelet_args::canonical(&format!("x{s}"))],
                json!(s)
            );
        }
        assert_eq!(
            join["nodeRegistration"]["kubeletExtraArgs"]["node-labels"],
            json!(format!("k={s}"))
        );
        assert_eq!(doc["runcmd"][0], json!(s), "{s:?}");
        assert_eq!(doc["bootcmd"], json!([s]));
        assert_eq!(doc["ssh_authorized_keys"], json!([s]));
    }
}

#[test]
fn flow_yaml_escapes_what_yaml_does_not_allow_raw() {
    let mut out = String::new();
    yaml_string("a\"b\\c\n\u{85}\u{2028}\u{7f}é", &mut out);
    assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0085\\u2028\\u007fé\"");
    assert_eq!(
        to_flow_yaml(&json!({"a": [1, true, null, "x"]})),
        "{\"a\": [1, true, null, \"x\"]}"
    );
}

#[test]
fn a_block_scalar_reads_back_as_the_same_text_and_unholdable_text_is_refused() {
    for text in [
        "#!/bin/sh\necho a\n\n  indented: \"x\"\n",
        "no newline",
        "two\n\n",
    ] {
        let block = to_block_yaml(text, 2).expect("representable");
        let doc: Value = crate::yaml::from_str(&format!("k: {block}\n")).expect("YAML");
        assert_eq!(doc["k"], text, "{block}");
    }
    for text in ["", " leading", "\tleading", "bell\u{7}", "cr\r\n"] {
        assert_eq!(to_block_yaml(text, 2), None, "{text:?}");
    }
}

/// The content of the prepare script the user data writes.
fn prepare_script(doc: &Value) -> String {
    doc["write_files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"] == PREPARE_SCRIPT_PATH))
        .and_then(|f| f["content"].as_str())
        .expect("prepare script written")
        .to_string()
}

#[test]
fn the_join_configuration_api_and_kubelet_args_follow_the_tenant_version() {
    let mut f = Fixture::new();
    for (minor, api, list, crictl) in [
        (20, "kubeadm.k8s.io/v1beta2", false, true),
        (22, "kubeadm.k8s.io/v1beta3", false, true),
        (30, "kubeadm.k8s.io/v1beta3", false, true),
        (31, "kubeadm.k8s.io/v1beta4", true, false),
        (33, "kubeadm.k8s.io/v1beta4", true, false),
    ] {
        f.join.kubernetes_version = KubeVersion::new(1, minor, 4);
        let ud = render_user_data(&f.input(None)).expect("renders");
        let (doc, join) = parse(&ud);
        assert_eq!(join["apiVersion"], api, "1.{minor}");
        let args = &join["nodeRegistration"]["kubeletExtraArgs"];
        if list {
            assert!(args
                .as_array()
                .expect("a list in v1beta4")
                .contains(&json!({"name": "provider-id", "value": "kubevirt://tenant-node-1"})));
        } else {
            assert_eq!(args["provider-id"], "kubevirt://tenant-node-1", "1.{minor}");
        }
        assert_eq!(
            join["nodeRegistration"]
                .get("ignorePreflightErrors")
                .is_some(),
            crictl,
            "1.{minor}"
        );
        let script = prepare_script(&doc);
        assert!(
            script.contains(&format!("KUBERNETES_VERSION=\"v1.{minor}.4\"")),
            "{script}"
        );
    }
    f.join.kubernetes_version = KubeVersion::new(1, 14, 0);
    assert!(matches!(
        render_user_data(&f.input(None)),
        Err(UserDataError::InvalidJoinParams {
            field: "kubernetesVersion",
            ..
        })
    ));
}

#[test]
fn a_stock_image_installs_from_the_download_url_and_a_prepared_one_installs_nothing() {
    let f = Fixture::new();
    let ud = render_user_data(&f.input(None)).expect("renders");
    let script = prepare_script(&parse(&ud).0);
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(script.contains("INSTALL=true"), "{script}");
    assert!(
        script.contains("DOWNLOAD_URL=\"https://dl.k8s.io/release\""),
        "{script}"
    );
    assert!(script.contains("SystemdCgroup = true"), "{script}");

    let mut input = f.input(None);
    input.download_url = Some("http://mirror.internal:8080/k8s/");
    let script = prepare_script(&parse(&render_user_data(&input).expect("renders")).0);
    assert!(
        script.contains("DOWNLOAD_URL=\"http://mirror.internal:8080/k8s\""),
        "{script}"
    );

    input.image_prepared = true;
    let script = prepare_script(&parse(&render_user_data(&input).expect("renders")).0);
    assert!(script.contains("INSTALL=false"), "{script}");

    for bad in [
        "ftp://x",
        "https://x/$(reboot)",
        "https://x/\"; reboot",
        "https://x y",
        "https://",
    ] {
        input.download_url = Some(bad);
        assert!(
            matches!(
                render_user_data(&input),
                Err(UserDataError::InvalidDownloadUrl(_))
            ),
            "{bad}"
        );
    }
}

#[test]
fn the_prepare_script_makes_the_node_name_resolve_from_the_hosts_file_unless_it_does() {
    let f = Fixture::new();
    let script = prepare_script(&parse(&render_user_data(&f.input(None)).expect("renders")).0);
    assert!(script.contains("NODE_NAME=\"tenant-node-1\"\n"), "{script}");
    assert!(
        script.contains("resolve_locally /etc/hosts \"$NODE_NAME\"\n"),
        "{script}"
    );
    // The script's own function, run by sh on hosts files of our own.
    let start = script.find("resolve_locally() {").expect("the function");
    let end = start + script[start..].find("\n}\n").expect("its end") + 3;
    let function = &script[start..end];
    let dir = std::env::temp_dir().join(format!("autonodes-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let hosts = dir.join("hosts");
    let run = |before: Option<&str>| -> String {
        let _ = std::fs::remove_file(&hosts);
        if let Some(text) = before {
            std::fs::write(&hosts, text).expect("hosts written");
        }
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -eu\nlog() {{ echo \"$*\" >&2; }}\n{function}resolve_locally \"$1\" tenant-node-1"
            ))
            .arg("sh")
            .arg(&hosts)
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "{out:?}");
        std::fs::read_to_string(&hosts).expect("hosts read")
    };
    let base = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n";
    // Not there: added, once.
    assert_eq!(run(Some(base)), format!("{base}127.0.1.1 tenant-node-1\n"));
    // There already (any address, any position on its line): left alone.
    for present in [
        "10.0.2.15 tenant-node-1\n",
        "127.0.1.1 tenant-node-1.cluster.local tenant-node-1 # by cloud-init\n",
    ] {
        let text = format!("{base}{present}");
        assert_eq!(run(Some(&text)), text);
    }
    // Only in a comment, as an address, or as a longer name: not there.
    for absent in [
        "# 10.0.2.15 tenant-node-1\n",
        "10.0.2.15 tenant-node-10 tenant-node-1.example\n",
    ] {
        let text = format!("{base}{absent}");
        assert_eq!(run(Some(&text)), format!("{text}127.0.1.1 tenant-node-1\n"));
    }
    // A last line without its newline keeps its name.
    assert_eq!(
        run(Some("127.0.0.1 localhost")),
        "127.0.0.1 localhost\n127.0.1.1 tenant-node-1\n"
    );
    // No hosts file at all: written.
    assert_eq!(run(None), "127.0.1.1 tenant-node-1\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vcluster_template_installs_with_the_join_script_then_joins_with_kubeadm() {
    let f = Fixture::new();
    let mut input = f.input(Some("#cloud-config\nruncmd: [echo pre]\n"));
    input.template = JoinTemplate::Vcluster;
    let ud = render_user_data(&input).expect("renders");
    let (doc, join) = parse(&ud);
    assert_eq!(join["nodeRegistration"]["name"], "tenant-node-1");
    let runcmd = doc["runcmd"].as_array().expect("list");
    assert_eq!(runcmd[0], "echo pre");
    let n = runcmd.len();
    assert_eq!(
            runcmd[n - 2],
            json!(["sh", "-c",
                "curl -fsSL \"https://10.0.0.1:6443/node/join?token=abcdef.0123456789abcdef\" | sh -s -- --skip-join"])
        );
    assert_eq!(
        runcmd[n - 1],
        json!([
            "sh",
            "-c",
            format!("{PREPARE_SCRIPT_PATH} && kubeadm join --config {JOIN_CONFIG_PATH}")
        ])
    );
    // vCluster's script installs the binaries: the prepare script only checks them.
    assert!(prepare_script(&doc).contains("INSTALL=false"));
    // A published join script URL, fetched trusting the tenant's CA.
    let mut join_params = f.join.clone();
    join_params.join_script_url = Some("https://vc.example.com:8443/".into());
    join_params.ca_pem =
        Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into());
    input.join = &join_params;
    let (doc, _) = parse(&render_user_data(&input).expect("renders"));
    let runcmd = doc["runcmd"].as_array().expect("list");
    assert_eq!(
            runcmd[runcmd.len() - 2][2],
            json!(format!("curl -fsSL --cacert {JOIN_CA_PATH} \"https://vc.example.com:8443/node/join?token=abcdef.0123456789abcdef\" | sh -s -- --skip-join"))
        );
    let ca = doc["write_files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"] == JOIN_CA_PATH))
        .expect("the CA file");
    assert!(ca["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")));
    // A URL that could break out of the shell quotes is refused.
    for bad in [
        "http://x",
        "https://x\"; rm -rf /",
        "https://x?a=b",
        "https://",
        "https://x y",
    ] {
        join_params.join_script_url = Some(bad.into());
        assert!(join_params.validate().is_err(), "{bad}");
    }
    // Both templates write the same JoinConfiguration.
    let (_, kubeadm_join) = parse(&render_user_data(&f.input(None)).expect("renders"));
    assert_eq!(join, kubeadm_join);
}

#[test]
fn templates_are_chosen_by_property_and_unknown_names_are_errors() {
    assert_eq!(JoinTemplate::from_property(None), Ok(JoinTemplate::Kubeadm));
    assert_eq!(
        JoinTemplate::from_property(Some("vcluster")),
        Ok(JoinTemplate::Vcluster)
    );
    let e = JoinTemplate::from_property(Some("k3s")).expect_err("unknown");
    assert!(e.to_string().contains("\"k3s\""), "{e}");
}

#[test]
fn oversized_user_data_is_a_clear_error() {
    let f = Fixture::new();
    let big = format!(
        "#cloud-config\nruncmd:\n  - echo {}\n",
        "x".repeat(USER_DATA_MAX_BYTES)
    );
    let e = render_user_data(&f.input(Some(&big))).expect_err("too large");
    assert!(
        matches!(
            e,
            UserDataError::TooLarge {
                max: USER_DATA_MAX_BYTES,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("65536-byte limit"), "{e}");
}

#[test]
fn join_params_are_validated() {
    let f = Fixture::new();
    for (field, change) in [
        (
            "apiServerEndpoint",
            JoinParams {
                api_server_endpoint: "host".into(),
                ..join()
            },
        ),
        (
            "apiServerEndpoint",
            JoinParams {
                api_server_endpoint: "h\"; rm -rf /:1".into(),
                ..join()
            },
        ),
        (
            "apiServerEndpoint",
            JoinParams {
                api_server_endpoint: "host:99999".into(),
                ..join()
            },
        ),
        (
            "token",
            JoinParams {
                token: "ABCDEF.0123456789abcdef".into(),
                ..join()
            },
        ),
        (
            "token",
            JoinParams {
                token: "abcdef0123456789abcdef".into(),
                ..join()
            },
        ),
        (
            "caCertHashes",
            JoinParams {
                ca_cert_hashes: vec![],
                ..join()
            },
        ),
        (
            "caCertHashes",
            JoinParams {
                ca_cert_hashes: vec!["md5:00".into()],
                ..join()
            },
        ),
    ] {
        let mut input = f.input(None);
        input.join = &change;
        let e = render_user_data(&input).expect_err(field);
        assert!(
            e.to_string()
                .starts_with(&format!("join parameters: {field}:")),
            "{e}"
        );
    }
    assert!(JoinParams {
        api_server_endpoint: "[fd00::1]:6443".into(),
        ..join()
    }
    .validate()
    .is_ok());
    assert!(JoinParams::placeholder().validate().is_ok());
}

#[test]
fn provider_id_and_node_labels_cannot_be_given_as_kubelet_args_in_any_spelling() {
    for name in ["--provider-id", "provider_id", "node_labels"] {
        let mut f = Fixture::new();
        f.args = BTreeMap::from([(name.to_string(), "x".to_string())]);
        assert!(
            matches!(
                render_user_data(&f.input(None)),
                Err(UserDataError::KubeletArg(
                    crate::kubelet_args::KubeletArgError::Reserved { .. }
                ))
            ),
            "{name}"
        );
    }
}

#[test]
fn kubelet_args_reach_the_join_configuration_under_the_kubelets_own_names() {
    let mut f = Fixture::new();
    f.args = BTreeMap::from([("max_pods".to_string(), "42".to_string())]);
    let rendered = render_user_data(&f.input(None)).expect("rendered");
    assert!(rendered.contains("max-pods"), "{rendered}");
    assert!(!rendered.contains("max_pods"), "{rendered}");
}

#[test]
fn bootstrap_tokens_have_the_kubeadm_format() {
    let mut bytes = (0u8..=255).cycle();
    let t = BootstrapToken::from_random(|| bytes.next().unwrap_or(0));
    assert!(BootstrapToken::parse(&t.token()).is_some(), "{}", t.token());
    assert_eq!(t.id().len(), 6);
    assert_eq!(t.secret().len(), 16);
    assert_eq!(t.secret_name(), format!("bootstrap-token-{}", t.id()));
    assert!(
        !format!("{t:?}").contains(t.secret()),
        "Debug hides the secret"
    );
    // Biased bytes are rejected: only 252..=255 would never be used.
    let mut high = [255u8, 254, 253, 252, 0].into_iter().cycle();
    let t = BootstrapToken::from_random(|| high.next().unwrap_or(0));
    assert_eq!(t.token(), "aaaaaa.aaaaaaaaaaaaaaaa");
    assert!(BootstrapToken::parse("abcdef.0123456789abcde").is_none());
    assert!(BootstrapToken::parse(PLACEHOLDER_TOKEN).is_some());
}

#[test]
fn ssh_keys_property_is_one_key_per_line() {
    assert_eq!(
        parse_ssh_keys(" ssh-ed25519 AAAA a \n\n# off\nssh-rsa BBBB b"),
        vec![
            "ssh-ed25519 AAAA a".to_string(),
            "ssh-rsa BBBB b".to_string()
        ]
    );
}

#[test]
fn debug_output_of_join_parameters_and_user_data_input_never_shows_the_token() {
    let mut join = JoinParams::placeholder();
    join.token = "abcdef.0123456789abcdef".into();
    let shown = format!("{join:?}");
    assert!(!shown.contains("0123456789abcdef"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    let labels = BTreeMap::new();
    let input = UserDataInput {
        template: JoinTemplate::Kubeadm,
        node_name: "n",
        join: &join,
        node_labels: &labels,
        taints: &[],
        kubelet_args: &labels,
        user_cloud_config: Some("password: hunter2"),
        ssh_keys: &[],
        image_prepared: false,
        download_url: None,
    };
    let shown = format!("{input:?}");
    assert!(
        !shown.contains("0123456789abcdef") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[test]
fn user_data_given_with_a_warm_vms_binding_is_the_claims_keys_files_and_commands_only() {
    use super::binding::{at_binding_problem, render_binding_user_data};
    assert_eq!(at_binding_problem(None), None);
    assert_eq!(
        at_binding_problem(Some(
            "#cloud-config\nwrite_files: []\nruncmd: []\nssh_authorized_keys: []\n"
        )),
        None
    );
    let why = at_binding_problem(Some("#cloud-config\npackages: [htop]\n")).expect("refused");
    assert!(why.contains("\"packages\""), "{why}");
    assert!(why.contains("first boots"), "{why}");
    assert!(at_binding_problem(Some("echo not a cloud-config")).is_some());
    let text = render_binding_user_data(
        Some("#cloud-config\nruncmd:\n  - echo \"hi\"\n"),
        &["ssh-ed25519 AAAA k".to_string()],
    )
    .expect("rendered");
    let config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(config["runcmd"], serde_json::json!(["echo \"hi\""]));
    assert_eq!(
        config["ssh_authorized_keys"],
        serde_json::json!(["ssh-ed25519 AAAA k"])
    );
    assert_eq!(config["ssh_deletekeys"], serde_json::json!(false));
    assert!(
        config.get("write_files").is_none(),
        "no empty list: {config}"
    );
    assert!(render_binding_user_data(Some("#cloud-config\nbootcmd: [[true]]\n"), &[]).is_err());
    let huge = format!("#cloud-config\nruncmd:\n  - {}\n", "x".repeat(70_000));
    assert!(
        render_binding_user_data(Some(&huge), &[]).is_err(),
        "64 KiB at most"
    );
}
