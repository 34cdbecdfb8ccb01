//! The cluster connection's settings (`--cluster` and the flags after it).

use super::*;

/// Settings of the cluster connection (`--cluster` and the flags after it).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// NATS server URLs (seeds).
    pub servers: Vec<String>,
    /// The cluster's name (`[A-Za-z0-9_-]`, 1 to 64 bytes).
    pub name: String,
    /// The node id given on the command line (None: the stable random one).
    pub node_id: Option<String>,
    /// NATS credentials file.
    pub creds_file: Option<PathBuf>,
    /// File holding a NATS token.
    pub token_file: Option<PathBuf>,
    /// CA of the NATS servers (implies TLS).
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key for NATS.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// Refuse plaintext NATS connections.
    pub require_tls: bool,
    /// How long the stream keeps a message.
    pub max_age: Duration,
    /// Bytes the stream keeps.
    pub max_bytes: u64,
    /// Stream replicas.
    pub replicas: usize,
    /// Bound of the outgoing buffer, in bytes.
    pub buffer_bytes: usize,
    /// The longest time between two batches.
    pub batch_interval: Duration,
}

impl ClusterConfig {
    /// Checks what clap cannot.
    pub fn validate(&self) -> Result<(), ServerError> {
        let invalid = |field: &'static str, reason: String| ServerError::Config { field, reason };
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !name_ok(&self.name) {
            return Err(invalid(
                "cluster_name",
                format!("{:?}: use 1 to 64 letters, digits, '_' or '-'", self.name),
            ));
        }
        if let Some(id) = &self.node_id
            && !name_ok(id)
        {
            return Err(invalid(
                "node_id",
                format!("{id:?}: use 1 to 64 letters, digits, '_' or '-'"),
            ));
        }
        for url in &self.servers {
            let scheme = url.split_once("://").map(|(s, _)| s);
            if !matches!(scheme, Some("nats" | "tls" | "ws" | "wss")) || url.ends_with("://") {
                return Err(invalid(
                    "cluster",
                    format!("{url:?}: expected nats://HOST:PORT or tls://HOST:PORT"),
                ));
            }
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(invalid(
                "cluster_replicas",
                format!("{} is not between 1 and 5", self.replicas),
            ));
        }
        if self.max_age.is_zero() {
            return Err(invalid("cluster_max_age", "must be above 0".into()));
        }
        if self.buffer_bytes < 1 << 16 {
            return Err(invalid(
                "cluster_buffer",
                format!("{} bytes is too small (at least 64KiB)", self.buffer_bytes),
            ));
        }
        if self.batch_interval.is_zero() {
            return Err(invalid("cluster_batch_ms", "must be at least 1".into()));
        }
        Ok(())
    }
}
