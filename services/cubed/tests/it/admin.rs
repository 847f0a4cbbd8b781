//! `cubed tenant create` / `cubed key create` work with the server running and stopped, and
//! their credentials work at once.

use cube_auth::Credentials;
use cube_testkit::TestServer;

use crate::{cubed, read, write};

fn parse(out: &std::process::Output) -> Credentials {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let creds: Credentials = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(creds.secret.len(), 64);
    creds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_keys_are_created_online_and_offline() {
    let mut server = TestServer::start(cubed()).unwrap();
    let online = parse(&server.cli(&["tenant", "create", "online"]).unwrap());
    assert_eq!(online.tenant, "online");
    let mut c = server.cells(&online).await.unwrap();
    c.write(write(1, 0, 0, b"on")).await.unwrap();

    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    let offline = parse(&server.cli(&["tenant", "create", "offline"]).unwrap());
    let second_key = parse(&server.cli(&["key", "create", "online"]).unwrap());
    assert_ne!(second_key.key_id, online.key_id);
    tokio::task::block_in_place(|| server.restart()).unwrap();
    // The commands closed the tenants they opened as a server's stop does: nothing for this
    // start to recover (it used to report both as left open by a crash).
    assert!(
        !server.log().contains("left open by the last run"),
        "{}",
        server.log()
    );

    let mut c = server.cells(&offline).await.unwrap();
    c.write(write(1, 0, 0, b"off")).await.unwrap();
    let mut c = server.cells(&second_key).await.unwrap();
    assert_eq!(
        c.read(read(1, 0, 0)).await.unwrap().into_inner().value,
        b"on"
    );
    let online_again = parse(&server.cli(&["key", "create", "offline"]).unwrap());
    assert_eq!(online_again.tenant, "offline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_duplicates_are_refused_clearly() {
    let mut server = TestServer::start(cubed()).unwrap();
    let out = server.cli(&["tenant", "create", "Not_Valid"]).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid tenant name"));
    let out = server.cli(&["tenant", "create", "demo"]).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    // Every key command names a missing tenant as such, not as a missing key of it: through
    // the running server's admin socket, then offline on the stopped data dir.
    let ghost_commands = [
        &["key", "create", "ghost"][..],
        &["key", "revoke", "ghost", "k-1"],
        &["key", "cert", "ghost", "k-1"],
        &["tenant", "durability", "ghost", "sync"],
    ];
    let refused_as_no_tenant = |server: &TestServer| {
        for args in ghost_commands {
            let out = server.cli(args).unwrap();
            assert!(!out.status.success(), "{args:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("no tenant named 'ghost'"),
                "{args:?}: {stderr}"
            );
        }
        let out = server.cli(&["key", "revoke", "demo", "k-1"]).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("tenant 'demo' has no key 'k-1'"),
            "{stderr}"
        );
    };
    refused_as_no_tenant(&server);
    // A bound of the relaxed policy given with `sync` is refused, not silently dropped.
    let out = server
        .cli(&[
            "tenant",
            "durability",
            "demo",
            "sync",
            "--max-delay-ms",
            "50",
        ])
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bound the `relaxed` policy only"),
        "{stderr}"
    );
    // --out that names a file: said so, with the path, not a bare "File exists".
    let file = server.data_dir().join("dev-credentials.json");
    let out = server
        .cli(&[
            "key",
            "cert",
            "demo",
            &server.demo.key_id,
            "--out",
            file.to_str().unwrap(),
        ])
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "--out {} is a file: --out names the directory",
            file.display()
        )) && !stderr.contains("os error"),
        "{stderr}"
    );
    assert!(server.sigterm().unwrap().success());
    refused_as_no_tenant(&server);
}

