//! Prometheus metrics: counters kept by the service, the drafters' own counters read at scrape
//! time, and a tiny HTTP endpoint (`--metrics-listen`) that serves them as text format 0.0.4.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::namespaces::Namespaces;

/// Upper bounds (seconds) of the step latency histogram buckets.
pub const LATENCY_BOUNDS_S: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// A latency histogram with fixed buckets, updated without locks.
#[derive(Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is +Inf.
    buckets: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BOUNDS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BOUNDS_S.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = LATENCY_BOUNDS_S
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(
            out,
            "{name}_count{{{labels}}} {}",
            self.count.load(Ordering::Relaxed)
        );
    }
}

/// Counters of one namespace kept by the service.
#[derive(Default)]
pub struct NamespaceMetrics {
    /// Time to answer one step (checks, drafting, building the answer).
    pub step_latency: Histogram,
    /// Per-request errors by code name.
    request_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Requests ended by `--request-ttl`.
    pub expired_requests: AtomicU64,
    /// Snapshots written.
    pub snapshots_written: AtomicU64,
}

impl NamespaceMetrics {
    /// Steps observed by the latency histogram.
    pub fn step_latency_count(&self) -> u64 {
        self.step_latency.count.load(Ordering::Relaxed)
    }

    /// Counts one per-request error.
    pub fn request_error(&self, code: &'static str) {
        *self.request_errors.lock().entry(code).or_insert(0) += 1;
    }
}

/// Counters of the whole server.
#[derive(Default)]
pub struct ServerMetrics {
    /// Calls that ended with a non-OK gRPC status, by method and code.
    call_errors: Mutex<BTreeMap<(&'static str, String), u64>>,
    /// Snapshot writes that failed.
    pub snapshot_failures: AtomicU64,
}

impl ServerMetrics {
    /// Counts a call of `method` that ended with status `code`.
    pub fn call_error(&self, method: &'static str, code: tonic::Code) {
        let code = format!("{code:?}");
        *self.call_errors.lock().entry((method, code)).or_insert(0) += 1;
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics of the server in Prometheus text format.
pub fn render(namespaces: &Namespaces, server: &ServerMetrics) -> String {
    let mut out = String::with_capacity(8 << 10);
    let all = namespaces.all();
    let gauges: [(&str, &str, &str); 11] = [
        (
            "lookahead_active_requests",
            "gauge",
            "Requests started and not ended.",
        ),
        (
            "lookahead_memory_bytes",
            "gauge",
            "Heap bytes held by the namespace's drafter.",
        ),
        (
            "lookahead_memory_budget_bytes",
            "gauge",
            "Memory budget of the namespace.",
        ),
        (
            "lookahead_trie_nodes",
            "gauge",
            "Live nodes of the shared n-gram trie.",
        ),
        (
            "lookahead_evicted_nodes_total",
            "counter",
            "Trie nodes evicted to stay under budget.",
        ),
        (
            "lookahead_tokens_ingested_total",
            "counter",
            "Tokens inserted into the shared trie.",
        ),
        ("lookahead_drafts_total", "counter", "Draft trees served."),
        (
            "lookahead_draft_nodes_total",
            "counter",
            "Nodes proposed in the draft trees served.",
        ),
        (
            "lookahead_accepted_tokens_total",
            "counter",
            "Accepted draft tokens reported by engines.",
        ),
        (
            "lookahead_accept_reports_total",
            "counter",
            "Accepted counts reported by engines.",
        ),
        (
            "lookahead_expired_requests_total",
            "counter",
            "Requests ended by --request-ttl.",
        ),
    ];
    let stats: Vec<_> = all.iter().map(|ns| (ns, ns.stats())).collect();
    for (name, kind, help) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (ns, s) in &stats {
            let value = match name {
                "lookahead_active_requests" => s.active_requests as u64,
                "lookahead_memory_bytes" => s.memory_bytes as u64,
                "lookahead_memory_budget_bytes" => s.memory_budget_bytes as u64,
                "lookahead_trie_nodes" => s.trie_nodes as u64,
                "lookahead_evicted_nodes_total" => s.evicted_nodes,
                "lookahead_tokens_ingested_total" => s.tokens_ingested,
                "lookahead_drafts_total" => s.drafts,
                "lookahead_draft_nodes_total" => s.draft_nodes,
                "lookahead_accepted_tokens_total" => s.accepted_reported,
                "lookahead_accept_reports_total" => s.steps_reported,
                _ => ns.metrics().expired_requests.load(Ordering::Relaxed),
            };
            let _ = writeln!(out, "{name}{{namespace=\"{}\"}} {value}", escape(ns.name()));
        }
    }
    let _ = writeln!(
        out,
        "# HELP lookahead_snapshots_written_total Snapshot files written.\n# TYPE lookahead_snapshots_written_total counter"
    );
    for ns in &all {
        let _ = writeln!(
            out,
            "lookahead_snapshots_written_total{{namespace=\"{}\"}} {}",
            escape(ns.name()),
            ns.metrics().snapshots_written.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP lookahead_step_latency_seconds Time to answer one step.\n# TYPE lookahead_step_latency_seconds histogram"
    );
    for ns in &all {
        let labels = format!("namespace=\"{}\"", escape(ns.name()));
        ns.metrics()
            .step_latency
            .render(&mut out, "lookahead_step_latency_seconds", &labels);
    }
    let _ = writeln!(
        out,
        "# HELP lookahead_request_errors_total Per-request errors of steps, by code.\n# TYPE lookahead_request_errors_total counter"
    );
    for ns in &all {
        for (code, n) in ns.metrics().request_errors.lock().iter() {
            let _ = writeln!(
                out,
                "lookahead_request_errors_total{{namespace=\"{}\",code=\"{code}\"}} {n}",
                escape(ns.name())
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP lookahead_call_errors_total Calls that ended with a non-OK gRPC status.\n# TYPE lookahead_call_errors_total counter"
    );
    for ((method, code), n) in server.call_errors.lock().iter() {
        let _ = writeln!(
            out,
            "lookahead_call_errors_total{{method=\"{method}\",code=\"{code}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP lookahead_snapshot_failures_total Snapshot writes that failed.\n# TYPE lookahead_snapshot_failures_total counter\nlookahead_snapshot_failures_total {}",
        server.snapshot_failures.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP lookahead_namespaces Namespaces that exist.\n# TYPE lookahead_namespaces gauge\nlookahead_namespaces {}",
        all.len()
    );
    out
}

/// Serves `GET /metrics` on `listener` until the future is dropped. Anything else gets 404.
pub async fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    let render = std::sync::Arc::new(render);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = std::sync::Arc::clone(&render);
        tokio::spawn(async move {
            let answer = tokio::time::timeout(Duration::from_secs(5), answer(stream, &*render));
            if let Ok(Err(e)) = answer.await {
                tracing::debug!(peer = %peer, error = %e, "metrics endpoint: connection failed");
            }
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    render: &(dyn Fn() -> String + Send + Sync),
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 16 << 10 {
            break;
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next(), parts.next());
    let (status, body) = match (method, path) {
        (Some(b"GET"), Some(p)) if p == b"/metrics" || p.starts_with(b"/metrics?") => {
            ("200 OK", render())
        }
        _ => ("404 Not Found", "not found: GET /metrics\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Binds the metrics endpoint.
pub async fn bind(addr: &str) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}
