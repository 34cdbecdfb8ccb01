//! [`Drafter`]: the thread-safe front of the core.
//!
//! Locking: the shared trie sits behind a read-write lock (drafts read, inserts write); each
//! request and each group behind its own mutex; the request and group tables behind mutexes
//! held only to look up, add or remove entries. Lock order, where several are held: request
//! table, trie, remote texts, a request, group table, a group, sibling responses, outboxes.
//! Inserts of a whole step are applied after its drafts, in one write section.
//!
//! The front (construction, the step calls, ingest, flushes, counters) is here; the rest of
//! the impl by concern: [`requests`] (lifecycle: checks, starts, tokens applied once, ends),
//! [`step`] (one engine step, sizing), [`memory`] (accounting), [`cluster`] (what other
//! drafters send and get), [`persist`] (snapshots).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::Token;
use crate::answer::Drafted;
use crate::calibration::Calibration;
use crate::cluster::{GroupUpdate, LearnedText, Outboxes};
use crate::config::{ConfigError, DrafterConfig};
use crate::draft::{DraftParams, DraftSources, build};
use crate::error::DraftError;
use crate::group::{Group, member_key};
use crate::provenance::{Origin, ReplicaStats, Replicas};
use crate::realise::temperature_band;
use crate::remote_text::RemoteTexts;
use crate::request::{LastDraft, RequestState, TrieCursor};
use crate::siblings::SiblingResponses;
use crate::sizing::{self, CostCurve, Layout, StepCost};
use crate::snapshot::{Reader, SNAPSHOT_VERSION, SnapshotError, Writer, frame, unframe};
use crate::suffix_automaton::SuffixAutomaton;
use crate::tree::DraftTree;
use crate::trie::{BYTES_PER_NODE_BOUND, NgramTrie};
use crate::types::CalibrationCounts;
use crate::types::{GroupKey, MAX_GROUP_NAME_BYTES};
use accounting::MemoryAccount;

mod accounting;
mod cluster;
mod memory;
mod persist;
mod requests;
mod step;

type SharedRequest = Arc<Mutex<RequestState>>;
type SharedGroup = Arc<Mutex<Group>>;

/// Tokens ingested per write section of the trie.
const INGEST_CHUNK: usize = 4096;

/// One request's part of an engine step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepItem<'a> {
    /// The engine's id of the request.
    pub request_id: &'a str,
    /// `Some` starts the request with this prompt (it must not be active).
    pub prompt: Option<&'a [Token]>,
    /// Tokens appended since the last step.
    pub new_tokens: &'a [Token],
    /// Feedback: draft tokens accepted at the last step.
    pub accepted_last: Option<u32>,
    /// The request ends after `new_tokens`; its tree is empty.
    pub finished: bool,
    /// Draft nodes wanted (root excluded), the cap of a sized shape; 0 gives an empty tree.
    pub budget: usize,
    /// The draft's shape: a tree or a chain, of `budget` nodes or sized.
    pub shape: DraftShape,
    /// The request's sampling temperature (0: greedy); drafts are worth less when it is high.
    pub temperature: f32,
    /// The number of tokens (prompt included) the request holds before `new_tokens`, as the
    /// engine knows it. With it a step sent twice is harmless: tokens the request already
    /// holds are checked and skipped, and a step that would leave a gap is refused
    /// ([`DraftError::OffsetGap`]). With a prompt it must be the prompt's length, and a start
    /// of an active request holding that prompt goes on from it. `None`: the tokens are
    /// appended.
    pub offset: Option<usize>,
    /// The group the request belongs to, read when it starts (with `prompt`). `None` or empty:
    /// the requests with the same prompt. At most [`MAX_GROUP_NAME_BYTES`] bytes.
    pub group: Option<&'a str>,
    /// The engine replica sending the step ([`Drafter::origin_of`] its name), read when the
    /// request starts: the writer of its text, and whose text its drafts are told apart from.
    pub origin: Origin,
}

