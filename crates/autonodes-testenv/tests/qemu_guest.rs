//! Real guests (issue 16): the stock image of `scripts/guest-image.sh` boots under QEMU/KVM,
//! Debian's cloud-init reads a NoCloud seed made as KubeVirt makes it and finishes, the guest
//! reaches the one host-loopback port it was given (and not another one), and powers off
//! cleanly. The prepared image is booted by the controller's real-guest test
//! (`crates/autonodes/tests/it/real_guest.rs`), whose Node of it shows its kubelet's version.
//!
//! Skipped, with the reason printed, where `/dev/kvm` is missing or not usable; where it
//! exists but cannot boot a stock kernel (`kvm-pvm`), QEMU emulates the CPU (TCG) instead. Otherwise the
//! test runs `scripts/guest-image.sh` (cached after the first run; it needs root to build).
//! The guest prints one line beginning
//! `qemu-guest:` with the seconds from starting QEMU to cloud-init's "finished" line.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autonodes_testenv::qemu::{
    accelerator, Accel, BootOptions, Guest, GuestImage, GuestNetwork, PowerOff, Variant,
    HOST_ADDRESS,
};

/// From QEMU's start to cloud-init's "finished": generous, the machine may be loaded.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// From the ACPI power button to QEMU's exit.
const POWER_OFF_TIMEOUT: Duration = Duration::from_secs(120);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether guests can run here (KVM, or TCG where `/dev/kvm` exists but cannot boot them);
/// prints why not and returns false when they cannot.
fn guests_or_skip(test: &str) -> bool {
    match accelerator() {
        Ok(Accel::Kvm) => true,
        Ok(Accel::Tcg(why)) => {
            println!("{test}: QEMU emulates the CPU (TCG), slower than KVM: {why}");
            true
        }
        Err(why) => {
            println!("SKIPPED {test}: {why}; the real-guest tests need /dev/kvm");
            false
        }
    }
}

/// The image of `variant`, built by `scripts/guest-image.sh` when it is not cached yet.
fn image(variant: Variant) -> GuestImage {
    let script = repo_root().join("scripts/guest-image.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("running scripts/guest-image.sh");
    assert!(
        out.status.success(),
        "scripts/guest-image.sh failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    println!(
        "guest images in {dir} ({} s for scripts/guest-image.sh)",
        started.elapsed().as_secs()
    );
    GuestImage::in_dir(Path::new(&dir), variant).expect("the image scripts/guest-image.sh built")
}

/// An HTTP server on the host's loopback answering every request with `body`; counts the
/// connections it accepted.
fn http_server(body: &'static str) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, accepted)
}

/// Waits for cloud-init's "finished" line and for the status the user data prints, prints
/// the boot time, and returns the console.
async fn boot_to_finished(guest: &mut Guest, name: &str) -> String {
    let finished = guest
        .wait_for("finished at", BOOT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let seconds = guest.started().elapsed().as_secs_f64();
    assert!(
        finished.contains("Cloud-init v. ") && finished.contains("DataSourceNoCloud"),
        "{name}: cloud-init finished without the NoCloud seed: {finished}"
    );
    guest
        .wait_for("AUTONODES-STATUS-END", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let console = guest.serial_log();
    let status: Vec<&str> = console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("AUTONODES-STATUS "))
        .collect();
    println!(
        "qemu-guest: {name}: cloud-init finished {seconds:.1} s after QEMU started ({:?}); {finished}",
        guest.accel()
    );
    println!(
        "qemu-guest: {name}: cloud-init status --long: {}",
        status.join(" | ")
    );
    assert!(
        status.contains(&"status: done"),
        "{name}: cloud-init did not end with status done: {status:?}"
    );
    assert!(
        status.iter().any(|l| l.contains("DataSourceNoCloud")),
        "{name}: the datasource was not NoCloud: {status:?}"
    );
    console
}

/// The runcmd lines both tests share: cloud-init's version, the cgroup file system, and
/// cloud-init's final status (after the final stage, in the background).
const COMMON_RUNCMD: &str = r#"  - [sh, -c, 'echo "AUTONODES-VERSION $(cloud-init --version 2>&1)" > /dev/console']
  - [sh, -c, 'echo "AUTONODES-CGROUP $(stat -fc %T /sys/fs/cgroup)" > /dev/console']
  - [sh, -c, '(cloud-init status --wait --long 2>&1 | sed "s/^/AUTONODES-STATUS /"; echo AUTONODES-STATUS-END) > /dev/console &']
"#;

fn console_value<'a>(console: &'a str, key: &str) -> Option<&'a str> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(key))
        .map(str::trim)
        .next_back()
}

