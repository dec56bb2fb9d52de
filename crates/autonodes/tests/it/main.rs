//! The controller's integration tests, one binary: a module per area, each against real
//! API servers (`common::world`), the chart, the docs or the image. `cargo test -p autonodes
//! --test it AREA::` runs one area; the test command runs the areas in two lanes
//! (`scripts/lib/test-lanes.sh`).

mod common;
mod hostile;
mod opscommon;

mod addresses;
mod capi;
mod chaos;
mod chart;
mod cloud_init_schema;
mod crash;
mod crds_up_to_date;
mod disruption;
mod docs;
mod explain;
mod foundation;
mod ha;
mod host_maintenance;
mod image;
mod kubeconfig_secrets;
mod kubevirt_native;
mod lifecycle;
mod nodepool;
mod operations;
mod packing;
mod power;
mod prometheus;
mod provisioning;
mod real_guest;
mod release;
mod reliability;
mod render_golden;
mod shards;
mod tenant_cost;
mod tenant_safety;
mod vcluster_import;
mod vcluster_import_cli;
mod vm_namespaces;
mod warm;
