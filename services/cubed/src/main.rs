//! cubed: parse flags, set up logging, run.

use std::process::ExitCode;

use cubed::config::{Command, KeyCommand, PolicyArg, TenantCommand};
use cubed::{admin_cli, serve};

/// `cubed tenant durability NAME relaxed` without --max-delay-ms / --max-records.
const RELAXED_DEFAULT_MAX_DELAY_MS: u64 = 5;
const RELAXED_DEFAULT_MAX_RECORDS: u64 = 1000;

// Measured: glibc malloc/free took ~20% of CPU under load; see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Everything cubed creates holds or guards secrets (the catalog, its journal, the tenants'
    // logs with their key records, certificates): owner only, whichever command creates it
    // first (`cubed tenant create` may run before any `cubed serve` has secured the directory).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    allocator_settings();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cubed: error: {}", cube_cli::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// mimalloc reads its options from the environment once, at process start. By default it keeps
/// memory freed by passivated tenants for reuse (2 GiB resident after 10,000 tenants went idle,
/// against 49 MiB with purging on: docs/benchmarks.md), so unless the operator set
/// `MIMALLOC_PURGE_DELAY` themselves, cubed re-executes itself once with purging on. Freed pages
/// are purged after 100 ms, not at once: with 0, every large value's buffers were fresh pages,
/// faulted in and zeroed again on each write (a 1 GiB bulk load of 64 KiB values 172-181 vs
/// 206-216 MiB/s; 10,000 idle tenants 53 vs 57 MiB resident: docs/benchmarks.md).
fn allocator_settings() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("MIMALLOC_PURGE_DELAY", "100")
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
        .exec();
    // exec returns only when it failed: carry on with the allocator's defaults.
    eprintln!("cubed: warning: could not apply allocator settings ({err}); continuing without");
}

fn run() -> anyhow::Result<()> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = cubed::config::parse_with_config(argv.clone())?;
    let validated = |serve: cubed::config::ServeArgs| {
        serve
            .validate()
            .map_err(|e| cubed::config::naming_the_source(e, &argv))
    };
    // The server logs at info; the one-shot commands (tenant, key) print their answer on stdout
    // and only warnings and errors on stderr, unless RUST_LOG says otherwise.
    let default_filter = match cli.command {
        None | Some(Command::Serve(_)) => "info,fjall=warn,lsm_tree=warn",
        Some(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            // fjall logs every keyspace it opens at info: one line per tenant wake-up.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not in a log file or a journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Before the flags are validated: the default --max-connections is half the soft limit.
    if matches!(cli.command, None | Some(Command::Serve(_))) {
        if let Some((before, after)) = cubed::config::raise_open_file_limit() {
            tracing::info!(
                before,
                after,
                "raised the soft open-file limit to the hard one"
            );
        }
        if let Some((soft, hard)) = cubed::config::low_open_file_limit() {
            tracing::warn!(
                soft,
                hard,
                "the open-file limit is low (under {}): each open tenant's state store may keep \
                 up to 900 files open, and a flush or WAL rotation that finds none left fails \
                 its tenant; give cubed a higher hard limit (LimitNOFILE=1048576 in a systemd \
                 unit, --ulimit nofile=1048576 for docker run; docs/operations.md)",
                cubed::config::LOW_OPEN_FILES
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            None => serve::run_until_signal(validated(cli.serve)?).await,
            Some(Command::Serve(args)) => serve::run_until_signal(validated(args)?).await,
            Some(Command::Tenant(TenantCommand::List { dir })) => {
                admin_cli::list_tenants(&dir).await
            }
            Some(Command::Tenant(TenantCommand::Create { name, dir })) => {
                admin_cli::create_tenant(&dir, &name).await
            }
            Some(Command::Tenant(TenantCommand::Delete { name, yes, dir })) => {
                anyhow::ensure!(
                    yes,
                    "`cubed tenant delete` removes tenant '{name}' and all its data for good (its \
                     cells, log and audit trail; its keys stop working): add --yes to do it"
                );
                admin_cli::delete_tenant(&dir, &name).await
            }
            Some(Command::Tenant(TenantCommand::Durability {
                name,
                policy,
                max_delay_ms,
                max_records,
                dir,
            })) => {
                let policy = match policy {
                    PolicyArg::Sync => {
                        // Given with `sync` they would be dropped without a word.
                        anyhow::ensure!(
                            max_delay_ms.is_none() && max_records.is_none(),
                            "--max-delay-ms and --max-records bound the `relaxed` policy only; \
                             `sync` acknowledges every write after its fdatasync: leave them out"
                        );
                        cube_store::SyncPolicy::Always
                    }
                    PolicyArg::Relaxed => cube_store::SyncPolicy::Relaxed {
                        max_delay: std::time::Duration::from_millis(
                            max_delay_ms.unwrap_or(RELAXED_DEFAULT_MAX_DELAY_MS),
                        ),
                        max_records: max_records.unwrap_or(RELAXED_DEFAULT_MAX_RECORDS),
                    },
                };
                admin_cli::set_durability(&dir, &name, policy).await
            }
            Some(Command::Key(KeyCommand::Create { tenant, admin, dir })) => {
                admin_cli::create_key(&dir, &tenant, admin).await
            }
            Some(Command::Key(KeyCommand::Cert {
                tenant,
                key_id,
                dir,
                out,
                days,
            })) => admin_cli::key_cert(&dir, &tenant, &key_id, &out, days).await,
            Some(Command::Key(KeyCommand::Revoke {
                tenant,
                key_id,
                dir,
            })) => admin_cli::revoke_key(&dir, &tenant, &key_id).await,
        }
    })
}
