//! The metrics endpoint (`--metrics-listen`): `GET /metrics` (and `HEAD`) over HTTP/1.1.
//!
//! Connections are served by hyper with axum's router, so keep-alive, `HEAD`, pipelining and
//! malformed requests are handled by code built and tested for them; a client that does not
//! send its request head within [`HEADER_READ_TIMEOUT`] is disconnected, and at most
//! [`MAX_CONNECTIONS`] connections are open at once (more are closed on accept).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// The content type of the answer: the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Time a client has to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A keep-alive connection is closed (gracefully) after this long.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// Binds the metrics endpoint.
pub async fn bind(addr: &str) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// The routes: `/metrics` answers GET and HEAD; other paths 404, other methods 405.
fn router(registry: Arc<Registry>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move {
                // Encoding reads every drafter's counters: CPU work, off the async workers.
                let text = tokio::task::spawn_blocking(move || crate::metrics::encode(&registry))
                    .await
                    .unwrap_or_default();
                ([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text)
            }
        }),
    )
}

/// Serves `registry` on `listener` until `stop` becomes true.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    mut stop: watch::Receiver<bool>,
) {
    let app = router(registry);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(peer = %peer, "metrics endpoint: too many connections; closed");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = tokio::time::sleep(MAX_CONNECTION_AGE) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = outcome {
                tracing::debug!(peer = %peer, error = %e, "metrics endpoint: connection ended");
            }
            drop(slot);
        });
    }
}
