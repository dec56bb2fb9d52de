//! Real guests under QEMU (issue 16): the Debian bookworm images `scripts/guest-image.sh`
//! builds, booted with a NoCloud seed made as KubeVirt's `cloudInitNoCloud` makes it.
//!
//! A [`Guest`] runs `qemu-system-x86_64` on a qcow2 overlay of the cached image (the image
//! itself is never written), with the kernel and initrd beside the image (`-kernel`, `-initrd`),
//! its serial console in a log file and QEMU's user-mode network only: by default
//! ([`GuestNetwork::HostPorts`]) the guest reaches the listed ports of the host's loopback as
//! `10.0.2.2:<port>` and nothing else (`restrict=on`). Its process is recorded like every other
//! process the tests start ([`crate::testenv::record_pid`]), is killed when the [`Guest`] is
//! dropped, and [`Guest::shutdown`] powers it off cleanly (ACPI power button over QMP, then a
//! kill after a timeout).
//!
//! The CPU: KVM (`-enable-kvm -cpu host`) where [`kvm_usable`]; where `/dev/kvm` exists but
//! cannot boot a stock kernel (the nested `kvm-pvm` flavour) QEMU emulates it (TCG), several
//! times slower; where there is no `/dev/kvm`, [`accelerator`] says why and the tests skip.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::testenv::ManagedProcess;

/// Where `scripts/guest-image.sh` puts the images unless [`GUEST_DIR_ENV`] says otherwise.
pub const DEFAULT_GUEST_DIR: &str = "/var/cache/autonodes/guest";

/// The environment variable naming the images' directory (as `scripts/guest-image.sh` reads it).
pub const GUEST_DIR_ENV: &str = "AUTONODES_GUEST_DIR";

/// The environment variable naming the QEMU binary (else `qemu-system-x86_64` on `PATH`).
pub const QEMU_ENV: &str = "AUTONODES_QEMU";

/// The address under which a guest reaches the host's loopback (QEMU's user-mode network).
pub const HOST_ADDRESS: &str = "10.0.2.2";

/// QEMU's own address on a restricted guest's network (its gateway, which it cannot reach).
const RESTRICTED_GATEWAY: &str = "10.0.2.254";

/// Which image: both are Debian bookworm with cloud-init, containerd and the CNI plugins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Without kubelet and kubeadm: user data has to install them.
    Stock,
    /// With kubelet and kubeadm v1.20.2, `kubelet.service` and kubeadm's drop-in (enabled).
    Prepared,
}

impl Variant {
    /// The variant's directory name under the images' directory.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Stock => "stock",
            Variant::Prepared => "prepared",
        }
    }
}

/// A guest image built by `scripts/guest-image.sh`: a root file system and the kernel and
/// initrd QEMU boots directly.
#[derive(Clone, Debug)]
pub struct GuestImage {
    /// The variant.
    pub variant: Variant,
    /// The root file system (qcow2; ext4 on the whole disk), used read-only as a backing file.
    pub rootfs: PathBuf,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initrd (virtio_blk, virtio_net, ext4).
    pub initrd: PathBuf,
    /// The kernel command line (root disk, serial console, cgroup v1).
    pub cmdline: String,
}

impl GuestImage {
    /// The image of `variant` in `$AUTONODES_GUEST_DIR` (else [`DEFAULT_GUEST_DIR`]); an error
    /// saying to run `scripts/guest-image.sh` when it is not there.
    pub fn cached(variant: Variant) -> io::Result<Self> {
        let dir = std::env::var_os(GUEST_DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_GUEST_DIR));
        Self::in_dir(&dir, variant)
    }

    /// The image of `variant` under `dir` (as `scripts/guest-image.sh` lays it out).
    fn in_dir(dir: &Path, variant: Variant) -> io::Result<Self> {
        let base = dir.join(variant.name());
        let missing = |what: &Path| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no {} guest image: {} is missing; run scripts/guest-image.sh (as root; \
                     it builds the images once into {} or ${GUEST_DIR_ENV})",
                    variant.name(),
                    what.display(),
                    dir.display()
                ),
            )
        };
        let image = GuestImage {
            variant,
            rootfs: base.join("rootfs.qcow2"),
            kernel: base.join("vmlinuz"),
            initrd: base.join("initrd.img"),
            cmdline: String::new(),
        };
        for path in [&image.rootfs, &image.kernel, &image.initrd] {
            if !path.is_file() {
                return Err(missing(path));
            }
        }
        let cmdline_path = base.join("cmdline");
        let cmdline = fs::read_to_string(&cmdline_path).map_err(|_| missing(&cmdline_path))?;
        Ok(GuestImage {
            cmdline: cmdline.trim().to_string(),
            ..image
        })
    }
}

