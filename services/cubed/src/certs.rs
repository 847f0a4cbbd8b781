//! The data directory's certificate authority (`<data-dir>/tls/`): a dev server certificate for
//! `--tls-dev`, and client certificates for mTLS (`cubed key cert`), whose subject common name is
//! `tenant/key_id`.
//!
//! The CA key never leaves the data directory (mode 0600). Its parameters are rebuilt from
//! [`ca_params`] when signing, so only the key and the certificate are stored.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
const SERVER_CERT: &str = "server.pem";
const SERVER_KEY: &str = "server.key";
/// Beside `tls/`, not in it: says a client certificate was issued under the data directory's CA,
/// so that a copy of the directory restored without `tls/` is known to have lost a CA that
/// certificates rely on.
const CLIENT_CERTS_ISSUED: &str = "client-certs-issued";

/// Whether `cubed key cert` ever issued a client certificate for this data directory (by this
/// build or a later one).
pub fn client_certs_issued(data_dir: &Path) -> bool {
    data_dir.join(CLIENT_CERTS_ISSUED).exists()
}

/// `<data-dir>/tls`.
pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Cube data-directory CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Write `contents` to `path` with mode 0600, whole or not at all (see
/// [`cube_wal::replace_file_durably`]).
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    cube_wal::replace_file_durably(path, contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// An exclusive lock on `tls/` while the certificate files are looked at and created, so two
/// processes (a `cubed key cert` and a starting `--tls-dev` server, say) cannot each make a CA
/// and leave one's key beside the other's certificate.
fn lock_tls_dir(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(".lock"))
        .with_context(|| format!("locking {}", dir.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", dir.display()))
}

/// Whether the data directory has its CA already: its certificate, or its key (from which
/// [`ensure_ca`] makes the certificate again).
pub fn has_ca(data_dir: &Path) -> bool {
    let dir = tls_dir(data_dir);
    dir.join(CA_CERT).exists() || dir.join(CA_KEY).exists()
}

/// The CA certificate PEM, to verify client certificates with: `ca.pem` alone where it is
/// there (`ca.key` may be kept elsewhere: only issuing needs it), else [`ensure_ca`]'s.
pub fn ca_cert_pem(data_dir: &Path) -> anyhow::Result<String> {
    let path = tls_dir(data_dir).join(CA_CERT);
    match fs::read_to_string(&path) {
        Ok(pem) => Ok(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            ensure_ca(data_dir).map(|(_, pem)| pem)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The CA key and certificate PEM, created on first use. A certificate missing beside its key
/// (a crash between the two writes, a partial restore) is made again from the key: the
/// certificates it signed stay valid. A key missing beside its certificate is an error: a new
/// CA would replace the certificate every client certificate issued so far is checked against
/// (until 2026-12-06 it did, at the next start with TLS).
pub fn ensure_ca(data_dir: &Path) -> anyhow::Result<(KeyPair, String)> {
    let dir = tls_dir(data_dir);
    fs::create_dir_all(&dir)?;
    let _lock = lock_tls_dir(&dir)?;
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if key_path.exists() {
        let key =
            KeyPair::from_pem(&fs::read_to_string(&key_path)?).context("reading the CA key")?;
        if cert_path.exists() {
            return Ok((key, fs::read_to_string(&cert_path)?));
        }
        let cert = ca_params()?.self_signed(&key)?;
        write_private(&cert_path, &cert.pem())?;
        tracing::warn!(dir = %dir.display(), "the certificate authority's ca.pem was missing: made again from its ca.key (the certificates it signed stay valid)");
        return Ok((key, cert.pem()));
    }
    if cert_path.exists() {
        anyhow::bail!(
            "{} is there without its key {}: put the key back to issue certificates with it \
             (a server only verifying client certificates needs ca.pem alone, but a new \
             certificate must be signed), or remove {} too to make a new certificate authority \
             (every client certificate issued under the old one is then refused)",
            cert_path.display(),
            key_path.display(),
            cert_path.display()
        );
    }
    // The key goes first, the certificate last.
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    write_private(&key_path, &key.serialize_pem())?;
    write_private(&cert_path, &cert.pem())?;
    tracing::info!(dir = %dir.display(), "created the data directory's certificate authority");
    Ok((key, cert.pem()))
}

/// That `key` is the key of the CA certificate `pem`, before it signs anything: certificates
/// signed with another key (a partial restore, a file replaced by hand) fail every TLS
/// handshake, which the server logs only at debug level. (A server only verifying client
/// certificates needs `pem` alone, and starts whatever the key.)
fn check_ca_pair(pem: &str, key: &KeyPair, dir: &Path) -> anyhow::Result<()> {
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.join(CA_CERT).display()))?;
    let cert = parsed
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.join(CA_CERT).display()))?;
    anyhow::ensure!(
        cert.public_key().subject_public_key.data.as_ref() == rcgen::PublicKeyData::der_bytes(key),
        "{} is not the key of {} (restored from different backups, or one replaced): put back \
         the pair that belong together, or remove both to make a new certificate authority \
         (every client certificate issued under the old one is then refused)",
        dir.join(CA_KEY).display(),
        dir.join(CA_CERT).display()
    );
    Ok(())
}

/// Paths of the CA certificate clients should trust.
pub fn ca_cert_path(data_dir: &Path) -> PathBuf {
    tls_dir(data_dir).join(CA_CERT)
}

/// A server certificate for localhost / 127.0.0.1 / ::1, and `listen` if it is another (not a
/// wildcard) address, signed by the CA (for `--tls-dev`), created on first use and made again
/// for a `listen` it does not name: dev-credentials.json names that address, and a client
/// checks the certificate against it. Returns (cert chain PEM, key PEM).
pub fn ensure_dev_server_cert(
    data_dir: &Path,
    listen: std::net::IpAddr,
) -> anyhow::Result<(String, String)> {
    let dir = tls_dir(data_dir);
    let (cert_path, key_path) = (dir.join(SERVER_CERT), dir.join(SERVER_KEY));
    // The CA's key only if a certificate must be made: one already made serves without it.
    let ca_pem = ca_cert_pem(data_dir)?;
    {
        let _lock = lock_tls_dir(&dir)?;
        if cert_path.exists() && key_path.exists() {
            let chain = fs::read_to_string(&cert_path)?;
            // The chain ends with the CA that signed it: one made by an earlier CA (its files
            // removed to replace it, or a partial restore) is made again, else clients trusting
            // the new ca.pem would refuse the server.
            if !chain.ends_with(&ca_pem) {
                tracing::warn!(dir = %dir.display(), "the development server certificate was signed by an earlier CA: making a new one");
            } else if !names_ip(&chain, listen) {
                tracing::info!(dir = %dir.display(), %listen, "the development server certificate does not name the listen address: making a new one that does");
            } else {
                let key = fs::read_to_string(&key_path)?;
                // A key that is not the certificate's (a stop between the two writes below,
                // when a certificate was made again) would fail every start from here on.
                if is_key_of(&chain, &key) {
                    return Ok((chain, key));
                }
                tracing::warn!(dir = %dir.display(), "the development server key is not the certificate's: making a new pair");
            }
        }
    }
    let (ca_key, ca_pem) = ensure_ca(data_dir)?;
    let _lock = lock_tls_dir(&dir)?;
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if needs_own_name(listen) {
        names.push(listen.to_string());
    }
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "cubed (development)");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    check_ca_pair(&ca_pem, &ca_key, &dir)?;
    let key = KeyPair::generate()?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let cert = params.signed_by(&key, &issuer)?;
    let chain = format!("{}{}", cert.pem(), ca_pem);
    // The key first: a certificate on disk always has its key beside it.
    write_private(&key_path, &key.serialize_pem())?;
    write_private(&cert_path, &chain)?;
    Ok((chain, key.serialize_pem()))
}

/// Whether `key_pem` is the key of the first certificate of `chain`.
fn is_key_of(chain: &str, key_pem: &str) -> bool {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(chain.as_bytes()) else {
        return false;
    };
    pem.parse_x509().is_ok_and(|cert| {
        cert.public_key().subject_public_key.data.as_ref() == rcgen::PublicKeyData::der_bytes(&key)
    })
}

/// Whether the development certificate must name `ip` besides localhost, 127.0.0.1 and ::1:
/// clients are pointed at it (a wildcard address is given to them as 127.0.0.1 or ::1).
fn needs_own_name(ip: std::net::IpAddr) -> bool {
    !ip.is_unspecified()
        && ip != std::net::Ipv4Addr::LOCALHOST
        && ip != std::net::Ipv6Addr::LOCALHOST
}

/// Whether the first certificate of `chain` names `ip`, or `ip` needs no name of its own.
fn names_ip(chain: &str, ip: std::net::IpAddr) -> bool {
    if !needs_own_name(ip) {
        return true;
    }
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(chain.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let octets = match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value.general_names.iter().any(|name| {
                matches!(name, x509_parser::extensions::GeneralName::IPAddress(a) if *a == octets.as_slice())
            })
        })
}

