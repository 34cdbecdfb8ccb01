//! The command line (clap), and the [`ServerConfig`] it becomes.

use super::*;

/// An address the server listens on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// `host:port` (a name, an IPv4 address, or `[v6]`); port 0 picks a free port.
    Tcp(String),
    /// A Unix domain socket path (`unix:///abs/path`, `unix:/abs/path` or `unix:rel/path`).
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("unix:") {
            let path = match rest.strip_prefix("//") {
                Some(abs) if abs.starts_with('/') => abs,
                Some(_) => {
                    return Err(format!(
                        "{s:?}: unix:// needs an absolute path (unix:///path)"
                    ));
                }
                None => rest,
            };
            if path.is_empty() {
                return Err(format!("{s:?}: empty Unix socket path"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let hostport = s.strip_prefix("tcp://").unwrap_or(s);
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(format!("{s:?}: expected host:port or unix:///path"));
        };
        if host.is_empty() {
            return Err(format!(
                "{s:?}: empty host (use 0.0.0.0:{port} for every interface)"
            ));
        }
        if port.parse::<u16>().is_err() {
            return Err(format!(
                "{s:?}: port {port:?} is not a number from 0 to 65535"
            ));
        }
        Ok(Self::Tcp(hostport.to_string()))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(hostport) => f.write_str(hostport),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How log lines are written (to stderr).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses a byte size: a plain number of bytes, or a number with one of the suffixes
/// `K`, `M`, `G`, `T` (powers of 1000) or `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), with
/// an optional trailing `B` for the decimal ones (`512MiB`, `4G`, `1.5GiB`).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as 1073741824, 512MiB or 4GiB"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("{s:?}: unknown size unit {other:?}")),
    };
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 {
        return Err(format!("{s:?}: size out of range"));
    }
    Ok(bytes as usize)
}

/// The `lookahead-server` command line.
#[derive(Debug, Parser)]
#[command(
    name = "lookahead-server",
    version,
    about = "Shared drafting service for lookahead (trie / n-gram) speculative decoding, over gRPC."
)]
pub struct Cli {
    /// Address to listen on: host:port or unix:///path/to/socket. Repeat to listen on several.
    #[arg(
        long = "listen",
        value_name = "ADDR",
        default_value = "127.0.0.1:50051"
    )]
    pub listen: Vec<ListenAddr>,

    /// Memory budget of the whole server (e.g. 4GiB); every namespace gets an equal share,
    /// budget / --max-namespaces.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub memory_budget: usize,

    /// The most namespaces (one drafter each) the server creates.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_namespaces: usize,

    /// Tokio worker threads; 0 means one per CPU.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub worker_threads: usize,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax, e.g. info or lookahead_server=debug).
    #[arg(
        long,
        value_name = "FILTER",
        env = "LOOKAHEAD_LOG",
        default_value = "info"
    )]
    pub log_level: String,

    /// Largest draft budget (nodes per tree) accepted. Default: the core's.
    #[arg(long, value_name = "N")]
    pub max_budget: Option<usize>,

    /// Depth of the shared n-gram trie. Default: the core's.
    #[arg(long, value_name = "N")]
    pub max_ngram: Option<usize>,

    /// Token ids must be below this. Default: the core's.
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<u32>,

    /// Nodes whose path probability is below this are not proposed. Default: the core's.
    #[arg(long, value_name = "P")]
    pub min_score: Option<f32>,

    /// Single-branch (chain) drafts instead of trees.
    #[arg(long)]
    pub chain: bool,

    /// Most tokens (prompt + output) per request. Default: the core's.
    #[arg(long, value_name = "N")]
    pub max_request_tokens: Option<usize>,

    /// Most requests in one step.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_requests_per_step: usize,

    /// Largest gRPC message accepted or sent (e.g. 64MiB).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub max_message_bytes: usize,

    /// Seconds given to open calls and streams to finish after SIGTERM / Ctrl-C.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub shutdown_grace: f64,

    /// Most tokens (prompts plus new tokens) in one step.
    #[arg(long, value_name = "N", default_value_t = 4 << 20)]
    pub max_step_tokens: usize,

    /// Most active requests per namespace; new prompts past it get RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value_t = 65536)]
    pub max_active_requests: usize,

    /// Requests no step touched for this many seconds are ended (an engine that went away).
    /// 0 disables it.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub request_ttl: f64,

    /// Directory of the namespaces' snapshot files: restored at start, written periodically
    /// (--snapshot-interval) and on graceful shutdown. Without it nothing is persisted.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,

    /// Seconds between periodic snapshots (0: only on graceful shutdown).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub snapshot_interval: f64,

    /// What to do with a snapshot file that cannot be loaded: refuse to start, or move it
    /// aside (*.corrupt) and start that namespace empty.
    #[arg(long, value_enum, default_value_t = OnCorrupt::Fail)]
    pub on_corrupt: OnCorrupt,

    /// Serve Prometheus metrics over HTTP on host:port (GET /metrics).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,

    /// Bearer tokens file: lines `TOKEN NAMESPACE[,NAMESPACE...]` or `TOKEN *`; `#` starts a
    /// comment. Reloaded on SIGHUP and when the file changes. Without it no token is needed.
    #[arg(long, value_name = "FILE")]
    pub auth_tokens: Option<PathBuf>,

    /// Permission bits of the Unix sockets (octal).
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub unix_socket_mode: u32,

    /// TLS certificate chain (PEM) of the TCP listeners; needs --tls-key. Unix sockets stay
    /// plaintext (protected by their file mode).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA certificate(s) (PEM) that client certificates must be signed by: mutual TLS, every
    /// TCP client must present one. Needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Join a cluster through NATS JetStream: a NATS server URL (nats://HOST:PORT, or
    /// tls://HOST:PORT). Repeat for more seed servers of one NATS cluster. Without it the
    /// server learns only from its own clients (docs/cluster.md).
    #[arg(long = "cluster", value_name = "URL", help_heading = "Cluster")]
    pub cluster: Vec<String>,

    /// Name of the cluster: servers with the same name share what they learn (it names the
    /// JetStream stream LOOKAHEAD_<NAME> and the subjects lookahead.<NAME>.>).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        help_heading = "Cluster"
    )]
    pub cluster_name: String,

    /// This server's id in the cluster. Default: a random id, kept in --snapshot-dir/node-id
    /// so that it is stable across restarts (without --snapshot-dir it changes each start).
    #[arg(long, value_name = "ID", help_heading = "Cluster")]
    pub node_id: Option<String>,

    /// NATS credentials file (.creds: user JWT and NKey seed) for the cluster connection.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Cluster",
        conflicts_with = "cluster_token_file"
    )]
    pub cluster_creds: Option<PathBuf>,

    /// File holding a NATS authentication token for the cluster connection.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub cluster_token_file: Option<PathBuf>,

    /// CA certificate(s) (PEM) to verify the NATS servers with; implies TLS.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub cluster_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for NATS servers that require one; needs --cluster-tls-key.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Cluster",
        requires = "cluster_tls_key"
    )]
    pub cluster_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --cluster-tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Cluster",
        requires = "cluster_tls_cert"
    )]
    pub cluster_tls_key: Option<PathBuf>,

    /// Refuse a NATS connection without TLS.
    #[arg(long, help_heading = "Cluster")]
    pub cluster_require_tls: bool,

    /// Seconds the stream keeps a message (what a new or restarted server can catch up on).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 86_400.0,
        help_heading = "Cluster"
    )]
    pub cluster_max_age: f64,

    /// Bytes the stream keeps at most (oldest messages go first).
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size, help_heading = "Cluster")]
    pub cluster_max_bytes: usize,

    /// Copies of the stream kept by a clustered NATS deployment (1 to 5).
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = "Cluster")]
    pub cluster_replicas: usize,

    /// Bytes of outgoing messages kept while NATS cannot take them; past it the oldest are
    /// dropped (counted in lookahead_cluster_dropped_*).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size, help_heading = "Cluster")]
    pub cluster_buffer: usize,

    /// The most milliseconds between two batches of learnt texts (per namespace); batches also
    /// go out right after steps while none waits to be sent.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 20,
        help_heading = "Cluster"
    )]
    pub cluster_batch_ms: u64,
}