/// The shape of a request's draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftShape {
    /// A tree of at most `budget` nodes.
    #[default]
    Tree,
    /// The best path, at most `budget` tokens.
    Chain,
    /// A tree of zero up to `budget` nodes, chosen against the step's cost.
    SizedTree,
    /// A chain of zero up to `budget` tokens, chosen against the step's cost.
    SizedChain,
}

impl DraftShape {
    /// The shape numbered as the proto's `DraftShape` (0 to 3), `None` for another number.
    pub fn from_number(number: i64) -> Option<Self> {
        match number {
            0 => Some(Self::Tree),
            1 => Some(Self::Chain),
            2 => Some(Self::SizedTree),
            3 => Some(Self::SizedChain),
            _ => None,
        }
    }

    /// Whether every node has at most one child.
    pub fn is_chain(self) -> bool {
        matches!(self, Self::Chain | Self::SizedChain)
    }

    /// Whether the length is chosen against the step's cost.
    pub fn is_sized(self) -> bool {
        matches!(self, Self::SizedTree | Self::SizedChain)
    }
}

/// Counters of a drafter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Requests started and not ended.
    pub active_requests: usize,
    /// Live nodes of the shared trie.
    pub trie_nodes: usize,
    /// Heap bytes held: trie, requests and calibration tables.
    pub memory_bytes: usize,
    /// The configured budget.
    pub memory_budget_bytes: usize,
    /// Trie heap bytes per live trie node.
    pub trie_bytes_per_node: f64,
    /// Trie nodes evicted so far.
    pub evicted_nodes: u64,
    /// Tokens inserted into the shared trie so far.
    pub tokens_ingested: u64,
    /// Draft trees returned.
    pub drafts: u64,
    /// Nodes in the draft trees returned.
    pub draft_nodes: u64,
    /// Sum of the accepted counts engines reported.
    pub accepted_reported: u64,
    /// Number of accepted counts engines reported.
    pub steps_reported: u64,
    /// Of `accepted_reported`, draft tokens drafted from text only other replicas had written
    /// (a lower bound: see [`crate::provenance`]).
    pub accepted_cross_replica: u64,
    /// The same two counts per named replica (see [`crate::provenance`]).
    pub replicas: Vec<ReplicaStats>,
    /// Draft nodes built for sized drafts and cut because they did not pay.
    pub sized_away: u64,
    /// Groups with an active request.
    pub active_groups: usize,
    /// Heap bytes of the groups (members' outputs and group indexes), part of `memory_bytes`.
    pub group_bytes: usize,
    /// Records for the cluster dropped because nobody took them in time (see
    /// [`Drafter::take_learned`]).
    pub cluster_dropped: u64,
}

#[derive(Default)]
struct Counters {
    tokens_ingested: AtomicU64,
    drafts: AtomicU64,
    draft_nodes: AtomicU64,
    accepted_reported: AtomicU64,
    steps_reported: AtomicU64,
    costed_steps: AtomicU64,
    sized_away: AtomicU64,
}

/// A drafter: per-request indexes plus one shared trie, safe to share between threads.
pub struct Drafter {
    config: DrafterConfig,
    trie: RwLock<NgramTrie>,
    requests: Mutex<HashMap<String, SharedRequest>>,
    /// Requests (possibly ended) whose tokens wait for the shared trie.
    pending: Mutex<Vec<SharedRequest>>,
    calibration: Calibration,
    /// Heap bytes of the active requests and their groups.
    memory: MemoryAccount,
    /// Finished responses by group, for later requests of the same group.
    siblings: Mutex<SiblingResponses>,
    /// Groups with an active request (samples of one prompt running side by side).
    groups: Mutex<HashMap<GroupKey, SharedGroup>>,
    /// What the other drafters of a cluster are sent (with `record_for_cluster`).
    outboxes: Outboxes,
    /// Where other drafters' running requests stand in the trie (their running parts).
    remote: Mutex<RemoteTexts>,
    /// The replica names steps came with (see [`crate::provenance`]).
    replicas: Replicas,
    counters: Counters,
}

