//! Prometheus metrics: the counters the service keeps (prometheus-client metric families) and
//! the drafters' own counters, read at scrape time by a collector. [`encode`] writes them in
//! the OpenMetrics text format, which Prometheus and other scrapers read; the HTTP endpoint is
//! [`crate::metrics_http`].
//!
//! This module knows nothing of the namespaces: the scrape-time drafter counters come through
//! [`DrafterStatsSource`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lookahead_core::Stats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the step latency histogram buckets.
pub const LATENCY_BOUNDS_S: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// The label of per-namespace series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    /// The namespace's name (names are `[A-Za-z0-9._-:/]`, nothing to escape).
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestErrorLabels {
    namespace: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallErrorLabels {
    method: String,
    code: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BOUNDS_S)
}

/// The counters of one namespace (handles into the server's metric families).
#[derive(Clone, Debug)]
pub struct NamespaceMetrics {
    namespace: String,
    step_latency: Histogram,
    request_errors: Family<RequestErrorLabels, Counter>,
    expired_requests: Counter,
    snapshots_written: Counter,
}

impl NamespaceMetrics {
    /// Records the time to answer one step.
    pub fn observe_step(&self, latency: Duration) {
        self.step_latency.observe(latency.as_secs_f64());
    }

    /// Counts one per-request error of a step.
    pub fn request_error(&self, code: &str) {
        self.request_errors
            .get_or_create(&RequestErrorLabels {
                namespace: self.namespace.clone(),
                code: code.to_string(),
            })
            .inc();
    }

    /// Counts requests ended by `--request-ttl`.
    pub fn expired(&self, requests: u64) {
        self.expired_requests.inc_by(requests);
    }

    /// Counts a snapshot written.
    pub fn snapshot_written(&self) {
        self.snapshots_written.inc();
    }
}

/// Every counter the server keeps; cheap to share (`Arc`).
#[derive(Debug)]
pub struct ServerMetrics {
    step_latency: Family<NamespaceLabel, Histogram, fn() -> Histogram>,
    request_errors: Family<RequestErrorLabels, Counter>,
    expired_requests: Family<NamespaceLabel, Counter>,
    snapshots_written: Family<NamespaceLabel, Counter>,
    call_errors: Family<CallErrorLabels, Counter>,
    snapshot_failures: Counter,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            step_latency: Family::new_with_constructor(latency_histogram),
            request_errors: Family::default(),
            expired_requests: Family::default(),
            snapshots_written: Family::default(),
            call_errors: Family::default(),
            snapshot_failures: Counter::default(),
        }
    }
}

impl ServerMetrics {
    /// The handles of namespace `name` (its series appear on the first scrape after this).
    pub fn namespace(&self, name: &str) -> NamespaceMetrics {
        let label = NamespaceLabel {
            namespace: name.to_string(),
        };
        NamespaceMetrics {
            namespace: name.to_string(),
            step_latency: self.step_latency.get_or_create_owned(&label),
            request_errors: self.request_errors.clone(),
            expired_requests: self.expired_requests.get_or_create_owned(&label),
            snapshots_written: self.snapshots_written.get_or_create_owned(&label),
        }
    }

    /// Counts a call of `method` that ended with status `code`.
    pub fn call_error(&self, method: &str, code: tonic::Code) {
        self.call_errors
            .get_or_create(&CallErrorLabels {
                method: method.to_string(),
                code: format!("{code:?}"),
            })
            .inc();
    }

    /// Counts a snapshot write that failed.
    pub fn snapshot_failed(&self) {
        self.snapshot_failures.inc();
    }

    /// Registers the service's families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "lookahead_step_latency_seconds",
            "Time to answer one step.",
            self.step_latency.clone(),
        );
        registry.register(
            "lookahead_request_errors",
            "Per-request errors of steps, by code.",
            self.request_errors.clone(),
        );
        registry.register(
            "lookahead_expired_requests",
            "Requests ended by --request-ttl.",
            self.expired_requests.clone(),
        );
        registry.register(
            "lookahead_snapshots_written",
            "Snapshot files written.",
            self.snapshots_written.clone(),
        );
        registry.register(
            "lookahead_call_errors",
            "Calls that ended with a non-OK gRPC status.",
            self.call_errors.clone(),
        );
        registry.register(
            "lookahead_snapshot_failures",
            "Snapshot writes that failed.",
            self.snapshot_failures.clone(),
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabels {
    namespace: String,
    reason: String,
}

/// Upper bounds (seconds) of the cluster's apply lag histogram: publish to apply.
pub const CLUSTER_LAG_BOUNDS_S: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// What a cluster connection has exchanged for one namespace so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    /// NATS is connected now.
    pub connected: bool,
    /// Batches of learnt texts NATS acknowledged.
    pub published_messages: u64,
    /// Batches of other nodes applied to the namespace's drafter.
    pub consumed_messages: u64,
    /// Tokens of those batches.
    pub consumed_tokens: u64,
    /// Group tokens of other nodes applied (samples of one prompt running elsewhere).
    pub group_applied_tokens: u64,
}

