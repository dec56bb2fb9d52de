//! `autonodes render`: prints what a claim would get ([`autonodes_core::render`]), computed
//! from files without touching any cluster. Only [`run`] does I/O: it reads the files
//! named on the command line and prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;

use autonodes_api::{NodeClaim, NodeProvider};
use autonodes_core::catalogue::Catalogue;
use autonodes_core::render::plan_node;
use autonodes_core::template::names::{NETWORK_DATA_KEY, USER_DATA_KEY};
use autonodes_core::userdata::{self, JoinParams};

// ---------------------------------------------------------------------------------------
// `autonodes render`
// ---------------------------------------------------------------------------------------

/// Output format of `autonodes render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// YAML documents separated by `---`.
    #[default]
    Yaml,
    /// A JSON `v1` `List`.
    Json,
}

/// Arguments of `autonodes render`: print the NodeType, Secret and VirtualMachine a claim
/// would get, without touching any cluster.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RenderArgs {
    /// NodeProvider YAML file.
    #[arg(long, value_name = "P.yaml")]
    pub provider: PathBuf,
    /// NodeClaim YAML file.
    #[arg(long, value_name = "C.yaml")]
    pub claim: PathBuf,
    /// Pin the node type (short or full name) instead of letting the claim choose.
    #[arg(long = "node-type", value_name = "T")]
    pub node_type: Option<String>,
    /// Kubeconfig of the tenant cluster: its API server endpoint and CA hash are used
    /// (the bootstrap token stays a placeholder; a real one is minted at provisioning).
    #[arg(long = "tenant-kubeconfig", value_name = "K")]
    pub tenant_kubeconfig: Option<PathBuf>,
    /// The tenant's Kubernetes version, which picks the JoinConfiguration's apiVersion and
    /// the kubelet and kubeadm a stock image installs (at provisioning it is read from the
    /// tenant's `/version`).
    #[arg(long = "kubernetes-version", value_name = "V", default_value = "v1.33.0",
          value_parser = autonodes_core::kubeversion::KubeVersion::parse)]
    pub kubernetes_version: autonodes_core::kubeversion::KubeVersion,
    /// Where a stock image downloads the kubelet and kubeadm (as `autonodes run
    /// --kubernetes-download-url`).
    #[arg(long = "kubernetes-download-url", value_name = "URL", default_value = userdata::DEFAULT_DOWNLOAD_URL,
          value_parser = autonodes_core::userdata::parse_download_url)]
    pub kubernetes_download_url: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
}

/// The installation id `autonodes render` labels objects with (`autonodes run` uses its
/// `--installation-id`): the one of the default controller settings.
pub(crate) const PLACEHOLDER_INSTALLATION: &str = crate::controller::config::DEFAULT_INSTALLATION;

/// UID given to a claim file without `metadata.uid`.
pub(crate) const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

fn parse_object<T: serde::de::DeserializeOwned>(
    text: &str,
    source: &str,
    kind: &str,
) -> anyhow::Result<T> {
    let value: Value = autonodes_core::yaml::from_str(text)
        .with_context(|| format!("{source}: not a YAML document"))?;
    match value.get("kind").and_then(Value::as_str) {
        Some(k) if k == kind => {}
        Some(k) => anyhow::bail!("{source}: kind is {k}, expected {kind}"),
        None => anyhow::bail!("{source}: kind is not set, expected {kind}"),
    }
    match value.get("apiVersion").and_then(Value::as_str) {
        Some("autonodes.io/v1alpha1") => {}
        other => anyhow::bail!(
            "{source}: apiVersion is {}, expected autonodes.io/v1alpha1",
            other.unwrap_or("not set")
        ),
    }
    // From the text, not the value, so errors carry the field path and line.
    autonodes_core::yaml::from_str_with_path(text)
        .map_err(|e| anyhow::anyhow!("{source}: {kind}: {e}"))
}

