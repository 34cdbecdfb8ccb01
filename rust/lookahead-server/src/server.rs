//! Listening and serving: binds every `--listen` address (TCP and Unix sockets), serves the
//! lookahead, health and reflection services on each, and shuts down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::auth::Auth;
use crate::cluster::{Cluster, node_id};
use crate::config::{ListenAddr, ServerConfig};
use crate::error::ServerError;
use crate::maintenance::{Maintenance, snapshot_all};
use crate::metrics::{ClusterMetrics, DrafterStatsSource, ServerMetrics};
use crate::namespaces::Namespaces;
use crate::pb;
use crate::pb::lookahead_server::LookaheadServer;
use crate::persistence::load_all;
use crate::service::{LookaheadService, ServiceLimits};
use crate::uds_authority::AuthorityFix;
use std::sync::Arc;

/// An address the server is listening on (ports resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundAddr {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl std::fmt::Display for BoundAddr {
    /// The address as a gRPC client target (`127.0.0.1:50051`, `unix:///run/l.sock`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) if path.is_absolute() => write!(f, "unix://{}", path.display()),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

enum Listener {
    Tcp(SocketAddr, TcpIncoming),
    Unix(PathBuf, UnixListener),
}

/// A server whose addresses are bound, ready to [`serve`](BoundServer::serve).
pub struct BoundServer {
    listeners: Vec<Listener>,
    tls: Option<ServerTlsConfig>,
    metrics_listener: Option<(SocketAddr, tokio::net::TcpListener)>,
    service: LookaheadService,
    namespaces: Arc<Namespaces>,
    auth: Arc<Auth>,
    metrics: Arc<ServerMetrics>,
    shutdown: watch::Sender<bool>,
    config: ServerConfig,
    cluster: Option<(Cluster, Arc<ClusterMetrics>)>,
}

/// Binds every address of `config`, restores the snapshots of `--snapshot-dir`, loads the
/// tokens file and builds the service. Must run inside a Tokio runtime.
pub async fn bind(config: &ServerConfig) -> Result<BoundServer, ServerError> {
    config.validate()?;
    let ops = &config.ops;
    let auth = match &ops.auth_tokens {
        Some(path) => Auth::from_file(path).map_err(|reason| ServerError::Config {
            field: "auth_tokens",
            reason,
        })?,
        None => Auth::disabled(),
    };
    let metrics = Arc::new(ServerMetrics::default());
    let namespaces = Namespaces::new(
        config.namespace_drafter_config(),
        config.max_namespaces,
        Arc::clone(&metrics),
    );
    if let Some(dir) = &ops.snapshot_dir {
        let (dir, drafter) = (dir.clone(), config.namespace_drafter_config());
        let (on_corrupt, limit) = (ops.on_corrupt, config.max_namespaces);
        let restored =
            tokio::task::spawn_blocking(move || load_all(&dir, &drafter, on_corrupt, limit))
                .await
                .map_err(|e| ServerError::Runtime(std::io::Error::other(e.to_string())))?
                .map_err(ServerError::Snapshot)?;
        namespaces.restore(
            restored
                .into_iter()
                .map(|r| (r.namespace, r.drafter, r.replicated_through)),
        );
    }
    let mut listeners = Vec::with_capacity(config.listen.len());
    for addr in &config.listen {
        listeners.push(bind_one(addr, ops.unix_socket_mode).await?);
    }
    let metrics_listener = match &ops.metrics_listen {
        Some(addr) => {
            let (listener, local) =
                crate::metrics_http::bind(addr)
                    .await
                    .map_err(|source| ServerError::Bind {
                        addr: format!("{addr} (--metrics-listen)"),
                        source,
                    })?;
            Some((local, listener))
        }
        None => None,
    };
    let tls = tls_config(ops)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let namespaces = Arc::new(namespaces);
    let cluster = match &config.cluster {
        Some(cluster_config) => {
            let node_id = node_id::resolve(
                cluster_config.node_id.as_deref(),
                ops.snapshot_dir.as_deref(),
            )
            .map_err(|reason| ServerError::Config {
                field: "node_id",
                reason,
            })?;
            let cluster_metrics = Arc::new(ClusterMetrics::default());
            let cluster = Cluster::start(
                cluster_config.clone(),
                node_id,
                Arc::clone(&namespaces),
                Arc::clone(&cluster_metrics),
            )
            .await?;
            Some((cluster, cluster_metrics))
        }
        None => None,
    };
    let auth = Arc::new(auth);
    let limits = ServiceLimits {
        max_requests_per_step: config.max_requests_per_step,
        max_message_bytes: config.max_message_bytes,
        max_step_tokens: config.max_step_tokens,
        max_active_requests: config.max_active_requests,
    };
    Ok(BoundServer {
        listeners,
        tls,
        metrics_listener,
        service: LookaheadService::new(
            Arc::clone(&namespaces),
            limits,
            shutdown_rx,
            Arc::clone(&auth),
            Arc::clone(&metrics),
        ),
        namespaces,
        auth,
        metrics,
        shutdown,
        config: config.clone(),
        cluster,
    })
}

