//! Namespaces: one [`Drafter`] per namespace, created on first use up to a limit, each with
//! a background thread that applies the shared-trie inserts a step left queued.
//!
//! Ordering guarantee: a step sees every insert of the steps of its namespace that were
//! answered before it began. Inserts of a step are queued by [`Drafter::step_deferred`] and
//! applied by the namespace's flush thread right after the answer was produced; a step that
//! begins while a flush is queued or running waits for it (see [`Namespace::step`]). The one
//! exception: while a snapshot is being encoded, steps do not wait (they would stall behind the
//! snapshot) and see the inserts of earlier steps only once it is done.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;

use lookahead_core::{
    ConfigError, DraftError, Drafted, Drafter, DrafterConfig, Stats, StepCost, StepItem,
};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::metrics::{DrafterStatsSource, NamespaceMetrics, ServerMetrics};

/// The namespace used when a call names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The longest namespace name accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

/// Why a namespace could not be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NamespaceError {
    /// The name has characters outside `[A-Za-z0-9._-:/]` or is too long.
    #[error(
        "namespace {name:?} is invalid: use 1 to {MAX_NAMESPACE_LEN} bytes of letters, digits and \"._-:/\""
    )]
    InvalidName {
        /// The name as given.
        name: String,
    },
    /// Creating it would exceed `--max-namespaces`.
    #[error(
        "namespace {name:?} cannot be created: the server holds {limit} namespaces already (--max-namespaces)"
    )]
    LimitReached {
        /// The name as given.
        name: String,
        /// The limit.
        limit: usize,
    },
    /// It does not exist (calls that need existing data do not create it).
    #[error("namespace {name:?} does not exist")]
    NotFound {
        /// The name as given.
        name: String,
    },
    /// The core refused the drafter settings.
    #[error("namespace {name:?} cannot be created: {source}")]
    Config {
        /// The name as given.
        name: String,
        /// The core's error.
        #[source]
        source: ConfigError,
    },
}

