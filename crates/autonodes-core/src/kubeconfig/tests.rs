use super::*;
use proptest::prelude::*;

const CA: &str = include_str!("testdata/ca.pem");
const CLIENT_CERT: &str = include_str!("testdata/client.pem");
const CLIENT_KEY: &str = include_str!("testdata/client.key");

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig with one cluster `c`, one user `u` and context `x`; `cluster` and `user`
/// are the bodies of the entries (YAML mapping lines indented by four spaces).
fn kubeconfig(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    )
}

fn good_cluster() -> String {
    format!(
        "    server: https://10.1.2.3:6443\n    certificate-authority-data: {}",
        b64(CA)
    )
}

fn token_user() -> String {
    "    token: abc.def-123".to_string()
}

fn check_default(text: &str) -> Result<CheckedKubeconfig, Refusal> {
    check(text.as_bytes(), &KubeconfigPolicy::default())
}

fn refusal(text: &str) -> Refusal {
    check_default(text).expect_err("refused")
}

#[test]
fn a_token_kubeconfig_is_accepted_with_its_server_ca_and_token() {
    let kc = check_default(&kubeconfig(&good_cluster(), &token_user())).expect("accepted");
    assert_eq!(kc.server, "https://10.1.2.3:6443");
    assert_eq!(kc.ca_pem.as_deref(), Some(CA.as_bytes()));
    assert_eq!(kc.ca_der.len(), 1);
    assert_eq!(kc.token.as_deref(), Some("abc.def-123"));
    assert!(kc.client_identity.is_none());
    assert!(!kc.insecure_skip_tls_verify);
}

#[test]
fn a_vcluster_exported_client_certificate_kubeconfig_is_accepted() {
    // The shape `vcluster connect --print` and the vc-<name> Secret hold.
    let text = format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: https://localhost:8443\n  name: my-vcluster\ncontexts:\n- context:\n    cluster: my-vcluster\n    user: my-vcluster\n  name: my-vcluster\ncurrent-context: my-vcluster\nkind: Config\npreferences: {{}}\nusers:\n- name: my-vcluster\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(CA),
        b64(CLIENT_CERT),
        b64(CLIENT_KEY)
    );
    let kc = check_default(&text).expect("accepted");
    let id = kc.client_identity.expect("client certificate");
    assert_eq!(id.certificate_pem, CLIENT_CERT.as_bytes());
    assert_eq!(id.key_pem, CLIENT_KEY.as_bytes());
    assert!(kc.token.is_none());
}

#[test]
fn a_kubectl_flattened_kubeconfig_with_namespace_extensions_and_other_entries_is_accepted() {
    let text = format!(
        "apiVersion: v1\nkind: Config\npreferences: {{}}\nclusters:\n- name: other\n  cluster:\n    server: http://plain\n    certificate-authority: /etc/ca.pem\n- name: c\n  cluster:\n    server: https://api.example.com/k8s/clusters/c-1\n    certificate-authority-data: {}\n    tls-server-name: api.internal\n    extensions:\n    - name: client.authentication.k8s.io/exec\n      extension: {{}}\nusers:\n- name: other\n  user:\n    exec: {{command: /bin/true}}\n- name: u\n  user:\n    token: t0k3n\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: kube-system\n- name: y\n  context:\n    cluster: other\n    user: other\ncurrent-context: x\n",
        b64(CA)
    );
    // Entries the current context does not use are never looked at.
    let kc = check_default(&text).expect("accepted");
    assert_eq!(kc.server, "https://api.example.com/k8s/clusters/c-1");
    assert_eq!(kc.tls_server_name.as_deref(), Some("api.internal"));
}

#[test]
fn every_refused_user_field_is_named_and_its_value_never_shown() {
    for (field, value) in [
        ("exec", "{command: /bin/touch, args: [/tmp/marker-secret]}"),
        (
            "auth-provider",
            "{name: oidc, config: {client-id: secret-id}}",
        ),
        ("tokenFile", "/etc/shadow"),
        ("username", "admin-secret"),
        ("password", "hunter2-secret"),
        ("client-certificate", "/etc/kubernetes/pki/secret.crt"),
        ("client-key", "/etc/kubernetes/pki/secret.key"),
        ("as", "system:admin-secret"),
        ("as-groups", "[system:masters-secret]"),
        ("as-uid", "uid-secret"),
        ("as-user-extra", "{scopes: [secret]}"),
    ] {
        let text = kubeconfig(
            &good_cluster(),
            &format!("{}\n    {field}: {value}", token_user()),
        );
        let r = refusal(&text);
        assert_eq!(r.field, format!("users[u].user.{field}"), "{field}");
        assert!(r.problem.starts_with("is refused"), "{field}: {r}");
        let shown = r.to_string();
        assert!(
            !shown.contains("secret") && !shown.contains("shadow") && !shown.contains("marker"),
            "{field}: the refusal shows the value: {shown}"
        );
    }
}

