//! The committed `crds/` must be exactly what `autonodes crdgen` writes.

use std::collections::BTreeMap;

#[test]
fn committed_crds_match_what_crdgen_writes() {
    // The workspace root: this crate lives in `crates/autonodes`.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut on_disk: BTreeMap<String, String> = BTreeMap::new();
    for sub in ["", autonodes_api::crdgen::CAPI_DIR] {
        for e in std::fs::read_dir(dir.join(sub)).expect("crds/ and crds/capi/ exist") {
            let path = e.expect("dir entry").path();
            if path.is_dir() {
                continue;
            }
            let name = path
                .strip_prefix(&dir)
                .expect("under crds/")
                .to_string_lossy()
                .into_owned();
            on_disk.insert(
                name,
                std::fs::read_to_string(&path).expect("readable CRD file"),
            );
        }
    }
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
            "capi/machinepools.capi.autonodes.io.yaml",
            "capi/machines.capi.autonodes.io.yaml",
            "capi/machinesets.capi.autonodes.io.yaml"
        ]
    );
}