/// The environment variable choosing the accelerator: `kvm` or `tcg` (else [`accelerator`]
/// decides).
pub const ACCEL_ENV: &str = "AUTONODES_QEMU_ACCEL";

/// How QEMU runs the guest's CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation (`-enable-kvm -cpu host`).
    Kvm,
    /// QEMU's own emulation (`-accel tcg,thread=multi -cpu max`): several times slower; used
    /// where `/dev/kvm` exists but cannot boot a stock kernel. Says why.
    Tcg(String),
}

/// Whether `/dev/kvm` can boot the guests' stock Debian kernel: `Err` says why not (missing,
/// not usable by this user, or the `kvm-pvm` flavour of KVM, whose guests must be PVM-enabled
/// kernels: a stock kernel crawls through its decompressor for minutes), or that QEMU is not
/// installed.
pub fn kvm_usable() -> Result<(), String> {
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        return Err("/dev/kvm does not exist (no KVM on this machine)".into());
    }
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(kvm)
        .map_err(|e| format!("/dev/kvm is not usable: {e}"))?;
    if Path::new("/sys/module/kvm_pvm").exists() {
        return Err(
            "/dev/kvm is kvm-pvm (nested, Pagetable-based Virtual Machine), which \
                    does not boot a stock kernel in reasonable time"
                .into(),
        );
    }
    qemu_binary().map(|_| ())
}

/// The accelerator guests use here: `$AUTONODES_QEMU_ACCEL` (`kvm` or `tcg`) when set; else
/// KVM when [`kvm_usable`], else TCG when `/dev/kvm` exists but cannot boot the guests (so
/// real guests still run, slower); `Err` (why) where there is no `/dev/kvm` at all or no
/// QEMU: the tests skip there.
pub fn accelerator() -> Result<Accel, String> {
    qemu_binary()?;
    match std::env::var(ACCEL_ENV).ok().as_deref() {
        Some("kvm") => return kvm_usable().map(|()| Accel::Kvm),
        Some("tcg") => return Ok(Accel::Tcg(format!("{ACCEL_ENV}=tcg"))),
        Some(other) if !other.is_empty() => {
            return Err(format!("{ACCEL_ENV}={other}: expected kvm or tcg"))
        }
        _ => {}
    }
    match kvm_usable() {
        Ok(()) => Ok(Accel::Kvm),
        Err(why) if Path::new("/dev/kvm").exists() => Ok(Accel::Tcg(why)),
        Err(why) => Err(why),
    }
}

/// The QEMU binary: `$AUTONODES_QEMU`, else `qemu-system-x86_64` on `PATH`.
fn qemu_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(QEMU_ENV) {
        return Ok(PathBuf::from(path));
    }
    find_in_path("qemu-system-x86_64").ok_or_else(|| {
        "qemu-system-x86_64 not found: install Debian's qemu-system-x86 \
         (scripts/guest-image.sh does)"
            .to_string()
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs a short helper command, failing with its output when it fails.
fn run(program: &str, args: &[&str]) -> io::Result<()> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running {program}: {e}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// Writes a NoCloud seed to `iso` as KubeVirt's `cloudInitNoCloud` volume is made: an
/// ISO9660 volume labelled `cidata` (Joliet and Rock Ridge) holding `user-data`, `meta-data`
/// and, when given, `network-config` (Debian's `genisoimage`).
pub fn write_nocloud_seed(
    iso: &Path,
    user_data: &str,
    meta_data: &str,
    network_config: Option<&str>,
) -> io::Result<()> {
    let parent = iso.parent().unwrap_or(Path::new("."));
    let staging = tempfile::Builder::new()
        .prefix("cidata.")
        .tempdir_in(parent)?;
    let mut files = vec![("user-data", user_data), ("meta-data", meta_data)];
    if let Some(network) = network_config {
        files.push(("network-config", network));
    }
    let mut paths = Vec::new();
    for (name, content) in files {
        let path = staging.path().join(name);
        fs::write(&path, content)?;
        paths.push(path.to_string_lossy().into_owned());
    }
    let iso_arg = iso.to_string_lossy().into_owned();
    let mut args = vec![
        "-quiet", "-output", &iso_arg, "-volid", "cidata", "-joliet", "-rock",
    ];
    args.extend(paths.iter().map(String::as_str));
    run("genisoimage", &args).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                e.kind(),
                format!("{e}: install Debian's genisoimage (scripts/guest-image.sh does)"),
            )
        } else {
            e
        }
    })
}

