//! The command line: `sluice serve`, `sluice check-config`, `sluice default-config`,
//! `sluice bundle`, `sluice simulate`, `sluice stress`, `sluice jobs`.
//!
//! Exit status: 0 success, 1 a runtime failure (a port in use), 2 an invalid configuration.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config;
use crate::serve::{self, ServeError};

/// sluice: a rate-limiting gateway.
#[derive(Debug, Parser)]
#[command(name = "sluice", version = env!("SLUICE_VERSION_LINE"), about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: proxy traffic through the configured policies, and serve the
    /// decision API, /metrics and /healthz on the admin listener.
    /// With a `[browser]` table, the main listener also serves the browser limiter under
    /// /sluice/ (the Service Worker, its client module, the demo page) and POST /v1/telemetry.
    ///
    /// Without --config: the embedded defaults (see `sluice default-config`), listening on
    /// 127.0.0.1:8080 and 127.0.0.1:8081, with a built-in demo upstream.
    /// SIGTERM drains and exits 0; SIGHUP reloads the config file.
    /// Logs go to stderr; set SLUICE_LOG (e.g. `warn`, `info,sluice::access=off`) to filter.
    Serve {
        /// The TOML configuration file.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration file: exit 0, or exit 2 listing every error as
    /// FILE:LINE:COLUMN: FIELD: MESSAGE.
    CheckConfig {
        /// The TOML configuration file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the embedded default configuration (a starting point for your own).
    DefaultConfig,
    /// Write the browser limiter as static files for any web host, from the `[browser]`
    /// table: sluice-sw.js (the Service Worker, module embedded), sluice-sw-import.js and
    /// sluice-sw.mjs (for an app's own worker), sluice-client.js and sluice-config.json.
    /// Exit 1 if DIR cannot be written, 2 for an invalid configuration.
    Bundle(crate::bundle::Args),
    /// Replay a policy of a config against a trace or a synthetic pattern, on a virtual
    /// clock with the gateway's own algorithm and queue code, and report what it admits.
    Simulate(crate::simulate::Args),
    /// Send load to a URL at a fixed rate and summarise status codes and latencies.
    Stress(crate::stress::Args),
    /// Inspect a job queue in Redis (each group's waiting, active, completed, failed, retried
    /// and dead jobs), put its dead letters back, or purge it.
    Jobs(crate::jobs::Args),
}

/// Parses the command line and runs it.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => serve_main(config),
        Command::CheckConfig { file } => check_config(&file),
        Command::DefaultConfig => {
            print!("{}", config::DEFAULT_CONFIG);
            ExitCode::SUCCESS
        }
        Command::Bundle(args) => crate::bundle::run(args),
        Command::Simulate(args) => crate::simulate::run(args),
        Command::Stress(args) => crate::stress::run(args),
        Command::Jobs(args) => crate::jobs::run(args),
    }
}

fn init_logs() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn serve_main(config: Option<PathBuf>) -> ExitCode {
    init_logs();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(ServeError::Config(errors)) => {
            eprintln!("{errors}");
            ExitCode::from(2)
        }
        Err(ServeError::Other(e)) => {
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    let config = match config::load(file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let (policies, routes) = (config.policies.len(), config.routes.len());
    // Build the policies too (stores may refuse some), in a throwaway runtime.
    let built = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| rt.block_on(async { crate::runtime::dry_run(config).map(|_| ()) }));
    match built {
        Ok(Ok(())) => {
            println!(
                "{}: ok ({policies} policies, {routes} routes)",
                file.display()
            );
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
