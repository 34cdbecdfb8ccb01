//! Background upkeep while serving: periodic snapshots, expiry of idle requests, and reloading
//! the tokens file when it changes. Snapshot bytes are made and written on blocking threads:
//! the async workers (and so the steps) never wait for the disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::auth::Auth;
use crate::config::OpsConfig;
use crate::metrics::ServerMetrics;
use crate::namespaces::Namespaces;
use crate::persistence::{encode_file, write_atomic};

/// What the upkeep task works on.
pub struct Maintenance {
    /// The server's namespaces.
    pub namespaces: Arc<Namespaces>,
    /// Server-wide counters.
    pub metrics: Arc<ServerMetrics>,
    /// The tokens table.
    pub auth: Arc<Auth>,
    /// Snapshot, expiry and auth settings.
    pub ops: OpsConfig,
}

/// How often the upkeep task wakes up.
fn tick(ops: &OpsConfig) -> Duration {
    let mut tick = Duration::from_secs(1);
    if let Some(ttl) = ops.request_ttl {
        tick = tick.min(ttl / 4);
    }
    if let Some(interval) = ops.snapshot_interval {
        tick = tick.min(interval);
    }
    tick.max(Duration::from_millis(20))
}

impl Maintenance {
    /// Runs until `stop` becomes true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(tick(&self.ops));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_snapshot = Instant::now();
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = ticker.tick() => {}
            }
            self.auth.reload_if_changed();
            if let Some(ttl) = self.ops.request_ttl {
                self.expire(ttl).await;
            }
            if let (Some(dir), Some(interval)) =
                (&self.ops.snapshot_dir, self.ops.snapshot_interval)
                && last_snapshot.elapsed() >= interval
            {
                snapshot_all(&self.namespaces, dir, &self.metrics).await;
                last_snapshot = Instant::now();
            }
        }
    }

    async fn expire(&self, ttl: Duration) {
        for ns in self.namespaces.all() {
            let task = tokio::task::spawn_blocking(move || (ns.expire_idle(ttl), ns));
            let Ok((expired, ns)) = task.await else {
                continue;
            };
            if expired > 0 {
                ns.metrics().expired(expired as u64);
                tracing::info!(namespace = %ns.name(), expired, ttl_s = ttl.as_secs_f64(), "idle requests ended (--request-ttl)");
            }
        }
    }
}

/// Writes the snapshot of every namespace to `dir`, one at a time, on blocking threads.
/// Failures are logged and counted; they never stop the server. Returns the files written.
pub async fn snapshot_all(
    namespaces: &Namespaces,
    dir: &Path,
    metrics: &ServerMetrics,
) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for ns in namespaces.all() {
        let dir = dir.to_path_buf();
        let started = Instant::now();
        let task = tokio::task::spawn_blocking(move || {
            let snapshot = ns.snapshot();
            let file = encode_file(&snapshot.bytes, snapshot.replicated_through);
            let outcome = write_atomic(&dir, ns.name(), &file);
            (ns, file.len(), outcome)
        });
        match task.await {
            Ok((ns, bytes, Ok(path))) => {
                ns.metrics().snapshot_written();
                tracing::debug!(namespace = %ns.name(), path = %path.display(), bytes, ms = started.elapsed().as_millis() as u64, "snapshot written");
                written.push(path);
            }
            Ok((ns, _, Err(e))) => {
                metrics.snapshot_failed();
                tracing::error!(namespace = %ns.name(), error = %e, "snapshot NOT written");
            }
            Err(e) => {
                metrics.snapshot_failed();
                tracing::error!(error = %e, "snapshot task failed");
            }
        }
    }
    written
}
