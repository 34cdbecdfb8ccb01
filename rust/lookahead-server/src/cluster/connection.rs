//! The NATS connection: options from the command line (credentials, token, TLS), reconnection
//! with backoff forever, the connection state as a watch value, and the JetStream stream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use tokio::sync::watch;

use super::wire::Names;
use crate::config::ClusterConfig;
use crate::error::ServerError;
use crate::metrics::ClusterMetrics;

/// Delay before reconnection attempt `attempt` (1, 2, ...): 50 ms doubling up to 2 s.
pub fn reconnect_delay(attempt: usize) -> Duration {
    let exponent = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(6);
    Duration::from_millis(50 << exponent).min(Duration::from_secs(2))
}

/// Connects to NATS without waiting: the client keeps trying in the background (the server
/// serves meanwhile). Errors are bad settings (an unreadable credentials or token file).
pub async fn connect(
    config: &ClusterConfig,
    node_id: &str,
) -> Result<async_nats::Client, ServerError> {
    let invalid = |field: &'static str, reason: String| ServerError::Config { field, reason };
    let mut options = match &config.creds_file {
        Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| invalid("cluster_creds", format!("{}: {e}", path.display())))?,
        None => async_nats::ConnectOptions::new(),
    };
    if let Some(path) = &config.token_file {
        let token = std::fs::read_to_string(path)
            .map_err(|e| invalid("cluster_token_file", format!("{}: {e}", path.display())))?;
        options = options.token(token.trim().to_string());
    }
    if let Some(ca) = &config.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &config.tls_client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if config.require_tls {
        options = options.require_tls(true);
    }
    let servers: Vec<async_nats::ServerAddr> = config
        .servers
        .iter()
        .map(|url| {
            url.parse()
                .map_err(|e| invalid("cluster", format!("{url:?}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    options
        .name(format!("lookahead-server/{node_id}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(reconnect_delay)
        .connection_timeout(Duration::from_secs(2))
        .connect(servers)
        .await
        .map_err(|e| invalid("cluster", e.to_string()))
}

/// Watches the client's connection state: keeps `connected` and the metrics up to date and
/// logs each loss and recovery once (and, once, that NATS is not reachable at start). Runs
/// until the process ends.
pub async fn monitor(
    client: async_nats::Client,
    connected: watch::Sender<bool>,
    metrics: Arc<ClusterMetrics>,
    servers: String,
) {
    /// How long a start may take before "unreachable" is logged.
    const START_GRACE: Duration = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let (mut was, mut ever, mut told_unreachable) = (false, false, false);
    let mut ticker = tokio::time::interval(Duration::from_millis(50));
    loop {
        ticker.tick().await;
        let now = client.connection_state() == async_nats::connection::State::Connected;
        if now != was {
            metrics.set_connected(now);
            connected.send_replace(now);
            if now && ever {
                tracing::info!(servers = %servers, "cluster: NATS connection restored; catching up");
            } else if now {
                tracing::info!(servers = %servers, "cluster: connected to NATS");
            } else {
                tracing::warn!(servers = %servers, "cluster: NATS connection lost; serving from what this server has, reconnecting with backoff");
            }
            ever |= now;
            was = now;
        } else if !ever && !told_unreachable && started.elapsed() > START_GRACE {
            told_unreachable = true;
            tracing::warn!(servers = %servers, "cluster: NATS is not reachable; serving alone until it is, retrying with backoff");
        }
    }
}

/// The stream's settings for this cluster.
pub fn stream_config(names: &Names, config: &ClusterConfig) -> stream::Config {
    stream::Config {
        name: names.stream(),
        description: Some(format!(
            "lookahead: texts learnt by the servers of cluster {}",
            names.cluster()
        )),
        subjects: vec![names.learn_wildcard()],
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        storage: stream::StorageType::File,
        max_age: config.max_age,
        max_bytes: i64::try_from(config.max_bytes).unwrap_or(i64::MAX),
        num_replicas: config.replicas,
        duplicate_window: Duration::from_secs(120),
        ..stream::Config::default()
    }
}

/// Creates the stream, or takes the existing one as it is (another server made it, perhaps
/// with other limits: logged).
pub async fn ensure_stream(
    js: &jetstream::Context,
    names: &Names,
    config: &ClusterConfig,
) -> Result<stream::Stream, String> {
    let wanted = stream_config(names, config);
    let mut stream = js
        .get_or_create_stream(wanted.clone())
        .await
        .map_err(|e| format!("stream {}: {e}", names.stream()))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream {}: {e}", names.stream()))?;
    let have = &info.config;
    if have.max_age != wanted.max_age
        || have.max_bytes != wanted.max_bytes
        || have.num_replicas != wanted.num_replicas
    {
        tracing::warn!(
            stream = %names.stream(),
            max_age_s = have.max_age.as_secs_f64(),
            max_bytes = have.max_bytes,
            replicas = have.num_replicas,
            "cluster: the stream exists with other limits than this server's flags; kept as it is"
        );
    }
    Ok(stream)
}
