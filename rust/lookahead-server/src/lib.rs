//! `lookahead-server`: the shared drafter of lookahead speculative decoding, over gRPC.
//!
//! A [tonic] service (`lookahead.v1.Lookahead`, see `proto/lookahead/v1/lookahead.proto`)
//! over [`lookahead_core::Drafter`]: one drafter per namespace, engine steps as unary calls
//! or over one bidirectional stream per engine, bulk ingest, stats, plus the standard gRPC
//! health and reflection services. It listens on TCP and Unix sockets at once and stops
//! gracefully on SIGTERM or Ctrl-C.
//!
//! Entry points: the binary `lookahead-server` calls [`main_with_args`]; the Python
//! bindings call [`run_with_args`] (with the GIL released); embedders call [`run`] with a
//! [`ServerConfig`], or [`bind`] then [`BoundServer::serve`] inside their own runtime.

#![warn(missing_docs)]

pub mod auth;
pub mod cluster;
pub mod config;
pub mod convert;
pub mod error;
pub mod local;
mod logging;
mod maintenance;
pub mod member;
pub mod metrics;
pub mod metrics_http;
pub mod namespaces;
pub mod pb;
pub mod persistence;
mod server;
pub mod service;
mod shutdown;
pub mod status;
pub mod step;
pub mod uds_authority;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

pub use config::{Cli, ListenAddr, LogFormat, OpsConfig, ServerConfig, parse_size};
pub use error::ServerError;
pub use server::{BoundAddr, BoundServer, bind};
pub use service::LookaheadService;

/// Runs the server until SIGTERM or Ctrl-C: sets up logging, builds a Tokio runtime with
/// `config.worker_threads` workers, binds every address and serves. Blocks the calling thread.
pub fn run(config: ServerConfig) -> Result<(), ServerError> {
    config.validate()?;
    logging::init(config.log_format, &config.log_filter)?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.worker_threads > 0 {
        builder.worker_threads(config.worker_threads);
    }
    let runtime = builder
        .enable_all()
        .thread_name("lookahead-worker")
        .build()
        .map_err(ServerError::Runtime)?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        memory_budget_bytes = config.memory_budget_bytes,
        max_namespaces = config.max_namespaces,
        worker_threads = config.worker_threads,
        "lookahead-server starting"
    );
    let outcome = runtime.block_on(async {
        let mut signals = shutdown::Signals::install();
        let server = bind(&config).await?;
        server.serve(signals.recv()).await
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    outcome
}

/// Parses a command line (`args[0]` is the program name) and runs the server. Returns the
/// process exit status: 0 after a clean shutdown (or `--help` / `--version`), 1 when the
/// server failed, 2 for a bad command line. Errors are written to stderr.
pub fn run_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Printing can only fail if stderr/stdout is gone; nothing left to report to.
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let config = match ServerConfig::try_from(cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("lookahead-server: {e}");
            return 2;
        }
    };
    match run(config) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lookahead-server: error: {e}");
            1
        }
    }
}

/// [`run_with_args`] as a process exit code (what the binary's `main` returns).
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(run_with_args(args))
}
