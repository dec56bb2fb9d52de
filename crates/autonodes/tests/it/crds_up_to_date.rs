//! The committed `crds/` must be exactly what `autonodes crdgen` writes.

use std::collections::BTreeMap;

#[test]
fn committed_crds_match_what_crdgen_writes() {
    // The workspace root: this crate lives in `crates/autonodes`.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let on_disk: BTreeMap<String, String> = std::fs::read_dir(&dir)
        .expect("crds/ exists")
        .map(|e| {
            let path = e.expect("dir entry").path();
            let name = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            (
                name,
                std::fs::read_to_string(&path).expect("readable CRD file"),
            )
        })
        .collect();
    let generated: BTreeMap<String, String> = autonodes_api::crdgen::files()
        .expect("CRDs serialize")
        .into_iter()
        .collect();
    assert_eq!(
        on_disk.keys().collect::<Vec<_>>(),
        generated.keys().collect::<Vec<_>>(),
        "crds/ has other files than crdgen writes: run `cargo run -p autonodes -- crdgen`"
    );
    for (name, text) in &generated {
        assert!(
            on_disk[name] == *text,
            "crds/{name} is stale: run `cargo run -p autonodes -- crdgen` and commit the result"
        );
    }
}

#[test]
fn there_is_one_crd_file_per_kind_named_by_plural_and_group() {
    let names: Vec<String> = autonodes_api::crdgen::files()
        .expect("CRDs serialize")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "nodeclaims.autonodes.io.yaml",
            "nodepools.autonodes.io.yaml",
            "nodeproviders.autonodes.io.yaml",
            "nodequotas.autonodes.io.yaml",
            "nodetypes.autonodes.io.yaml",
            "machinepools.capi.autonodes.io.yaml",
            "machines.capi.autonodes.io.yaml",
            "machinesets.capi.autonodes.io.yaml"
        ]
    );
}