/// Resolves the name a call gave: empty means [`DEFAULT_NAMESPACE`]; others must be 1 to
/// [`MAX_NAMESPACE_LEN`] bytes of `[A-Za-z0-9._-:/]`.
pub fn resolve_name(name: &str) -> Result<&str, NamespaceError> {
    if name.is_empty() {
        return Ok(DEFAULT_NAMESPACE);
    }
    let valid_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/');
    if name.len() > MAX_NAMESPACE_LEN || !name.chars().all(valid_char) {
        return Err(NamespaceError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(name)
}

/// One namespace: its drafter and the thread that applies its deferred inserts.
pub struct Namespace {
    name: String,
    drafter: Arc<Drafter>,
    flush: FlushState,
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    metrics: NamespaceMetrics,
    /// The last cluster stream sequence applied (0: none). Held while a message is applied
    /// and while a snapshot is encoded, so that a snapshot and its sequence agree.
    replicated: Mutex<u64>,
    /// Notified after every step (the cluster publishes group tokens right away).
    stepped: Arc<Notify>,
}

/// A namespace's learnt state as snapshot bytes, with the cluster stream sequence it includes.
pub struct NamespaceSnapshot {
    /// The core's snapshot.
    pub bytes: Vec<u8>,
    /// The last stream sequence applied before it was taken (0: none).
    pub replicated_through: u64,
}

/// What the flush thread and the steps share.
#[derive(Clone)]
struct FlushState {
    /// Held while inserts are applied; a step takes it to wait for a running flush.
    gate: Arc<Mutex<()>>,
    /// Inserts are queued in the drafter and not yet applied.
    pending: Arc<AtomicBool>,
    /// A snapshot is being encoded (it holds `gate` and the trie's read lock): steps do not
    /// wait for queued inserts meanwhile, which would stall them behind the snapshot.
    snapshotting: Arc<AtomicBool>,
}

impl FlushState {
    /// Applies the queued inserts, if any; waits for a flush in progress.
    fn settle(&self, drafter: &Drafter) {
        let _gate = self.gate.lock();
        if self.pending.swap(false, Ordering::AcqRel) {
            drafter.flush_inserts();
        }
    }

    /// [`settle`](Self::settle), unless a snapshot is being encoded: then the queued inserts
    /// stay queued (they are applied once it is done) and the caller goes on at once.
    fn settle_unless_snapshotting(&self, drafter: &Drafter) {
        loop {
            if self.snapshotting.load(Ordering::Acquire) {
                return;
            }
            if let Some(_gate) = self.gate.try_lock_for(std::time::Duration::from_millis(1)) {
                if self.pending.swap(false, Ordering::AcqRel) {
                    drafter.flush_inserts();
                }
                return;
            }
        }
    }
}

impl Namespace {
    fn new(
        name: &str,
        config: DrafterConfig,
        metrics: NamespaceMetrics,
        stepped: Arc<Notify>,
    ) -> Result<Self, NamespaceError> {
        let drafter = Drafter::new(config).map_err(|source| NamespaceError::Config {
            name: name.to_string(),
            source,
        })?;
        Ok(Self::with_drafter(name, drafter, metrics, 0, stepped))
    }

    /// A namespace over an existing drafter (one restored from a snapshot that included the
    /// cluster stream up to `replicated_through`).
    fn with_drafter(
        name: &str,
        drafter: Drafter,
        metrics: NamespaceMetrics,
        replicated_through: u64,
        stepped: Arc<Notify>,
    ) -> Self {
        let drafter = Arc::new(drafter);
        let flush = FlushState {
            gate: Arc::new(Mutex::new(())),
            pending: Arc::new(AtomicBool::new(false)),
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        // Capacity 1: wake-ups coalesce while a flush is queued.
        let (wake, wakes) = mpsc::sync_channel::<()>(1);
        let thread = {
            let drafter = Arc::clone(&drafter);
            let flush = flush.clone();
            std::thread::Builder::new()
                .name(format!("lookahead-flush-{name}"))
                .spawn(move || {
                    while wakes.recv().is_ok() {
                        flush.settle(&drafter);
                    }
                })
        };
        // Without the thread the namespace still works: steps flush inline (see `step`).
        let thread = match thread {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(namespace = name, error = %e, "no flush thread; inserts will be applied inline");
                None
            }
        };
        let wake = thread.as_ref().map(|_| wake);
        Self {
            name: name.to_string(),
            drafter,
            flush,
            wake,
            thread,
            metrics,
            replicated: Mutex::new(replicated_through),
            stepped,
        }
    }

    /// The namespace's counters for the metrics endpoint.
    pub fn metrics(&self) -> &NamespaceMetrics {
        &self.metrics
    }

    /// The learnt state as snapshot bytes (after the inserts of every answered step), with
    /// the cluster stream sequence it includes. Takes only read locks of the drafter: steps go
    /// on meanwhile (messages of the cluster wait). CPU work: call it off the async workers.
    pub fn snapshot(&self) -> NamespaceSnapshot {
        self.flush.settle(&self.drafter);
        // Holding the gate keeps the flush thread from queueing a trie writer, which would
        // block the steps' read sections until the snapshot is done.
        self.flush.snapshotting.store(true, Ordering::Release);
        let snapshot = {
            let _gate = self.flush.gate.lock();
            let replicated = self.replicated.lock();
            NamespaceSnapshot {
                bytes: self.drafter.snapshot(),
                replicated_through: *replicated,
            }
        };
        self.flush.snapshotting.store(false, Ordering::Release);
        snapshot
    }

    /// The last cluster stream sequence applied (0: none).
    pub fn replicated_through(&self) -> u64 {
        *self.replicated.lock()
    }

    /// Forgets the stream position (the stream it referred to is gone): the next message
    /// applied may have any sequence.
    pub fn restart_replication(&self) {
        *self.replicated.lock() = 0;
    }

    /// Applies stream message `seq` with `apply`, unless a message at or after `seq` was
    /// applied already (a redelivery: returns `None`). A snapshot never sees half of it.
    pub fn apply_replicated<T>(&self, seq: u64, apply: impl FnOnce(&Drafter) -> T) -> Option<T> {
        let mut replicated = self.replicated.lock();
        if seq <= *replicated {
            return None;
        }
        let outcome = apply(&self.drafter);
        *replicated = seq;
        Some(outcome)
    }

    /// Ends the requests no step touched for `max_idle`; returns how many.
    pub fn expire_idle(&self, max_idle: std::time::Duration) -> usize {
        self.drafter.expire_idle(max_idle)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's drafter.
    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }

    /// One engine step: waits for the inserts of earlier steps, drafts, and hands this step's
    /// inserts to the flush thread (they are applied after the answer is produced).
    /// While a snapshot is being encoded, a step does not wait for the inserts of earlier
    /// steps (they are applied right after the snapshot).
    pub fn step(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<Drafted, DraftError>> {
        self.flush.settle_unless_snapshotting(&self.drafter);
        let results = self.drafter.step_deferred(items, cost);
        self.flush.pending.store(true, Ordering::Release);
        match &self.wake {
            Some(wake) => match wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    self.flush.settle_unless_snapshotting(&self.drafter);
                }
            },
            None => self.flush.settle_unless_snapshotting(&self.drafter),
        }
        self.stepped.notify_one();
        results
    }

    /// One engine step with its inserts applied before it returns (after those of earlier
    /// steps): for steps that bring too few tokens to be worth handing to the thread.
    pub fn step_inline(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<Drafted, DraftError>> {
        let results = self.settled().step_drafted(items, cost);
        self.stepped.notify_one();
        results
    }

    /// Ends a request if it is active (used to reset a request before restarting it).
    /// Returns whether it was active.
    pub fn end_if_active(&self, request_id: &str) -> Result<bool, DraftError> {
        self.flush.settle_unless_snapshotting(&self.drafter);
        match self.drafter.end(request_id) {
            Ok(()) => Ok(true),
            Err(DraftError::UnknownRequest { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Bulk-loads one finished text into the shared statistics.
    pub fn ingest(&self, tokens: &[u32]) -> Result<(), DraftError> {
        self.drafter.ingest(tokens)
    }

    /// The drafter, after the inserts of every answered step: for calls between steps
    /// (start, append, draft, end) that must see what the steps before them learnt.
    pub fn settled(&self) -> &Drafter {
        self.flush.settle(&self.drafter);
        &self.drafter
    }

    /// The drafter's counters, after the inserts of every answered step.
    pub fn stats(&self) -> Stats {
        self.flush.settle(&self.drafter);
        self.drafter.stats()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Closing the channel ends the flush thread once its current flush is done.
        self.wake = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(namespace = %self.name, "the flush thread panicked");
        }
    }
}

/// Every namespace of the server.
pub struct Namespaces {
    map: RwLock<HashMap<String, Arc<Namespace>>>,
    limit: usize,
    config: DrafterConfig,
    metrics: Arc<ServerMetrics>,
    stepped: Arc<Notify>,
}

impl std::fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespaces")
            .field("names", &self.names())
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Namespaces {
    /// An empty set that creates up to `limit` namespaces, each with `config` (which holds
    /// the namespace's share of the memory budget); their counters go to `metrics`.
    pub fn new(config: DrafterConfig, limit: usize, metrics: Arc<ServerMetrics>) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            limit,
            config,
            metrics,
            stepped: Arc::new(Notify::new()),
        }
    }

    /// Notified after every step of every namespace.
    pub fn stepped(&self) -> Arc<Notify> {
        Arc::clone(&self.stepped)
    }

    /// The drafter settings of every namespace.
    pub fn drafter_config(&self) -> &DrafterConfig {
        &self.config
    }

    /// The most namespaces created.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The namespace called `name` (empty: the default one) if it exists.
    pub fn get(&self, name: &str) -> Result<Arc<Namespace>, NamespaceError> {
        let name = resolve_name(name)?;
        self.map
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| NamespaceError::NotFound {
                name: name.to_string(),
            })
    }

    /// The namespace called `name` (empty: the default one), created if needed.
    pub fn get_or_create(&self, name: &str) -> Result<Arc<Namespace>, NamespaceError> {
        let name = resolve_name(name)?;
        if let Some(ns) = self.map.read().get(name) {
            return Ok(Arc::clone(ns));
        }
        let mut map = self.map.write();
        if let Some(ns) = map.get(name) {
            return Ok(Arc::clone(ns));
        }
        if map.len() >= self.limit {
            return Err(NamespaceError::LimitReached {
                name: name.to_string(),
                limit: self.limit,
            });
        }
        let ns = Arc::new(Namespace::new(
            name,
            self.config.clone(),
            self.metrics.namespace(name),
            Arc::clone(&self.stepped),
        )?);
        map.insert(name.to_string(), Arc::clone(&ns));
        tracing::info!(namespace = name, count = map.len(), "namespace created");
        Ok(ns)
    }

    /// Adds namespaces restored from snapshots (before serving): (name, drafter, last cluster
    /// stream sequence included). Names already present and those past the limit are skipped
    /// with a warning.
    pub fn restore(&self, restored: impl IntoIterator<Item = (String, Drafter, u64)>) {
        let mut map = self.map.write();
        for (name, drafter, replicated_through) in restored {
            if map.contains_key(&name) || map.len() >= self.limit {
                tracing::warn!(namespace = %name, "restored namespace skipped (duplicate or over --max-namespaces)");
                continue;
            }
            let metrics = self.metrics.namespace(&name);
            let ns = Arc::new(Namespace::with_drafter(
                &name,
                drafter,
                metrics,
                replicated_through,
                Arc::clone(&self.stepped),
            ));
            map.insert(name, ns);
        }
    }

    /// Every namespace that exists, sorted by name.
    pub fn all(&self) -> Vec<Arc<Namespace>> {
        let mut all: Vec<Arc<Namespace>> = self.map.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The names of the namespaces that exist, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.map.read().keys().cloned().collect();
        names.sort();
        names
    }
}

impl DrafterStatsSource for Namespaces {
    fn drafter_stats(&self) -> Vec<(String, Stats)> {
        self.all()
            .iter()
            .map(|ns| (ns.name().to_string(), ns.stats()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item<'a>(
        id: &'a str,
        prompt: Option<&'a [u32]>,
        new: &'a [u32],
        budget: usize,
    ) -> StepItem<'a> {
        StepItem {
            request_id: id,
            prompt,
            new_tokens: new,
            budget,
            ..StepItem::default()
        }
    }

    #[test]
    fn names_resolve() {
        assert_eq!(resolve_name(""), Ok(DEFAULT_NAMESPACE));
        assert_eq!(resolve_name("qwen2.5/7b:v1"), Ok("qwen2.5/7b:v1"));
        assert!(resolve_name("has space").is_err());
        assert!(resolve_name(&"x".repeat(MAX_NAMESPACE_LEN + 1)).is_err());
    }

    #[test]
    fn namespaces_are_created_up_to_the_limit_and_kept_apart() {
        let set = Namespaces::new(DrafterConfig::default(), 2, Arc::default());
        assert!(matches!(set.get("a"), Err(NamespaceError::NotFound { .. })));
        let a = set.get_or_create("a").expect("created");
        set.get_or_create("").expect("default created");
        assert!(Arc::ptr_eq(&a, &set.get_or_create("a").expect("same")));
        assert!(matches!(
            set.get_or_create("c"),
            Err(NamespaceError::LimitReached { limit: 2, .. })
        ));
        assert_eq!(set.names(), vec!["a".to_string(), "default".to_string()]);

        let prompt = [1, 2, 3, 1, 2];
        let results = a.step(&[item("r", Some(&prompt), &[], 4)], None);
        assert!(results[0].is_ok());
        // The other namespace does not know the request.
        let other = set.get("default").expect("exists");
        let results = other.step(&[item("r", None, &[3], 4)], None);
        assert!(matches!(results[0], Err(DraftError::UnknownRequest { .. })));
        assert_eq!(a.stats().active_requests, 1);
        assert_eq!(other.stats().active_requests, 0);
    }

    #[test]
    fn end_if_active_tells_whether_the_request_existed() {
        let set = Namespaces::new(DrafterConfig::default(), 1, Arc::default());
        let ns = set.get_or_create("x").expect("created");
        assert_eq!(ns.end_if_active("r"), Ok(false));
        assert!(ns.step(&[item("r", Some(&[5, 6]), &[], 0)], None)[0].is_ok());
        assert_eq!(ns.end_if_active("r"), Ok(true));
        assert_eq!(ns.stats().active_requests, 0);
    }
}