/// What the guest's user-mode network lets it reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestNetwork {
    /// `restrict=on`: the guest reaches `10.0.2.2:<port>` (the host's `127.0.0.1:<port>`) for
    /// exactly these ports, and nothing else: no other host port, no other address.
    HostPorts(Vec<u16>),
    /// QEMU's default user-mode network: `10.0.2.2` is the host's loopback on every port, and
    /// the guest's other connections leave through the host like the host's own.
    Open,
}

/// How a guest is booted; [`Default`] is 2048 MiB, 2 vCPUs, a 10 GiB disk, no host port and
/// the accelerator [`accelerator`] chooses.
#[derive(Clone, Debug)]
pub struct BootOptions {
    /// Memory in MiB (`-m`).
    pub memory_mib: u32,
    /// Virtual CPUs (`-smp`).
    pub cpus: u32,
    /// The overlay disk's size (`qemu-img` syntax, `10G`); cloud-init grows the root file
    /// system to it at boot.
    pub disk_size: String,
    /// What the network lets the guest reach.
    pub network: GuestNetwork,
    /// The accelerator; `None`: [`accelerator`] chooses.
    pub accel: Option<Accel>,
    /// The network card's MAC address (`52:54:00:12:34:56`, QEMU's own, when `None`): what
    /// network data matching an interface by its MAC address needs.
    pub mac_address: Option<String>,
}

impl Default for BootOptions {
    fn default() -> Self {
        BootOptions {
            memory_mib: 2048,
            cpus: 2,
            disk_size: "10G".into(),
            network: GuestNetwork::HostPorts(Vec::new()),
            accel: None,
            mac_address: None,
        }
    }
}

/// How [`Guest::shutdown`] ended the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerOff {
    /// The guest powered itself off after the ACPI power button.
    Clean,
    /// It did not within the timeout (or QMP failed) and was killed.
    Killed,
}

/// A running guest: QEMU (KVM or TCG), killed when dropped.
#[derive(Debug)]
pub struct Guest {
    dir: PathBuf,
    process: ManagedProcess,
    serial: PathBuf,
    qmp: PathBuf,
}

impl Guest {
    /// Boots `image` with a NoCloud seed of `user_data`, `meta_data` and `network_config`
    /// and `options`; the seed, the overlay disk and the logs go to `work_dir` (created when
    /// missing).
    pub fn boot_with(
        image: &GuestImage,
        user_data: &str,
        meta_data: &str,
        network_config: Option<&str>,
        work_dir: &Path,
        options: &BootOptions,
    ) -> io::Result<Guest> {
        let qemu = qemu_binary().map_err(io::Error::other)?;
        let accel = match &options.accel {
            Some(accel) => accel.clone(),
            None => accelerator().map_err(io::Error::other)?,
        };
        fs::create_dir_all(work_dir)?;
        let dir = work_dir.canonicalize()?;
        let seed = dir.join("seed.iso");
        write_nocloud_seed(&seed, user_data, meta_data, network_config)?;

        let disk = dir.join("disk.qcow2");
        let _ = fs::remove_file(&disk);
        let backing = image.rootfs.canonicalize()?;
        run(
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-b",
                &backing.to_string_lossy(),
                "-F",
                "qcow2",
                &disk.to_string_lossy(),
                &options.disk_size,
            ],
        )?;