#[test]
fn dev_credentials_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::start(cubed()).unwrap();
    let meta = std::fs::metadata(server.data_dir().join("dev-credentials.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(server.demo.tenant, "demo");
    assert_eq!(
        server.demo.endpoint.as_deref(),
        Some(server.endpoint().as_str())
    );
}

/// `cubed tenant create` may be the first command to touch a data directory: whatever the
/// caller's umask, what it creates (the catalog and its journal, which hold the key's secret,
/// and the tenant's log, whose first record does too) is readable by the owner only.
#[test]
fn the_cli_creates_a_data_directory_only_its_owner_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("fresh");
    // Through a shell that sets the usual umask first, whatever this process's is.
    let out = cube_testkit::command("sh")
        .args(["-c", "umask 022; exec \"$0\" \"$@\""])
        .arg(crate::cubed())
        .args(["tenant", "create", "acme", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checked = 0;
    let mut stack = vec![data.clone()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{} is {:o}",
            path.display(),
            meta.permissions().mode()
        );
        checked += 1;
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    assert!(checked > 5, "{checked}");
}

/// A `demo` whose first key was revoked and another made (rotation) does not get its deleted
/// credentials file written again at the next start: that wrote the new key's secret to disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_demo_keys_secret_is_not_written_again() {
    let mut server = TestServer::start(cubed()).unwrap();
    let first = server.demo.key_id.clone();
    let out = server.cli(&["key", "create", "demo"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = server.cli(&["key", "revoke", "demo", &first]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped = tokio::task::block_in_place(|| server.sigterm()).unwrap();
    assert!(stopped.success(), "{}", server.log());
    restart_without_credentials(
        &mut server,
        "the server wrote the rotated key's secret to disk",
    );
}

/// Remove `server`'s stopped data directory's dev-credentials.json and start it again: the
/// start must not write the file (`why` if it did). The server becomes ready; the harness then
/// fails to read the demo credentials it expects.
fn restart_without_credentials(server: &mut TestServer, why: &str) {
    let path = server.data_dir().join("dev-credentials.json");
    std::fs::remove_file(&path).unwrap();
    let restarted = tokio::task::block_in_place(|| server.restart());
    let err = restarted.expect_err(why);
    assert!(
        format!("{err:#}").contains("No such file"),
        "{err:#}\n{}",
        server.log()
    );
    assert!(!path.exists());
}

/// A first start interrupted between creating tenant `demo` and writing its credentials file
/// leaves the catalog with `demo` alone and no file: the next start writes the file from the
/// catalog's key. Once the operator has other tenants, a missing file stays missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_demo_credentials_are_written_again_from_the_catalog() {
    let mut server = TestServer::start(cubed()).unwrap();
    let path = server.data_dir().join("dev-credentials.json");
    let before = server.demo.clone();
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    std::fs::remove_file(&path).unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let after: Credentials = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        (&after.tenant, &after.key_id, &after.secret),
        (&before.tenant, &before.key_id, &before.secret)
    );
    let mut c = server.cells(&after).await.unwrap();
    c.write(write(0, 0, 0, b"v")).await.unwrap();

    server.create_tenant("acme").unwrap();
    tokio::task::block_in_place(|| server.kill9()).unwrap();
    restart_without_credentials(&mut server, "the server wrote the file again");
}

/// Tenant `demo` is made on a data directory's first start only: a directory first started
/// with `--no-demo` gets no `demo` (no tenant with every capability, no secret on disk) from a
/// later start that forgot the flag.
#[test]
fn a_later_start_without_no_demo_makes_no_demo_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for extra in [&["--no-demo"][..], &[]] {
        // The harness reads the demo credentials once the server is ready: without them it
        // fails (and kills the server).
        let Err(err) = TestServer::start_at(cubed(), &data, extra) else {
            panic!("a start with {extra:?} wrote dev-credentials.json");
        };
        assert!(format!("{err:#}").contains("No such file"), "{err:#}");
    }
    assert!(!data.join("dev-credentials.json").exists());
    let out = offline(&["key", "create", "demo"], &data);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no tenant named 'demo'"),
        "{stderr}"
    );
}

/// A first start that ended after it opened (so made) the catalog but before it made `demo`
/// (here: the catalog made and left empty) is followed by a start that makes `demo`.
#[test]
fn a_catalog_left_empty_by_a_first_start_still_gets_demo() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    drop(cube_store::Catalog::open(&cube_store::DataDir::new(&data).catalog()).unwrap());
    let server = TestServer::start_at(cubed(), &data, &[]).unwrap();
    assert_eq!(server.demo.tenant, "demo");
}

