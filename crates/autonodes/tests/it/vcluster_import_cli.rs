//! `autonodes import-vcluster`: a vcluster.yaml printed as the NodePools the controller
//! keeps for it, which the real API server accepts as they are.

use crate::common;

use std::process::Command;

use autonodes_api::NodePool;
use common::*;
use kube::api::Api;

fn import(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_autonodes"))
        .arg("import-vcluster")
        .args(args)
        .output()
        .expect("autonodes runs")
}

#[tokio::test]
async fn the_printed_pools_of_the_example_vcluster_yaml_are_stored_by_the_api_server_unchanged() {
    let example = repo().join("examples/vcluster.yaml");
    let out = import(&[
        "-f",
        path_str(&example),
        "--name",
        "tenant",
        "--namespace",
        "tenant",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<NodePool> = stdout
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| autonodes_core::yaml::from_str(d).expect("a NodePool"))
        .collect();
    let names: Vec<String> = printed
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, ["tenant-fixed", "tenant-burst"]);

    let env = start(&["mgmt"]).await;
    let mgmt = env.apiserver("mgmt").expect("mgmt server");
    apply_crds_dir(&env, mgmt);
    kubectl_ok(&env, mgmt, &["create", "namespace", "tenant"]);
    let file = env.dir.join("pools.yaml");
    std::fs::write(&file, &stdout).expect("write");
    kubectl_ok(&env, mgmt, &["apply", "-f", path_str(&file)]);
    let api: Api<NodePool> = Api::namespaced(mgmt.client().await.expect("client"), "tenant");
    for p in &printed {
        let stored = api
            .get(p.metadata.name.as_deref().unwrap_or_default())
            .await
            .expect("stored");
        assert_eq!(stored.spec, p.spec, "the API server changed the spec");
    }
    println!(
        "{}",
        kubectl_ok(&env, mgmt, &["-n", "tenant", "get", "npool"])
    );
}

#[test]
fn an_entry_that_cannot_be_mapped_is_named_on_stderr_and_fails_the_command() {
    let dir = std::env::temp_dir().join(format!("import-vcluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("vcluster.yaml");
    std::fs::write(
        &file,
        "privateNodes:\n  enabled: true\n  autoNodes:\n  - provider: p\n    static:\n    - {name: good, quantity: 1}\n    dynamic:\n    - {name: bad, limits: {cpu: lots}}\n",
    )
    .expect("write");
    let out = import(&["-f", path_str(&file), "--name", "t"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    println!("{stdout}\n{stderr}");
    assert!(!out.status.success());
    assert!(stdout.contains("name: t-good"), "{stdout}");
    assert!(
        stderr.contains("privateNodes.autoNodes[0].dynamic[0].limits.cpu"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