/// The longest validity `cubed key cert --days` takes (about ten years).
pub const MAX_CLIENT_CERT_DAYS: u32 = 3660;

/// A client certificate, made and not yet written anywhere.
pub struct ClientCert {
    pub cert_pem: String,
    pub key_pem: String,
    /// SHA-256 of the certificate's DER encoding.
    pub sha256: [u8; 32],
    pub not_after: time::OffsetDateTime,
}

/// Without the private key.
impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert")
            .field("sha256", &hex::encode(self.sha256))
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// A client certificate for `tenant/key_id`, signed by the CA, valid from an hour ago (for
/// clocks behind the server's) until `days` from now.
pub fn issue_client_cert(
    data_dir: &Path,
    tenant: &str,
    key_id: &str,
    days: u32,
) -> anyhow::Result<ClientCert> {
    anyhow::ensure!(
        (1..=MAX_CLIENT_CERT_DAYS).contains(&days),
        "--days must be 1 to {MAX_CLIENT_CERT_DAYS}, not {days}"
    );
    // Not a new CA without a word where certificates were issued under one now gone (a copy
    // restored without tls/): every certificate issued so far would then fail its handshake.
    // (A server starting with TLS makes one, with a warning in its log.)
    anyhow::ensure!(
        has_ca(data_dir) || !client_certs_issued(data_dir),
        "client certificates were issued under this data directory's certificate authority, \
         and its files ({}, {}) are gone: a new one would make every certificate issued so far \
         fail its TLS handshake. Restore tls/ from the copy this directory came from; or, to \
         start a new authority on purpose, remove {} and run this again (every earlier client \
         certificate is then refused)",
        tls_dir(data_dir).join(CA_CERT).display(),
        tls_dir(data_dir).join(CA_KEY).display(),
        data_dir.join(CLIENT_CERTS_ISSUED).display()
    );
    let (ca_key, ca_pem) = ensure_ca(data_dir)?;
    check_ca_pair(&ca_pem, &ca_key, &tls_dir(data_dir))?;
    if !client_certs_issued(data_dir) {
        write_private(
            &data_dir.join(CLIENT_CERTS_ISSUED),
            "client certificates were issued under tls/ca.pem\n",
        )?;
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{tenant}/{key_id}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Whole seconds: what the certificate can hold.
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0)?;
    params.not_before = now - time::Duration::HOUR;
    params.not_after = now + time::Duration::days(i64::from(days));
    let key = KeyPair::generate()?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let cert = params.signed_by(&key, &issuer)?;
    use sha2::Digest as _;
    Ok(ClientCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        sha256: sha2::Sha256::digest(cert.der()).into(),
        not_after: params.not_after,
    })
}