        let serial = dir.join("serial.log");
        let qmp = dir.join("qmp.sock");
        let _ = fs::remove_file(&qmp);
        // sun_path holds 108 bytes with the terminating NUL.
        if qmp.as_os_str().len() > 107 {
            return Err(io::Error::other(format!(
                "{} is too long for a unix socket: use a shorter work directory",
                qmp.display()
            )));
        }
        let mut netdev = "user,id=net0".to_string();
        if let GuestNetwork::HostPorts(ports) = &options.network {
            if !ports.is_empty() && find_in_path("socat").is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "socat not found (the guest's forwards to the host's loopback run it): \
                     install Debian's socat (scripts/guest-image.sh does)",
                ));
            }
            // A restricted guest reaches only guest forwards, and QEMU refuses one on its
            // host address: that moves to RESTRICTED_GATEWAY (unreachable when restricted), and
            // 10.0.2.2:<port> becomes a forward that runs `socat` to 127.0.0.1:<port> for each
            // connection.
            let _ = write!(netdev, ",restrict=on,host={RESTRICTED_GATEWAY}");
            for port in ports {
                let _ = write!(
                    netdev,
                    ",guestfwd=tcp:{HOST_ADDRESS}:{port}-cmd:socat - TCP:127.0.0.1:{port}"
                );
            }
        }
        let mut args: Vec<String> = vec![
            "-name".into(),
            format!("autonodes-{}", image.variant.name()),
        ];
        let accel_args = match &accel {
            Accel::Kvm => ["-enable-kvm", "-cpu", "host"].as_slice(),
            Accel::Tcg(_) => ["-accel", "tcg,thread=multi", "-cpu", "max"].as_slice(),
        };
        args.extend(accel_args.iter().map(|a| a.to_string()));
        args.extend([
            "-m".into(),
            options.memory_mib.to_string(),
            "-smp".into(),
            options.cpus.to_string(),
            "-nographic".into(),
            "-monitor".into(),
            "none".into(),
            "-serial".into(),
            format!("file:{}", serial.display()),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", qmp.display()),
            "-kernel".into(),
            image.kernel.to_string_lossy().into_owned(),
            "-initrd".into(),
            image.initrd.to_string_lossy().into_owned(),
            "-append".into(),
            image.cmdline.clone(),
            "-drive".into(),
            format!(
                "file={},format=qcow2,if=virtio,cache=unsafe,discard=unmap",
                disk.display()
            ),
            "-drive".into(),
            format!("file={},format=raw,if=virtio,readonly=on", seed.display()),
            "-netdev".into(),
            netdev,
            "-device".into(),
            match &options.mac_address {
                Some(mac) => format!("virtio-net-pci,netdev=net0,mac={mac}"),
                None => "virtio-net-pci,netdev=net0".into(),
            },
            "-device".into(),
            "virtio-rng-pci".into(),
        ]);
        let process = ManagedProcess::spawn(
            &format!("qemu-system-x86_64 {}", dir.display()),
            &qemu,
            &args,
            &dir.join("qemu.log"),
        )
        .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Guest {
            dir,
            process,
            serial,
            qmp,
        })
    }

    /// QEMU's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The guest's directory (seed, overlay disk, serial and QEMU logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The serial console's log file.
    pub fn serial_log_path(&self) -> &Path {
        &self.serial
    }

    /// Whether QEMU still runs.
    pub fn running(&mut self) -> bool {
        self.process.check_running().is_ok()
    }

    /// Presses the ACPI power button (QMP `system_powerdown`) and waits up to `timeout` for the
    /// guest to power off; kills QEMU when it does not. QEMU has exited when this returns.
    pub async fn shutdown(&mut self, timeout: Duration) -> io::Result<PowerOff> {
        if !self.running() {
            self.process.kill();
            return Ok(PowerOff::Clean);
        }
        let pressed = tokio::time::timeout(Duration::from_secs(10), self.qmp("system_powerdown"))
            .await
            .unwrap_or_else(|_| Err(io::Error::other("QMP did not answer within 10 s")));
        if let Err(e) = pressed {
            tracing::warn!(error = %e, dir = %self.dir.display(), "QMP system_powerdown failed; killing the guest");
            self.process.kill();
            return Ok(PowerOff::Killed);
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.running() {
                self.process.kill();
                return Ok(PowerOff::Clean);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.process.kill();
        Ok(PowerOff::Killed)
    }

    /// Kills QEMU (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Runs one QMP command (after the capabilities handshake) and returns its answer.
    async fn qmp(&self, command: &str) -> io::Result<String> {
        let stream = UnixStream::connect(&self.qmp).await?;
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        lines
            .next_line()
            .await?
            .ok_or_else(|| io::Error::other("QMP sent no greeting"))?;
        write
            .write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
            .await?;
        qmp_answer(&mut lines).await?;
        write
            .write_all(format!("{{\"execute\":\"{command}\"}}\n").as_bytes())
            .await?;
        qmp_answer(&mut lines).await
    }
}

/// The next QMP answer: a line with `"return"` (or `"error"`, an error); events in between
/// are skipped.
async fn qmp_answer(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
) -> io::Result<String> {
    loop {
        let line = lines
            .next_line()
            .await?
            .ok_or_else(|| io::Error::other("QMP closed the connection"))?;
        if line.contains("\"return\"") {
            return Ok(line);
        }
        if line.contains("\"error\"") {
            return Err(io::Error::other(format!("QMP error: {line}")));
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.process.kill();
    }
}