/// Renders the documents `autonodes render` prints — the chosen NodeType (with its
/// computed status), the Secret (user data under `stringData`, readable) and the
/// VirtualMachine — from the text of a NodeProvider and a NodeClaim. `node_type` pins a
/// type; `provider_name`/`claim_name` say where the texts came from, for error messages.
pub fn render_documents(
    provider_text: &str,
    provider_source: &str,
    claim_text: &str,
    claim_source: &str,
    node_type: Option<&str>,
    join: &JoinParams,
) -> anyhow::Result<Vec<Value>> {
    let provider: NodeProvider = parse_object(provider_text, provider_source, "NodeProvider")?;
    let provider_name = provider
        .metadata
        .name
        .clone()
        .with_context(|| format!("{provider_source}: NodeProvider metadata.name is not set"))?;
    let mut claim: NodeClaim = parse_object(claim_text, claim_source, "NodeClaim")?;
    if claim.metadata.name.is_none() {
        anyhow::bail!("{claim_source}: NodeClaim metadata.name is not set");
    }
    claim
        .metadata
        .namespace
        .get_or_insert_with(|| "default".to_string());
    claim
        .metadata
        .uid
        .get_or_insert_with(|| PLACEHOLDER_UID.to_string());
    if let Some(t) = node_type {
        claim.spec.type_ref = Some(t.to_string());
    }
    if let Some(p) = &claim.spec.provider_ref {
        if *p != provider_name {
            anyhow::bail!(
                "{claim_source}: NodeClaim spec.providerRef is {p}, but the provider file defines {provider_name}"
            );
        }
    }

    let catalogue = Catalogue::from_provider(&provider);
    let (name, namespace, uid) = (
        claim.metadata.name.as_deref().unwrap_or_default(),
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.uid.as_deref().unwrap_or_default(),
    );
    let vm_name = autonodes_core::template::names::vm_name_for_claim(namespace, name, uid);
    // Flattened: the message already carries the cause, so no repeated "Caused by".
    let rendered = plan_node(
        &catalogue,
        &claim,
        None,
        &BTreeMap::new(),
        &vm_name,
        join,
        PLACEHOLDER_INSTALLATION,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    let prepared = catalogue
        .get(&rendered.node_type)
        .with_context(|| format!("node type {} vanished", rendered.node_type))?;
    // A type with an address pool: shown with the first address of the pool (the
    // controller gives the lowest one no claim holds), unless the claim file has one.
    let has_address = claim.status.as_ref().is_some_and(|s| s.address.is_some());
    let rendered = match (&prepared.address_pool, has_address) {
        (Some(pool), false) => {
            let first = pool
                .allocate(|_| false)
                .map(|ip| pool.with_prefix(ip))
                .with_context(|| format!("node type {}: no address to hand out", prepared.name))?;
            claim.status.get_or_insert_with(Default::default).address = Some(first);
            autonodes_core::render::render_node(
                prepared,
                &claim,
                None,
                &vm_name,
                join,
                PLACEHOLDER_INSTALLATION,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?
        }
        _ => rendered,
    };
    let mut node_type_obj = autonodes_core::catalogue::node_types_from_provider(&provider)
        .into_iter()
        .find(|nt| nt.metadata.name.as_deref() == Some(rendered.node_type.as_str()))
        .with_context(|| format!("node type {} vanished", rendered.node_type))?;
    node_type_obj.status = Some(prepared.status(0));

    let mut secret = rendered.secret.clone();
    let mut shown = BTreeMap::from([(USER_DATA_KEY.to_string(), rendered.user_data.clone())]);
    if let Some(network) = secret.data.as_ref().and_then(|d| d.get(NETWORK_DATA_KEY)) {
        shown.insert(
            NETWORK_DATA_KEY.to_string(),
            String::from_utf8_lossy(&network.0).into_owned(),
        );
    }
    secret.data = None;
    secret.string_data = Some(shown);

    let mut node_type_value = serde_json::to_value(&node_type_obj)?;
    if let Some(obj) = node_type_value.as_object_mut() {
        // apiVersion/kind first, as kubectl prints them.
        let mut ordered = serde_json::Map::new();
        ordered.insert(
            "apiVersion".into(),
            Value::String("autonodes.io/v1alpha1".into()),
        );
        ordered.insert("kind".into(), Value::String("NodeType".into()));
        for (k, v) in std::mem::take(obj) {
            ordered.entry(k).or_insert(v);
        }
        *obj = ordered;
    }
    let mut secret_value = serde_json::to_value(&secret)?;
    if let Some(obj) = secret_value.as_object_mut() {
        obj.insert("apiVersion".into(), Value::String("v1".into()));
        obj.insert("kind".into(), Value::String("Secret".into()));
    }
    Ok(vec![node_type_value, secret_value, rendered.vm])
}

/// Formats rendered documents: YAML documents separated by `---`, or a JSON `v1` `List`.
pub fn format_documents(docs: &[Value], format: OutputFormat) -> anyhow::Result<String> {
    match format {
        OutputFormat::Yaml => {
            let mut out = String::new();
            for doc in docs {
                out.push_str("---\n");
                out.push_str(&autonodes_core::yaml::to_string(doc)?);
            }
            Ok(out)
        }
        OutputFormat::Json => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
            Ok(serde_json::to_string_pretty(&list)? + "\n")
        }
    }
}

/// The join parameters from a tenant kubeconfig: the API server of the current context's
/// cluster (`host:port`, port 443 when absent) and the hash of its CA
/// (`certificate-authority-data`, or the `certificate-authority` file). The bootstrap token
/// is the placeholder.
pub(crate) fn join_params_from_kubeconfig(path: &Path) -> anyhow::Result<JoinParams> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {source}"))?;
    let kc: kube::config::Kubeconfig = autonodes_core::yaml::from_str(&text)
        .with_context(|| format!("{source}: not a kubeconfig"))?;
    let (server, ca) =
        crate::remote::clients::server_and_ca(&kc, Some(path.parent().unwrap_or(Path::new("."))))
            .map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    let ca = ca.with_context(|| {
        format!("{source}: the cluster has neither certificate-authority-data nor certificate-authority")
    })?;
    let hash = userdata::ca_cert_hash(&ca)
        .map_err(|e| anyhow::anyhow!("{source}: the cluster's certificate authority: {e}"))?;
    let endpoint = crate::remote::clients::endpoint_of(&server)
        .map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    Ok(JoinParams {
        api_server_endpoint: endpoint,
        token: userdata::PLACEHOLDER_TOKEN.to_string(),
        ca_cert_hashes: vec![hash],
        join_script_url: None,
        ca_pem: Some(String::from_utf8_lossy(&ca).into_owned()),
        ..JoinParams::placeholder()
    })
}