impl std::fmt::Debug for Drafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drafter")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drafter {
    /// A drafter with nothing learnt yet.
    pub fn new(config: DrafterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let calibration = Self::calibration_for(&config, Calibration::default());
        let remote_entries =
            config.memory_budget_bytes / 256 / RemoteTexts::entry_bytes(config.max_ngram);
        let drafter = Self {
            trie: RwLock::new(NgramTrie::new(config.max_ngram, 0)),
            requests: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            memory: MemoryAccount::default(),
            siblings: Mutex::new(SiblingResponses::new(
                config.memory_budget_bytes / 16 / size_of::<Token>(),
            )),
            groups: Mutex::new(HashMap::new()),
            outboxes: Outboxes::new(Self::outbox_tokens(&config)),
            remote: Mutex::new(RemoteTexts::new(remote_entries.max(16), config.max_ngram)),
            replicas: Replicas::default(),
            counters: Counters::default(),
            calibration,
            config,
        };
        drafter.refresh_node_limit(&mut drafter.trie.write());
        Ok(drafter)
    }

    /// The configuration in force.
    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    /// The origin of the engine replica named `replica` (any stable name; empty: unnamed),
    /// for [`StepItem::origin`].
    pub fn origin_of(&self, replica: &str) -> Origin {
        self.replicas.origin_of(replica)
    }

    /// Starts a request with its prompt.
    pub fn start(&self, request_id: &str, prompt: &[Token]) -> Result<(), DraftError> {
        let item = StepItem {
            request_id,
            prompt: Some(prompt),
            ..Default::default()
        };
        self.step_one(item).map(drop)
    }

    /// Appends tokens to an active request.
    pub fn append(&self, request_id: &str, tokens: &[Token]) -> Result<(), DraftError> {
        let item = StepItem {
            request_id,
            new_tokens: tokens,
            ..Default::default()
        };
        self.step_one(item).map(drop)
    }

    /// Drafts a tree of at most `budget` nodes for an active request.
    pub fn draft(&self, request_id: &str, budget: usize) -> Result<DraftTree, DraftError> {
        self.step_one(StepItem {
            request_id,
            budget,
            ..Default::default()
        })
    }

    /// Ends a request; its text stays in the shared trie.
    pub fn end(&self, request_id: &str) -> Result<(), DraftError> {
        let item = StepItem {
            request_id,
            finished: true,
            ..Default::default()
        };
        self.step_one(item).map(drop)
    }

    /// A step of one item: what the single-request calls are made of.
    fn step_one(&self, item: StepItem<'_>) -> Result<DraftTree, DraftError> {
        self.run_step(&[item], None, false)
            .pop()
            .map_or(Ok(DraftTree::default()), |r| r.map(|d| d.tree))
    }

    /// One engine step: per item, start, append, draft (or end); then the shared-trie inserts.
    /// Items are independent: one's error does not affect the others. Sized drafts keep
    /// their whole caps (no cost is known: see [`Self::step_costed`]).
    pub fn step(&self, items: &[StepItem<'_>]) -> Vec<Result<DraftTree, DraftError>> {
        trees(self.run_step(items, None, false))
    }

    /// Like [`Self::step`], with sized drafts cut to the lengths that pay most against the
    /// engine's `cost` (see [`crate::sizing`]).
    pub fn step_costed(
        &self,
        items: &[StepItem<'_>],
        cost: &StepCost,
    ) -> Vec<Result<DraftTree, DraftError>> {
        trees(self.run_step(items, Some(cost), false))
    }

    /// Like [`Self::step_costed`] (a plain [`Self::step`] without `cost`), each tree with the
    /// tokens the drafter holds of its request after the step: what an engine's answer
    /// carries (see [`crate::StepColumns`]).
    pub fn step_drafted(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<Drafted, DraftError>> {
        self.run_step(items, cost, false)
    }

    /// Like [`Self::step_drafted`] but leaves the shared-trie inserts queued for
    /// [`Self::flush_inserts`], so a server can answer before inserting.
    pub fn step_deferred(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<Drafted, DraftError>> {
        self.run_step(items, cost, true)
    }

    /// Bulk-loads a finished text (a past output, a document) into the shared trie.
    pub fn ingest(&self, tokens: &[Token]) -> Result<(), DraftError> {
        self.check_tokens("tokens", tokens)?;
        self.insert_text(tokens, 0, usize::MAX, Origin::NOBODY);
        if self.config.record_for_cluster {
            self.outboxes
                .learned(LearnedText::Document(tokens.to_vec()), tokens.len());
        }
        Ok(())
    }

    /// Inserts a text from position `from` (what comes before is its context), written by
    /// `origin`, into the shared trie (see [`TrieCursor::insert`] for `shared_from`), in
    /// chunks, so that drafts of other requests get the trie between them.
    fn insert_text(&self, text: &[Token], from: usize, shared_from: usize, origin: Origin) {
        let mut cursor = TrieCursor::starting_at(self.config.max_ngram, from);
        while cursor.inserted() < text.len() {
            let end = (cursor.inserted() + INGEST_CHUNK).min(text.len());
            let mut trie = self.trie.write();
            self.refresh_node_limit(&mut trie);
            cursor.insert(&mut trie, text, end, shared_from, origin);
        }
        self.counters
            .tokens_ingested
            .fetch_add((text.len() - from) as u64, Ordering::Relaxed);
    }

    /// Inserts every queued token into the shared trie.
    pub fn flush_inserts(&self) {
        let queued = std::mem::take(&mut *self.pending.lock());
        if queued.is_empty() {
            return;
        }
        let mut trie = self.trie.write();
        self.refresh_node_limit(&mut trie);
        for request in queued {
            let mut state = request.lock();
            state.queued = false;
            let pending = state.pending() as u64;
            let shared_from = self.output_start_if_shared(&state);
            let RequestState {
                sam,
                cursor,
                origin,
                ..
            } = &mut *state;
            cursor.insert(
                &mut trie,
                sam.text(),
                sam.text().len(),
                shared_from,
                *origin,
            );
            self.counters
                .tokens_ingested
                .fetch_add(pending, Ordering::Relaxed);
        }
    }

    /// Counters describing the drafter now.
    pub fn stats(&self) -> Stats {
        let trie = self.trie.read();
        let trie_bytes = trie.heap_bytes();
        let c = &self.counters;
        Stats {
            active_requests: self.requests.lock().len(),
            trie_nodes: trie.live_nodes(),
            memory_bytes: trie_bytes
                + self.memory.requests()
                + self.calibration.heap_bytes()
                + self.siblings.lock().heap_bytes()
                + self.remote.lock().heap_bytes(),
            memory_budget_bytes: self.config.memory_budget_bytes,
            trie_bytes_per_node: trie_bytes as f64 / trie.live_nodes().max(1) as f64,
            evicted_nodes: trie.evicted(),
            tokens_ingested: c.tokens_ingested.load(Ordering::Relaxed),
            drafts: c.drafts.load(Ordering::Relaxed),
            draft_nodes: c.draft_nodes.load(Ordering::Relaxed),
            accepted_reported: c.accepted_reported.load(Ordering::Relaxed),
            steps_reported: c.steps_reported.load(Ordering::Relaxed),
            accepted_cross_replica: self.replicas.cross_total(),
            replicas: self.replicas.stats(),
            sized_away: c.sized_away.load(Ordering::Relaxed),
            active_groups: self.groups.lock().len(),
            group_bytes: self.memory.groups(),
            cluster_dropped: self.outboxes.dropped(),
        }
    }
}

/// The trees of a step's outcomes.
fn trees(outcomes: Vec<Result<Drafted, DraftError>>) -> Vec<Result<DraftTree, DraftError>> {
    outcomes.into_iter().map(|r| r.map(|d| d.tree)).collect()
}

/// The group of a request: the one it names, else the one of its prompt.
fn group_key(name: Option<&str>, prompt: &[Token]) -> Result<GroupKey, DraftError> {
    match name.filter(|name| !name.is_empty()) {
        None => Ok(GroupKey::of_prompt(prompt)),
        Some(name) if name.len() > MAX_GROUP_NAME_BYTES => Err(DraftError::GroupNameTooLong {
            bytes: name.len(),
            max: MAX_GROUP_NAME_BYTES,
        }),
        Some(name) => Ok(GroupKey::named(name)),
    }
}
