//! cubec end to end, against a real cubed on port 0: credentials from the environment, mTLS,
//! TLS server names, handshake errors, output into a closed pipe, binary values.
//!
//! cubed comes from the same build (`cargo test --workspace` builds it beside cubec).

// Test helpers outside #[test] fns: a panic here is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cube_testkit::TestServer;

fn cubec() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cubec"))
}

fn cubed() -> PathBuf {
    let bin = cubec().with_file_name("cubed");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo test --workspace` (or `cargo build -p cubed`) first",
        bin.display()
    );
    bin
}

/// cubec with `args`, run in `cwd` with none of the caller's CUBE_* variables, plus `env`.
fn run(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(cubec());
    cmd.current_dir(cwd).args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("CUBE_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

/// `first`, then `--cert CERT --key KEY read 1 1 1`: an mTLS read.
fn mtls_read<'a>(first: &[&'a str], cert: &'a Path, key: &'a Path) -> Vec<&'a str> {
    let mut args = first.to_vec();
    args.extend_from_slice(&["--cert", cert.to_str().unwrap()]);
    args.extend_from_slice(&["--key", key.to_str().unwrap()]);
    args.extend_from_slice(&["read", "1", "1", "1"]);
    args
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn credentials_from_the_environment_are_all_or_nothing_and_not_beside_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("creds.json");
    std::fs::write(&file, r#"{"tenant":"demo","key_id":"k-1","secret":"00"}"#).unwrap();
    // Half a set used to fall back to the default file, acting as its (demo) tenant.
    let o = run(
        dir.path(),
        &[("CUBE_TENANT", "acme"), ("CUBE_KEY_ID", "k-2")],
        &["--endpoint", "http://127.0.0.1:1", "read", "1", "2", "3"],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("but CUBE_SECRET not"), "{}", stderr(&o));
    let o = run(
        dir.path(),
        &[
            ("CUBE_TENANT", "acme"),
            ("CUBE_KEY_ID", "k-2"),
            ("CUBE_SECRET", "00"),
            ("CUBE_CREDENTIALS", file.to_str().unwrap()),
        ],
        &["--endpoint", "http://127.0.0.1:1", "read", "1", "2", "3"],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("credentials given twice"),
        "{}",
        stderr(&o)
    );
}

/// A malformed secret is named before any connection is tried (it was reported only once a
/// server answered: "cannot connect" first), once (the handshake's message said it twice).
#[test]
fn a_malformed_secret_is_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("creds.json");
    std::fs::write(&file, r#"{"tenant":"demo","key_id":"k-1","secret":"00"}"#).unwrap();
    for auth in ["call", "connection"] {
        let o = run(
            dir.path(),
            &[],
            &[
                "--credentials",
                file.to_str().unwrap(),
                "--auth",
                auth,
                "--endpoint",
                "http://127.0.0.1:1",
                "read",
                "1",
                "2",
                "3",
            ],
        );
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!("cubec: error: the secret in {}: ", file.display()))
                && err.matches("64 hex characters").count() == 1
                && !err.contains("connect"),
            "{err}"
        );
    }
    let o = run(
        dir.path(),
        &[
            ("CUBE_TENANT", "demo"),
            ("CUBE_KEY_ID", "k-1"),
            ("CUBE_SECRET", "zz"),
        ],
        &["--endpoint", "http://127.0.0.1:1", "read", "1", "2", "3"],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.starts_with("cubec: error: CUBE_SECRET: ") && !err.contains("connect"),
        "{err}"
    );
    // A tenant name or key id no server could take is refused before connecting, naming where
    // it came from (it used to be sent, or dropped, and refused as an unsigned call).
    for (tenant, key_id, named) in [
        ("démo", "k-1", "CUBE_TENANT"),
        ("demo", "k-1\u{7}", "CUBE_KEY_ID"),
    ] {
        let o = run(
            dir.path(),
            &[
                ("CUBE_TENANT", tenant),
                ("CUBE_KEY_ID", key_id),
                ("CUBE_SECRET", &"ab".repeat(32)),
            ],
            &["--endpoint", "http://127.0.0.1:1", "read", "1", "2", "3"],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with(&format!("cubec: error: {named} (")) && !err.contains("connect"),
            "{err}"
        );
    }
    // Empty variables are named as such (an empty tenant and key id were taken as given).
    let o = run(
        dir.path(),
        &[
            ("CUBE_TENANT", ""),
            ("CUBE_KEY_ID", "k-1"),
            ("CUBE_SECRET", &"ab".repeat(32)),
        ],
        &["--endpoint", "http://127.0.0.1:1", "read", "1", "2", "3"],
    );
    assert!(
        stderr(&o).starts_with("cubec: error: CUBE_TENANT is set but empty"),
        "{}",
        stderr(&o)
    );
    let good = dir.path().join("good.json");
    let secret = "ab".repeat(32);
    std::fs::write(
        &good,
        format!(r#"{{"tenant":"demo","key_id":"k-1","secret":"{secret}"}}"#),
    )
    .unwrap();
    let o = run(
        dir.path(),
        &[("CUBE_ENDPOINT", "")],
        &[
            "--credentials",
            good.to_str().unwrap(),
            "read",
            "1",
            "2",
            "3",
        ],
    );
    assert!(stderr(&o).contains("is empty"), "{}", stderr(&o));
}

/// A value the server takes reads back whatever its size (tonic's client refused answers over
/// 4 MiB: "decoded message length too large", shown as if the server had said OutOfRange).
#[test]
fn a_value_over_four_mib_reads_back() {
    let server = TestServer::start_with(
        &cubed(),
        &[
            "--max-value-bytes",
            "6000000",
            "--max-message-bytes",
            "8000000",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    let value: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    let file = dir.path().join("big.bin");
    std::fs::write(&file, &value).unwrap();
    let w = json(&run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "write",
            "1",
            "1",
            "1",
            "--value-file",
            file.to_str().unwrap(),
        ],
    ));
    assert_eq!(w["version"], 1);
    let r = json(&run(
        dir.path(),
        &[],
        &["--credentials", c, "read", "1", "1", "1"],
    ));
    let hex = r["value_hex"].as_str().expect("a binary value");
    assert_eq!(hex.len(), 2 * value.len());
    assert!(
        hex.starts_with("000102") && hex.ends_with(&format!("{:02x}", (4_999_999 % 251) as u8))
    );
}

/// `cubec stats` prints the tenant's totals, its stored bytes against its quota among them.
#[test]
fn stats_prints_the_totals_and_the_quota() {
    let server = TestServer::start_with(&cubed(), &["--tenant-max-bytes", "1000"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    json(&run(
        dir.path(),
        &[],
        &["--credentials", c, "write", "1", "2", "3", "hello"],
    ));
    let s = json(&run(dir.path(), &[], &["--credentials", c, "stats"]));
    assert_eq!(s["cells"], 1);
    // The cell's 13-byte key, its value's 7 and its version's 2.
    assert_eq!(s["stored_bytes"], 22);
    assert_eq!(s["quota_bytes"], 1000);
    assert_eq!(s["durability"], "sync");
    assert!(s["last_seq"].as_u64().unwrap() >= 2, "{s}");
    // The audit trail's head: demo's creation, then the write.
    assert_eq!(s["audit_last_seq"], 2);
    assert_eq!(s["audit_last_hash"].as_str().unwrap().len(), 64, "{s}");
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "write",
            "1",
            "2",
            "4",
            &"x".repeat(1000),
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("storage quota"), "{}", stderr(&o));
}

/// A CA given for an http:// endpoint is not used, and cubec says so: nobody should take the
/// calls that follow for encrypted.
#[test]
fn a_ca_for_a_plaintext_endpoint_is_named_as_unused() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let note = |source: &str| {
        format!(
            "cubec: note: {source} is not used: {} (from --endpoint or CUBE_ENDPOINT) is \
             plaintext; use https:// for TLS\n",
            server.endpoint()
        )
    };
    let args = [
        "--credentials",
        creds.to_str().unwrap(),
        "--endpoint",
        &server.endpoint(),
        "read",
        "1",
        "2",
        "3",
    ];
    let o = run(dir.path(), &[], &[&["--ca", "ca.pem"][..], &args].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), note("--ca"));
    let o = run(dir.path(), &[("CUBE_CA", "ca.pem")], &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), note("CUBE_CA"));
    let o = run(
        dir.path(),
        &[],
        &[&["--tls-server-name", "cube.example"][..], &args].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), note("--tls-server-name"));
    // Without a CA, nothing is said.
    let o = run(dir.path(), &[], &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

#[test]
fn a_client_certificate_needs_https_and_no_auth_model() {
    let dir = tempfile::tempdir().unwrap();
    // An mTLS read at `endpoint`, with `more` before the command.
    let mtls = |endpoint: &'static str, more: &[&'static str]| {
        let mut args = vec!["--endpoint", endpoint, "--cert", "c.pem", "--key", "k.pem"];
        args.extend_from_slice(more);
        args.extend_from_slice(&["read", "1", "2", "3"]);
        args
    };
    let o = run(dir.path(), &[], &mtls("http://127.0.0.1:1", &[]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--cert needs an https:// endpoint"),
        "{}",
        stderr(&o)
    );
    let https = "https://127.0.0.1:1";
    let o = run(dir.path(), &[], &mtls(https, &["--auth", "call"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("leave out --auth"), "{}", stderr(&o));
    // The same choice from the environment names the variable, not a flag the user never typed;
    // so does clap's refusal of a bad value from it.
    let o = run(dir.path(), &[("CUBE_AUTH", "call")], &mtls(https, &[]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unset CUBE_AUTH"), "{}", stderr(&o));
    // A key named in the environment beside a certificate would go unused, and the calls be
    // made as the certificate's key without a word: refused (they were made).
    let o = run(
        dir.path(),
        &[
            ("CUBE_TENANT", "acme"),
            ("CUBE_KEY_ID", "k-1"),
            ("CUBE_SECRET", "00"),
        ],
        &mtls(https, &[]),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET name a key, but --cert authenticates the \
             connection as the key its certificate names"
        ),
        "{}",
        stderr(&o)
    );
    let o = run(dir.path(), &[("CUBE_AUTH", "")], &["read", "1", "2", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("came from the environment variable CUBE_AUTH"),
        "{}",
        stderr(&o)
    );
    // Without --endpoint the default credentials file gives it, if there is one; one that is
    // not usable is named, with the way around it.
    std::fs::create_dir(dir.path().join("cube-data")).unwrap();
    let file = dir.path().join("cube-data/dev-credentials.json");
    std::fs::write(&file, "{").unwrap();
    let cert = ["--cert", "c.pem", "--key", "k.pem", "read", "1", "2", "3"];
    let o = run(dir.path(), &[], &cert);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "./cube-data/dev-credentials.json is not a credentials JSON file (with --cert only \
             its endpoint is needed: pass --endpoint instead)"
        ),
        "{}",
        stderr(&o)
    );
    std::fs::write(
        &file,
        r#"{"tenant":"demo","key_id":"k-1","secret":"00","endpoint":"http://127.0.0.1:1"}"#,
    )
    .unwrap();
    let o = run(dir.path(), &[], &cert);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not http://127.0.0.1:1 (from ./cube-data/dev-credentials.json)"),
        "{}",
        stderr(&o)
    );
}

/// An endpoint whose scheme does not match the server (http:// to a TLS server, https:// to a
/// plaintext one) is named as the likely cause, not left as an HTTP/2 or TLS error alone.
#[test]
fn a_scheme_that_does_not_match_the_server_is_named() {
    let tls = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let plain = TestServer::start_with(&cubed(), &[]).unwrap();
    let ca = tls.data_dir().join("tls/ca.pem");
    let dir = tempfile::tempdir().unwrap();
    let creds = |s: &TestServer| {
        [
            ("CUBE_TENANT", s.demo.tenant.clone()),
            ("CUBE_KEY_ID", s.demo.key_id.clone()),
            ("CUBE_SECRET", s.demo.secret.clone()),
        ]
    };
    let address = |s: &TestServer| s.endpoint().trim_start_matches("http://").to_string();
    for (server, endpoint, want) in [
        (
            &tls,
            format!("http://{}", address(&tls)),
            format!(
                "cubec: error: cannot talk to the server at http://{0} (from --endpoint or \
                 CUBE_ENDPOINT): it answers in TLS, not plaintext HTTP/2: use https://{0}\n",
                address(&tls)
            ),
        ),
        (
            &plain,
            format!("https://{}", address(&plain)),
            "it answered, but not in TLS: use http:// for a plaintext server".to_string(),
        ),
    ] {
        let env = creds(server);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = run(
            dir.path(),
            &env,
            &[
                "--endpoint",
                &endpoint,
                "--ca",
                ca.to_str().unwrap(),
                "read",
                "1",
                "1",
                "1",
            ],
        );
        assert!(!o.status.success(), "{endpoint}");
        assert!(stderr(&o).contains(&want), "{endpoint}: {}", stderr(&o));
    }
}

/// A self-signed CA of no server here, as a PEM file in `dir`.
fn unrelated_ca(dir: &Path) -> PathBuf {
    ca_named(dir, None)
}

/// A CA of its own key, named `name` (e.g. as every data directory's CA is named, so that a
/// client finds the issuer by name and then its signature wrong).
fn ca_named(dir: &Path, name: Option<&str>) -> PathBuf {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    if let Some(name) = name {
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, name);
        params.distinguished_name = dn;
    }
    let path = dir.join(format!("ca-{}.pem", name.is_some()));
    std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
    path
}

/// A --ca file without a certificate is refused before connecting (it used to surface as the
/// server's certificate being refused, "UnknownIssuer", with "is cubed serving there?"), and a
/// CA that did not sign the server's certificate is named as such.
#[test]
fn a_ca_that_cannot_check_the_server_is_named() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let read = |ca: Option<&Path>| {
        let mut args = vec!["--credentials", creds.to_str().unwrap()];
        if let Some(ca) = ca {
            args.extend(["--ca", ca.to_str().unwrap()]);
        }
        args.extend(["read", "1", "1", "1"]);
        run(dir.path(), &[], &args)
    };
    let not_pem = dir.path().join("ca.json");
    std::fs::write(&not_pem, r#"{"ca": "not a certificate"}"#).unwrap();
    let o = read(Some(&not_pem));
    assert!(!o.status.success());
    assert!(
        stderr(&o).starts_with(&format!(
            "cubec: error: no PEM certificate in {} (--ca): ",
            not_pem.display()
        )),
        "{}",
        stderr(&o)
    );
    let other = unrelated_ca(dir.path());
    let o = read(Some(&other));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "the server's certificate is not signed by the CA in {} (--ca): pass --ca with the \
             CA that signed it",
            other.display()
        )),
        "{err}"
    );
    // The server did answer.
    assert!(!err.contains("is cubed serving there?"), "{err}");
    // Another data directory's CA: the same name, another key.
    let namesake = ca_named(dir.path(), Some("Cube data-directory CA"));
    let o = read(Some(&namesake));
    let err = stderr(&o);
    assert!(
        err.contains("the server's certificate is not signed by the CA in"),
        "{err}"
    );
    // Without --ca and without the default file: the scheme is questioned too.
    let o = read(None);
    let err = stderr(&o);
    assert!(
        err.contains("(the default of --ca)") && err.contains("is the server started with TLS"),
        "{err}"
    );
    // Without --ca, the default file is the one named.
    std::fs::create_dir_all(dir.path().join("cube-data/tls")).unwrap();
    std::fs::copy(&other, dir.path().join("cube-data/tls/ca.pem")).unwrap();
    let o = read(None);
    assert!(
        stderr(&o).contains(
            "not signed by the CA in ./cube-data/tls/ca.pem (the default of --ca): pass --ca"
        ),
        "{}",
        stderr(&o)
    );
}

/// The endpoint is checked before connecting: without a scheme tonic said "invalid URL, scheme
/// is missing" (with "is cubed serving there?"), and took grpc:// as plaintext and dropped a
/// path without a word.
#[test]
fn an_endpoint_is_http_or_https_and_host_port() {
    let server = TestServer::start(&cubed()).unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let dir = tempfile::tempdir().unwrap();
    let read = |endpoint: &str| {
        run(
            dir.path(),
            &[],
            &[
                "--credentials",
                creds.to_str().unwrap(),
                "--endpoint",
                endpoint,
                "read",
                "1",
                "1",
                "1",
            ],
        )
    };
    let address = server.addr.to_string();
    for (endpoint, want) in [
        (
            address.clone(),
            format!(
                "the endpoint {address} (from --endpoint or CUBE_ENDPOINT) has no scheme: it \
                 needs http:// (plaintext) or https:// (TLS) before host:port, e.g. \
                 http://127.0.0.1:50051"
            ),
        ),
        (
            format!("grpc://{address}"),
            format!(
                "the endpoint grpc://{address} (from --endpoint or CUBE_ENDPOINT) has the scheme \
                 grpc://, which cubec does not speak: use http:// (plaintext) or https:// (TLS)"
            ),
        ),
        (
            format!("http://{address}/cube.v1.Cells"),
            format!(
                "the endpoint http://{address}/cube.v1.Cells (from --endpoint or CUBE_ENDPOINT) \
                 has /cube.v1.Cells after host:port: give only http://HOST:PORT"
            ),
        ),
        (
            format!("http://:{}", server.addr.port()),
            format!(
                "the endpoint http://:{} (from --endpoint or CUBE_ENDPOINT) does not name \
                 host:port after http://",
                server.addr.port()
            ),
        ),
        (
            "http://127.0.0.1:99999".to_string(),
            "the endpoint http://127.0.0.1:99999 (from --endpoint or CUBE_ENDPOINT) has the port \
             99999: a port is 1 to 65535"
                .to_string(),
        ),
        (
            "http://127.0.0.1:0".to_string(),
            "has the port 0: a port is 1 to 65535".to_string(),
        ),
        (
            "http://[::1]:70000".to_string(),
            "has the port 70000: a port is 1 to 65535".to_string(),
        ),
        (
            "http://127.0.0.1:".to_string(),
            "has ':' with no port after it".to_string(),
        ),
    ] {
        let o = read(&endpoint);
        assert!(!o.status.success(), "{endpoint}");
        assert!(stderr(&o).contains(&want), "{endpoint}: {}", stderr(&o));
        assert!(!stderr(&o).contains("serving there"), "{}", stderr(&o));
    }
    // A trailing slash is no path.
    assert_eq!(json(&read(&format!("http://{address}/")))["found"], false);
}

/// cubed's admin port answers HTTP/1.1: cubec names it instead of blaming the scheme ("does the
/// endpoint's scheme match", after "Unknown: ... broken pipe"; "not in TLS: use http://").
#[test]
fn the_admin_port_is_named_as_such() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let ca = server.data_dir().join("tls/ca.pem");
    let creds = server.data_dir().join("dev-credentials.json");
    let dir = tempfile::tempdir().unwrap();
    let read = |endpoint: &str| {
        run(
            dir.path(),
            &[],
            &[
                "--credentials",
                creds.to_str().unwrap(),
                "--ca",
                ca.to_str().unwrap(),
                "--endpoint",
                endpoint,
                "read",
                "1",
                "1",
                "1",
            ],
        )
    };
    for scheme in ["http", "https"] {
        let endpoint = format!("{scheme}://{}", server.admin_addr);
        let o = read(&endpoint);
        assert!(!o.status.success(), "{endpoint}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!(
                "cannot talk to the server at {endpoint} (from --endpoint or CUBE_ENDPOINT): it \
                 answers plain HTTP/1.1, not gRPC: is this cubed's --admin-listen (metrics) port \
                 rather than its --listen port?"
            )),
            "{err}"
        );
        assert!(!err.contains("scheme"), "{err}");
    }
    // A server cubec cannot tell (it closes every connection at once) gets both hints, and no
    // gRPC code: the server sent none.
    let closer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closer.local_addr().unwrap());
    std::thread::spawn(move || closer.incoming().for_each(drop));
    let o = read(&endpoint);
    assert!(!o.status.success());
    let err = stderr(&o);
    // (After the note that the --ca given is not used for http://.)
    let err = &err[err.find("cubec: error: ").unwrap_or(0)..];
    assert!(
        err.starts_with(&format!(
            "cubec: error: cannot talk to the server at {endpoint} (from --endpoint or \
             CUBE_ENDPOINT): the connection failed: "
        )),
        "{err}"
    );
    assert!(
        err.ends_with(
            " (does the endpoint's scheme match the server: https:// for TLS, http:// for \
             plaintext? or is this cubed's --admin-listen (metrics) port rather than its \
             --listen port?)\n"
        ),
        "{err}"
    );
}

/// --cert and --key are read and checked before connecting, each named with its flag; tonic's
/// own error named neither ("no RSA or PKCS8-encoded keys found").
#[test]
fn client_certificate_files_are_named_with_their_flag() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = server
        .demo_key_cert(&server.demo.key_id, dir.path())
        .unwrap();
    let ca = server.data_dir().join("tls/ca.pem");
    let endpoint = format!("https://{}", server.addr);
    let first = ["--endpoint", &endpoint, "--ca", ca.to_str().unwrap()];
    let read = |cert: &Path, key: &Path| run(dir.path(), &[], &mtls_read(&first, cert, key));
    let missing = dir.path().join("nope.pem");
    for (cert, key, want) in [
        (
            &key,
            &crt,
            format!(
                "cubec: error: --cert {} holds a private key and --key {} a certificate: they \
                 look swapped\n",
                key.display(),
                crt.display()
            ),
        ),
        (
            &missing,
            &key,
            format!(
                "cubec: error: cannot read the client certificate {} (--cert): No such file or \
                 directory\n",
                missing.display()
            ),
        ),
        (
            &crt,
            &missing,
            format!(
                "cubec: error: cannot read the private key {} (--key): No such file or \
                 directory\n",
                missing.display()
            ),
        ),
        (
            &crt,
            &crt,
            format!(
                "cubec: error: no PEM private key in {} (--key): pass the key written beside \
                 the certificate by `cubed key cert`\n",
                crt.display()
            ),
        ),
    ] {
        let o = read(cert, key);
        assert!(!o.status.success());
        assert!(stderr(&o).starts_with(&want), "{}", stderr(&o));
    }
    let not_pem = dir.path().join("cert.json");
    std::fs::write(&not_pem, "{}").unwrap();
    let o = read(&not_pem, &key);
    assert!(
        stderr(&o).starts_with(&format!(
            "cubec: error: no PEM certificate in {} (--cert)",
            not_pem.display()
        )),
        "{}",
        stderr(&o)
    );
    assert_eq!(json(&read(&crt, &key))["found"], false);
}

/// With a client certificate, cubec needs only it, its key and the CA: no credentials file
/// (protocol.md has users move only the two PEM files to the client).
#[test]
fn mtls_needs_no_credentials_file() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (crt, key) = server
        .demo_key_cert(&server.demo.key_id, out.path())
        .unwrap();
    let ca = server.data_dir().join("tls/ca.pem");
    let empty = tempfile::tempdir().unwrap();
    let endpoint = format!(
        "https://{}",
        server.endpoint().trim_start_matches("http://")
    );
    let first = ["--endpoint", &endpoint, "--ca", ca.to_str().unwrap()];
    let o = run(empty.path(), &[], &mtls_read(&first, &crt, &key));
    assert_eq!(json(&o)["found"], false);
    // A certificate issued by another data directory is refused by the server: said so (it
    // read "received fatal alert: DecryptError" alone).
    let other = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let foreign = tempfile::tempdir().unwrap();
    let (crt, key) = other
        .demo_key_cert(&other.demo.key_id, foreign.path())
        .unwrap();
    let o = run(empty.path(), &[], &mtls_read(&first, &crt, &key));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("refused the client certificate: issue it with `cubed key cert`"),
        "{}",
        stderr(&o)
    );
}

/// The README's mTLS command, run beside `./cube-data` with neither --endpoint nor --ca: the
/// endpoint comes from the credentials file (https, from `--tls-dev`), the CA from its default
/// place. cubec used to fall back to http://127.0.0.1:50051 with --cert and refuse it.
#[test]
fn mtls_takes_the_endpoint_from_the_credentials_file() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev"]).unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(server.data_dir(), cwd.path().join("cube-data")).unwrap();
    let (crt, key) = server
        .demo_key_cert(&server.demo.key_id, cwd.path())
        .unwrap();
    let o = run(cwd.path(), &[], &mtls_read(&[], &crt, &key));
    assert_eq!(json(&o)["found"], false);
    // An explicit credentials file that cannot be read is an error, not a silent default.
    let first = ["--credentials", "missing.json"];
    let o = run(cwd.path(), &[], &mtls_read(&first, &crt, &key));
    assert!(!o.status.success());
    // One piece of advice: it used to add "use --credentials or CUBE_TENANT/..." too.
    let err = stderr(&o);
    assert!(
        err.contains(
            "cannot read credentials from missing.json (with --cert only its endpoint is \
             needed: pass --endpoint instead): No such file or directory"
        ),
        "{err}"
    );
    assert!(!err.contains("CUBE_TENANT"), "{err}");
}

/// Against a server that takes only per-connection authentication, a signed call's refusal
/// ends with cubec's way of authenticating the connection; with it, the call goes through.
#[test]
fn a_connection_only_server_points_at_the_auth_flag() {
    let server = TestServer::start_with(&cubed(), &["--auth-mode", "connection"]).unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let dir = tempfile::tempdir().unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec!["--credentials", creds.to_str().unwrap()];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["read", "1", "1", "1"]);
        a
    };
    let o = run(dir.path(), &[], &args(&[]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("(with cubec: --auth connection, or a client certificate with --cert)"),
        "{}",
        stderr(&o)
    );
    let o = run(dir.path(), &[], &args(&["--auth", "connection"]));
    assert_eq!(json(&o)["found"], false);
}

/// Against a server that takes only signed calls, a client certificate's unsigned call is
/// refused with cubec's way out (it read only "sign every call with x-cube-tenant, …", headers
/// a cubec user never sets); and a server name no certificate could carry is named as such,
/// not blamed on the TLS files.
#[test]
fn a_call_only_server_and_a_bad_server_name_say_what_to_change() {
    let server = TestServer::start_with(&cubed(), &["--tls-dev", "--auth-mode", "call"]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (crt, key) = server
        .demo_key_cert(&server.demo.key_id, out.path())
        .unwrap();
    let ca = server.data_dir().join("tls/ca.pem");
    let endpoint = format!(
        "https://{}",
        server.endpoint().trim_start_matches("http://")
    );
    let first = ["--endpoint", &endpoint, "--ca", ca.to_str().unwrap()];
    let o = run(out.path(), &[], &mtls_read(&first, &crt, &key));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("leave out --cert and --key, and give --credentials"),
        "{}",
        stderr(&o)
    );
    let bad_name = [
        "--endpoint",
        &endpoint,
        "--ca",
        ca.to_str().unwrap(),
        "--tls-server-name",
        "bad name",
    ];
    let o = run(out.path(), &[], &mtls_read(&bad_name, &crt, &key));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("check --tls-server-name"), "{err}");
    assert!(!err.contains("TLS files"), "{err}");
}

/// The server certificate is checked against the endpoint's host, so a certificate that names
/// the server (not localhost, which cubec used to insist on) works.
#[test]
fn tls_checks_the_certificate_against_the_endpoints_host() {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["cube.test".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_pem = write("ca.pem", ca.pem());
    let cert_pem = write("server.pem", cert.pem());
    let key_pem = write("server.key", key.serialize_pem());
    let server = TestServer::start_with(
        &cubed(),
        &[
            "--tls-cert",
            cert_pem.to_str().unwrap(),
            "--tls-key",
            key_pem.to_str().unwrap(),
        ],
    )
    .unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            creds.to_str().unwrap(),
            "--ca",
            ca_pem.to_str().unwrap(),
            "read",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(json(&o)["found"], false);
    // A name the certificate does not carry is refused.
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            creds.to_str().unwrap(),
            "--ca",
            ca_pem.to_str().unwrap(),
            "--tls-server-name",
            "localhost",
            "read",
            "1",
            "1",
            "1",
        ],
    );
    assert!(!o.status.success());
}

#[test]
fn a_refused_handshake_reads_code_then_message() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        serde_json::json!({
            "tenant": server.demo.tenant,
            "key_id": server.demo.key_id,
            "secret": "11".repeat(32),
            "endpoint": server.endpoint(),
        })
        .to_string(),
    )
    .unwrap();
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            wrong.to_str().unwrap(),
            "--auth",
            "connection",
            "read",
            "1",
            "1",
            "1",
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.starts_with("cubec: error: handshake refused: Unauthenticated: "),
        "{err}"
    );
    assert!(!err.contains("code: '"), "{err}");
    assert!(
        err.contains("the secret of the credentials is not this key's"),
        "{err}"
    );
    // A signed call with it says the same.
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            wrong.to_str().unwrap(),
            "read",
            "1",
            "1",
            "1",
        ],
    );
    let err = stderr(&o);
    assert!(
        err.starts_with("cubec: error: Unauthenticated: x-cube-sig does not match")
            && err.contains("the secret of the credentials is not this key's"),
        "{err}"
    );
}

/// `cubec audit list | head -1`: the reader goes away, cubec ends quietly with status 0.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let server = TestServer::start(&cubed()).unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let mut child = Command::new(cubec())
        .args(["--credentials", creds.to_str().unwrap()])
        .args(["audit", "list", "--limit", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(o.status.success(), "{:?}: {}", o.status, stderr(&o));
}

#[test]
fn binary_values_from_a_file_and_conditional_deletes() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    let value = dir.path().join("value.bin");
    std::fs::write(&value, [0u8, 159, 146, 150, 255]).unwrap();
    let w = json(&run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "write",
            "4",
            "-5",
            "6",
            "--value-file",
            value.to_str().unwrap(),
        ],
    ));
    assert_eq!(w["version"], 1);
    let r = json(&run(
        dir.path(),
        &[],
        &["--credentials", c, "read", "4", "-5", "6"],
    ));
    assert_eq!(r["value_hex"], "009f9296ff");
    let o = run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "delete",
            "4",
            "-5",
            "6",
            "--expected-version",
            "7",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("FailedPrecondition"), "{}", stderr(&o));
    let d = json(&run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "delete",
            "4",
            "-5",
            "6",
            "--expected-version",
            "1",
        ],
    ));
    assert_eq!(d["existed"], true);
}

/// A server that took the connection and stopped answering (SIGSTOP) ends the command after
/// `--timeout-secs`, with exit code 1 and the flag named, instead of hanging it; once it
/// answers again, the same command is served. Over plaintext the call's timeout ends it, over
/// TLS the handshake's (tonic's connect timeout covers TCP only).
#[test]
fn a_server_that_does_not_answer_ends_the_command_after_the_timeout() {
    for tls in [false, true] {
        let server =
            TestServer::start_with(&cubed(), if tls { &["--tls-dev"] } else { &[] }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = server.data_dir().join("tls/ca.pem");
        let mut env = vec![
            ("CUBE_TENANT", server.demo.tenant.clone()),
            ("CUBE_KEY_ID", server.demo.key_id.clone()),
            ("CUBE_SECRET", server.demo.secret.clone()),
        ];
        if tls {
            env.push(("CUBE_ENDPOINT", format!("https://{}", server.addr)));
            env.push(("CUBE_CA", ca.to_string_lossy().into_owned()));
        } else {
            env.push(("CUBE_ENDPOINT", server.endpoint()));
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let read = ["--timeout-secs", "1", "read", "1", "2", "3"];
        let pid = nix::unistd::Pid::from_raw(server.pid().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let started = std::time::Instant::now();
        let o = run(dir.path(), &env, &read);
        let took = started.elapsed();
        // The handshake's call timed out too: no answer, not a refusal (it said "handshake
        // refused").
        let handshake = run(
            dir.path(),
            &env,
            &[&["--auth", "connection"][..], &read].concat(),
        );
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        assert_eq!(
            handshake.status.code(),
            Some(1),
            "tls {tls}: {}",
            stderr(&handshake)
        );
        assert!(
            stderr(&handshake).starts_with("cubec: error: no answer within --timeout-secs"),
            "tls {tls}: {}",
            stderr(&handshake)
        );
        assert_eq!(o.status.code(), Some(1), "tls {tls}: {}", stderr(&o));
        assert!(
            stderr(&o).starts_with("cubec: error: no answer within --timeout-secs"),
            "tls {tls}: {}",
            stderr(&o)
        );
        // Over plaintext the call's timeout ends it, and says the limit given.
        assert!(
            tls || stderr(&o).contains("--timeout-secs (1 s)"),
            "{}",
            stderr(&o)
        );
        assert!(
            took < std::time::Duration::from_secs(20),
            "tls {tls}: {took:?}"
        );
        // Served again once it runs (a server just resumed holds signed calls until it has
        // renewed its replay clock mark: a generous limit for that).
        let served = ["--timeout-secs", "10", "read", "1", "2", "3"];
        let o = run(dir.path(), &env, &served);
        assert!(o.status.success(), "tls {tls}: {}", stderr(&o));
    }
}

/// `cubec audit verify` re-computes the chain: on an intact trail it prints the entry count and
/// exits 0; after an entry was edited on disk (its record's CRC fixed too) it exits 1 naming
/// that entry's seq.
#[test]
fn audit_verify_names_the_first_broken_link() {
    // No checkpoint deletes the first WAL segment while the test runs.
    let mut server = TestServer::start_with(&cubed(), &["--checkpoint-secs", "3600"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    for x in ["0", "1", "2", "3"] {
        json(&run(
            dir.path(),
            &[],
            &["--credentials", c, "write", x, "0", "0", "v"],
        ));
    }
    let verify = ["--credentials", c, "audit", "verify"];
    let ok = json(&run(dir.path(), &[], &verify));
    // demo's creation, then the four writes; the newest entry is the anchor to keep.
    let list = run(dir.path(), &[], &["--credentials", c, "audit", "list"]);
    let newest: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(newest["seq"], 5);
    assert_eq!(
        ok,
        serde_json::json!({
            "ok": true, "entries": 5, "last_seq": 5, "last_hash": newest["hash"]
        })
    );
    let victim = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["detail"].as_str().unwrap().starts_with("coord=(2, 0, 0)"))
        .expect("the entry of the write at (2, 0, 0)")["seq"]
        .as_u64()
        .unwrap();
    // kill -9: a clean stop would checkpoint the log into the state store and remove it.
    server.kill9().unwrap();
    server
        .tamper_wal("demo", b"coord=(2, 0, 0)", b"coord=(7, 0, 0)")
        .unwrap();
    server.restart().unwrap();
    let o = run(dir.path(), &[], &verify);
    // 3, not 1: a broken chain, not a failure to check it.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.starts_with(&format!(
            "cubec: error: audit chain broken at seq {victim}: "
        )),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}

/// `cubec --credentials CREDS load -`, its standard input a pipe to write lines into.
fn load_from_stdin(creds: &Path) -> std::process::Child {
    Command::new(cubec())
        .args(["--credentials", creds.to_str().unwrap(), "load", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `cubec load`: every line of a JSON Lines file is written (text and hex values, blank lines
/// skipped, standard input too), and the summary counts them.
#[test]
fn load_writes_every_line_of_a_file_and_of_standard_input() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    let mut lines = Vec::new();
    let mut value_bytes = 0;
    for i in 0..600i32 {
        if i == 100 {
            lines.push(String::new());
        }
        if i % 2 == 0 {
            let v = format!("cell {i}");
            value_bytes += v.len();
            lines.push(format!(
                r#"{{"x":{i},"y":{},"z":{},"value":"{v}"}}"#,
                -i,
                i % 7
            ));
        } else {
            let v = [0u8, 255, (i % 256) as u8];
            value_bytes += v.len();
            lines.push(format!(
                r#"{{"x":{i},"y":{},"z":{},"value_hex":"00ff{:02x}"}}"#,
                -i,
                i % 7,
                i % 256
            ));
        }
    }
    let file = dir.path().join("cells.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let f = file.to_str().unwrap();
    let o = json(&run(
        dir.path(),
        &[],
        &["--credentials", c, "load", f, "--concurrency", "8"],
    ));
    assert_eq!(o["cells"], 600, "{o}");
    assert_eq!(o["value_bytes"], value_bytes, "{o}");
    let read = |x: i32, y: i32, z: i32| {
        json(&run(
            dir.path(),
            &[],
            &[
                "--credentials",
                c,
                "read",
                &x.to_string(),
                &y.to_string(),
                &z.to_string(),
            ],
        ))
    };
    assert_eq!(read(0, 0, 0)["value"], "cell 0");
    assert_eq!(read(598, -598, 598 % 7)["value"], "cell 598");
    assert_eq!(read(301, -301, 301 % 7)["value_hex"], "00ff2d");
    let stats = json(&run(dir.path(), &[], &["--credentials", c, "stats"]));
    assert_eq!(stats["cells"], 600);

    let mut child = load_from_stdin(&creds);
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        for i in 0..10 {
            writeln!(stdin, r#"{{"x":{i},"y":7,"z":7,"value":"stdin"}}"#).unwrap();
        }
    }
    let o = json(&child.wait_with_output().unwrap());
    assert_eq!(o["cells"], 10, "{o}");
    assert_eq!(read(9, 7, 7)["value"], "stdin");

    // Lines for one cell end with the last one's value, however many writes are in flight (the
    // order of sending is load.rs's unit test's).
    let same: Vec<String> = (1..=200)
        .map(|i| format!(r#"{{"x":-1,"y":-1,"z":-1,"value":"{i}"}}"#))
        .collect();
    let file = dir.path().join("one-cell.jsonl");
    std::fs::write(&file, same.join("\n")).unwrap();
    let o = json(&run(
        dir.path(),
        &[],
        &[
            "--credentials",
            c,
            "load",
            file.to_str().unwrap(),
            "--concurrency",
            "64",
        ],
    ));
    assert_eq!(o["cells"], 200, "{o}");
    let last = read(-1, -1, -1);
    assert_eq!(
        (&last["value"], &last["version"]),
        (&"200".into(), &200.into())
    );
}

/// The first line that is not a cell, or whose write is refused, stops the load: nothing after
/// it is sent, and the error names the line and the written prefix to resume from.
#[test]
fn a_failed_line_stops_the_load_and_says_what_is_written() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    let cells = |n: i32| {
        json(&run(dir.path(), &[], &["--credentials", c, "stats"]))["cells"]
            .as_i64()
            .unwrap()
            == i64::from(n)
    };

    let mut lines: Vec<String> = (0..300)
        .map(|i| format!(r#"{{"x":{i},"y":0,"z":0,"value":"v"}}"#))
        .collect();
    lines[199] = r#"{"x":199,"y":0,"z":0,"vlaue":"v"}"#.to_string();
    let file = dir.path().join("bad line.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let o = run(
        dir.path(),
        &[],
        &["--credentials", c, "load", file.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    for part in [
        "line 200: the load stopped there. Acknowledged: lines 1 to 199. Resume with `tail -n \
         +200 '",
        "bad line.jsonl' | cubec load -` (with this command's options)",
        "not a cell: unknown field `vlaue`",
    ] {
        assert!(e.contains(part), "{part:?} not in {e}");
    }
    assert!(cells(199));

    // A refused write, one call at a time: lines 1 and 2 written, 4 never sent.
    let lines = [
        r#"{"x":1000,"y":0,"z":0,"value":"a"}"#,
        r#"{"x":1001,"y":0,"z":0,"value":"b"}"#,
        r#"{"x":1002,"y":0,"z":0,"value":"c","expected_version":5}"#,
        r#"{"x":1003,"y":0,"z":0,"value":"d"}"#,
    ];
    let file = dir.path().join("refused.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let f = file.to_str().unwrap();
    let load_at = |n: &str| {
        run(
            dir.path(),
            &[],
            &["--credentials", c, "load", f, "--concurrency", n],
        )
    };
    let o = load_at("1");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("line 3: the load stopped there. Acknowledged: lines 1 to 2. Resume"),
        "{e}"
    );
    assert!(e.contains("FailedPrecondition: version mismatch"), "{e}");
    assert!(cells(201));
    let o = load_at("0");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `cubec region` prints every cell of a box, across pages, as the JSON lines `cubec load`