/// Runs `autonodes render`: reads the files, renders, prints to stdout.
pub(crate) fn run(args: RenderArgs) -> anyhow::Result<()> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let provider_text = read(&args.provider)?;
    let claim_text = read(&args.claim)?;
    let mut join = match &args.tenant_kubeconfig {
        Some(k) => join_params_from_kubeconfig(k)?,
        None => JoinParams::placeholder(),
    };
    join.kubernetes_version = args.kubernetes_version;
    join.download_url = args.kubernetes_download_url.clone();
    let docs = render_documents(
        &provider_text,
        &args.provider.display().to_string(),
        &claim_text,
        &args.claim.display().to_string(),
        args.node_type.as_deref(),
        &join,
    )?;
    print!("{}", format_documents(&docs, args.output)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonodes_api::{NodeClaimSpec, VClusterRef};
    use autonodes_core::render::render_node;
    use k8s_openapi::ByteString;
    use serde_json::json;

    fn example(file: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(file);
        std::fs::read_to_string(path).expect("example exists")
    }

    fn claim_yaml(requirements: &str) -> String {
        format!(
            "apiVersion: autonodes.io/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: c1\n  namespace: tenant\n  uid: \"1111\"\nspec:\n  vClusterRef:\n    name: tenant\n{requirements}"
        )
    }

    fn render(provider: &str, claim: &str, pin: Option<&str>) -> anyhow::Result<Vec<Value>> {
        render_documents(
            &example(provider),
            provider,
            claim,
            "claim.yaml",
            pin,
            &JoinParams::placeholder(),
        )
    }

    fn join_config(secret: &Value) -> Value {
        let ud = secret["stringData"]["userdata"]
            .as_str()
            .expect("user data");
        let doc: Value = autonodes_core::yaml::from_str(ud).expect("user data is YAML");
        let content = doc["write_files"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["path"] == userdata::JOIN_CONFIG_PATH))
            .and_then(|f| f["content"].as_str())
            .expect("join config");
        autonodes_core::yaml::from_str(content).expect("join config is YAML")
    }

    #[test]
    fn high_memory_claim_gets_4_cpu_16gi_both_labels_the_taint_and_the_base_devices() {
        let docs = render(
            "nodeprovider-advanced.yaml",
            &example("nodeclaim.yaml"),
            None,
        )
        .expect("renders");
        let [nt, secret, vm] = docs.as_slice() else {
            panic!("three documents");
        };
        assert_eq!(
            nt["metadata"]["name"],
            "kubevirt-provider-advanced.high-memory-node"
        );
        assert_eq!(nt["status"]["cost"], 72);
        assert_eq!(
            nt["status"]["capacity"],
            json!({"total": 5, "claimed": 0, "available": 5})
        );
        assert_eq!(vm["metadata"]["labels"]["provider"], "kubevirt");
        assert_eq!(vm["metadata"]["labels"]["workload"], "memory-intensive");
        let vmi = &vm["spec"]["template"]["spec"];
        assert_eq!(
            vmi["domain"]["resources"]["requests"],
            json!({"cpu": "4", "memory": "16Gi"})
        );
        assert!(vmi.get("taints").is_none());
        let disks: Vec<&str> = vmi["domain"]["devices"]["disks"]
            .as_array()
            .expect("disks")
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        assert_eq!(disks, vec!["containerdisk", "cloudinitdisk"]);
        assert_eq!(
            vmi["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}}])
        );
        assert_eq!(vmi["networks"], json!([{"name": "default", "pod": {}}]));
        let join = join_config(secret);
        assert_eq!(
            join["nodeRegistration"]["taints"],
            json!([
                {"key": "workload", "value": "high-memory", "effect": "NoSchedule"},
                {"key": "autonodes.io/unregistered", "effect": "NoExecute"}
            ])
        );
        let vm_name = vm["metadata"]["name"].as_str().expect("name");
        assert_eq!(secret["metadata"]["name"], format!("{vm_name}-userdata"));
        assert_eq!(secret["metadata"]["namespace"], "vcluster-platform");
        assert_eq!(
            vmi["volumes"][1]["cloudInitNoCloud"]["secretRef"]["name"],
            format!("{vm_name}-userdata")
        );
    }

    #[test]
    fn without_requirements_the_cheapest_type_is_chosen() {
        let docs = render("nodeprovider-advanced.yaml", &claim_yaml(""), None).expect("renders");
        assert_eq!(
            docs[0]["metadata"]["name"],
            "kubevirt-provider-advanced.standard-node"
        );
        assert_eq!(docs[0]["status"]["cost"], 28);
    }

    #[test]
    fn node_type_flag_pins_the_type_by_short_name() {
        let docs = render(
            "nodeprovider-types.yaml",
            &claim_yaml(""),
            Some("different-vm-with-different-template-2"),
        )
        .expect("renders");
        let vm = &docs[2];
        assert_eq!(vm["metadata"]["labels"]["foo"], "baz");
        assert_eq!(
            vm["spec"]["template"]["spec"]["volumes"][0]["containerDisk"]["image"],
            "quay.io/containerdisks/fedora:40"
        );
    }

    #[test]
    fn a_claim_nothing_fits_is_an_error_naming_the_claim_and_the_reason() {
        let claim = claim_yaml(
            "  requirements:\n    - key: autonodes.io/node-type\n      operator: In\n      values: [gpu-node]\n",
        );
        let e = render("nodeprovider-advanced.yaml", &claim, None).expect_err("no fit");
        let msg = format!("{e:#}");
        assert!(
            msg.starts_with("NodeClaim tenant/c1: NoMatchingNodeType: none of 2 node type(s) fits"),
            "{msg}"
        );
        assert!(
            msg.contains("requirement `autonodes.io/node-type In [gpu-node]` not met"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file_object_and_field() {
        let claim = claim_yaml("  desiredCapacity:\n    cpu: [1]\n");
        let e = render("nodeprovider-advanced.yaml", &claim, None).expect_err("bad");
        assert_eq!(
            format!("{e:#}"),
            "claim.yaml: NodeClaim: spec.desiredCapacity.cpu: invalid type: sequence, expected Quantity at line 11, column 5"
        );
        let e = render_documents(
            "kind: Service\n",
            "p.yaml",
            &claim_yaml(""),
            "c.yaml",
            None,
            &JoinParams::placeholder(),
        )
        .expect_err("wrong kind");
        assert_eq!(
            e.to_string(),
            "p.yaml: kind is Service, expected NodeProvider"
        );
        let claim = claim_yaml(
            "  requirements:\n    - key: cores\n      operator: Gt\n      values: [many]\n",
        );
        let e = render("nodeprovider-advanced.yaml", &claim, None).expect_err("bad requirement");
        assert_eq!(
            e.to_string(),
            "NodeClaim tenant/c1: spec.requirements[0]: requirement on cores: Gt needs an integer value, got \"many\""
        );
    }

    #[test]
    fn a_claim_holding_a_static_address_gets_it_as_network_data_its_vm_reads_and_others_get_none() {
        let mut provider: NodeProvider =
            autonodes_core::yaml::from_str(&example("nodeprovider-minimal.yaml")).expect("parses");
        if let Some(spec) = provider
            .spec
            .kube_virt
            .virtual_machine_template
            .as_mut()
            .and_then(|t| t.pointer_mut("/spec/template/spec"))
        {
            spec["domain"]["devices"]["interfaces"] =
                serde_json::json!([{"name": "nodes", "bridge": {}}]);
            spec["networks"] =
                serde_json::json!([{"name": "nodes", "multus": {"networkName": "nodes"}}]);
        }
        provider.spec.kube_virt.address_pool = Some(autonodes_api::AddressPool {
            cidr: "10.30.0.0/24".into(),
            gateway: Some("10.30.0.1".into()),
            dns_servers: vec!["10.30.0.2".into()],
            exclude: vec![],
        });
        let cat = Catalogue::from_provider(&provider);
        let t = &cat.types()[0];
        let mut claim: NodeClaim = autonodes_core::yaml::from_str(&claim_yaml("")).expect("claim");
        claim.metadata.uid = Some("u".into());
        let volume = |r: &autonodes_core::render::RenderedNode| {
            r.vm["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .and_then(|v| v.iter().find(|v| v["name"] == "cloudinitdisk").cloned())
                .expect("the cloud-init volume")
        };
        // Not scheduled with an address (yet): no network data.
        let r = render_node(t, &claim, None, "vm", &JoinParams::placeholder(), "test")
            .expect("renders");
        assert!(volume(&r)["cloudInitNoCloud"]
            .get("networkDataSecretRef")
            .is_none());
        assert!(!r
            .secret
            .data
            .as_ref()
            .expect("data")
            .contains_key("networkdata"));

        claim.status = Some(autonodes_api::NodeClaimStatus {
            address: Some("10.30.0.7/24".into()),
            ..Default::default()
        });
        let r = render_node(t, &claim, None, "vm", &JoinParams::placeholder(), "test")
            .expect("renders");
        assert_eq!(
            volume(&r)["cloudInitNoCloud"]["networkDataSecretRef"]["name"],
            "vm-userdata"
        );
        // The interface the network data matches by its MAC address.
        assert_eq!(
            r.vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"],
            "02:a5:0a:1e:00:07"
        );
        assert_eq!(r.secret.metadata.name.as_deref(), Some("vm-userdata"));
        let data = &r.secret.data.as_ref().expect("data")["networkdata"].0;
        let network: serde_json::Value =
            autonodes_core::yaml::from_str(std::str::from_utf8(data).expect("UTF-8"))
                .expect("YAML");
        assert_eq!(network["ethernets"]["eth0"]["addresses"][0], "10.30.0.7/24");
        assert_eq!(
            network["ethernets"]["eth0"]["match"]["macaddress"],
            "02:a5:0a:1e:00:07"
        );
        assert_eq!(
            network["ethernets"]["eth0"]["nameservers"]["addresses"][0],
            "10.30.0.2"
        );
    }

    #[test]
    fn autonodes_render_shows_a_type_with_an_address_pool_with_the_pool_s_first_address() {
        let mut provider: Value =
            autonodes_core::yaml::from_str(&example("nodeprovider-minimal.yaml")).expect("parses");
        let spec = &mut provider["spec"]["kubeVirt"];
        spec["addressPool"] = serde_json::json!({"cidr": "10.40.0.0/24", "gateway": "10.40.0.1"});
        let vmi = &mut spec["virtualMachineTemplate"]["spec"]["template"]["spec"];
        vmi["domain"]["devices"]["interfaces"] =
            serde_json::json!([{"name": "nodes", "bridge": {}}]);
        vmi["networks"] =
            serde_json::json!([{"name": "nodes", "multus": {"networkName": "nodes"}}]);
        let docs = render_documents(
            &provider.to_string(),
            "provider.yaml",
            &claim_yaml(""),
            "claim.yaml",
            None,
            &JoinParams::placeholder(),
        )
        .expect("renders");
        let secret = docs
            .iter()
            .find(|d| d["kind"] == "Secret")
            .expect("a Secret");
        let network = secret["stringData"]["networkdata"]
            .as_str()
            .expect("networkdata");
        assert!(network.contains("\"10.40.0.2/24\""), "{network}");
        let vm = docs
            .iter()
            .find(|d| d["kind"] == "VirtualMachine")
            .expect("a VM");
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"],
            "02:a5:0a:28:00:02"
        );
    }

    #[test]
    fn render_node_needs_the_claim_identity() {
        let provider: NodeProvider =
            autonodes_core::yaml::from_str(&example("nodeprovider-minimal.yaml")).expect("parses");
        let cat = Catalogue::from_provider(&provider);
        let mut claim = NodeClaim::new(
            "c",
            NodeClaimSpec {
                provider_ref: None,
                type_ref: None,
                requirements: vec![],
                desired_capacity: Default::default(),
                v_cluster_ref: VClusterRef { name: "t".into() },
                properties: Default::default(),
                taints: vec![],
                startup_taints: vec![],
                labels: Default::default(),
                kubelet_args: Default::default(),
                kubernetes_version: None,
                power: None,
            },
        );
        claim.metadata.namespace = Some("ns".into());
        let t = &cat.types()[0];
        let e = render_node(t, &claim, None, "vm", &JoinParams::placeholder(), "test")
            .expect_err("no uid");
        assert_eq!(e.to_string(), "NodeClaim ns/c: metadata.uid is not set");
        claim.metadata.uid = Some("u".into());
        let r = render_node(t, &claim, None, "vm", &JoinParams::placeholder(), "test")
            .expect("renders");
        assert_eq!(r.provider_id, "kubevirt://vm");
        let mut join = JoinParams::placeholder();
        join.token = "abcdef.0123456789abcdef".into();
        let secret = render_node(t, &claim, None, "vm", &join, "test").expect("renders");
        assert!(secret.user_data.contains("0123456789abcdef"));
        let shown = format!("{secret:?}");
        assert!(
            !shown.contains("0123456789abcdef"),
            "Debug shows no token: {shown}"
        );
        assert_eq!(r.vm_namespace, "vcluster-platform");
        assert_eq!(r.host_cluster, "test-kubevirt-1");
        assert_eq!(r.cost, 14);
        let data = r
            .secret
            .data
            .as_ref()
            .and_then(|d| d.get("userdata"))
            .expect("data");
        assert_eq!(data.0, r.user_data.as_bytes());
    }

    #[test]
    fn restricted_labels_are_returned_for_after_join_and_kept_out_of_the_join_config() {
        let claim =
            claim_yaml("  labels:\n    node-role.kubernetes.io/worker: \"\"\n    team: a\n");
        let provider: NodeProvider =
            autonodes_core::yaml::from_str(&example("nodeprovider-minimal.yaml")).expect("parses");
        let claim: NodeClaim = autonodes_core::yaml::from_str(&claim).expect("parses");
        let r = plan_node(
            &Catalogue::from_provider(&provider),
            &claim,
            None,
            &BTreeMap::new(),
            "vm",
            &JoinParams::placeholder(),
            "test",
        )
        .expect("renders");
        assert_eq!(
            r.labels.after_join,
            BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), String::new())])
        );
        assert_eq!(r.labels.join.get("team").map(String::as_str), Some("a"));
        assert!(!r.user_data.contains("node-role.kubernetes.io"));
        assert!(r.user_data.contains("team=a"));
    }

    #[test]
    fn json_output_is_a_v1_list_and_yaml_output_separates_documents() {
        let docs = render("nodeprovider-minimal.yaml", &claim_yaml(""), None).expect("renders");
        let json: Value =
            serde_json::from_str(&format_documents(&docs, OutputFormat::Json).expect("json"))
                .expect("valid JSON");
        assert_eq!(json["kind"], "List");
        assert_eq!(json["items"].as_array().map(Vec::len), Some(3));
        let yaml = format_documents(&docs, OutputFormat::Yaml).expect("yaml");
        assert_eq!(yaml.matches("---\n").count(), 3);
        assert_eq!(json["items"][1]["kind"], "Secret");
    }

    #[test]
    fn a_tenant_kubeconfig_gives_the_real_endpoint_and_ca_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = include_str!("../../autonodes-core/src/userdata/test-ca.pem");
        let b64 = serde_json::to_value(ByteString(ca.as_bytes().to_vec())).expect("encodes");
        let kc = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\ncontexts:\n- name: t\n  context: {{cluster: t, user: u}}\nclusters:\n- name: t\n  cluster:\n    server: https://10.1.2.3:8443\n    certificate-authority-data: {}\nusers:\n- name: u\n  user: {{token: x}}\n",
            b64.as_str().expect("string")
        );
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kc).expect("writes");
        let join = join_params_from_kubeconfig(&path).expect("reads");
        assert_eq!(join.api_server_endpoint, "10.1.2.3:8443");
        assert_eq!(
            join.ca_cert_hashes,
            vec![
                "sha256:2917f5ab7ab656c6c2585c6a715cfb777c242f7a357a5ba18a4c21849d401d6a"
                    .to_string()
            ]
        );
        assert_eq!(join.token, userdata::PLACEHOLDER_TOKEN);
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n",
        )
        .expect("writes");
        let e = join_params_from_kubeconfig(&path).expect_err("empty");
        assert!(e.to_string().contains("no current-context"), "{e}");
    }
}
