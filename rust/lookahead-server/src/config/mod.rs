//! The server's settings: [`ServerConfig`] (what the server runs with), built from the
//! command line ([`cli`]), with the cluster connection's settings apart ([`cluster`]).

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use lookahead_core::DrafterConfig;

use crate::error::ServerError;
use crate::persistence::OnCorrupt;

mod cli;
mod cluster;

pub use cli::{Cli, ListenAddr, LogFormat, parse_mode, parse_size};
pub use cluster::ClusterConfig;

/// Settings of persistence, expiry and the operational endpoints.
#[derive(Clone, Debug, Default)]
pub struct OpsConfig {
    /// Snapshot directory (None: no persistence).
    pub snapshot_dir: Option<PathBuf>,
    /// Time between periodic snapshots (None: only on shutdown).
    pub snapshot_interval: Option<Duration>,
    /// What to do with a snapshot that cannot be loaded.
    pub on_corrupt: OnCorrupt,
    /// Idle time after which a request is ended (None: never).
    pub request_ttl: Option<Duration>,
    /// Address of the metrics endpoint.
    pub metrics_listen: Option<String>,
    /// Bearer tokens file.
    pub auth_tokens: Option<PathBuf>,
    /// Permission bits of the Unix sockets.
    pub unix_socket_mode: u32,
    /// TLS certificate chain and key of the TCP listeners.
    pub tls_cert: Option<(PathBuf, PathBuf)>,
    /// CA of the client certificates (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
}

/// Everything [`crate::run`] needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Addresses to listen on (at least one).
    pub listen: Vec<ListenAddr>,
    /// Memory budget of the whole server in bytes, split equally among `max_namespaces`.
    pub memory_budget_bytes: usize,
    /// The most namespaces the server creates.
    pub max_namespaces: usize,
    /// Tokio worker threads (0: one per CPU).
    pub worker_threads: usize,
    /// Log line format.
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax).
    pub log_filter: String,
    /// The drafter settings of every namespace; `memory_budget_bytes` is overwritten by the
    /// namespace's share.
    pub drafter: DrafterConfig,
    /// Most requests in one step.
    pub max_requests_per_step: usize,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Time given to open calls and streams to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Most tokens in one step.
    pub max_step_tokens: usize,
    /// Most active requests per namespace.
    pub max_active_requests: usize,
    /// Persistence, expiry, metrics and access control.
    pub ops: OpsConfig,
    /// The cluster (None: a server on its own).
    pub cluster: Option<ClusterConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: vec![ListenAddr::Tcp("127.0.0.1:50051".to_string())],
            memory_budget_bytes: 1 << 30,
            max_namespaces: 8,
            worker_threads: 0,
            log_format: LogFormat::Text,
            log_filter: "info".to_string(),
            drafter: DrafterConfig::default(),
            max_requests_per_step: 4096,
            max_message_bytes: 64 << 20,
            shutdown_grace: Duration::from_secs(5),
            max_step_tokens: 4 << 20,
            max_active_requests: 65536,
            ops: OpsConfig {
                unix_socket_mode: 0o600,
                ..OpsConfig::default()
            },
            cluster: None,
        }
    }
}

impl ServerConfig {
    /// The memory budget of one namespace: the server's budget split equally.
    pub fn namespace_memory_budget(&self) -> usize {
        self.memory_budget_bytes / self.max_namespaces.max(1)
    }

    /// The drafter settings of one namespace (its share of the memory budget included).
    pub fn namespace_drafter_config(&self) -> DrafterConfig {
        DrafterConfig {
            memory_budget_bytes: self.namespace_memory_budget(),
            // In a cluster the drafters record what they learn for the other servers.
            record_for_cluster: self.cluster.is_some(),
            ..self.drafter.clone()
        }
    }

    /// Checks the settings that the command line cannot check alone.
    pub fn validate(&self) -> Result<(), ServerError> {
        let invalid = |field: &'static str, reason: String| ServerError::Config { field, reason };
        if self.listen.is_empty() {
            return Err(invalid("listen", "at least one address is needed".into()));
        }
        if self.max_namespaces == 0 {
            return Err(invalid("max_namespaces", "must be at least 1".into()));
        }
        if self.max_requests_per_step == 0 {
            return Err(invalid(
                "max_requests_per_step",
                "must be at least 1".into(),
            ));
        }
        if self.max_active_requests == 0 {
            return Err(invalid("max_active_requests", "must be at least 1".into()));
        }
        if self.max_message_bytes < 1024 {
            return Err(invalid(
                "max_message_bytes",
                format!(
                    "{} bytes is too small (at least 1024)",
                    self.max_message_bytes
                ),
            ));
        }
        if u32::try_from(self.drafter.max_budget).is_err() {
            return Err(invalid("max_budget", "must fit in 32 bits".into()));
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        self.namespace_drafter_config()
            .validate()
            .map_err(ServerError::Drafter)
    }
}