/// clap names the flag of a refused value; when the value came from a `CUBE_*` variable, cubed
/// also names the variable (the flag was not on the command line at all).
#[test]
fn a_refused_value_from_the_environment_names_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut cmd = cube_testkit::command(cubed());
        cmd.args(["serve", "--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("CUBE_IDLE_SECS", "soon");
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run(&[]);
    assert!(
        stderr.contains("invalid value 'soon' for '--idle-secs")
            && stderr.contains(
                "the value of --idle-secs came from the environment variable CUBE_IDLE_SECS"
            ),
        "{stderr}"
    );
    // Given on the command line, the variable is not what was refused.
    let stderr = run(&["--idle-secs", "later"]);
    assert!(
        stderr.contains("'later'") && !stderr.contains("environment variable"),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists());
}

/// A value in range for its type but refused by the server's own checks names where it came
/// from too: its variable, or the `--config` file (it said `--skew-secs must be between 1 and
/// 3600` alone, to an operator whose command line had no such flag).
#[test]
fn a_value_out_of_range_names_the_variable_or_file_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], env: Option<(&str, &str)>| {
        let mut cmd = cube_testkit::command(cubed());
        cmd.args(["serve", "--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run(&[], Some(("CUBE_SKEW_SECS", "0")));
    assert!(
        stderr.contains("--skew-secs must be between 1 and")
            && stderr.contains(
                "(the value of --skew-secs came from the environment variable CUBE_SKEW_SECS)"
            ),
        "{stderr}"
    );
    let file = dir.path().join("cubed.toml");
    std::fs::write(&file, "skew-secs = 0\n").unwrap();
    let file = file.to_str().unwrap();
    let stderr = run(&["--config", file], None);
    assert!(
        stderr.contains(&format!(
            "(the value of --skew-secs came from --config {file})"
        )),
        "{stderr}"
    );
    let stderr = run(&[], Some(("CUBE_CONFIG", file)));
    assert!(
        stderr.contains(&format!(
            "(the value of --skew-secs came from the file CUBE_CONFIG names, {file})"
        )),
        "{stderr}"
    );
    // A default refused beside a value given is no file's: a file that does not set it is not
    // named.
    let other = dir.path().join("other.toml");
    std::fs::write(&other, "idle-secs = 60\n").unwrap();
    let other = other.to_str().unwrap();
    let stderr = run(&["--config", other, "--max-value-bytes", "134217728"], None);
    assert!(
        stderr.contains("--max-in-flight-bytes") && !stderr.contains("came from"),
        "{stderr}"
    );
    // On the command line: nothing to add.
    let stderr = run(&["--skew-secs", "0"], Some(("CUBE_SKEW_SECS", "0")));
    assert!(
        stderr.contains("--skew-secs must be between") && !stderr.contains("came from"),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists());
}

/// A `--max-connections` above half the open-file limit is warned about at start: clients could
/// take the descriptors the tenants need (the default never is).
#[test]
fn more_connections_than_half_the_open_files_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the data directory should be stops the start right after the warning.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let run = |max: &str| {
        let out = cube_testkit::command("sh")
            .arg("-c")
            .arg("ulimit -S -n 1024 && ulimit -H -n 1024 && exec \"$0\" \"$@\"")
            .arg(cubed())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--max-connections", max, "--data-dir"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run("100000");
    assert!(
        stderr.contains("--max-connections is more than half the open-file limit"),
        "{stderr}"
    );
    let stderr = run("512");
    assert!(
        !stderr.contains("more than half the open-file limit"),
        "{stderr}"
    );
}

/// With `serve` given, the environment fills only `serve`'s flags: a variable that the
/// command line overrides is not parsed (before, clap also read it into the unused top-level
/// copy of the flags and refused it there), and a switch variable set to false is off (before,
/// `CUBE_TLS_DEV=false` conflicted with --tls-cert). Each run is refused by a flag given on
/// purpose (`--skew-secs 0`), which shows that everything before it was accepted.
#[test]
fn serve_reads_the_environment_into_its_own_flags_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cubed.toml");
    std::fs::write(&file, "tls-key = \"/k.pem\"\n").unwrap();
    let run = |env: (&str, &str), extra: &[&str]| {
        let out = cube_testkit::command(cubed())
            .args([
                "serve",
                "--admin-listen",
                "127.0.0.1:0",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env(env.0, env.1)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let skew = |(code, stderr): (Option<i32>, String)| {
        assert!(
            code == Some(1) && stderr.contains("--skew-secs must be between"),
            "{code:?}: {stderr}"
        );
    };
    skew(run(
        ("CUBE_LISTEN", "localhost:50051"),
        &["--skew-secs", "0"],
    ));
    let config = ["--skew-secs", "0", "--config", file.to_str().unwrap()];
    skew(run(("CUBE_TLS_CERT", "/c.pem"), &config));
    // A pair whose partner only the file gives, beside a variable the command line overrides.
    let cert = ["--tls-cert", "/c.pem"];
    skew(run(
        ("CUBE_LISTEN", "localhost:50051"),
        &[&config[..], &cert].concat(),
    ));
    let files = ["--tls-cert", "/c.pem", "--tls-key", "/k.pem"];
    skew(run(
        ("CUBE_TLS_DEV", "false"),
        &[&["--skew-secs", "0"][..], &files].concat(),
    ));
    let (code, stderr) = run(("CUBE_TLS_DEV", "true"), &files);
    assert!(
        code == Some(1) && stderr.contains("two ways to serve TLS"),
        "{code:?}: {stderr}"
    );
    assert!(!dir.path().join("data").exists());
}

fn serve_on(data_dir: &std::path::Path) -> std::process::Command {
    let mut cmd = cube_testkit::command(cubed());
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .arg("--data-dir")
    .arg(data_dir);
    cmd
}

/// SIGTERM during start-up (before the ready line): the server stops cleanly without ever
/// announcing it is ready.
#[test]
fn a_stop_during_start_up_never_announces_ready() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let child = serve_on(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The catalog exists once `run` has begun (its signal handler is in place by then); the
    // ready line comes at least a second later.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !dir.path().join("catalog").exists() {
        assert!(std::time::Instant::now() < deadline, "cubed never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(!stdout.contains("cubed ready"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("stop requested during start-up"),
        "{stderr}"
    );
}

/// An admin-socket connection that never closes (a client that sent nothing, one suspended
/// mid-call) does not keep a stop from closing the tenants: the wait for it is bounded.
#[test]
fn an_idle_admin_connection_does_not_hold_up_a_stop() {
    use std::time::{Duration, Instant};
    let mut server = TestServer::start(cubed()).unwrap();
    let _idle = std::os::unix::net::UnixStream::connect(server.admin_socket()).unwrap();
    let mut preface = std::os::unix::net::UnixStream::connect(server.admin_socket()).unwrap();
    std::io::Write::write_all(&mut preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    let started = Instant::now();
    let status = server.sigterm().unwrap();
    let log = server.log();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(log.contains("admin socket connections still open"), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
}

/// A server started while another cubed holds the catalog as a server (still recovering, so
/// its admin socket does not answer yet) fails at once, naming it, instead of waiting as for an
/// offline command. The recovering server is staged: this test holds the catalog and notes a
/// live cubed (another test server) as its holder, as a starting server does.
#[test]
fn a_second_server_fails_at_once_beside_a_starting_one() {
    use std::time::{Duration, Instant};
    let other = TestServer::start(cubed()).unwrap();
    let pid = other.pid().unwrap();
    let note = std::fs::read_to_string(cube_store::DataDir::new(other.data_dir()).catalog_holder())
        .unwrap();
    assert!(note.starts_with(&format!("server {pid} ")), "{note}");

    let mut server = TestServer::start(cubed()).unwrap();
    server.sigterm().unwrap();
    let data = cube_store::DataDir::new(server.data_dir());
    let _held = cube_store::Catalog::open(&data.catalog()).unwrap();
    std::fs::write(data.catalog_holder(), &note).unwrap();
    let started = Instant::now();
    let refused = TestServer::start_at(cubed(), &server.data_dir(), &[])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!(
            "another cubed (pid {pid}) holds the data directory"
        )),
        "{refused}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// A server started while another process holds the catalog (an offline `cubed tenant` or
/// `cubed key` command, here this test) waits for it instead of failing at once, and a stop
/// during that wait ends it cleanly without serving; a start beside a running server fails at
/// once.
#[test]
fn a_starting_server_waits_for_a_held_catalog_but_not_beside_a_server() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let mut server = TestServer::start(cubed()).unwrap();
    let started = Instant::now();
    let beside = TestServer::start_at(cubed(), &server.data_dir(), &[])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(beside.contains("already serving"), "{beside}");
    assert!(started.elapsed() < Duration::from_secs(20));
    server.sigterm().unwrap();

    let catalog_path = cube_store::DataDir::new(server.data_dir()).catalog();
    let held = cube_store::Catalog::open(&catalog_path).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        drop(held);
    });
    server.restart().unwrap();
    release.join().unwrap();
    server.sigterm().unwrap();

    let _held = cube_store::Catalog::open(&catalog_path).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("stderr");
    let child = serve_on(&server.data_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for_catalog_wait(&log);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cubed ready"));
    assert!(
        stderr.contains("stop requested during start-up"),
        "{stderr}"
    );
}

/// Until the ready line the gRPC port is bound but refuses connections: a TCP check of it does
/// not take a server still starting (waiting for its catalog here, recovering its tenants after
/// a crash) for one that serves. It used to listen from the start, the kernel accepting
/// connections nobody answered.
#[test]
fn the_grpc_port_refuses_connections_until_the_server_is_ready() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::BufRead;
    let start = StartingBesideHeldCatalog::new();
    let (held, mut child, port) = (start.held, start.child, start.port);
    let refused = std::net::TcpStream::connect(("127.0.0.1", port));
    assert_eq!(
        refused.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused,
        "a connection was taken before the ready line"
    );
    drop(held);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.starts_with("cubed ready"), "{ready}");
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("no connection once ready");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
}

/// The port bound but not listening during start-up can be taken by another socket (both with
/// SO_REUSEADDR): the start then fails at its ready line with the port named, exit code 1,
/// after closing what it opened (the admin socket is gone).
#[test]
fn a_port_taken_during_start_up_fails_the_start_cleanly() {
    let start = StartingBesideHeldCatalog::new();
    let (held, child, port, log) = (start.held, start.child, start.port, start.log);
    // std's listener sets SO_REUSEADDR, as most do.
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    drop(held);
    let out = child.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on --listen 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cubed ready"));
    assert!(
        !start.server.admin_socket().exists(),
        "the admin socket was left"
    );
}

/// Until the server logging to `log` says it waits for a catalog another process holds (at
/// most 20 s).
fn wait_for_catalog_wait(log: &std::path::Path) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("held by another cubed process")
    {
        assert!(Instant::now() < deadline, "no wait announced");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A cubed started on a data directory whose catalog this test holds (as an offline command
/// would), on a free port named on the command line (port 0 would not be known before the
/// ready line), once it says it waits for the catalog: still starting, not serving.
struct StartingBesideHeldCatalog {
    server: TestServer,
    held: cube_store::Catalog,
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
    _logs: tempfile::TempDir,
}

impl StartingBesideHeldCatalog {
    fn new() -> StartingBesideHeldCatalog {
        let mut server = TestServer::start(cubed()).unwrap();
        server.sigterm().unwrap();
        let catalog = cube_store::DataDir::new(server.data_dir()).catalog();
        let held = cube_store::Catalog::open(&catalog).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("stderr");
        let child = cube_testkit::command(cubed())
            .args(["serve", "--admin-listen", "127.0.0.1:0", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(server.data_dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_for_catalog_wait(&log);
        StartingBesideHeldCatalog {
            server,
            held,
            child,
            port,
            log,
            _logs: logs,
        }
    }
}

/// A stdout nobody reads any more (closed, full) does not crash the server at its ready line:
/// it serves, and stops cleanly. `println!` there panicked (exit 101), leaving every
/// recovered tenant to be recovered again.
#[test]
fn an_unwritable_stdout_does_not_stop_the_server() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("stderr");
    let mut child = serve_on(&dir.path().join("data"))
        .stdout(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("serving") {
            assert!(
                text.contains("the ready line could not be written"),
                "{text}"
            );
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("cubed exited ({status:?}) before serving:\n{text}");
        }
        assert!(Instant::now() < deadline, "cubed never served:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A third SIGTERM ends a stop whose tenants do not close (here an apply held 30 s on the
/// actor's thread by a test-only failpoint; in life a final checkpoint on a full disk) at once,
/// with exit code 1; what was acknowledged is there after the restart. Further signals used to
/// be ignored, and only SIGKILL ended such a stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_signal_ends_a_stop_that_cannot_close_its_tenants() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let env = [("CUBE_FAILPOINT_APPLY_DELAY_MS", "30000")];
    let mut server = TestServer::start_with_env(cubed(), &[], &env).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    // Answered once durable; its apply then waits 30 s on the actor's thread.
    c.write(write(1, 1, 1, b"kept")).await.unwrap();
    drop(c);
    let pid = Pid::from_raw(server.pid().unwrap() as i32);
    // Each signal once the one before has been taken: signals that arrive before the server
    // receives them merge into one.
    for taken in ["SIGTERM: shutting down", "second signal"] {
        kill(pid, Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !server.log().contains(taken) {
            assert!(Instant::now() < deadline, "{}", server.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    kill(pid, Signal::SIGTERM).unwrap();
    // Well before the held apply's 30 s are over.
    let status = tokio::task::block_in_place(|| server.wait_exit(Duration::from_secs(10)))
        .unwrap()
        .expect("cubed still running 10 s after a third SIGTERM");
    assert_eq!(status.code(), Some(1), "{}", server.log());
    assert!(
        server.log().contains("third signal: exiting now"),
        "{}",
        server.log()
    );
    server.restart().unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let got = c.read(read(1, 1, 1)).await.unwrap().into_inner();
    assert_eq!((got.found, got.value.as_slice()), (true, &b"kept"[..]));
}

/// `cubed ARGS...` in no server's presence: its output.
fn offline(args: &[&str], data_dir: &std::path::Path) -> std::process::Output {
    cube_testkit::command(cubed())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .unwrap()
}

/// The server's settings in the environment are not read by a `tenant`/`key` command, so one
/// the server would refuse does not stop it (each used to exit 2 with clap's error about the
/// server's flag); the server itself still refuses it, naming the variable.
#[test]
fn the_servers_settings_in_the_environment_do_not_stop_offline_commands() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        ("CUBE_LISTEN", "localhost:50051"),
        ("CUBE_IDLE_SECS", "soon"),
        ("CUBE_TLS_DEV", "1"),
    ];
    for (n, (var, value)) in bad.iter().enumerate() {
        let tenant = format!("t{n}");
        for args in [
            &["tenant", "create", &tenant][..],
            &["key", "create", &tenant],
        ] {
            let out = cube_testkit::command(cubed())
                .args(args)
                .arg("--data-dir")
                .arg(dir.path())
                .env(var, value)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{var}={value} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let serve = cube_testkit::command(cubed())
        .arg("--data-dir")
        .arg(dir.path())
        .env("CUBE_IDLE_SECS", "soon")
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&serve.stderr).contains("CUBE_IDLE_SECS"),
        "{}",
        String::from_utf8_lossy(&serve.stderr)
    );
}

/// `cubed serve` on `dir` started by a shell after `ulimit LIMITS`, its stderr to `stderr`,
/// once its ready line came.
fn ready_under_ulimit(
    limits: &str,
    dir: &std::path::Path,
    stderr: std::process::Stdio,
) -> std::process::Child {
    ready_by_shell(&format!("ulimit {limits}"), "\"$1\"", dir, stderr)
}

/// `cubed serve --data-dir DATA_DIR` started by a shell after `SETUP`, `$1` being `arg` in
/// both, its stderr to `stderr`, once its ready line came.
fn ready_by_shell(
    setup: &str,
    data_dir: &str,
    arg: &std::path::Path,
    stderr: std::process::Stdio,
) -> std::process::Child {
    use std::io::BufRead;
    let mut child = cube_testkit::command("sh")
        .arg("-c")
        .arg(format!(
            "{setup} && exec \"$0\" serve --data-dir {data_dir} --listen 127.0.0.1:0 \
             --admin-listen 127.0.0.1:0"
        ))
        .arg(cubed())
        .arg(arg)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("cubed ready"));
    assert!(ready, "cubed did not become ready");
    child
}

/// Under a hard open-file limit too low for a few tenants' state stores, `cubed serve` says
/// so at its start (it used to say nothing when it could not raise the soft limit).
#[test]
fn serve_warns_of_a_low_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("stderr");
    let stderr = std::fs::File::create(&log).unwrap().into();
    let mut child = ready_under_ulimit("-n 1024", dir.path(), stderr);
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("the open-file limit is low (under 4096)") && text.contains("soft=1024"),
        "{text}"
    );
}

/// `cubed serve` raises its soft open-file limit to the hard one (at most 1,048,576): started
/// under a soft limit of 256, it runs with the hard limit's.
#[test]
fn serve_raises_its_soft_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = ready_under_ulimit("-Sn 256", dir.path(), std::process::Stdio::null());
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    let wanted = match hard.parse::<u64>() {
        Ok(h) => h.min(1 << 20).to_string(),
        Err(_) => (1u64 << 20).to_string(),
    };
    assert_eq!(soft, wanted, "{line}");
}

/// A command aimed at a data directory that does not exist (a typo, the default one from the
/// wrong working directory) creates nothing: the key commands refuse, and a bad tenant name is
/// refused before a catalog is made. Only a good `tenant create` makes a new one, and says so.
#[test]
fn commands_on_a_missing_data_directory_create_nothing_they_should_not() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    for args in [
        &["key", "create", "acme"][..],
        &["key", "revoke", "acme", "k-1"],
        &["tenant", "durability", "acme", "sync"],
        &["tenant", "create", "Bad_Name"],
    ] {
        let out = offline(args, &missing);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no Cube data directory at") || stderr.contains("invalid tenant name"),
            "{args:?}: {stderr}"
        );
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
    let out = offline(&["tenant", "create", "acme"], &missing);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("creating one"));
    parse(&out);
    parse(&offline(&["key", "create", "acme"], &missing));
}

/// A data directory path that names a file is refused in plain words, by the server and by the
/// admin commands alike, and the file is left as it was.
#[test]
fn a_data_directory_that_is_a_file_is_refused_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cube-data");
    std::fs::write(&file, b"not a directory").unwrap();
    let serve = serve_on(&file).output().unwrap();
    for (what, out) in [
        ("serve", serve),
        (
            "tenant create",
            offline(&["tenant", "create", "acme"], &file),
        ),
        ("key create", offline(&["key", "create", "acme"], &file)),
    ] {
        assert!(!out.status.success(), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("exists and is not a directory") && !stderr.contains("os error"),
            "{what}: {stderr}"
        );
        assert!(!stderr.contains("creating one"), "{what}: {stderr}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
    // A directory to create below that file: the file is named as what stands in the way.
    let below = file.join("sub");
    let serve = serve_on(&below).output().unwrap();
    for (what, out) in [
        ("serve", serve),
        (
            "tenant create",
            offline(&["tenant", "create", "acme"], &below),
        ),
    ] {
        assert!(!out.status.success(), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("{} is not a directory", file.display()))
                && !stderr.contains("os error")
                && !stderr.contains("creating one"),
            "{what}: {stderr}"
        );
    }
}

/// A directory holding someone else's files (a mistyped `--data-dir` naming a home directory,
/// or a project with a `tls/` of its own) is refused by the server and by the offline commands:
/// nothing is written into it and its mode is left as it was. An empty one, or one holding only
/// `lost+found`, is taken.
#[test]
fn a_directory_holding_files_not_cubes_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join("notes.txt"), b"mine").unwrap();
    std::fs::create_dir(home.join("lost+found")).unwrap();
    std::fs::create_dir(home.join("tls")).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A server that took the directory would not exit: it is given 30 s.
    let mut serve = serve_on(&home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while serve.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            serve.kill().unwrap();
            panic!("cubed serve took a directory holding someone else's files");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let serve = serve.wait_with_output().unwrap();
    for (what, out) in [
        ("serve", serve),
        (
            "tenant create",
            offline(&["tenant", "create", "acme"], &home),
        ),
    ] {
        assert!(!out.status.success(), "{what}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("holds no Cube catalog")
                && (stderr.contains("notes.txt") || stderr.contains("tls")),
            "{what}: {stderr}"
        );
    }
    let mut names: Vec<_> = std::fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["lost+found", "notes.txt", "tls"]);
    let mode = std::fs::metadata(&home).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    // A new filesystem's root: only lost+found there, taken as empty.
    std::fs::remove_file(home.join("notes.txt")).unwrap();
    std::fs::remove_dir(home.join("tls")).unwrap();
    parse(&offline(&["tenant", "create", "acme"], &home));
    // Once the catalog is there, other files beside it do not matter.
    std::fs::write(home.join("notes.txt"), b"mine").unwrap();
    parse(&offline(&["key", "create", "acme"], &home));
}

/// A command that finds the catalog locked with no server on the admin socket (a server still
/// recovering its tenants, or closing them) waits for it, longer than the 5 s it used to.
#[test]
fn a_command_waits_for_a_catalog_held_while_no_server_answers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    parse(&offline(&["tenant", "create", "acme"], &data));
    let catalog = cube_store::Catalog::open(&cube_store::DataDir::new(&data).catalog()).unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(7));
        drop(catalog);
    });
    let out = offline(&["key", "create", "acme"], &data);
    holder.join().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("waiting for the catalog"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&out);
}