/// The TLS settings of the TCP listeners, with the certificate files read (an unreadable
/// file is an error naming it).
fn tls_config(ops: &crate::config::OpsConfig) -> Result<Option<ServerTlsConfig>, ServerError> {
    let Some((cert, key)) = &ops.tls_cert else {
        return Ok(None);
    };
    let read = |field: &'static str, path: &Path| {
        std::fs::read(path).map_err(|e| ServerError::Config {
            field,
            reason: format!("cannot read {}: {e}", path.display()),
        })
    };
    let identity = Identity::from_pem(read("tls_cert", cert)?, read("tls_key", key)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &ops.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read("tls_client_ca", ca)?));
    }
    Ok(Some(tls))
}

async fn bind_one(addr: &ListenAddr, unix_mode: u32) -> Result<Listener, ServerError> {
    let bind_error = |source| ServerError::Bind {
        addr: addr.to_string(),
        source,
    };
    match addr {
        ListenAddr::Tcp(hostport) => {
            let resolved = tokio::net::lookup_host(hostport.as_str())
                .await
                .map_err(bind_error)?
                .next()
                .ok_or_else(|| {
                    bind_error(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the host name resolves to no address",
                    ))
                })?;
            let incoming = TcpIncoming::bind(resolved).map_err(bind_error)?;
            let local = incoming.local_addr().map_err(bind_error)?;
            Ok(Listener::Tcp(local, incoming.with_nodelay(Some(true))))
        }
        ListenAddr::Unix(path) => {
            remove_stale_socket(path).map_err(bind_error)?;
            let listener = UnixListener::bind(path).map_err(bind_error)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(unix_mode))
                .map_err(bind_error)?;
            Ok(Listener::Unix(path.clone(), listener))
        }
    }
}

/// Removes a socket file left by a server that is gone; refuses to touch anything else.
fn remove_stale_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket",
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another server is listening on this socket",
        ));
    }
    std::fs::remove_file(path)
}