/// reads: piped into a load for another tenant, it copies the cells (a sealed one is noted,
/// not sealed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_pages_through_a_box_and_its_output_loads_elsewhere() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let demo = server.data_dir().join("dev-credentials.json");
    let mut acme = server.create_tenant("acme").unwrap();
    acme.endpoint = server.demo.endpoint.clone();
    let acme_file = dir.path().join("acme.json");
    std::fs::write(&acme_file, serde_json::to_vec(&acme).unwrap()).unwrap();
    let (d, a) = (demo.to_str().unwrap(), acme_file.to_str().unwrap());
    // 2,500 cells in the box (more than two pages), one outside it, one binary, one sealed.
    let mut lines: Vec<String> = (0..2500)
        .map(|i| format!(r#"{{"x":{},"y":{},"z":0,"value":"v{i}"}}"#, i % 50, i / 50))
        .collect();
    lines.push(r#"{"x":-1,"y":-1,"z":-1,"value_hex":"00ff"}"#.into());
    lines.push(r#"{"x":500,"y":0,"z":0,"value":"outside"}"#.into());
    let file = dir.path().join("cells.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let f = file.to_str().unwrap();
    let loaded = tokio::task::block_in_place(|| {
        json(&run(
            dir.path(),
            &[],
            &["--credentials", d, "load", f, "--concurrency", "32"],
        ))
    });
    assert_eq!(loaded["cells"], 2502);
    let mut cells = server.cells(&server.demo).await.unwrap();
    cells
        .seal(cube_api::v1::SealRequest {
            coord: Some(cube_api::v1::Coord { x: 7, y: 7, z: 0 }),
        })
        .await
        .unwrap();

    let region = |creds: &str, limit: Option<&str>| {
        let mut args = vec![
            "--credentials",
            creds,
            "region",
            "-1",
            "-1",
            "-1",
            "49",
            "49",
            "0",
        ];
        if let Some(l) = limit {
            args.extend(["--limit", l]);
        }
        tokio::task::block_in_place(|| run(dir.path(), &[], &args))
    };
    let o = region(d, None);
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: Vec<serde_json::Value> = String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(printed.len(), 2501);
    assert!(printed.iter().all(|c| c["x"] != 500));
    let find = |x: i64, y: i64| {
        printed
            .iter()
            .find(|c| c["x"] == x && c["y"] == y)
            .unwrap()
            .clone()
    };
    assert_eq!(find(-1, -1)["value_hex"], "00ff");
    let sealed = find(7, 7);
    assert_eq!(
        (&sealed["value"], &sealed["sealed"]),
        (&"v357".into(), &true.into())
    );
    // Limits within the first page and across pages print exactly that many, in the same order.
    for limit in [5, 1500] {
        let limited = region(d, Some(&limit.to_string()));
        let lines: Vec<serde_json::Value> = String::from_utf8(limited.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[..], printed[..limit]);
    }

    // Into acme: the same cells, none sealed.
    let copy = dir.path().join("region.jsonl");
    std::fs::write(&copy, &o.stdout).unwrap();
    let o = tokio::task::block_in_place(|| {
        run(
            dir.path(),
            &[],
            &["--credentials", a, "load", copy.to_str().unwrap()],
        )
    });
    assert_eq!(json(&o)["cells"], 2501);
    assert!(
        stderr(&o).contains("1 of the lines said their cell was sealed"),
        "{}",
        stderr(&o)
    );
    let o = region(a, None);
    let copied: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(copied.len(), 2501);
    for (from, to) in printed.iter().zip(&copied) {
        for field in ["x", "y", "z", "value", "value_hex"] {
            assert_eq!(from.get(field), to.get(field), "{from} / {to}");
        }
        assert_eq!(to["sealed"], false);
    }
}

/// A load from standard input that stops at a refused write exits then, with the input still
/// open (the reader's read of standard input, left behind, does not hold the exit).
#[test]
fn a_stopped_load_from_an_open_standard_input_exits() {
    let server = TestServer::start(&cubed()).unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let mut child = load_from_stdin(&creds);
    let mut stdin = child.stdin.take().unwrap();
    {
        use std::io::Write as _;
        writeln!(
            stdin,
            r#"{{"x":1,"y":1,"z":1,"value":"v","expected_version":5}}"#
        )
        .unwrap();
        stdin.flush().unwrap();
    }
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "cubec load - still runs 20 s after its first line was refused"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    drop(stdin);
    assert_eq!(status.code(), Some(1));
    let out = child.wait_with_output().unwrap();
    let e = stderr(&out);
    assert!(e.contains("line 1: the load stopped there"), "{e}");
    assert!(e.contains("FailedPrecondition"), "{e}");
}

/// `seal`, `prog`, `run`, `link`, `unlink` and `walk`: each one call, its answer one JSON
/// object, a refusal the server's code and message.
#[test]
fn programs_seals_and_edges_from_the_command_line() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = server.data_dir().join("dev-credentials.json");
    let c = creds.to_str().unwrap();
    let cubec_ok = |args: &[&str]| {
        let mut all = vec!["--credentials", c];
        all.extend_from_slice(args);
        json(&run(dir.path(), &[], &all))
    };
    let cubec_err = |args: &[&str]| {
        let mut all = vec!["--credentials", c];
        all.extend_from_slice(args);
        let o = run(dir.path(), &[], &all);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        stderr(&o)
    };

    // A program and a run input starting with `-` are text.
    assert_eq!(cubec_ok(&["prog", "1", "-1", "0", "-inc"])["version"], 1);
    let r = cubec_ok(&["run", "1", "-1", "0", "--input", "-x"]);
    assert_eq!(
        (&r["program"], &r["run_count"]),
        (&"-inc".into(), &1.into())
    );
    // The input reached the server: the run's audit entry holds its digest.
    let newest_run = || {
        let o = run(
            dir.path(),
            &[],
            &["--credentials", c, "audit", "list", "--limit", "1000"],
        );
        let text = String::from_utf8(o.stdout).unwrap();
        let entry = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .rfind(|e| e["op"] == "run")
            .unwrap();
        entry["detail"].as_str().unwrap().to_string()
    };
    // `printf -- '-x' | sha256sum`
    assert!(
        newest_run().ends_with(
            "input_sha256=a420962426d711880258b007d6767792992f6700fa93f127dafe1f7333e50466"
        ),
        "{}",
        newest_run()
    );
    let input = dir.path().join("input.bin");
    std::fs::write(&input, [1u8, 2]).unwrap();
    let input = input.to_str().unwrap();
    assert_eq!(
        cubec_ok(&["run", "1", "-1", "0", "--input-file", input])["run_count"],
        2
    );
    // `printf '\x01\x02' | sha256sum`
    assert!(
        newest_run().ends_with(
            "input_sha256=a12871fee210fb8619291eaea194581cbd2531e4b23759d225f6806923f63222"
        ),
        "{}",
        newest_run()
    );
    let binary = dir.path().join("prog.bin");
    std::fs::write(&binary, [0u8, 0xfe]).unwrap();
    cubec_ok(&[
        "prog",
        "1",
        "-1",
        "0",
        "--program-file",
        binary.to_str().unwrap(),
    ]);
    let r = cubec_ok(&["run", "1", "-1", "0"]);
    assert_eq!(
        (&r["program_hex"], &r["run_count"]),
        (&"00fe".into(), &3.into())
    );
    assert!(cubec_err(&["run", "5", "5", "5"]).contains("FailedPrecondition"));
    // `-h` is a program too (help is `--help`); a misspelt flag is a usage error.
    assert_eq!(cubec_ok(&["prog", "0", "0", "0", "-h"])["version"], 1);
    assert_eq!(cubec_ok(&["run", "0", "0", "0"])["program"], "-h");
    let typo = run(
        dir.path(),
        &[],
        &["--credentials", c, "prog", "0", "0", "0", "--program-fil"],
    );
    assert_eq!(typo.status.code(), Some(2), "{}", stderr(&typo));

    cubec_ok(&["write", "2", "2", "2", "sealed value"]);
    let s = cubec_ok(&["seal", "2", "2", "2"]);
    // `printf 'sealed value' | sha256sum`
    assert_eq!(
        s["digest"],
        "c1e9c138c3c54592988af644358aca6f142a7b7f183a20846ca32eea15e495d8"
    );
    assert_eq!(s["version"], 1);
    assert!(cubec_err(&["write", "2", "2", "2", "again"]).contains("sealed"));

    let link = |args: &[&str]| {
        let mut all = vec!["link"];
        all.extend_from_slice(args);
        cubec_ok(&all)["created"].clone()
    };
    assert_eq!(link(&["0", "0", "0", "1", "0", "0", "next"]), true);
    assert_eq!(link(&["1", "0", "0", "2", "0", "0", "next"]), true);
    assert_eq!(link(&["0", "0", "0", "0", "-3", "9", "-other"]), true);
    assert_eq!(link(&["0", "0", "0", "1", "0", "0", "next"]), false);
    let w = cubec_ok(&["walk", "0", "0", "0", "--label", "next"]);
    assert_eq!(
        w["visits"].to_string(),
        r#"[{"depth":1,"x":1,"y":0,"z":0},{"depth":2,"x":2,"y":0,"z":0}]"#
    );
    assert_eq!(w["truncated"], false);
    let w = cubec_ok(&["walk", "0", "0", "0", "--max-depth", "1"]);
    assert_eq!(w["visits"].as_array().unwrap().len(), 2);
    let w = cubec_ok(&[
        "walk", "0", "0", "0", "--label", "next", "--label", "-other",
    ]);
    assert_eq!(w["visits"].as_array().unwrap().len(), 3, "{w}");
    assert!(
        w["visits"]
            .to_string()
            .contains(r#"{"depth":1,"x":0,"y":-3,"z":9}"#),
        "{w}"
    );
    let w = cubec_ok(&["walk", "0", "0", "0", "--limit", "1"]);
    assert_eq!(w["visits"].as_array().unwrap().len(), 1);
    assert_eq!(w["truncated"], true);
    let unlink =
        |label: &str| cubec_ok(&["unlink", "0", "0", "0", "1", "0", "0", label])["existed"].clone();
    assert_eq!(unlink("next"), true);
    assert_eq!(unlink("next"), false);
    assert!(cubec_err(&["link", "0", "0", "0", "1", "0", "0", ""]).contains("InvalidArgument"));
}

#[test]
fn grant_and_revoke_change_another_keys_capabilities() {
    let server = TestServer::start(&cubed()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let demo = server.data_dir().join("dev-credentials.json");
    let made = server.cli(&["key", "create", "demo"]).unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let second = dir.path().join("second.json");
    std::fs::write(&second, &made.stdout).unwrap();
    let second_id = json(&made)["key_id"].as_str().unwrap().to_string();
    let demo_id = {
        let text = std::fs::read_to_string(&demo).unwrap();
        let creds: serde_json::Value = serde_json::from_str(&text).unwrap();
        creds["key_id"].as_str().unwrap().to_string()
    };
    // A key file from `key create` names no endpoint.
    let endpoint = server.endpoint();
    let as_key = |creds: &Path, args: &[&str]| {
        let mut all = vec![
            "--endpoint",
            &endpoint,
            "--credentials",
            creds.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        run(dir.path(), &[], &all)
    };
    let caps = |o: &Output| json(o)["capabilities"].to_string();
    let refused = |o: &Output, code: &str| {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
        assert!(stderr(o).contains(code), "{}", stderr(o));
        stderr(o)
    };

    // The second key (read and write) loses write: its writes are refused, its reads are not.
    let o = as_key(&demo, &["revoke", &second_id, "write"]);
    assert_eq!(json(&o)["key_id"], second_id.as_str());
    assert_eq!(caps(&o), r#"["read"]"#);
    refused(
        &as_key(&second, &["write", "1", "1", "1", "x"]),
        "PermissionDenied",
    );
    assert!(as_key(&second, &["read", "1", "1", "1"]).status.success());
    // Names in any case and order; the answer in the order read, write, admin.
    let o = as_key(&demo, &["grant", &second_id, "ADMIN", "Write"]);
    assert_eq!(caps(&o), r#"["read","write","admin"]"#);
    assert!(
        as_key(&second, &["write", "1", "1", "1", "x"])
            .status
            .success()
    );
    // The second key, now an ADMIN, takes everything from the first.
    let o = as_key(&second, &["revoke", &demo_id, "admin", "read", "write"]);
    assert_eq!(caps(&o), "[]");
    refused(&as_key(&demo, &["read", "1", "1", "1"]), "PermissionDenied");
    refused(
        &as_key(&demo, &["grant", &demo_id, "read"]),
        "lacks the Admin",
    );
    // The tenant's last ADMIN keeps it; a key the tenant does not have is named.
    let e = refused(
        &as_key(&second, &["revoke", &second_id, "admin"]),
        "FailedPrecondition",
    );
    assert!(e.contains("last ADMIN"), "{e}");
    let e = refused(&as_key(&second, &["grant", "k-nosuch", "read"]), "NotFound");
    assert!(e.contains("no active key 'k-nosuch'"), "{e}");
    // No capability, or an unknown one: usage errors, nothing sent.
    for args in [
        vec!["grant", second_id.as_str()],
        vec!["revoke", second_id.as_str(), "delete"],
    ] {
        let o = as_key(&second, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    // Each change is in the trail, by the key that made it.
    let o = as_key(&second, &["audit", "list"]);
    let text = String::from_utf8(o.stdout).unwrap();
    let changes: Vec<(String, String)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["op"] == "grant" || e["op"] == "revoke")
        .map(|e| {
            let principal = e["principal"].as_str().unwrap();
            (e["op"].as_str().unwrap().into(), principal.into())
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("revoke".into(), format!("demo/{demo_id}")),
            ("grant".into(), format!("demo/{demo_id}")),
            ("revoke".into(), format!("demo/{second_id}")),
        ]
    );
}