/// `cubed ARGS --data-dir DIR` with `env`, killed (and the test failed) if it has not exited
/// within 20 s.
fn within_20_s(
    args: &[&str],
    data_dir: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut child = cube_testkit::command(cubed())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "`cubed {args:?}` still waiting after 20 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A server that takes admin-socket connections but never answers (stopped with SIGSTOP, or
/// hung) fails a `tenant`/`key` command after `--admin-timeout-secs`, saying what is known,
/// instead of leaving it waiting for good; one that closes them unanswered (a server stopping)
/// fails it with a message that says so, not a transport error.
#[test]
fn a_command_facing_an_admin_socket_that_does_not_answer_gives_up_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    parse(&offline(&["tenant", "create", "acme"], &data));
    let socket = cube_store::DataDir::new(&data).admin_socket();
    for answers in ["never", "by closing"] {
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let never = answers == "never";
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if never {
                    held.push(conn);
                    continue;
                }
                // Closed once the call's request came (HTTP/2 preface, SETTINGS, HEADERS, ...):
                // the command's connection was set up, and it waits for the answer.
                let mut got = 0;
                let mut buf = [0u8; 4096];
                while got < 100 {
                    match std::io::Read::read(&mut conn, &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
            }
        });
        let started = std::time::Instant::now();
        let out = within_20_s(
            &["key", "create", "acme"],
            &data,
            &[("CUBE_ADMIN_TIMEOUT_SECS", "1")],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{answers}: {stderr}");
        assert!(
            stderr.contains("the server on the admin socket"),
            "{answers}: {stderr}"
        );
        if never {
            assert!(stderr.contains("did not answer within 1 s"), "{stderr}");
            assert!(started.elapsed() >= std::time::Duration::from_secs(1));
        } else {
            assert!(stderr.contains("closed the connection"), "{stderr}");
        }
        assert!(
            stderr.contains("A key may or may not have been created: repeat the command"),
            "{stderr}"
        );
    }
}