/// Make `out` a directory for certificate files (or find it one), before a certificate is made
/// for it.
pub fn prepare_out_dir(out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !out.exists() || out.is_dir(),
        "--out {} is a file: --out names the directory the certificate and key files are written \
         into",
        out.display()
    );
    fs::create_dir_all(out).with_context(|| {
        format!(
            "--out {}: cannot create it as a directory for the certificate files",
            out.display()
        )
    })
}

/// Write a client certificate pair into `out` (a directory: [`prepare_out_dir`]); returns (cert
/// path, key path).
pub fn write_client_cert(
    out: &Path,
    tenant: &str,
    key_id: &str,
    cert: &str,
    key: &str,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let cert_path = out.join(format!("{tenant}.{key_id}.crt.pem"));
    let key_path = out.join(format!("{tenant}.{key_id}.key.pem"));
    // The pair under an exclusive lock on the directory: two runs for one key into one --out
    // could otherwise leave one's certificate beside the other's key, a pair no handshake
    // accepts. A file system that cannot lock a directory (NFS) gets the pair unlocked, with a
    // warning: the lock only guards against a race the user makes.
    let dir =
        fs::File::open(out).with_context(|| format!("--out {}: cannot open it", out.display()))?;
    let _lock = match nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive) {
        Ok(lock) => Some(lock),
        Err((_, e)) => {
            eprintln!(
                "cubed: warning: --out {} cannot be locked ({e}): writing the pair without the \
                 lock; do not run two `key cert` for one key into it at once",
                out.display()
            );
            None
        }
    };
    write_private(&cert_path, cert)?;
    write_private(&key_path, key)?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate pair is written under an exclusive lock on its --out directory: a second
    /// writer into it waits, so two runs for one key cannot mix their files.
    #[test]
    fn a_certificate_pair_is_written_under_a_lock_on_its_directory() {
        let out = tempfile::tempdir().unwrap();
        let held = nix::fcntl::Flock::lock(
            fs::File::open(out.path()).unwrap(),
            nix::fcntl::FlockArg::LockExclusive,
        )
        .map_err(|(_, e)| e)
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = out.path().to_path_buf();
        let writer = std::thread::spawn(move || {
            tx.send(write_client_cert(&dir, "t", "k-1", "CERT", "KEY").is_ok())
                .unwrap();
        });
        let early = rx.recv_timeout(std::time::Duration::from_millis(300));
        assert!(early.is_err(), "written while the directory was locked");
        drop(held);
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true)
        );
        writer.join().unwrap();
        assert_eq!(
            fs::read_to_string(out.path().join("t.k-1.key.pem")).unwrap(),
            "KEY"
        );
    }

    /// A CA key that is not the CA certificate's is refused, naming both files, instead of
    /// signing certificates no handshake accepts.
    #[test]
    fn a_ca_key_and_certificate_that_do_not_belong_together_are_refused() {
        let (one, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        ensure_ca(one.path()).unwrap();
        ensure_ca(other.path()).unwrap();
        issue_client_cert(one.path(), "t", "k-1", 365).unwrap();
        fs::copy(
            tls_dir(other.path()).join(CA_CERT),
            tls_dir(one.path()).join(CA_CERT),
        )
        .unwrap();
        let e = format!(
            "{:#}",
            issue_client_cert(one.path(), "t", "k-1", 365).unwrap_err()
        );
        assert!(e.contains("ca.key is not the key of"), "{e}");
        assert!(e.contains("remove both"), "{e}");
    }

    /// A client certificate is valid from an hour ago until `days` from now, and its fingerprint
    /// is the SHA-256 of its DER encoding; a validity out of bounds is refused.
    #[test]
    fn a_client_certificate_carries_its_validity_and_fingerprint() {
        use sha2::Digest as _;
        let dir = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let issued = issue_client_cert(dir.path(), "t", "k-1", 30).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(issued.cert_pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        let validity = cert.validity();
        let (from, to) = (
            validity.not_before.timestamp(),
            validity.not_after.timestamp(),
        );
        assert!((from - (now - 3600)).abs() <= 5, "{from} against {now}");
        assert!((to - (now + 30 * 86_400)).abs() <= 5, "{to} against {now}");
        assert_eq!(issued.not_after.unix_timestamp(), to);
        let der_sha: [u8; 32] = sha2::Sha256::digest(&pem.contents).into();
        assert_eq!(issued.sha256, der_sha);
        assert_eq!(
            cert.subject().to_string(),
            "CN=t/k-1",
            "the subject names the key"
        );
        for days in [0, MAX_CLIENT_CERT_DAYS + 1] {
            let e = issue_client_cert(dir.path(), "t", "k-1", days).unwrap_err();
            assert!(e.to_string().contains("--days must be"), "{e}");
        }
    }

    /// A new CA (the old one's files removed) gets a new development server certificate signed
    /// by it; the same CA keeps the certificate it signed.
    #[test]
    fn the_dev_server_certificate_follows_its_ca() {
        let dir = tempfile::tempdir().unwrap();
        let local = std::net::IpAddr::from([127, 0, 0, 1]);
        let (first, _) = ensure_dev_server_cert(dir.path(), local).unwrap();
        let (again, _) = ensure_dev_server_cert(dir.path(), local).unwrap();
        assert_eq!(first, again);
        let tls = tls_dir(dir.path());
        fs::remove_file(tls.join(CA_CERT)).unwrap();
        fs::remove_file(tls.join(CA_KEY)).unwrap();
        let (renewed, _) = ensure_dev_server_cert(dir.path(), local).unwrap();
        let ca = fs::read_to_string(tls.join(CA_CERT)).unwrap();
        assert_ne!(renewed, first);
        assert!(
            renewed.ends_with(&ca),
            "the chain does not end with the new CA"
        );
        assert!(!first.ends_with(&ca));
    }

    /// A CA whose key was taken away (kept offline, a partial restore) is not replaced: its
    /// certificate still verifies, issuing says what is missing, and a development server
    /// certificate made before still serves. One whose certificate is missing is made again
    /// from its key, which the certificates it signed were signed with. (A missing key made a
    /// new CA, overwriting the ca.pem every issued client certificate is checked against.)
    #[test]
    fn a_ca_missing_one_of_its_files_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let local = std::net::IpAddr::from([127, 0, 0, 1]);
        let (key, pem) = ensure_ca(d).unwrap();
        let (server_chain, _) = ensure_dev_server_cert(d, local).unwrap();
        issue_client_cert(d, "t", "k-1", 365).unwrap();
        let tls = tls_dir(d);
        let ca_key = fs::read_to_string(tls.join(CA_KEY)).unwrap();
        fs::remove_file(tls.join(CA_KEY)).unwrap();
        assert!(has_ca(d));
        let Err(err) = ensure_ca(d) else {
            panic!("a CA made anew")
        };
        let err = err.to_string();
        assert!(err.contains("without its key"), "{err}");
        assert_eq!(fs::read_to_string(ca_cert_path(d)).unwrap(), pem);
        assert_eq!(ca_cert_pem(d).unwrap(), pem);
        assert_eq!(ensure_dev_server_cert(d, local).unwrap().0, server_chain);
        assert!(issue_client_cert(d, "t", "k-2", 365).is_err());
        // The key back and the certificate gone: made again from the key.
        fs::write(tls.join(CA_KEY), &ca_key).unwrap();
        fs::remove_file(tls.join(CA_CERT)).unwrap();
        let (again, rebuilt) = ensure_ca(d).unwrap();
        assert_eq!(again.public_key_pem(), key.public_key_pem());
        check_ca_pair(&rebuilt, &again, &tls).unwrap();
        assert_eq!(fs::read_to_string(ca_cert_path(d)).unwrap(), rebuilt);
    }

    /// A data directory that issued client certificates and lost its CA's files is not given a
    /// new CA by `key cert` (the earlier certificates would all fail), until its marker is
    /// removed on purpose; one that never issued any gets its first CA.
    #[test]
    fn a_lost_ca_is_not_replaced_by_issuing_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        issue_client_cert(d, "t", "k-1", 365).unwrap();
        fs::remove_dir_all(tls_dir(d)).unwrap();
        let e = format!("{:#}", issue_client_cert(d, "t", "k-2", 365).unwrap_err());
        assert!(
            e.contains("are gone") && e.contains(CLIENT_CERTS_ISSUED),
            "{e}"
        );
        assert!(!has_ca(d));
        fs::remove_file(d.join(CLIENT_CERTS_ISSUED)).unwrap();
        issue_client_cert(d, "t", "k-2", 365).unwrap();
        assert!(has_ca(d) && client_certs_issued(d));
    }

    /// A development server key that is not its certificate's (a stop between the two writes
    /// when the pair was made again) is replaced with a new pair, not served: the start would
    /// fail on it every time.
    #[test]
    fn a_dev_server_key_that_is_not_its_certificates_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let local = std::net::IpAddr::from([127, 0, 0, 1]);
        let (first, _) = ensure_dev_server_cert(dir.path(), local).unwrap();
        let stray = KeyPair::generate().unwrap().serialize_pem();
        fs::write(tls_dir(dir.path()).join(SERVER_KEY), &stray).unwrap();
        let (chain, key) = ensure_dev_server_cert(dir.path(), local).unwrap();
        assert_ne!(chain, first);
        assert!(is_key_of(&chain, &key));
        assert!(!is_key_of(&first, &stray));
        cube_gateway::server_config(&cube_gateway::TlsSettings {
            cert_chain_pem: chain.into_bytes(),
            key_pem: key.into_bytes(),
            client_ca_pem: None,
        })
        .unwrap();
    }

    /// A listen address other than 127.0.0.1, ::1 or a wildcard is named by the development
    /// certificate (dev-credentials.json points clients at it): one made without it is made
    /// again; a wildcard or the usual loopback keeps the one there.
    #[test]
    fn the_dev_server_certificate_names_the_listen_address() {
        let dir = tempfile::tempdir().unwrap();
        let other = std::net::IpAddr::from([127, 0, 0, 2]);
        let (first, _) = ensure_dev_server_cert(dir.path(), "0.0.0.0".parse().unwrap()).unwrap();
        assert!(!names_ip(&first, other));
        let (named, _) = ensure_dev_server_cert(dir.path(), other).unwrap();
        assert_ne!(named, first);
        assert!(names_ip(&named, other));
        let v6: std::net::IpAddr = "fd00::7".parse().unwrap();
        assert!(!names_ip(&named, v6));
        let (kept, _) = ensure_dev_server_cert(dir.path(), "::".parse().unwrap()).unwrap();
        assert_eq!(kept, named);
        let (named_v6, _) = ensure_dev_server_cert(dir.path(), v6).unwrap();
        assert!(names_ip(&named_v6, v6));
    }
}