impl BoundServer {
    /// The address of the metrics endpoint, if any (port resolved).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(addr, _)| *addr)
    }

    /// The addresses being listened on, in the order given (TCP ports resolved).
    pub fn local_addrs(&self) -> Vec<BoundAddr> {
        self.listeners
            .iter()
            .map(|l| match l {
                Listener::Tcp(addr, _) => BoundAddr::Tcp(*addr),
                Listener::Unix(path, _) => BoundAddr::Unix(path.clone()),
            })
            .collect()
    }

    /// Serves until `signal` completes, then shuts down gracefully: health turns
    /// NOT_SERVING, listeners close, open streams end with UNAVAILABLE, and open calls get
    /// `shutdown_grace` to finish. Unix socket files are removed.
    pub async fn serve(self, signal: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
        let Self {
            listeners,
            tls,
            metrics_listener,
            service,
            namespaces,
            auth,
            metrics,
            shutdown,
            config,
            cluster,
        } = self;
        let mut background = JoinSet::new();
        background.spawn(
            Maintenance {
                namespaces: Arc::clone(&namespaces),
                metrics: Arc::clone(&metrics),
                auth: Arc::clone(&auth),
                ops: config.ops.clone(),
            }
            .run(shutdown.subscribe()),
        );
        if let Some((addr, listener)) = metrics_listener {
            tracing::info!(address = %addr, "metrics endpoint listening (GET /metrics)");
            let drafters: Arc<dyn DrafterStatsSource> = namespaces.clone();
            let cluster_metrics = cluster.as_ref().map(|(_, m)| m.as_ref());
            let registry = Arc::new(crate::metrics::registry(
                &metrics,
                cluster_metrics,
                drafters,
            ));
            background.spawn(crate::metrics_http::serve(
                listener,
                registry,
                shutdown.subscribe(),
            ));
        }
        if auth.enabled() {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(mut hup) => {
                    let auth = Arc::clone(&auth);
                    background.spawn(async move {
                        while hup.recv().await.is_some() {
                            auth.reload_logged("SIGHUP");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGHUP; the tokens file is still reloaded when it changes")
                }
            }
        }
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<LookaheadServer<LookaheadService>>()
            .await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        let lookahead = LookaheadServer::new(service)
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);

        let mut tasks = JoinSet::new();
        let mut sockets = Vec::new();
        for listener in listeners {
            let mut builder = Server::builder();
            if let (Listener::Tcp(addr, _), Some(tls)) = (&listener, &tls) {
                builder = builder
                    .tls_config(tls.clone())
                    .map_err(|source| ServerError::Serve {
                        addr: format!("{addr} (TLS settings)"),
                        source,
                    })?;
            }
            let router = builder
                .add_service(health_service.clone())
                .add_service(reflection_v1.clone())
                .add_service(reflection_v1alpha.clone())
                .add_service(lookahead.clone());
            let mut stop = shutdown.subscribe();
            let stopped = async move {
                // An error means the sender is gone, which also means stop.
                let _ = stop.wait_for(|stop| *stop).await;
            };
            match listener {
                Listener::Tcp(addr, incoming) => {
                    tracing::info!(address = %addr, tls = tls.is_some(), mutual_tls = config.ops.tls_client_ca.is_some(), "listening (tcp)");
                    tasks.spawn(async move {
                        router
                            .serve_with_incoming_shutdown(incoming, stopped)
                            .await
                            .map_err(|source| ServerError::Serve {
                                addr: addr.to_string(),
                                source,
                            })
                    });
                }
                Listener::Unix(path, listener) => {
                    tracing::info!(path = %path.display(), "listening (unix)");
                    sockets.push(path.clone());
                    // Stock gRPC clients send the socket path as :authority: see uds_authority.
                    let incoming = UnixListenerStream::new(listener).map_ok(AuthorityFix::new);
                    tasks.spawn(async move {
                        router
                            .serve_with_incoming_shutdown(incoming, stopped)
                            .await
                            .map_err(|source| ServerError::Serve {
                                addr: format!("unix:{}", path.display()),
                                source,
                            })
                    });
                }
            }
        }

        let mut failure: Option<ServerError> = None;
        tokio::select! {
            () = signal => tracing::info!("shutting down"),
            Some(ended) = tasks.join_next() => {
                failure = task_failure(ended);
                if let Some(e) = &failure {
                    tracing::error!(error = %e, "a listener failed; shutting down");
                }
            }
        }
        shutdown.send_replace(true);
        health
            .set_not_serving::<LookaheadServer<LookaheadService>>()
            .await;
        let drain = async {
            while let Some(ended) = tasks.join_next().await {
                if let Some(e) = task_failure(ended) {
                    tracing::error!(error = %e, "listener failed while shutting down");
                    failure.get_or_insert(e);
                }
            }
        };
        if tokio::time::timeout(config.shutdown_grace, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                grace_s = config.shutdown_grace.as_secs_f64(),
                "open calls did not finish within the shutdown grace; closing them"
            );
            tasks.abort_all();
        }
        background.abort_all();
        // The last batches go out before the final snapshots record the stream position.
        if let Some((cluster, _)) = cluster {
            cluster.shutdown().await;
        }
        if let Some(dir) = &config.ops.snapshot_dir {
            let written = snapshot_all(&namespaces, dir, &metrics).await;
            tracing::info!(files = written.len(), dir = %dir.display(), "final snapshots written");
        }
        for path in sockets {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove the socket file");
            }
        }
        tracing::info!("stopped");
        failure.map_or(Ok(()), Err)
    }
}

fn task_failure(
    ended: Result<Result<(), ServerError>, tokio::task::JoinError>,
) -> Option<ServerError> {
    match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(join) => Some(ServerError::Runtime(std::io::Error::other(format!(
            "a listener task ended abnormally: {join}"
        )))),
    }
}
