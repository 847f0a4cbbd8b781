//! cubed: parse flags, set up logging, run.

use std::process::ExitCode;

use clap::Parser;
use cubed::config::{Cli, Command, KeyCommand, PolicyArg, TenantCommand};
use cubed::{admin_cli, serve};

// Measured: glibc malloc/free took ~20% of CPU under load; see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cubed: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            None => serve::run_until_signal(cli.serve.validate()?).await,
            Some(Command::Serve(args)) => serve::run_until_signal(args.validate()?).await,
            Some(Command::Tenant(TenantCommand::Create { name, dir })) => {
                admin_cli::create_tenant(&dir.data_dir, &name).await
            }
            Some(Command::Tenant(TenantCommand::Durability {
                name,
                policy,
                max_delay_ms,
                max_records,
                dir,
            })) => {
                let policy = match policy {
                    PolicyArg::Sync => cube_store::SyncPolicy::Always,
                    PolicyArg::Relaxed => cube_store::SyncPolicy::Relaxed {
                        max_delay: std::time::Duration::from_millis(max_delay_ms),
                        max_records,
                    },
                };
                admin_cli::set_durability(&dir.data_dir, &name, policy).await
            }
            Some(Command::Key(KeyCommand::Create { tenant, dir })) => {
                admin_cli::create_key(&dir.data_dir, &tenant).await
            }
            Some(Command::Key(KeyCommand::Cert {
                tenant,
                key_id,
                dir,
                out,
            })) => admin_cli::key_cert(&dir.data_dir, &tenant, &key_id, &out).await,
            Some(Command::Key(KeyCommand::Revoke {
                tenant,
                key_id,
                dir,
            })) => admin_cli::revoke_key(&dir.data_dir, &tenant, &key_id).await,
        }
    })
}