/// The counters of the cluster connection (`--cluster`).
#[derive(Debug)]
pub struct ClusterMetrics {
    connected: Gauge,
    connections: Counter,
    published_messages: Counter,
    published_tokens: Counter,
    dropped_messages: Counter,
    dropped_tokens: Counter,
    outgoing_bytes: Gauge,
    consumed_messages: Family<NamespaceLabel, Counter>,
    consumed_tokens: Family<NamespaceLabel, Counter>,
    skipped_messages: Family<SkipLabels, Counter>,
    lag_messages: Family<NamespaceLabel, Gauge>,
    lag_seconds: Family<NamespaceLabel, Gauge<f64, AtomicU64>>,
    applied_sequence: Family<NamespaceLabel, Gauge>,
    apply_lag: Histogram,
    group_published_messages: Counter,
    group_published_tokens: Counter,
    group_unsent_messages: Counter,
    group_applied_messages: Counter,
    group_applied_tokens: Counter,
    group_subscriptions: Gauge,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self {
            connected: Gauge::default(),
            connections: Counter::default(),
            published_messages: Counter::default(),
            published_tokens: Counter::default(),
            dropped_messages: Counter::default(),
            dropped_tokens: Counter::default(),
            outgoing_bytes: Gauge::default(),
            consumed_messages: Family::default(),
            consumed_tokens: Family::default(),
            skipped_messages: Family::default(),
            lag_messages: Family::default(),
            lag_seconds: Family::default(),
            applied_sequence: Family::default(),
            apply_lag: Histogram::new(CLUSTER_LAG_BOUNDS_S),
            group_published_messages: Counter::default(),
            group_published_tokens: Counter::default(),
            group_unsent_messages: Counter::default(),
            group_applied_messages: Counter::default(),
            group_applied_tokens: Counter::default(),
            group_subscriptions: Gauge::default(),
        }
    }
}

fn label(namespace: &str) -> NamespaceLabel {
    NamespaceLabel {
        namespace: namespace.to_string(),
    }
}

impl ClusterMetrics {
    /// What the connection has exchanged for `namespace` so far.
    pub fn counts(&self, namespace: &str) -> ClusterCounts {
        let l = label(namespace);
        ClusterCounts {
            connected: self.connected.get() != 0,
            published_messages: self.published_messages.get(),
            consumed_messages: self.consumed_messages.get_or_create(&l).get(),
            consumed_tokens: self.consumed_tokens.get_or_create(&l).get(),
            group_applied_tokens: self.group_applied_tokens.get(),
        }
    }

    /// Records whether NATS is connected now (a new connection is counted).
    pub fn set_connected(&self, connected: bool) {
        let before = self.connected.set(i64::from(connected));
        if connected && before == 0 {
            self.connections.inc();
        }
    }

    /// Counts a message NATS acknowledged.
    pub fn published(&self, tokens: u64) {
        self.published_messages.inc();
        self.published_tokens.inc_by(tokens);
    }

    /// Counts messages dropped from the full outgoing buffer.
    pub fn dropped(&self, messages: u64, tokens: u64) {
        self.dropped_messages.inc_by(messages);
        self.dropped_tokens.inc_by(tokens);
    }