async fn power_off(mut guest: Guest, name: &str) {
    let pid = guest.pid().expect("QEMU runs");
    let started = Instant::now();
    let how = guest
        .shutdown(POWER_OFF_TIMEOUT)
        .await
        .expect("shutting the guest down");
    println!(
        "qemu-guest: {name}: powered off ({how:?}) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        how,
        PowerOff::Clean,
        "{name}: the guest did not power off by itself"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "{name}: QEMU (pid {pid}) is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_guest_runs_cloud_init_and_reaches_only_its_host_port() {
    if !guests_or_skip("stock_guest_runs_cloud_init_and_reaches_only_its_host_port") {
        return;
    }
    let image = image(Variant::Stock);
    let (port, served) = http_server("autonodes-probe-answer");
    // A second loopback server the guest is not given: it must not reach it.
    let (other_port, other_served) = http_server("must-not-be-reached");
    let user_data = format!(
        r#"#cloud-config
runcmd:
  - [sh, -c, 'echo "AUTONODES-MARKER $(hostname)" > /dev/console']
  - [sh, -c, 'echo "AUTONODES-HTTP $(curl -fsS --max-time 30 http://{HOST_ADDRESS}:{port}/probe 2>&1)" > /dev/console']
  - [sh, -c, 'out=$(curl -sS --max-time 15 http://{HOST_ADDRESS}:{other_port}/ 2>&1); echo "AUTONODES-OTHER exit=$? $out" > /dev/console']
{COMMON_RUNCMD}"#
    );
    let meta_data = "instance-id: autonodes-stock-test\nlocal-hostname: guest-stock\n";
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = BootOptions {
        network: GuestNetwork::HostPorts(vec![port]),
        ..BootOptions::default()
    };
    let mut guest = Guest::boot_with(&image, &user_data, meta_data, None, dir.path(), &options)
        .expect("booting the stock guest");
    let console = boot_to_finished(&mut guest, "stock").await;

    assert_eq!(
        console_value(&console, "AUTONODES-MARKER"),
        Some("guest-stock"),
        "the marker with the meta-data's hostname"
    );
    println!(
        "qemu-guest: stock: {}",
        console_value(&console, "AUTONODES-VERSION").unwrap_or("no cloud-init version")
    );
    assert_eq!(
        console_value(&console, "AUTONODES-HTTP"),
        Some("autonodes-probe-answer"),
        "the guest fetches from the host's loopback via {HOST_ADDRESS}"
    );
    assert!(served.load(Ordering::SeqCst) >= 1);
    let other = console_value(&console, "AUTONODES-OTHER").unwrap_or_default();
    println!("qemu-guest: stock: a host port it was not given: {other}");
    assert!(
        other.starts_with("exit=")
            && !other.starts_with("exit=0 ")
            && !other.contains("must-not-be-reached"),
        "the guest reached a host port it was not given: {other}"
    );
    assert_eq!(other_served.load(Ordering::SeqCst), 0);
    assert_eq!(
        console_value(&console, "AUTONODES-CGROUP"),
        Some("tmpfs"),
        "cgroup v1 (kubelet 1.20)"
    );
    power_off(guest, "stock").await;
}