#[test]
fn file_paths_and_proxies_in_the_cluster_are_refused_by_name() {
    for (field, value) in [
        ("certificate-authority", "/etc/ssl/private/secret.pem"),
        ("proxy-url", "http://127.0.0.1:3128"),
    ] {
        let text = kubeconfig(
            &format!("{}\n    {field}: {value}", good_cluster()),
            &token_user(),
        );
        let r = refusal(&text);
        assert_eq!(r.field, format!("clusters[c].cluster.{field}"));
        assert!(!r.to_string().contains(value), "{r}");
    }
}

#[test]
fn empty_values_of_refused_fields_count_as_not_set() {
    let text = kubeconfig(
        &format!("{}\n    proxy-url: \"\"", good_cluster()),
        &format!(
            "{}\n    tokenFile: \"\"\n    as-groups: []\n    as-user-extra: {{}}\n    exec: null",
            token_user()
        ),
    );
    check_default(&text).expect("accepted");
}

#[test]
fn insecure_skip_tls_verify_is_refused_unless_the_operator_allows_it() {
    let cluster = "    server: https://10.1.2.3:6443\n    insecure-skip-tls-verify: true";
    let text = kubeconfig(cluster, &token_user());
    let r = refusal(&text);
    assert_eq!(r.field, "clusters[c].cluster.insecure-skip-tls-verify");
    assert!(
        r.problem.contains("--allow-insecure-skip-tls-verify"),
        "{r}"
    );
    let allowed = KubeconfigPolicy {
        allow_insecure_skip_tls_verify: true,
    };
    let kc = check(text.as_bytes(), &allowed).expect("accepted with the opt-in");
    assert!(kc.insecure_skip_tls_verify);
    assert!(kc.ca_pem.is_none());
    // `false` is the default and always fine.
    let text = kubeconfig(
        &format!("{}\n    insecure-skip-tls-verify: false", good_cluster()),
        &token_user(),
    );
    check_default(&text).expect("accepted");
}

#[test]
fn a_cluster_without_inline_ca_is_refused() {
    let r = refusal(&kubeconfig(
        "    server: https://10.1.2.3:6443",
        &token_user(),
    ));
    assert_eq!(r.field, "clusters[c].cluster.certificate-authority-data");
    let r = refusal(&kubeconfig(
        &format!(
            "    server: https://10.1.2.3:6443\n    certificate-authority-data: {}",
            b64("not a certificate")
        ),
        &token_user(),
    ));
    assert_eq!(r.problem, "holds no PEM X.509 certificate");
    let r = refusal(&kubeconfig(
        "    server: https://10.1.2.3:6443\n    certificate-authority-data: '%%%'",
        &token_user(),
    ));
    assert_eq!(r.problem, "is not base64");
}

#[test]
fn only_https_servers_without_user_info_are_accepted() {
    for (server, ok) in [
        ("https://10.1.2.3:6443", true),
        ("https://api.example.com", true),
        ("https://[::1]:6443", true),
        ("https://localhost:8443", true),
        ("http://10.1.2.3:6443", false),
        ("HTTPS://10.1.2.3", false),
        ("unix:///var/run/kube.sock", false),
        ("file:///etc/shadow", false),
        ("https://admin:pw@10.1.2.3", false),
        ("https://10.1.2.3/?x=y", false),
        ("https://", false),
        ("https://exa mple.com", false),
    ] {
        let text = kubeconfig(
            &format!(
                "    server: '{server}'\n    certificate-authority-data: {}",
                b64(CA)
            ),
            &token_user(),
        );
        match check_default(&text) {
            Ok(_) => assert!(ok, "{server} was accepted"),
            Err(r) => {
                assert!(!ok, "{server} was refused: {r}");
                assert_eq!(r.field, "clusters[c].cluster.server");
                assert!(!r.to_string().contains("pw@"), "{r}");
            }
        }
    }
}

