//! Command-line interface of the `autonodes` binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// KubeVirt virtual machines as worker nodes for tenant clusters.
#[derive(Debug, Parser)]
#[command(name = "autonodes", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands of `autonodes`.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Write the CustomResourceDefinitions, one YAML file per CRD.
    Crdgen {
        /// Directory to write into.
        #[arg(long, default_value = "crds")]
        out: PathBuf,
    },
    /// Print the NodeType, Secret and VirtualMachine a claim would get, touching no cluster.
    Render(crate::render::RenderArgs),
    /// Print the NodePools a vCluster's `vcluster.yaml` (`privateNodes.autoNodes`) becomes,
    /// touching no cluster.
    ImportVcluster(crate::vcluster_import::ImportArgs),
    /// Say why a NodeClaim, a NodePool, a tenant Node or a tenant pod is where it is (reads the
    /// management cluster of the current kubeconfig; writes nothing).
    Explain(crate::explain::ExplainArgs),
    /// Run the controller.
    Run(Box<crate::run::RunArgs>),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crdgen { out } => {
            for path in autonodes_api::crdgen::write_all(&out)? {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Render(args) => crate::render::run(args),
        Command::ImportVcluster(args) => crate::vcluster_import::run(args),
        Command::Explain(args) => runtime()?.block_on(crate::explain::run(args)),
        Command::Run(args) => runtime()?.block_on(crate::run::run(*args)),
    }
}

/// The async runtime of the long-running subcommands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_takes_kubectls_flags_after_the_name() {
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "autonodes",
            "explain",
            "nodeclaim",
            "x",
            "-n",
            "team-a",
            "--kubeconfig",
            "mgmt.kubeconfig",
            "--context",
            "mgmt",
            "-o",
            "yaml",
        ])
        .expect("parses");
        let Command::Explain(args) = cli.command else {
            panic!("not explain");
        };
        assert_eq!(args.namespace.as_deref(), Some("team-a"));
        assert_eq!(args.context.as_deref(), Some("mgmt"));
        assert_eq!(args.output, crate::explain::Format::Yaml);
        assert_eq!(
            args.kubeconfig.as_deref(),
            Some(std::path::Path::new("mgmt.kubeconfig"))
        );
    }
}