/// A new key whose answer cannot be written (its reader gone: a closed pipe) is an error that
/// names the key and says to revoke it, with exit code 1 (it was a panic, exit code 101, with
/// no word of the key). (A closed standard output, `>&-`, is /dev/null to a Rust program: the
/// standard library opens it so at start.)
#[test]
fn a_new_keys_answer_that_cannot_be_written_is_an_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    parse(&offline(&["tenant", "create", "acme"], &data));
    let mut child = cube_testkit::command(cubed())
        .args(["key", "create", "acme", "--data-dir"])
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cubed: error:")
            && stderr.contains("of tenant 'acme' was made")
            && stderr.contains("cubed key revoke acme k-"),
        "{stderr}"
    );
    // Made all the same: the first key and this one.
    let catalog = cube_store::Catalog::open(&cube_store::DataDir::new(&data).catalog()).unwrap();
    assert_eq!(catalog.key_count("acme"), 2);
}

/// A command names the data directory by a path too long for a Unix socket address, while the
/// server, started with a shorter (relative) spelling, serves its admin socket: the command
/// reaches it through the directory's descriptor. (It took the failed connect for "no server",
/// then waited a minute on the catalog the server held and failed with the wrong reason.)
#[test]
fn a_command_reaches_the_server_through_a_data_directory_path_too_long_for_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&deep).unwrap();
    let data = deep.join("data");
    assert!(data.join("admin.sock").as_os_str().len() >= 108);
    // The server's spelling: relative to its working directory.
    let mut server = ready_by_shell("cd \"$1\"", "data", &deep, std::process::Stdio::null());
    let out = cube_testkit::command(cubed())
        .args([
            "key",
            "create",
            "demo",
            "--admin-timeout-secs",
            "20",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(parse(&out).tenant, "demo");
}

/// An Admin client on the server's local admin socket.
async fn admin_on_socket(
    path: std::path::PathBuf,
) -> cube_api::v1::admin_client::AdminClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_static("http://admin.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    cube_api::v1::admin_client::AdminClient::new(channel)
}

/// Admin.RecordCertificate (what `cubed key cert` calls): on the admin socket INVALID_ARGUMENT
/// for a malformed request and NOT_FOUND for a tenant or an active key that does not exist (a
/// revoked key included), else one `key.cert` entry; on the network listener PERMISSION_DENIED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_a_certificate_checks_the_request_and_the_key() {
    use cube_api::v1::RecordCertificateRequest;
    use tonic::Code;
    let server = TestServer::start(cubed()).unwrap();
    let mut admin = admin_on_socket(server.admin_socket()).await;
    let demo_key = server.demo.key_id.clone();
    let req =
        |tenant: &str, key_id: &str, sha_len: usize, not_after_ms: i64| RecordCertificateRequest {
            tenant: tenant.into(),
            key_id: key_id.into(),
            sha256: vec![9; sha_len],
            not_after_ms,
        };
    let revoked = parse(&server.cli(&["key", "create", "demo"]).unwrap()).key_id;
    let o = server.cli(&["key", "revoke", "demo", &revoked]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let no_revoked = format!("tenant 'demo' has no active key '{revoked}'");
    for (r, code, text) in [
        (
            req("demo", &demo_key, 31, 1),
            Code::InvalidArgument,
            "not 31 bytes",
        ),
        (
            req("demo", &demo_key, 32, 0),
            Code::InvalidArgument,
            "not 0",
        ),
        (
            req("demo", "", 32, 1),
            Code::InvalidArgument,
            "key_id is required",
        ),
        (
            req("ghost", &demo_key, 32, 1),
            Code::NotFound,
            "no tenant named 'ghost'",
        ),
        (
            req("demo", "k-nope", 32, 1),
            Code::NotFound,
            "no active key 'k-nope'",
        ),
        (
            req("demo", &revoked, 32, 1),
            Code::NotFound,
            no_revoked.as_str(),
        ),
    ] {
        let what = format!("{r:?}");
        let e = admin.record_certificate(r).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e:?}");
        assert!(e.message().contains(text), "{what}: {}", e.message());
    }
    admin
        .record_certificate(req("demo", &demo_key, 32, 1_800_000_000_000))
        .await
        .unwrap();
    let entries = crate::audit::trail(&server, 0, 0).await;
    let certs: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.op == "key.cert")
        .map(|e| (e.principal.as_str(), e.detail.as_str()))
        .collect();
    let detail = format!(
        "key={demo_key} sha256={} not_after_ms=1800000000000",
        "09".repeat(32)
    );
    assert_eq!(certs, [("operator", detail.as_str())]);
    // Off the admin socket, even for the tenant's own ADMIN key: refused, nothing recorded.
    let mut network =
        cube_api::v1::admin_client::AdminClient::new(server.signed(&server.demo).await.unwrap());
    let e = network
        .record_certificate(req("demo", &demo_key, 32, 1_800_000_000_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let after = crate::audit::trail(&server, 0, 0).await;
    assert_eq!(
        after.iter().filter(|e| e.op == "key.cert").count(),
        1,
        "{after:?}"
    );
}

/// `cubed tenant list`: every tenant, its durability policy and its active keys with their
/// capabilities (as Access left them), the same through the running server's admin socket and
/// offline; a revoked key is gone from it; no secret is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_listed_with_their_keys_online_and_offline() {
    use cube_api::v1::access_client::AccessClient;
    use cube_api::v1::{Capability, RevokeRequest};
    let mut server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let second = parse(&server.cli(&["key", "create", "acme"]).unwrap());
    let gone = parse(&server.cli(&["key", "create", "acme"]).unwrap());
    let o = server
        .cli(&["key", "revoke", "acme", &gone.key_id])
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = server
        .cli(&[
            "tenant",
            "durability",
            "acme",
            "relaxed",
            "--max-records",
            "7",
        ])
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut access = AccessClient::new(server.signed(&acme).await.unwrap());
    access
        .revoke(RevokeRequest {
            key_id: second.key_id.clone(),
            capabilities: vec![Capability::Write as i32],
        })
        .await
        .unwrap();
    let list = |server: &TestServer| -> Vec<serde_json::Value> {
        let o = server.cli(&["tenant", "list"]).unwrap();
        let stdout = String::from_utf8(o.stdout).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            o.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        for secret in [
            &acme.secret,
            &second.secret,
            &gone.secret,
            &server.demo.secret,
        ] {
            assert!(!stdout.contains(secret.as_str()), "{stdout}");
        }
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let mut keys = vec![
        (acme.key_id.clone(), vec!["read", "write", "admin"]),
        (second.key_id.clone(), vec!["read"]),
    ];
    keys.sort();
    let keys: Vec<serde_json::Value> = keys
        .into_iter()
        .map(|(id, caps)| serde_json::json!({ "key_id": id, "capabilities": caps }))
        .collect();
    let expected = vec![
        serde_json::json!({
            "tenant": "acme",
            "durability": "relaxed(max_delay_ms=5, max_records=7)",
            "keys": keys,
        }),
        serde_json::json!({
            "tenant": "demo",
            "durability": "sync",
            "keys": [{ "key_id": server.demo.key_id, "capabilities": ["read", "write", "admin"] }],
        }),
    ];
    assert_eq!(list(&server), expected);
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    assert_eq!(tokio::task::block_in_place(|| list(&server)), expected);
}

/// `cubed tenant delete`: with the server running the tenant's keys stop at once (signed calls
/// and a session on an open connection), its files go, other tenants go on, its name is not
/// given to a new tenant and a second deletion says it was deleted; with the server stopped the
/// same, and a start removes files a deletion left behind. A start after every tenant, `demo`
/// included, was deleted makes no `demo`, and deleting `demo` removes its dev credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenant_is_gone_online_and_offline() {
    let mut server = TestServer::start(cubed()).unwrap();
    let acme = server.create_tenant("acme").unwrap();
    let second = parse(&server.cli(&["key", "create", "acme"]).unwrap());
    let mut signed = server.cells(&acme).await.unwrap();
    signed.write(write(1, 2, 3, b"deleted soon")).await.unwrap();
    let mut session = server.cells_on_connection(&second).await.unwrap();
    session.read(read(1, 2, 3)).await.unwrap();
    let files = server.data_dir().join("tenants").join("acme");
    assert!(files.join("wal").is_dir());
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let listed = |server: &TestServer| -> Vec<String> {
        let o = server.cli(&["tenant", "list"]).unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["tenant"].as_str().unwrap().to_string()
            })
            .collect()
    };

    // A name that is no tenant's, or no tenant name at all, deletes nothing.
    for (name, says) in [
        ("nosuch", "no tenant named 'nosuch'"),
        ("Not_a_name", "tenant name"),
    ] {
        let o = server.cli(&["tenant", "delete", name, "--yes"]).unwrap();
        assert!(
            !o.status.success() && stderr(&o).contains(says),
            "{name}: {}",
            stderr(&o)
        );
    }
    signed.read(read(1, 2, 3)).await.unwrap();

    // Without --yes nothing happens.
    let o = server.cli(&["tenant", "delete", "acme"]).unwrap();
    assert!(
        !o.status.success() && stderr(&o).contains("--yes"),
        "{}",
        stderr(&o)
    );
    signed.read(read(1, 2, 3)).await.unwrap();

    let o = server.cli(&["tenant", "delete", "acme", "--yes"]).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut ids = vec![acme.key_id.clone(), second.key_id.clone()];
    ids.sort();
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"tenant": "acme", "deleted": true, "key_ids": ids, "files_removed": true})
    );
    assert!(!files.exists(), "the tenant's files are still there");
    for (what, e) in [
        ("signed", signed.read(read(1, 2, 3)).await.unwrap_err()),
        ("session", session.read(read(1, 2, 3)).await.unwrap_err()),
    ] {
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{what}: {e:?}");
    }
    assert_eq!(listed(&server), ["demo"]);
    let mut demo = server.cells(&server.demo).await.unwrap();
    demo.write(write(1, 2, 3, b"still here")).await.unwrap();
    for args in [
        &["tenant", "delete", "acme", "--yes"][..],
        &["tenant", "create", "acme"],
        &["key", "create", "acme"],
    ] {
        let o = server.cli(args).unwrap();
        assert!(
            !o.status.success() && stderr(&o).contains("tenant 'acme' was deleted"),
            "{args:?}: {}",
            stderr(&o)
        );
    }

    // Offline.
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    let beta = parse(&server.cli(&["tenant", "create", "beta"]).unwrap());
    let beta_files = server.data_dir().join("tenants").join("beta");
    assert!(beta_files.join("wal").is_dir());
    let o = server.cli(&["tenant", "delete", "beta", "--yes"]).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"tenant": "beta", "deleted": true, "key_ids": [beta.key_id], "files_removed": true})
    );
    assert!(!beta_files.exists());
    // Files a deletion left behind (a crash between the catalog's change and their removal)
    // are removed by the next start.
    std::fs::create_dir_all(beta_files.join("wal")).unwrap();
    std::fs::write(beta_files.join("wal").join("left.wal"), b"x").unwrap();
    tokio::task::block_in_place(|| server.restart()).unwrap();
    assert!(!beta_files.exists(), "{}", server.log());
    assert_eq!(listed(&server), ["demo"]);
    let mut demo = server.cells(&server.demo).await.unwrap();
    assert_eq!(
        demo.read(read(1, 2, 3)).await.unwrap().into_inner().value,
        b"still here"
    );

    // Every tenant deleted, `demo` too: its dev credentials go, and no start makes it again.
    assert!(
        tokio::task::block_in_place(|| server.sigterm())
            .unwrap()
            .success()
    );
    let data = server.data_dir();
    let o = offline(&["tenant", "delete", "demo", "--yes"], &data);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!data.join("dev-credentials.json").exists());
    let Err(err) = TestServer::start_at(cubed(), &data, &[]) else {
        panic!("a start after every tenant was deleted wrote dev-credentials.json");
    };
    assert!(format!("{err:#}").contains("No such file"), "{err:#}");
    let o = offline(&["tenant", "list"], &data);
    assert!(o.status.success() && o.stdout.is_empty(), "{}", stderr(&o));
}