#[test]
fn link_local_servers_are_refused_in_every_spelling() {
    for host in [
        "169.254.169.254",
        "169.254.0.1",
        "[fe80::1]",
        "[FE80::a:b]",
        "[febf::1]",
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
        "2852039166",
        "0xa9fea9fe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "169.16689662",
        "169.254.169.254.",
    ] {
        let server = format!("https://{host}:443");
        assert!(
            check_server(&server).is_err(),
            "{server} should be refused as link-local"
        );
        let text = kubeconfig(
            &format!(
                "    server: '{server}'\n    certificate-authority-data: {}",
                b64(CA)
            ),
            &token_user(),
        );
        let r = refusal(&text);
        assert!(r.problem.contains("link-local"), "{host}: {r}");
    }
    for host in [
        "169.255.0.1",
        "10.0.0.1",
        "[fec0::1]",
        "[::1]",
        "api.example.com",
        "0xa9fea9fe.example.com",
        "169.254.example.com",
    ] {
        assert!(
            check_server(&format!("https://{host}")).is_ok(),
            "{host} should be accepted"
        );
    }
}

#[test]
fn inet_aton_reads_the_short_octal_and_hex_forms() {
    assert_eq!(inet_aton("127.1"), Some(Ipv4Addr::new(127, 0, 0, 1)));
    assert_eq!(inet_aton("0x7f.1"), Some(Ipv4Addr::new(127, 0, 0, 1)));
    assert_eq!(inet_aton("017700000001"), Some(Ipv4Addr::new(127, 0, 0, 1)));
    assert_eq!(inet_aton("10.1.258"), Some(Ipv4Addr::new(10, 1, 1, 2)));
    assert_eq!(inet_aton("256.1.1.1"), None);
    assert_eq!(inet_aton("1.2.3.4.5"), None);
    assert_eq!(inet_aton("08.1.1.1"), None);
    assert_eq!(inet_aton("example"), None);
    assert_eq!(inet_aton("4294967296"), None);
}

#[test]
fn missing_or_ambiguous_context_cluster_and_user_are_refused() {
    let no_current = kubeconfig(&good_cluster(), &token_user()).replace("current-context: x\n", "");
    assert_eq!(refusal(&no_current).field, "current-context");
    let wrong_current = kubeconfig(&good_cluster(), &token_user())
        .replace("current-context: x", "current-context: nope");
    assert_eq!(refusal(&wrong_current).field, "contexts[nope]");
    let no_cluster =
        kubeconfig(&good_cluster(), &token_user()).replace("- name: c\n", "- name: d\n");
    assert_eq!(refusal(&no_cluster).field, "clusters[c]");
    let no_user = kubeconfig(&good_cluster(), &token_user()).replace("- name: u\n", "- name: v\n");
    assert_eq!(refusal(&no_user).field, "users[u]");
    let twice = kubeconfig(&good_cluster(), &token_user()).replace(
        "contexts:\n",
        "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n",
    );
    assert_eq!(refusal(&twice).problem, "appears more than once");
    let no_context_user = kubeconfig(&good_cluster(), &token_user()).replace("    user: u\n", "");
    assert_eq!(refusal(&no_context_user).field, "contexts[x].context.user");
}

#[test]
fn a_user_without_credentials_or_with_half_a_certificate_is_refused() {
    let r = refusal(&kubeconfig(&good_cluster(), "    extensions: []"));
    assert_eq!(r.field, "users[u].user");
    assert!(r.problem.contains("no credentials"), "{r}");
    let r = refusal(&kubeconfig(
        &good_cluster(),
        &format!("    client-certificate-data: {}", b64(CLIENT_CERT)),
    ));
    assert_eq!(r.field, "users[u].user.client-key-data");
    let r = refusal(&kubeconfig(
        &good_cluster(),
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            b64(CLIENT_CERT),
            b64("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
        ),
    ));
    assert_eq!(r.problem, "holds no PEM private key");
    let r = refusal(&kubeconfig(
        &good_cluster(),
        "    token: \"a b\\r\\nX-Evil: 1\"",
    ));
    assert_eq!(r.field, "users[u].user.token");
    assert!(!r.to_string().contains("Evil"), "{r}");
}

