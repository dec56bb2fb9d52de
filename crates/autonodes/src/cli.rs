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
    /// Print a shell completion script (`source <(autonodes completion bash)`).
    Completion {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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
        Command::Completion { shell } => {
            print!("{}", completion(shell));
            Ok(())
        }
    }
}

/// The completion script of `autonodes` for `shell`.
fn completion(shell: clap_complete::Shell) -> String {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "autonodes", &mut out);
    String::from_utf8_lossy(&out).into_owned()
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

    #[test]
    fn completion_scripts_complete_the_subcommands_and_explains_kubectl_flags() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = completion(shell);
            for word in ["explain", "import-vcluster", "--kubeconfig", "--context"] {
                assert!(script.contains(word), "{shell}: no {word}");
            }
        }
        let cli = Cli::try_parse_from(["autonodes", "completion", "bash"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Completion {
                shell: clap_complete::Shell::Bash
            }
        ));
        assert!(Cli::try_parse_from(["autonodes", "completion", "tcsh"]).is_err());
    }
}
