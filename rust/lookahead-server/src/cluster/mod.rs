//! The cluster (`--cluster nats://HOST:PORT`): servers that learn from each other through NATS
//! JetStream (docs/cluster.md).
//!
//! What each namespace's drafter learns (ended requests, ingested documents) is recorded by
//! the core, taken every `--cluster-batch-ms` and published in batches to the namespace's
//! subject of the cluster's stream ([`publisher`]); every server consumes the subjects of the
//! namespaces it serves and applies the other servers' batches once each ([`consumer`]).
//! Faults stay here: NATS unreachable or lost never blocks or fails a step; the client
//! reconnects with backoff, outgoing batches wait in a bounded buffer, and consumers resume
//! from their namespace's last applied sequence.

mod connection;
mod consumer;
pub mod convert;
mod groups;
pub mod node_id;
pub mod outbox;
mod publisher;
pub mod wire;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::config::ClusterConfig;
use crate::error::ServerError;
use crate::metrics::ClusterMetrics;
use crate::namespaces::Namespaces;

/// What the cluster's tasks share.
pub struct Shared {
    config: ClusterConfig,
    names: wire::Names,
    node_id: String,
    namespaces: Arc<Namespaces>,
    metrics: Arc<ClusterMetrics>,
    connected: watch::Receiver<bool>,
}

impl Shared {
    fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }
}

/// How often new namespaces are looked for (to start their consumers).
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
/// Time a graceful shutdown gives the last batches to reach NATS.
const FINAL_PUBLISH_GRACE: Duration = Duration::from_secs(1);

/// The running cluster connection.
pub struct Cluster {
    stop: watch::Sender<bool>,
    sender: tokio::task::JoinHandle<()>,
    tasks: JoinSet<()>,
}

impl Cluster {
    /// Connects (without waiting for NATS: the server serves meanwhile) and starts the
    /// publisher, the connection monitor and a consumer per namespace, present and future.
    /// Errors are bad settings (unreadable credentials...). Must run inside a Tokio runtime.
    pub async fn start(
        config: ClusterConfig,
        node_id: String,
        namespaces: Arc<Namespaces>,
        metrics: Arc<ClusterMetrics>,
    ) -> Result<Self, ServerError> {
        let client = connection::connect(&config, &node_id).await?;
        let js = async_nats::jetstream::new(client.clone());
        let (connected_tx, connected) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let names = wire::Names::new(&config.name);
        tracing::info!(
            servers = %config.servers.join(","),
            cluster = %config.name,
            node_id = %node_id,
            stream = %names.stream(),
            "cluster: joining"
        );
        let shared = Arc::new(Shared {
            names,
            node_id,
            namespaces,
            metrics: Arc::clone(&metrics),
            connected: connected.clone(),
            config,
        });
        let mut tasks = JoinSet::new();
        let (groups_wake, publish_wake) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        tasks.spawn(fan_out(
            shared.namespaces.stepped(),
            [Arc::clone(&groups_wake), Arc::clone(&publish_wake)],
        ));
        tasks.spawn(groups::run(
            Arc::clone(&shared),
            client.clone(),
            groups_wake,
            stop_rx.clone(),
        ));
        tasks.spawn(connection::monitor(
            client,
            connected_tx,
            metrics,
            shared.config.servers.join(","),
        ));
        // Each connection (the first and every reconnection) moves the epoch once the
        // stream is known to exist: consumers (re)start on it.
        let (epoch_tx, epoch) = watch::channel(0u64);
        tasks.spawn(ready_epochs(
            Arc::clone(&shared),
            js.clone(),
            epoch_tx,
            stop_rx.clone(),
        ));
        let queue = Arc::new(publisher::Queue::new(shared.config.buffer_bytes));
        tasks.spawn(publisher::collect(
            Arc::clone(&shared),
            Arc::clone(&queue),
            publish_wake,
            stop_rx.clone(),
        ));
        let sender = tokio::spawn(publisher::send(
            Arc::clone(&shared),
            queue,
            js.clone(),
            connected,
            stop_rx.clone(),
        ));
        tasks.spawn(discover(shared, js, epoch, stop_rx));
        Ok(Self {
            stop,
            sender,
            tasks,
        })
    }

    /// Stops the tasks; the batches still queued get [`FINAL_PUBLISH_GRACE`] to reach NATS.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if tokio::time::timeout(FINAL_PUBLISH_GRACE, &mut self.sender)
            .await
            .is_err()
        {
            tracing::warn!("cluster: batches still queued at shutdown were not published");
            self.sender.abort();
        }
        self.tasks.abort_all();
    }
}

/// Hands every step's wake-up to each task that acts on steps (one `Notify` wakes one waiter).
async fn fan_out(stepped: Arc<Notify>, wakes: [Arc<Notify>; 2]) {
    loop {
        stepped.notified().await;
        for wake in &wakes {
            wake.notify_one();
        }
    }
}

/// Moves the epoch at each new connection, once the stream exists (created if needed).
async fn ready_epochs(
    shared: Arc<Shared>,
    js: async_nats::jetstream::Context,
    epoch: watch::Sender<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connected = shared.connected.clone();
    let mut failures = 0usize;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = connected.wait_for(|c| *c) => if changed.is_err() { return },
        }
        match connection::ensure_stream(&js, &shared.names, &shared.config).await {
            Ok(_) => {
                failures = 0;
                epoch.send_modify(|e| *e += 1);
                // Wait for this connection to end before the next round.
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    changed = connected.wait_for(|c| !*c) => if changed.is_err() { return },
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %e, "cluster: cannot set up the stream; retrying with backoff");
                }
                tokio::time::sleep(connection::reconnect_delay(failures)).await;
            }
        }
    }
}

/// Starts a consumer for every namespace, as namespaces appear.
async fn discover(
    shared: Arc<Shared>,
    js: async_nats::jetstream::Context,
    epoch: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut started: HashSet<String> = HashSet::new();
    let mut consumers = JoinSet::new();
    let mut ticker = tokio::time::interval(DISCOVERY_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = ticker.tick() => {}
        }
        for ns in shared.namespaces.all() {
            if started.insert(ns.name().to_string()) {
                consumers.spawn(consumer::run(
                    Arc::clone(&shared),
                    js.clone(),
                    ns,
                    epoch.clone(),
                    stop.clone(),
                ));
            }
        }
    }
}