    /// Records the bytes waiting in the outgoing buffer.
    pub fn set_outgoing_bytes(&self, bytes: usize) {
        self.outgoing_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts a message of another node applied to `namespace`, `lag` after it was made.
    pub fn consumed(&self, namespace: &str, tokens: u64, lag: Option<Duration>) {
        let l = label(namespace);
        self.consumed_messages.get_or_create(&l).inc();
        self.consumed_tokens.get_or_create(&l).inc_by(tokens);
        if let Some(lag) = lag {
            self.apply_lag.observe(lag.as_secs_f64());
        }
    }

    /// Counts a message skipped for `reason` (own, malformed, foreign, duplicate).
    pub fn skipped(&self, namespace: &str, reason: &str) {
        self.skipped_messages
            .get_or_create(&SkipLabels {
                namespace: namespace.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records how far `namespace` is behind the stream, and the last sequence applied.
    pub fn set_position(&self, namespace: &str, applied: u64, pending: u64, lag: Duration) {
        let l = label(namespace);
        self.applied_sequence
            .get_or_create(&l)
            .set(i64::try_from(applied).unwrap_or(i64::MAX));
        self.lag_messages
            .get_or_create(&l)
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.lag_seconds.get_or_create(&l).set(lag.as_secs_f64());
    }

    /// Counts a group message published (`sent`) or not (NATS was away).
    pub fn group_published(&self, sent: bool, tokens: u64) {
        if sent {
            self.group_published_messages.inc();
            self.group_published_tokens.inc_by(tokens);
        } else {
            self.group_unsent_messages.inc();
        }
    }

    /// Counts a group message of another node applied.
    pub fn group_applied(&self, tokens: u64) {
        self.group_applied_messages.inc();
        self.group_applied_tokens.inc_by(tokens);
    }

    /// Records the group subscriptions held.
    pub fn set_group_subscriptions(&self, subscriptions: usize) {
        self.group_subscriptions
            .set(i64::try_from(subscriptions).unwrap_or(i64::MAX));
    }

    /// Registers the cluster's families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "lookahead_cluster_connected",
            "1 while the NATS connection is up.",
            self.connected.clone(),
        );
        registry.register(
            "lookahead_cluster_connections",
            "NATS connections established (the first and every reconnection).",
            self.connections.clone(),
        );
        registry.register(
            "lookahead_cluster_published_messages",
            "Messages of learnt text acknowledged by JetStream.",
            self.published_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_published_tokens",
            "Tokens in the messages acknowledged by JetStream.",
            self.published_tokens.clone(),
        );
        registry.register(
            "lookahead_cluster_dropped_messages",
            "Outgoing messages dropped (oldest first) while NATS could not take them.",
            self.dropped_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_dropped_tokens",
            "Tokens in the dropped outgoing messages.",
            self.dropped_tokens.clone(),
        );
        registry.register(
            "lookahead_cluster_outgoing_bytes",
            "Bytes of messages waiting for NATS.",
            self.outgoing_bytes.clone(),
        );
        registry.register(
            "lookahead_cluster_consumed_messages",
            "Messages of other nodes applied.",
            self.consumed_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_consumed_tokens",
            "Tokens in the messages of other nodes applied.",
            self.consumed_tokens.clone(),
        );
        registry.register(
            "lookahead_cluster_skipped_messages",
            "Messages not applied, by reason (own, malformed, foreign, duplicate).",
            self.skipped_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_lag_messages",
            "Messages of the namespace's subject not applied yet.",
            self.lag_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_lag_seconds",
            "Age of the last message applied when more were pending (0 when caught up).",
            self.lag_seconds.clone(),
        );
        registry.register(
            "lookahead_cluster_applied_sequence",
            "Last stream sequence applied to the namespace.",
            self.applied_sequence.clone(),
        );
        registry.register(
            "lookahead_cluster_apply_lag_seconds",
            "Time from making a batch on one node to applying it on another.",
            self.apply_lag.clone(),
        );
        registry.register(
            "lookahead_cluster_group_published_messages",
            "Messages of in-flight group tokens published (core NATS).",
            self.group_published_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_group_published_tokens",
            "In-flight group tokens published.",
            self.group_published_tokens.clone(),
        );
        registry.register(
            "lookahead_cluster_group_unsent_messages",
            "Messages of in-flight group tokens not sent (NATS away; they are not kept).",
            self.group_unsent_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_group_applied_messages",
            "Messages of other nodes' in-flight group tokens applied.",
            self.group_applied_messages.clone(),
        );
        registry.register(
            "lookahead_cluster_group_applied_tokens",
            "Other nodes' in-flight group tokens applied.",
            self.group_applied_tokens.clone(),
        );
        registry.register(
            "lookahead_cluster_group_subscriptions",
            "Group subjects subscribed to (groups with an active request here).",
            self.group_subscriptions.clone(),
        );
    }
}

/// Where the scrape-time drafter counters come from (the server's namespaces).
pub trait DrafterStatsSource: fmt::Debug + Send + Sync + 'static {
    /// Every namespace's name and drafter counters, sorted by name.
    fn drafter_stats(&self) -> Vec<(String, Stats)>;
}

/// Reads the drafters' counters at each scrape.
#[derive(Debug)]
pub struct DrafterCollector(pub Arc<dyn DrafterStatsSource>);

/// A drafter counter or gauge: name (counters without `_total`), help, type and how it is
/// read from [`Stats`].
type StatSeries = (&'static str, &'static str, MetricType, fn(&Stats) -> u64);

const DRAFTER_SERIES: [StatSeries; 13] = [
    (
        "lookahead_active_requests",
        "Requests started and not ended.",
        MetricType::Gauge,
        |s| s.active_requests as u64,
    ),
    (
        "lookahead_memory_bytes",
        "Heap bytes held by the namespace's drafter.",
        MetricType::Gauge,
        |s| s.memory_bytes as u64,
    ),
    (
        "lookahead_memory_budget_bytes",
        "Memory budget of the namespace.",
        MetricType::Gauge,
        |s| s.memory_budget_bytes as u64,
    ),
    (
        "lookahead_trie_nodes",
        "Live nodes of the shared n-gram trie.",
        MetricType::Gauge,
        |s| s.trie_nodes as u64,
    ),
    (
        "lookahead_active_groups",
        "Groups with an active request (samples of one prompt, or a named group).",
        MetricType::Gauge,
        |s| s.active_groups as u64,
    ),
    (
        "lookahead_group_bytes",
        "Heap bytes of the groups' indexes.",
        MetricType::Gauge,
        |s| s.group_bytes as u64,
    ),
    (
        "lookahead_evicted_nodes",
        "Trie nodes evicted to stay under budget.",
        MetricType::Counter,
        |s| s.evicted_nodes,
    ),
    (
        "lookahead_tokens_ingested",
        "Tokens inserted into the shared trie.",
        MetricType::Counter,
        |s| s.tokens_ingested,
    ),
    (
        "lookahead_drafts",
        "Draft trees served.",
        MetricType::Counter,
        |s| s.drafts,
    ),
    (
        "lookahead_draft_nodes",
        "Nodes proposed in the draft trees served.",
        MetricType::Counter,
        |s| s.draft_nodes,
    ),
    (
        "lookahead_accepted_tokens",
        "Accepted draft tokens reported by engines.",
        MetricType::Counter,
        |s| s.accepted_reported,
    ),
    (
        "lookahead_accept_reports",
        "Accepted counts reported by engines.",
        MetricType::Counter,
        |s| s.steps_reported,
    ),
    (
        "lookahead_accepted_cross_replica_tokens",
        "Accepted draft tokens drafted from text only other replicas had written (a lower bound).",
        MetricType::Counter,
        |s| s.accepted_cross_replica,
    ),
];

impl Collector for DrafterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let stats = self.0.drafter_stats();
        for (name, help, kind, read) in DRAFTER_SERIES {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (namespace, s) in &stats {
                let label = NamespaceLabel {
                    namespace: namespace.clone(),
                };
                let series = family.encode_family(&label)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(read(s)).encode(series)?,
                    _ => ConstGauge::new(read(s)).encode(series)?,
                }
            }
        }
        let count = encoder.encode_descriptor(
            "lookahead_namespaces",
            "Namespaces that exist.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(stats.len() as u64).encode(count)
    }
}

