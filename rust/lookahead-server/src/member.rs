//! An embedded drafter as a member of a cluster: the server's cluster tasks ([`crate::cluster`])
//! run on a thread of their own beside a drafter that the engine steps in its own process
//! ([`crate::local`]).
//!
//! The engine drafts in process (no call on the step's path) and still learns what every other
//! member learns: its drafter records what it learns for the cluster, the publisher sends it to
//! NATS every `--cluster-batch-ms` and after steps, and the consumer applies the other
//! members' texts (servers' and other embedded drafters') to the same drafter. NATS away or
//! slow never blocks a step, as on a server.

use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::cluster::{Cluster, node_id};
use crate::config::{Cli, ClusterConfig, ServerConfig};
use crate::error::ServerError;
use crate::metrics::{ClusterCounts, ClusterMetrics};
use crate::namespaces::Namespaces;

/// Where an embedded drafter joins a cluster.
#[derive(Clone, Debug)]
pub struct MemberSettings {
    /// NATS server URLs (seeds), as the server's `--cluster`.
    pub servers: Vec<String>,
    /// The cluster's name, as `--cluster-name` (None: its default).
    pub name: Option<String>,
    /// The member's node id, as `--node-id` (None: a random one).
    pub node_id: Option<String>,
}

impl MemberSettings {
    /// The cluster connection's settings: the server's own defaults (its command line with
    /// only these flags), so that a member and a server of one cluster agree on the stream.
    fn cluster_config(&self) -> Result<ClusterConfig, ServerError> {
        let mut args = vec!["lookahead-server".to_string()];
        for url in &self.servers {
            args.extend(["--cluster".to_string(), url.clone()]);
        }
        for (flag, value) in [("--cluster-name", &self.name), ("--node-id", &self.node_id)] {
            if let Some(value) = value {
                args.extend([flag.to_string(), value.clone()]);
            }
        }
        let cli = <Cli as clap::Parser>::try_parse_from(args).map_err(|e| ServerError::Config {
            field: "cluster",
            // clap's message without its usage lines
            reason: e
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .to_string(),
        })?;
        let cluster = ServerConfig::try_from(cli)?
            .cluster
            .ok_or_else(|| ServerError::Config {
                field: "cluster",
                reason: "no NATS server URL given".into(),
            })?;
        cluster.validate()?;
        Ok(cluster)
    }
}

/// A running membership; leaving (drop) gives the last batches a second to reach NATS.
pub struct ClusterMember {
    node_id: String,
    namespace: String,
    metrics: Arc<ClusterMetrics>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMember")
            .field("node_id", &self.node_id)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl ClusterMember {
    /// Joins the cluster with the drafters of `namespaces` (one embedded drafter's, which
    /// record for it: [`lookahead_core::DrafterConfig::record_for_cluster`]), counting what
    /// `namespace` exchanges. Returns once the tasks run, without waiting for NATS (the
    /// drafter drafts meanwhile). Errors are bad settings and a thread or runtime that cannot
    /// start.
    pub fn join(
        namespaces: Arc<Namespaces>,
        namespace: &str,
        settings: &MemberSettings,
    ) -> Result<Self, ServerError> {
        let config = settings.cluster_config()?;
        let node_id = node_id::resolve(config.node_id.as_deref(), None).map_err(|reason| {
            ServerError::Config {
                field: "node_id",
                reason,
            }
        })?;
        let metrics = Arc::new(ClusterMetrics::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ServerError::Runtime)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::sync_channel(1);
        let thread = {
            let (node_id, metrics) = (node_id.clone(), Arc::clone(&metrics));
            std::thread::Builder::new()
                .name("lookahead-cluster".into())
                .spawn(move || {
                    runtime.block_on(async move {
                        match Cluster::start(config, node_id, namespaces, metrics).await {
                            Ok(cluster) => {
                                let _ = started_tx.send(Ok(()));
                                // A dropped sender (the member dropped) stops the tasks too.
                                let _ = stopped.await;
                                cluster.shutdown().await;
                            }
                            Err(e) => {
                                let _ = started_tx.send(Err(e));
                            }
                        }
                    });
                })
                .map_err(ServerError::Runtime)?
        };
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ServerError::Runtime(std::io::Error::other(
                    "the cluster thread stopped before it started",
                )));
            }
        }
        Ok(Self {
            node_id,
            namespace: namespace.to_string(),
            metrics,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// This member's node id in the cluster.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// What the member has exchanged so far.
    pub fn counts(&self) -> ClusterCounts {
        self.metrics.counts(&self.namespace)
    }
}

impl Drop for ClusterMember {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(servers: &[&str], name: &str, node_id: Option<&str>) -> MemberSettings {
        MemberSettings {
            servers: servers.iter().map(|s| (*s).to_string()).collect(),
            name: Some(name.to_string()),
            node_id: node_id.map(str::to_string),
        }
    }

    #[test]
    fn a_member_takes_the_servers_defaults_for_what_it_does_not_set() {
        let config = settings(&["nats://127.0.0.1:4222"], "demo", Some("r0"))
            .cluster_config()
            .expect("valid settings");
        let cli = <Cli as clap::Parser>::try_parse_from([
            "lookahead-server",
            "--cluster",
            "nats://127.0.0.1:4222",
            "--cluster-name",
            "demo",
            "--node-id",
            "r0",
        ])
        .expect("a valid command line");
        let server = ServerConfig::try_from(cli).expect("valid").cluster;
        assert_eq!(Some(config), server);
    }

    #[test]
    fn bad_settings_name_their_field() {
        for (s, field) in [
            (settings(&["http://h:1"], "demo", None), "cluster"),
            (settings(&[], "demo", None), "cluster"),
            (settings(&["nats://h:1"], "a b", None), "cluster_name"),
            (settings(&["nats://h:1"], "demo", Some("x.y")), "node_id"),
        ] {
            match s.cluster_config() {
                Err(ServerError::Config { field: got, .. }) => assert_eq!(got, field, "{s:?}"),
                other => panic!("{s:?}: expected a Config error, got {other:?}"),
            }
        }
    }
}
