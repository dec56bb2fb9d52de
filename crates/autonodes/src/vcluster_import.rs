//! `autonodes import-vcluster -f vcluster.yaml`: the NodePools the controller keeps for a
//! vCluster with that configuration, printed as YAML, touching no cluster.

use std::path::PathBuf;

use anyhow::Context as _;
use autonodes_core::vcluster;

/// Arguments of `autonodes import-vcluster`.
#[derive(Debug, clap::Args)]
pub(crate) struct ImportArgs {
    /// The vCluster's `vcluster.yaml` (or its chart values), `-` for standard input.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The vCluster's name (its Helm release): pools are named `<name>-<pool>` and join it.
    #[arg(long, default_value = "vcluster")]
    pub name: String,
    /// The vCluster's namespace on the management cluster, where its pools live.
    #[arg(long, default_value = "default")]
    pub namespace: String,
}

/// Prints the pools as a YAML stream, and each entry that cannot be mapped on standard
/// error; fails when any could not.
pub(crate) fn run(args: ImportArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .context("reading standard input")?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let config = vcluster::parse(&text)?;
    let mut failed = 0;
    let mut out = String::new();
    for pool in vcluster::node_pools(&args.name, &args.namespace, &config, None) {
        match pool {
            Ok(p) => {
                let mut doc = serde_json::to_value(&p)?;
                if let Some(o) = doc.as_object_mut() {
                    o.remove("status");
                }
                out.push_str("---\n");
                out.push_str(&autonodes_core::yaml::to_string(&doc)?);
            }
            Err(e) => {
                failed += 1;
                eprintln!("not imported: {e}");
            }
        }
    }
    print!("{out}");
    if !config.private_nodes.enabled {
        eprintln!("privateNodes.enabled is not true: vCluster runs no private nodes, so no pool");
    }
    anyhow::ensure!(failed == 0, "{failed} pool(s) could not be imported");
    Ok(())
}