/// The server's registry: the service's families, the cluster's (if any) and the drafters'
/// collector.
pub fn registry(
    server: &ServerMetrics,
    cluster: Option<&ClusterMetrics>,
    drafters: Arc<dyn DrafterStatsSource>,
) -> Registry {
    let mut registry = Registry::default();
    server.register(&mut registry);
    if let Some(cluster) = cluster {
        cluster.register(&mut registry);
    }
    registry.register_collector(Box::new(DrafterCollector(drafters)));
    registry
}

/// The registry in the OpenMetrics text format (ends with `# EOF`).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(8 << 10);
    // Writing to a String cannot fail; a collector error would leave a partial text, which
    // is still better than no answer.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed;

    impl DrafterStatsSource for Fixed {
        fn drafter_stats(&self) -> Vec<(String, Stats)> {
            let s = Stats {
                active_requests: 3,
                tokens_ingested: 7,
                ..Stats::default()
            };
            vec![("m/1".to_string(), s)]
        }
    }

    #[test]
    fn names_are_the_documented_ones() {
        let server = ServerMetrics::default();
        let ns = server.namespace("m/1");
        ns.observe_step(Duration::from_micros(70));
        ns.observe_step(Duration::from_secs(3));
        ns.request_error("INVALID_ARGUMENT");
        ns.expired(2);
        server.call_error("Step", tonic::Code::NotFound);
        let text = encode(&registry(&server, None, Arc::new(Fixed)));
        for line in [
            "lookahead_active_requests{namespace=\"m/1\"} 3",
            "lookahead_tokens_ingested_total{namespace=\"m/1\"} 7",
            "lookahead_step_latency_seconds_bucket{le=\"0.0001\",namespace=\"m/1\"} 1",
            "lookahead_step_latency_seconds_bucket{le=\"+Inf\",namespace=\"m/1\"} 2",
            "lookahead_step_latency_seconds_count{namespace=\"m/1\"} 2",
            "lookahead_request_errors_total{namespace=\"m/1\",code=\"INVALID_ARGUMENT\"} 1",
            "lookahead_expired_requests_total{namespace=\"m/1\"} 2",
            "lookahead_call_errors_total{method=\"Step\",code=\"NotFound\"} 1",
            "lookahead_snapshot_failures_total 0",
            "lookahead_namespaces 1",
            "# TYPE lookahead_evicted_nodes counter",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