/// Parses octal permission bits (`600`, `0660`).
pub fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "{s:?}: expected octal permission bits such as 600 or 660"
        )),
    }
}

impl TryFrom<Cli> for ServerConfig {
    type Error = ServerError;

    fn try_from(cli: Cli) -> Result<Self, Self::Error> {
        let defaults = DrafterConfig::default();
        let seconds = |field: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(ServerError::Config {
                    field,
                    reason: format!("{v} is not a number of seconds >= 0"),
                })
            }
        };
        let shutdown_grace = seconds("shutdown_grace", cli.shutdown_grace)?;
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        let ops = OpsConfig {
            snapshot_dir: cli.snapshot_dir,
            snapshot_interval: nonzero(seconds("snapshot_interval", cli.snapshot_interval)?),
            on_corrupt: cli.on_corrupt,
            request_ttl: nonzero(seconds("request_ttl", cli.request_ttl)?),
            metrics_listen: cli.metrics_listen,
            auth_tokens: cli.auth_tokens,
            unix_socket_mode: cli.unix_socket_mode,
            tls_cert: cli.tls_cert.zip(cli.tls_key),
            tls_client_ca: cli.tls_client_ca,
        };
        let cluster = if cli.cluster.is_empty() {
            None
        } else {
            let max_age = seconds("cluster_max_age", cli.cluster_max_age)?;
            Some(ClusterConfig {
                servers: cli.cluster,
                name: cli.cluster_name,
                node_id: cli.node_id,
                creds_file: cli.cluster_creds,
                token_file: cli.cluster_token_file,
                tls_ca: cli.cluster_tls_ca,
                tls_client: cli.cluster_tls_cert.zip(cli.cluster_tls_key),
                require_tls: cli.cluster_require_tls,
                max_age,
                max_bytes: cli.cluster_max_bytes as u64,
                replicas: cli.cluster_replicas,
                buffer_bytes: cli.cluster_buffer,
                batch_interval: Duration::from_millis(cli.cluster_batch_ms),
            })
        };
        let config = Self {
            listen: cli.listen,
            memory_budget_bytes: cli.memory_budget,
            max_namespaces: cli.max_namespaces,
            worker_threads: cli.worker_threads,
            log_format: cli.log_format,
            log_filter: cli.log_level,
            drafter: DrafterConfig {
                max_budget: cli.max_budget.unwrap_or(defaults.max_budget),
                max_ngram: cli.max_ngram.unwrap_or(defaults.max_ngram),
                vocab_size: cli.vocab_size.unwrap_or(defaults.vocab_size),
                min_score: cli.min_score.unwrap_or(defaults.min_score),
                chain: cli.chain || defaults.chain,
                max_request_tokens: cli
                    .max_request_tokens
                    .unwrap_or(defaults.max_request_tokens),
                ..defaults
            },
            max_requests_per_step: cli.max_requests_per_step,
            max_message_bytes: cli.max_message_bytes,
            shutdown_grace,
            max_step_tokens: cli.max_step_tokens,
            max_active_requests: cli.max_active_requests,
            ops,
            cluster,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "127.0.0.1:50051".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("127.0.0.1:50051".into()))
        );
        assert_eq!(
            "[::1]:0".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("[::1]:0".into()))
        );
        assert_eq!(
            "tcp://localhost:9".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("localhost:9".into()))
        );
        assert_eq!(
            "unix:///tmp/x.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/tmp/x.sock".into()))
        );
        assert_eq!(
            "unix:rel.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("rel.sock".into()))
        );
        for bad in [
            "unix://rel",
            "unix:",
            "localhost",
            ":80",
            "host:99999",
            "host:x",
        ] {
            assert!(
                bad.parse::<ListenAddr>().is_err(),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn cli_builds_a_config_with_core_defaults() {
        let cli = Cli::try_parse_from([
            "lookahead-server",
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "unix:///tmp/l.sock",
            "--memory-budget",
            "8MiB",
            "--max-namespaces",
            "4",
            "--max-budget",
            "32",
        ])
        .expect("parses");
        let config = ServerConfig::try_from(cli).expect("valid");
        assert_eq!(config.listen.len(), 2);
        assert_eq!(config.namespace_memory_budget(), 2 << 20);
        assert_eq!(config.drafter.max_budget, 32);
        assert_eq!(config.drafter.max_ngram, DrafterConfig::default().max_ngram);
    }

    #[test]
    fn cluster_flags_build_a_cluster_config() {
        let cli = Cli::try_parse_from(["lookahead-server"]).expect("parses");
        assert_eq!(ServerConfig::try_from(cli).expect("valid").cluster, None);
        let cli = Cli::try_parse_from([
            "lookahead-server",
            "--cluster",
            "nats://127.0.0.1:4222",
            "--cluster",
            "nats://127.0.0.1:4223",
            "--cluster-name",
            "prod",
            "--node-id",
            "node-7",
            "--cluster-max-bytes",
            "2GiB",
        ])
        .expect("parses");
        let cluster = ServerConfig::try_from(cli)
            .expect("valid")
            .cluster
            .expect("cluster on");
        assert_eq!(cluster.servers.len(), 2);
        assert_eq!(
            (cluster.name.as_str(), cluster.node_id.as_deref()),
            ("prod", Some("node-7"))
        );
        assert_eq!(cluster.max_bytes, 2 << 30);
        for (flag, value, field) in [
            ("--cluster-name", "a.b", "cluster_name"),
            ("--node-id", "x y", "node_id"),
            ("--cluster-replicas", "9", "cluster_replicas"),
        ] {
            let cli =
                Cli::try_parse_from(["lookahead-server", "--cluster", "nats://h:1", flag, value])
                    .expect("parses");
            match ServerConfig::try_from(cli) {
                Err(ServerError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{flag} {value}: expected a config error, got {other:?}"),
            }
        }
        let cli = Cli::try_parse_from(["lookahead-server", "--cluster", "127.0.0.1:4222"])
            .expect("parses");
        assert!(
            ServerConfig::try_from(cli).is_err(),
            "a URL needs its scheme"
        );
    }

    #[test]
    fn zero_namespaces_is_refused_naming_the_field() {
        let cli =
            Cli::try_parse_from(["lookahead-server", "--max-namespaces", "0"]).expect("parses");
        match ServerConfig::try_from(cli) {
            Err(ServerError::Config { field, .. }) => assert_eq!(field, "max_namespaces"),
            other => panic!("expected a config error, got {other:?}"),
        }
    }
}
