//! The certificates of a test environment, made with `openssl`: each API server's client
//! CA and the admin certificate it signed, serving certificates, client certificates for
//! other users, and the service-account signing key.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::{io_err, TestEnvError};

/// The last complete `CERTIFICATE` PEM block of a bundle (the CA of a leaf + CA chain).
pub(super) fn last_certificate(pem: &str) -> Option<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.rfind(BEGIN)?;
    let end = pem[start..].find(END)? + start + END.len();
    Some(format!("{}\n", &pem[start..end]))
}

/// Writes an EC P-256 private key (SEC 1 PEM, which the API server reads as a key pair
/// for `--service-account-key-file`; PKCS#8 it does not) with `openssl`: an API server's
/// service-account signing key (ES256). Much cheaper to make than an RSA key.
pub(super) fn generate_signing_key(path: &Path) -> Result<(), TestEnvError> {
    let path = path.to_string_lossy();
    run_openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        &path,
    ])
}

/// A client CA and an admin client certificate it signed.
pub(super) struct ClientCa {
    /// The CA certificate's file (`client-ca.crt`).
    pub(super) ca_path: PathBuf,
    /// The admin client certificate (PEM).
    pub(super) admin_cert_pem: Vec<u8>,
    /// The admin client certificate's key (PEM).
    pub(super) admin_key_pem: Vec<u8>,
}

/// Writes a client CA (`client-ca.crt`, `client-ca.key`) into `dir` and an `admin` client
/// certificate in group `system:masters` signed by it, with openssl (EC P-256, quick).
pub(super) fn generate_client_ca(dir: &Path) -> Result<ClientCa, TestEnvError> {
    let ca_key = dir.join("client-ca.key").to_string_lossy().into_owned();
    let ca_crt = dir.join("client-ca.crt").to_string_lossy().into_owned();
    let mut args = vec!["req", "-x509"];
    args.extend(EC_KEY_ARGS);
    args.extend(["-keyout", &ca_key, "-out", &ca_crt, "-days", "3650"]);
    args.extend(["-subj", "/CN=autonodes-test-client-ca"]);
    run_openssl(&args)?;
    let (admin_cert_pem, admin_key_pem) =
        sign_client_certificate(dir, "admin", &["system:masters"])?;
    Ok(ClientCa {
        ca_path: PathBuf::from(ca_crt),
        admin_cert_pem,
        admin_key_pem,
    })
}

const EC_KEY_ARGS: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

/// A key and an X.509 v3 client certificate for `user` in `groups`, signed by the client CA
/// in `dir` (as kubeadm and vCluster issue them; rustls refuses v1 certificates). Returns
/// the certificate and key PEM.
pub(super) fn sign_client_certificate(
    dir: &Path,
    user: &str,
    groups: &[&str],
) -> Result<(Vec<u8>, Vec<u8>), TestEnvError> {
    let file_safe: String = user
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let subject: String = std::iter::once(format!("/CN={user}"))
        .chain(groups.iter().map(|g| format!("/O={g}")))
        .collect();
    let (crt, key) = issue_with_client_ca(
        dir,
        &format!("{file_safe}-client"),
        &subject,
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )?;
    let read = |f: &str| fs::read(f).map_err(io_err(format!("reading {f}")));
    Ok((read(&crt)?, read(&key)?))
}

/// A serving certificate (and key) for `127.0.0.1`, `localhost`, the in-cluster names and
/// `extra_sans` (`IP:…` and `DNS:…` entries), signed by the client CA in `dir`. Returns
/// (certificate path, key path).
pub(super) fn sign_serving_certificate(
    dir: &Path,
    extra_sans: &[String],
) -> Result<(PathBuf, PathBuf), TestEnvError> {
    let mut names = vec![
        "IP:127.0.0.1".to_string(),
        "IP:10.0.0.1".to_string(),
        "DNS:localhost".to_string(),
        "DNS:kubernetes".to_string(),
        "DNS:kubernetes.default".to_string(),
        "DNS:kubernetes.default.svc".to_string(),
    ];
    names.extend(extra_sans.iter().cloned());
    let (crt, key) = issue_with_client_ca(
        dir,
        "serving",
        "/CN=kube-apiserver",
        &format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName={}\n",
            names.join(",")
        ),
    )?;
    Ok((PathBuf::from(crt), PathBuf::from(key)))
}

/// A new EC key and an X.509 v3 certificate for `subject` with `extensions` (an openssl
/// extension file), signed by the client CA in `dir`, written as `<stem>.crt` and
/// `<stem>.key` there. Returns (certificate path, key path).
fn issue_with_client_ca(
    dir: &Path,
    stem: &str,
    subject: &str,
    extensions: &str,
) -> Result<(String, String), TestEnvError> {
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let (key, csr, crt, ext) = (
        p(&format!("{stem}.key")),
        p(&format!("{stem}.csr")),
        p(&format!("{stem}.crt")),
        p(&format!("{stem}.ext")),
    );
    let mut args = vec!["req"];
    args.extend(EC_KEY_ARGS);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
    run_openssl(&args)?;
    fs::write(&ext, extensions).map_err(io_err(format!("writing {ext}")))?;
    let (ca_crt, ca_key, serial) = (p("client-ca.crt"), p("client-ca.key"), p("client-ca.srl"));
    let mut args = vec![
        "x509", "-req", "-in", &csr, "-CA", &ca_crt, "-CAkey", &ca_key,
    ];
    args.extend([
        "-CAcreateserial",
        "-CAserial",
        &serial,
        "-out",
        &crt,
        "-days",
        "3650",
        "-extfile",
        &ext,
    ]);
    run_openssl(&args)?;
    Ok((crt, key))
}

fn run_openssl(args: &[&str]) -> Result<(), TestEnvError> {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(io_err(format!("running openssl {}", args.join(" "))))?;
    if !out.status.success() {
        return Err(TestEnvError::Io {
            context: format!("openssl {}", args.first().copied().unwrap_or_default()),
            source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        });
    }
    Ok(())
}