#[test]
fn unknown_fields_in_the_used_entries_are_refused() {
    let r = refusal(&kubeconfig(
        &good_cluster(),
        &format!("{}\n    future-credential-plugin: {{cmd: x}}", token_user()),
    ));
    assert_eq!(r.field, "users[u].user.future-credential-plugin");
    let r = refusal(&kubeconfig(
        &format!("{}\n    socks: 127.0.0.1:1080", good_cluster()),
        &token_user(),
    ));
    assert_eq!(r.field, "clusters[c].cluster.socks");
    let r = refusal(&kubeconfig(
        &good_cluster(),
        &format!("{}\n    <<: {{exec: x}}", token_user()),
    ));
    // A YAML merge key is applied, as kubectl's YAML reader applies it: what it merges in
    // is checked like any other field.
    assert_eq!(r.field, "users[u].user.exec");
}

#[test]
fn entry_names_in_refusals_are_shortened_and_sanitised() {
    let long = format!("evil\n{}", "n".repeat(300));
    let text = kubeconfig(&good_cluster(), &token_user()).replace(
        "current-context: x",
        &format!("current-context: {:?}", long),
    );
    let r = refusal(&text);
    assert!(!r.field.contains('\n'), "{r:?}");
    assert!(r.field.chars().count() < 80, "{r:?}");
}

#[test]
fn not_yaml_is_refused_without_echoing_it() {
    let r = refusal("this: is: not a kubeconfig [ secret-value");
    assert_eq!(r.field, "the kubeconfig");
    assert!(r.problem.starts_with("is not YAML"), "{r}");
    assert!(!r.to_string().contains("secret-value"), "{r}");
    assert_eq!(
        check(&[0xff, 0xfe], &KubeconfigPolicy::default())
            .expect_err("binary")
            .problem,
        "is not UTF-8 text"
    );
    assert_eq!(refusal("- a list").problem, "is not a YAML mapping");
    let big = vec![b' '; MAX_KUBECONFIG_BYTES + 1];
    assert!(check(&big, &KubeconfigPolicy::default()).is_err());
}

#[test]
fn debug_output_never_shows_credentials() {
    let text = format!(
        "{}\n    client-certificate-data: {}\n    client-key-data: {}",
        "    token: supersecrettoken",
        b64(CLIENT_CERT),
        b64(CLIENT_KEY)
    );
    let kc = check_default(&kubeconfig(&good_cluster(), &text)).expect("accepted");
    let shown = format!("{kc:?}");
    assert!(!shown.contains("supersecrettoken"), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

fn yaml_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        "[a-z:/._-]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("exec"),
            Just("tokenFile"),
            Just("server"),
            Just("https://169.254.169.254"),
            Just("current-context"),
            Just("name"),
            Just("user"),
            Just("cluster"),
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        "[a-z-]{1,10}".prop_map(String::from),
                        Just(String::from("name")),
                        Just(String::from("user")),
                        Just(String::from("cluster")),
                        Just(String::from("context")),
                        Just(String::from("users")),
                        Just(String::from("clusters")),
                        Just(String::from("contexts")),
                        Just(String::from("current-context")),
                    ],
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_checker(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = check(&bytes, &KubeconfigPolicy::default());
    }

    #[test]
    fn arbitrary_text_never_panics_the_checker(text in "\\PC{0,300}") {
        let _ = check(text.as_bytes(), &KubeconfigPolicy { allow_insecure_skip_tls_verify: true });
    }

    #[test]
    fn arbitrary_yaml_documents_never_panic_the_checker(doc in yaml_value()) {
        let text = crate::yaml::to_string(&doc).unwrap_or_default();
        let _ = check(text.as_bytes(), &KubeconfigPolicy::default());
    }

    #[test]
    fn a_refused_user_field_with_any_value_is_always_refused_by_name(
        i in 0..REFUSED_USER_FIELDS.len(),
        value in "[a-zA-Z0-9/._-]{1,40}",
    ) {
        let field = REFUSED_USER_FIELDS[i].0;
        let text = kubeconfig(&good_cluster(), &format!("{}\n    {field}: \"{value}\"", token_user()));
        let r = check_default(&text).expect_err("refused");
        prop_assert_eq!(r.field, format!("users[u].user.{field}"));
    }

    #[test]
    fn an_accepted_server_is_always_https_and_never_link_local(
        a in 0u8..=255, b in 0u8..=255, c in 0u8..=255, d in 0u8..=255, scheme in prop_oneof![Just("https"), Just("http")],
    ) {
        let server = format!("{scheme}://{a}.{b}.{c}.{d}:6443");
        let accepted = check_server(&server).is_ok();
        prop_assert_eq!(accepted, scheme == "https" && !(a == 169 && b == 254));
    }
}
