//! [`Drafter`]: the thread-safe front of the core.
//!
//! Locking: the shared trie sits behind a read-write lock (drafts read, inserts write); each
//! request and each group behind its own mutex; the request and group tables behind mutexes
//! held only to look up, add or remove entries. Lock order, where several are held: request
//! table, trie, remote texts, a request, group table, a group, sibling responses, outboxes.
//! Inserts of a whole step are applied after its drafts, in one write section.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::Token;
use crate::calibration::Calibration;
use crate::cluster::{GroupUpdate, LearnedText, Outbox};
use crate::config::{ConfigError, DrafterConfig};
use crate::draft::{DraftParams, DraftSources, build};
use crate::error::DraftError;
use crate::group::{Group, member_key};
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
    /// Heap bytes of all active requests.
    request_bytes: AtomicUsize,
    /// Finished responses by group, for later requests of the same group.
    siblings: Mutex<SiblingResponses>,
    /// Groups with an active request (samples of one prompt running side by side).
    groups: Mutex<HashMap<GroupKey, SharedGroup>>,
    /// Heap bytes of all groups (also counted in `request_bytes`).
    group_bytes: AtomicUsize,
    /// Texts learnt, for the other drafters of a cluster (with `record_for_cluster`).
    learned: Mutex<Outbox<LearnedText>>,
    /// New tokens of group members, for the other drafters of a cluster.
    group_updates: Mutex<Outbox<GroupUpdate>>,
    /// Where other drafters' running requests stand in the trie (their running parts).
    remote: Mutex<RemoteTexts>,
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
            request_bytes: AtomicUsize::new(0),
            siblings: Mutex::new(SiblingResponses::new(
                config.memory_budget_bytes / 16 / size_of::<Token>(),
            )),
            groups: Mutex::new(HashMap::new()),
            group_bytes: AtomicUsize::new(0),
            learned: Mutex::new(Outbox::new(Self::outbox_tokens(&config))),
            group_updates: Mutex::new(Outbox::new(Self::outbox_tokens(&config))),
            remote: Mutex::new(RemoteTexts::new(remote_entries.max(16), config.max_ngram)),
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

    /// The calibration tables, recording what they learn for the cluster if the drafter does.
    fn calibration_for(config: &DrafterConfig, calibration: Calibration) -> Calibration {
        if config.record_for_cluster {
            calibration.recording()
        } else {
            calibration
        }
    }

    /// Tokens each cluster outbox holds at most: 1/64 of the budget.
    fn outbox_tokens(config: &DrafterConfig) -> usize {
        config.memory_budget_bytes / 64 / size_of::<Token>()
    }

    /// Trie nodes allowed now: what the budget leaves after requests and fixed tables.
    fn trie_node_limit(&self, trie: &NgramTrie) -> usize {
        let cluster = if self.config.record_for_cluster {
            2 * Self::outbox_tokens(&self.config) * size_of::<Token>()
                + self.remote.lock().heap_bytes()
        } else {
            0
        };
        let fixed = self.calibration.heap_bytes()
            + self.siblings.lock().heap_bytes()
            + trie.unigram_table_bytes()
            + cluster
            + (64 << 10);
        let used = fixed + self.request_bytes.load(Ordering::Relaxed);
        self.config.memory_budget_bytes.saturating_sub(used) / BYTES_PER_NODE_BOUND
    }

    /// Brings the trie's node limit up to date with the memory used elsewhere.
    fn refresh_node_limit(&self, trie: &mut NgramTrie) {
        let limit = self.trie_node_limit(trie);
        trie.set_node_limit(limit);
    }

    /// Active requests may use up to half the budget; the trie always keeps the other half.
    fn request_share(&self) -> usize {
        self.config.memory_budget_bytes / 2
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
            .unwrap_or(Ok(DraftTree::default()))
    }

    /// One engine step: per item, start, append, draft (or end); then the shared-trie inserts.
    /// Items are independent: one's error does not affect the others. Sized drafts keep
    /// their whole caps (no cost is known: see [`Self::step_costed`]).
    pub fn step(&self, items: &[StepItem<'_>]) -> Vec<Result<DraftTree, DraftError>> {
        self.run_step(items, None, false)
    }

    /// Like [`Self::step`], with sized drafts cut to the lengths that pay most against the
    /// engine's `cost` (see [`crate::sizing`]).
    pub fn step_costed(
        &self,
        items: &[StepItem<'_>],
        cost: &StepCost,
    ) -> Vec<Result<DraftTree, DraftError>> {
        self.run_step(items, Some(cost), false)
    }

    /// Like [`Self::step`] but leaves the shared-trie inserts queued for
    /// [`Self::flush_inserts`], so a server can answer before inserting.
    pub fn step_deferred(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<DraftTree, DraftError>> {
        self.run_step(items, cost, true)
    }

    /// Bulk-loads a finished text (a past output, a document) into the shared trie.
    pub fn ingest(&self, tokens: &[Token]) -> Result<(), DraftError> {
        self.check_tokens("tokens", tokens)?;
        self.insert_text(tokens, 0, usize::MAX);
        if self.config.record_for_cluster {
            self.learned
                .lock()
                .push(LearnedText::Document(tokens.to_vec()), tokens.len());
        }
        Ok(())
    }

    /// Inserts a text from position `from` (what comes before is its context) into the
    /// shared trie (see [`TrieCursor::insert`] for `shared_from`), in chunks, so that drafts
    /// of other requests get the trie between them.
    fn insert_text(&self, text: &[Token], from: usize, shared_from: usize) {
        let mut cursor = TrieCursor::starting_at(self.config.max_ngram, from);
        while cursor.inserted() < text.len() {
            let end = (cursor.inserted() + INGEST_CHUNK).min(text.len());
            let mut trie = self.trie.write();
            self.refresh_node_limit(&mut trie);
            cursor.insert(&mut trie, text, end, shared_from);
        }
        self.counters
            .tokens_ingested
            .fetch_add((text.len() - from) as u64, Ordering::Relaxed);
    }

    /// The texts learnt since the last call, oldest first: ingested documents, the new tokens
    /// of running requests at every step, requests that ended. Empty unless
    /// [`DrafterConfig::record_for_cluster`]; bounded (past 1/64 of the memory budget the
    /// oldest are dropped, counted in [`Stats::cluster_dropped`]).
    pub fn take_learned(&self) -> Vec<LearnedText> {
        self.learned.lock().take()
    }

    /// The calibration counts recorded since the last call (engines' feedback on this
    /// drafter's drafts), as a text to apply elsewhere; `None` when there are none or without
    /// [`DrafterConfig::record_for_cluster`]. Counts applied from elsewhere are not included.
    pub fn take_calibration(&self) -> Option<LearnedText> {
        self.calibration
            .take_recorded()
            .map(LearnedText::Calibration)
    }

    /// Applies a text another drafter learnt (`origin` names that drafter), so that this one
    /// learns the same: its shared trie gets the text as that drafter's did (a running
    /// request's parts step by step, then the rest of it when it ends), a finished output
    /// becomes a sibling response of its group, calibration counts add to this drafter's.
    /// Not recorded for the cluster again. Applying a text twice counts it twice: keeping
    /// track of what was applied is the caller's job.
    pub fn apply_learned(&self, origin: &str, text: &LearnedText) -> Result<(), DraftError> {
        match text {
            LearnedText::Document(tokens) => {
                self.check_tokens("tokens", tokens)?;
                self.insert_text(tokens, 0, usize::MAX);
            }
            LearnedText::Request {
                prompt,
                output,
                finished,
                group,
                request,
                streamed,
            } => {
                self.check_tokens("prompt", prompt)?;
                self.check_tokens("output", output)?;
                let key = group_key(group.as_deref(), prompt)?;
                self.remote.lock().remove(member_key(origin, request));
                let shared =
                    self.groups.lock().contains_key(&key) || self.siblings.lock().contains(key);
                let text: Vec<Token> = prompt.iter().chain(output).copied().collect();
                let from = (*streamed).min(text.len());
                self.insert_text(&text, from, if shared { prompt.len() } else { usize::MAX });
                if *finished {
                    self.siblings.lock().record(key, output.as_slice().into());
                }
            }
            LearnedText::Running {
                request,
                offset,
                tokens,
                shared_from,
            } => {
                self.check_tokens("tokens", tokens)?;
                let key = member_key(origin, request);
                let shared_from = shared_from.unwrap_or(usize::MAX);
                for (i, chunk) in tokens.chunks(INGEST_CHUNK).enumerate() {
                    let mut trie = self.trie.write();
                    self.refresh_node_limit(&mut trie);
                    let at = offset.saturating_add(i * INGEST_CHUNK);
                    self.remote
                        .lock()
                        .insert(&mut trie, key, at, chunk, shared_from);
                }
                self.counters
                    .tokens_ingested
                    .fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
            LearnedText::Calibration(counts) => self.apply_calibration(counts)?,
        }
        Ok(())
    }

    fn apply_calibration(&self, counts: &CalibrationCounts) -> Result<(), DraftError> {
        use crate::calibration::CountsError;
        self.calibration
            .add(counts)
            .map_err(|e| DraftError::CalibrationCounts {
                reason: match e {
                    CountsError::Layout => "taken from calibration tables of another layout",
                    CountsError::Count => "a counter out of range or with more hits than trials",
                },
            })
    }

    /// New output tokens of the members of every group since the last call, oldest first.
    /// Empty unless [`DrafterConfig::record_for_cluster`]; bounded like
    /// [`Self::take_learned`].
    pub fn take_group_updates(&self) -> Vec<GroupUpdate> {
        self.group_updates.lock().take()
    }

    /// The groups with an active request here: those whose members elsewhere matter.
    pub fn active_groups(&self) -> Vec<GroupKey> {
        self.groups.lock().keys().copied().collect()
    }

    /// Applies a member update from another drafter (`origin` names it): the member's new
    /// tokens join its group's index, so that the requests here draft from them. Ignored when
    /// no request of the group is active here. Duplicates are skipped and gaps tolerated.
    pub fn apply_group_update(&self, origin: &str, update: &GroupUpdate) -> Result<(), DraftError> {
        self.check_tokens("tokens", &update.tokens)?;
        let Some(group) = self.groups.lock().get(&update.group).cloned() else {
            return Ok(());
        };
        let mut group = group.lock();
        if group.active == 0 {
            return Ok(()); // the group's last request here ended meanwhile
        }
        let room = self
            .request_share()
            .saturating_sub(self.request_bytes.load(Ordering::Relaxed));
        let member = member_key(origin, &update.member);
        group.extend(member, update.offset, &update.tokens, room);
        if update.finished {
            group.finish(member);
        }
        self.account_group(&mut group);
        Ok(())
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
            let RequestState { sam, cursor, .. } = &mut *state;
            cursor.insert(&mut trie, sam.text(), sam.text().len(), shared_from);
            self.counters
                .tokens_ingested
                .fetch_add(pending, Ordering::Relaxed);
        }
    }

    /// Records for the cluster what a running request's step queued for the shared trie: its
    /// text since the last part (nothing once it ended: its ended text carries the rest).
    /// Recorded when queued, not when inserted, so that it can go out as soon as the step is
    /// answered.
    fn record_running(&self, state: &mut RequestState) {
        let Some(streamed) = state.streamed else {
            return;
        };
        let written = state.own_text().len();
        if written <= streamed {
            return;
        }
        let shared_from = self.output_start_if_shared(state);
        let part = LearnedText::Running {
            request: state.id.clone(),
            offset: streamed,
            tokens: state.own_text()[streamed..].to_vec(),
            shared_from: (shared_from != usize::MAX).then(|| shared_from - state.prefix_len),
        };
        state.streamed = Some(written);
        self.learned.lock().push(part, written - streamed);
    }

    /// The learnt state (shared trie, calibration, sibling responses; in a cluster also where
    /// other drafters' running requests stand in the trie) as snapshot bytes. Active requests
    /// are not included. Drafts go on meanwhile; inserts wait for it.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.config.max_ngram as u32);
        let trie = self.trie.read();
        trie.encode(&mut w);
        self.calibration.encode(&mut w);
        self.siblings.lock().encode(&mut w);
        self.remote.lock().encode(&mut w);
        frame(&w.buf, SNAPSHOT_VERSION)
    }

    /// A drafter with `config` and the learnt state of a snapshot. The snapshot is checked
    /// whole before anything is built: a corrupt one is refused, never half-loaded.
    pub fn from_snapshot(config: DrafterConfig, bytes: &[u8]) -> Result<Self, SnapshotError> {
        let mut drafter = Self::new(config)?;
        let (version, payload) = unframe(bytes)?;
        let mut r = Reader::new(payload);
        let max_ngram = r.u32()?;
        if max_ngram as usize != drafter.config.max_ngram {
            return Err(SnapshotError::IncompatibleConfig {
                field: "max_ngram",
                snapshot: u64::from(max_ngram),
                config: drafter.config.max_ngram as u64,
            });
        }
        let limit = drafter.trie_node_limit(&drafter.trie.read());
        let trie = NgramTrie::decode(&mut r, drafter.config.max_ngram, limit)?;
        let calibration = Calibration::decode(&mut r, version)?;
        drafter.calibration = Self::calibration_for(&drafter.config, calibration);
        let max_sibling_tokens = drafter.siblings.get_mut().max_tokens();
        drafter.siblings = Mutex::new(SiblingResponses::decode(&mut r, max_sibling_tokens)?);
        if version >= 3 {
            let remote = drafter.remote.get_mut();
            *remote = RemoteTexts::decode(&mut r, remote.max_entries(), drafter.config.max_ngram)?;
        }
        if !r.is_empty() {
            return Err(SnapshotError::Corrupt("bytes left after the last section"));
        }
        drafter.trie = RwLock::new(trie);
        drafter.refresh_node_limit(&mut drafter.trie.write());
        Ok(drafter)
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
                + self.request_bytes.load(Ordering::Relaxed)
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
            sized_away: c.sized_away.load(Ordering::Relaxed),
            active_groups: self.groups.lock().len(),
            group_bytes: self.group_bytes.load(Ordering::Relaxed),
            cluster_dropped: self.learned.lock().dropped() + self.group_updates.lock().dropped(),
        }
    }

    fn check_tokens(&self, field: &'static str, tokens: &[Token]) -> Result<(), DraftError> {
        let vocab_size = self.config.vocab_size;
        match tokens.iter().position(|&t| t >= vocab_size) {
            Some(index) => Err(DraftError::TokenOutOfRange {
                field,
                index,
                token: tokens[index],
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    fn validate(&self, item: &StepItem<'_>) -> Result<(), DraftError> {
        if !(item.temperature.is_finite() && item.temperature >= 0.0) {
            return Err(DraftError::InvalidTemperature {
                value: item.temperature,
            });
        }
        if item.budget > self.config.max_budget {
            return Err(DraftError::BudgetTooLarge {
                budget: item.budget,
                max: self.config.max_budget,
            });
        }
        if let Some(prompt) = item.prompt {
            self.check_tokens("prompt", prompt)?;
            group_key(item.group, prompt)?;
        }
        self.check_tokens("new_tokens", item.new_tokens)
    }

    /// The request of an item: found, or (with a prompt) created. A start with an offset of
    /// an active request holding the same prompt finds it (a repeated first step).
    fn request_of(&self, item: &StepItem<'_>) -> Result<SharedRequest, DraftError> {
        let Some(prompt) = item.prompt else {
            return self
                .requests
                .lock()
                .get(item.request_id)
                .cloned()
                .ok_or_else(|| DraftError::UnknownRequest {
                    request_id: item.request_id.to_owned(),
                });
        };
        if let Some(offset) = item.offset
            && offset != prompt.len()
        {
            return Err(DraftError::OffsetNotAfterPrompt {
                offset,
                prompt: prompt.len(),
            });
        }
        match self.begin(item, prompt) {
            Err(DraftError::RequestAlreadyActive { request_id }) if item.offset.is_some() => {
                let existing = self.requests.lock().get(item.request_id).cloned();
                match existing {
                    Some(request) if request.lock().own_text().starts_with(prompt) => Ok(request),
                    _ => Err(DraftError::RequestAlreadyActive { request_id }),
                }
            }
            started => started,
        }
    }

    /// The part of an item's new tokens the request does not hold yet, and whether the whole
    /// step had been applied before (checked against `offset`; see [`StepItem::offset`]).
    fn unheld<'t>(
        item: &StepItem<'t>,
        state: &RequestState,
    ) -> Result<(&'t [Token], bool), DraftError> {
        let Some(offset) = item.offset else {
            return Ok((item.new_tokens, false));
        };
        let text = state.own_text();
        let held = text.len();
        if offset > held {
            return Err(DraftError::OffsetGap {
                request_id: item.request_id.to_owned(),
                offset,
                held,
            });
        }
        let overlap = (held - offset).min(item.new_tokens.len());
        if text[offset..offset + overlap] != item.new_tokens[..overlap] {
            return Err(DraftError::TokensDiffer {
                request_id: item.request_id.to_owned(),
                offset,
                held,
            });
        }
        Ok((&item.new_tokens[overlap..], offset < held))
    }

    /// Finds (or, with a prompt, creates) the request and applies the item's tokens it does
    /// not hold yet (the feedback of a repeated step is not counted twice).
    fn apply(&self, item: &StepItem<'_>) -> Result<SharedRequest, DraftError> {
        let request = self.request_of(item)?;
        {
            let mut state = request.lock();
            let (new_tokens, repeated) = Self::unheld(item, &state)?;
            if let Some(accepted) = item.accepted_last
                && !repeated
            {
                self.counters
                    .accepted_reported
                    .fetch_add(u64::from(accepted), Ordering::Relaxed);
                self.counters.steps_reported.fetch_add(1, Ordering::Relaxed);
            }
            state.last_used = Instant::now();
            // where the new tokens start in the request's output
            let offset = state.response().len() as u32;
            if !new_tokens.is_empty() {
                let held = state.own_text().len() + new_tokens.len();
                if held > self.config.max_request_tokens {
                    return Err(DraftError::RequestTooLong {
                        request_id: item.request_id.to_owned(),
                        tokens: held,
                        max: self.config.max_request_tokens,
                    });
                }
                state.append(new_tokens, &self.calibration);
                self.account(&mut state);
                self.extend_member(&state, offset, new_tokens);
            }
            if self.config.record_for_cluster && (item.finished || !new_tokens.is_empty()) {
                let update = GroupUpdate {
                    group: state.group_key,
                    member: item.request_id.to_owned(),
                    offset,
                    tokens: new_tokens.to_vec(),
                    finished: item.finished,
                };
                self.group_updates.lock().push(update, new_tokens.len());
            }
        }
        if item.finished {
            self.remove(item.request_id, true);
        }
        Ok(request)
    }

    /// The tokens (prompt included) an active request holds; `None` when it is not active.
    pub fn held_tokens(&self, request_id: &str) -> Option<usize> {
        let request = self.requests.lock().get(request_id).cloned()?;
        let held = request.lock().own_text().len();
        Some(held)
    }

    /// Adds output tokens of a request (from output position `offset`) to its group.
    fn extend_member(&self, state: &RequestState, offset: u32, tokens: &[Token]) {
        let mut group = state.group.lock();
        let room = self
            .request_share()
            .saturating_sub(self.request_bytes.load(Ordering::Relaxed));
        group.extend(state.member, offset, tokens, room);
        self.account_group(&mut group);
    }

    /// Brings the drafter's totals of request and group bytes up to date with a group.
    fn account_group(&self, group: &mut Group) {
        let (before, after) = (group.accounted_bytes, group.heap_bytes());
        adjust(&self.request_bytes, before, after);
        adjust(&self.group_bytes, before, after);
        group.accounted_bytes = after;
    }

    /// Removes an active request; a finished one's response becomes a sibling for later
    /// requests of its group. Its queued inserts still happen.
    fn remove(&self, request_id: &str, finished: bool) -> bool {
        let removed = self.requests.lock().remove(request_id);
        let Some(request) = removed else { return false };
        let mut state = request.lock();
        self.request_bytes
            .fetch_sub(state.accounted_bytes, Ordering::Relaxed);
        state.accounted_bytes = 0;
        self.leave_group(&state, finished);
        if self.config.record_for_cluster {
            // Tokens of the ending step go out as a part too: out of its group now, the
            // request's queued inserts keep the trie orders they get here.
            self.record_running(&mut state);
            let streamed = state.streamed.take().unwrap_or(0);
            let own = state.own_text();
            let text = LearnedText::Request {
                prompt: own[..state.prompt_len].to_vec(),
                output: state.response().to_vec(),
                finished,
                group: state.group_name.clone(),
                request: request_id.to_owned(),
                streamed,
            };
            self.learned.lock().push(text, own.len());
        }
        true
    }

    /// Takes a removed request out of its group; a finished one's output becomes history for
    /// later requests of the group (now, and as a sibling response once the group is gone).
    /// The last one out drops the group and frees its memory.
    fn leave_group(&self, state: &RequestState, finished: bool) {
        let mut groups = self.groups.lock();
        let mut group = state.group.lock();
        if finished && !state.response().is_empty() {
            let output = group
                .finish(state.member)
                .unwrap_or_else(|| state.response().into());
            self.siblings.lock().record(state.group_key, output);
        }
        group.active -= 1;
        if group.active == 0 {
            groups.remove(&state.group_key);
            adjust(&self.request_bytes, group.accounted_bytes, 0);
            adjust(&self.group_bytes, group.accounted_bytes, 0);
            group.accounted_bytes = 0;
        }
    }

    /// Where a request's output starts in its text when other samples of its group exist
    /// (running, or finished and remembered), else `usize::MAX`: the trie keeps the output of
    /// a shared prompt at more orders, since its other samples are likely to repeat it.
    fn output_start_if_shared(&self, state: &RequestState) -> usize {
        let shared =
            state.group.lock().members() >= 2 || self.siblings.lock().contains(state.group_key);
        if shared {
            state.prefix_len + state.prompt_len
        } else {
            usize::MAX
        }
    }

    /// Ends every request no step has touched for `max_idle` (an engine that went away without
    /// ending them). Their text stays in the shared trie. Returns how many were ended. Other
    /// drafters' running requests no part reached for as long are forgotten too.
    pub fn expire_idle(&self, max_idle: Duration) -> usize {
        let now = Instant::now();
        self.remote.lock().expire(now, max_idle);
        let idle: Vec<String> = self
            .requests
            .lock()
            .iter()
            .filter(|(_, r)| {
                r.try_lock()
                    .is_some_and(|s| now.duration_since(s.last_used) > max_idle)
            })
            .map(|(id, _)| id.clone())
            .collect();
        idle.iter().filter(|id| self.remove(id, false)).count()
    }

    /// Brings the drafter's total of request bytes up to date with an active request.
    fn account(&self, state: &mut RequestState) {
        adjust(
            &self.request_bytes,
            state.accounted_bytes,
            state.heap_bytes(),
        );
        state.accounted_bytes = state.heap_bytes();
    }

    /// The group of a request that starts, which it joins (formed if it has no active
    /// request).
    fn join_group(&self, key: GroupKey, request_id: &str) -> (SharedGroup, u64, Vec<Arc<[Token]>>) {
        let mut groups = self.groups.lock();
        let group = groups
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(Group::new(self.siblings.lock().get(key)))))
            .clone();
        let member = member_key("", request_id);
        let mut g = group.lock();
        g.active += 1;
        let history = g.join_with_history(member);
        self.account_group(&mut g);
        drop(g);
        (group, member, history)
    }

    fn begin(&self, item: &StepItem<'_>, prompt: &[Token]) -> Result<SharedRequest, DraftError> {
        let request_id = item.request_id;
        let tokens = prompt.len() + item.new_tokens.len();
        if tokens > self.config.max_request_tokens {
            return Err(DraftError::RequestTooLong {
                request_id: request_id.to_owned(),
                tokens,
                max: self.config.max_request_tokens,
            });
        }
        let needed = self.request_bytes.load(Ordering::Relaxed)
            + tokens * SuffixAutomaton::bytes_per_token_bound();
        if needed > self.request_share() {
            return Err(DraftError::MemoryExhausted {
                needed,
                budget: self.request_share(),
            });
        }
        let already_active = || DraftError::RequestAlreadyActive {
            request_id: request_id.to_owned(),
        };
        if self.requests.lock().contains_key(request_id) {
            return Err(already_active());
        }
        // Built outside the table's lock: indexing a long prompt takes a while.
        let name = item.group.filter(|name| !name.is_empty());
        let key = group_key(name, prompt)?;
        let (group, member, history) = self.join_group(key, request_id);
        let mut state = RequestState::new(self.config.max_ngram, &history, group, member);
        state.append(prompt, &self.calibration);
        state.prompt_len = prompt.len();
        state.id = request_id.to_owned();
        state.group_key = key;
        state.group_name = name.map(str::to_owned);
        let mut requests = self.requests.lock();
        if requests.contains_key(request_id) {
            drop(requests);
            self.leave_group(&state, false);
            return Err(already_active());
        }
        self.account(&mut state);
        let shared = Arc::new(Mutex::new(state));
        requests.insert(request_id.to_owned(), shared.clone());
        Ok(shared)
    }

    fn run_step(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
        defer: bool,
    ) -> Vec<Result<DraftTree, DraftError>> {
        // 1. validate and apply tokens (each request under its own lock)
        let applied: Vec<Result<SharedRequest, DraftError>> = items
            .iter()
            .map(|item| self.validate(item).and_then(|()| self.apply(item)))
            .collect();
        // 2. draft, all under one read section of the trie
        let mut results = Vec::with_capacity(items.len());
        {
            let trie = self.trie.read();
            let mut context = Vec::new();
            for (item, applied) in items.iter().zip(&applied) {
                results.push(applied.as_ref().map_err(Clone::clone).map(|request| {
                    let mut state = request.lock();
                    if item.finished || item.budget == 0 {
                        return DraftTree::empty(state.own_text().last().copied());
                    }
                    let tree = self.draft_locked(&mut state, &trie, item, &mut context);
                    if state.accounted_bytes != 0 {
                        self.account(&mut state); // not once ended: its bytes left the total
                    }
                    tree
                }));
            }
        }
        self.size(items, &mut results, cost);
        // 3. queue the inserts, then apply them unless deferred
        {
            let mut pending = self.pending.lock();
            for request in applied.iter().flatten() {
                let mut state = request.lock();
                if state.pending() > 0 && !state.queued {
                    state.queued = true;
                    pending.push(request.clone());
                }
                if self.config.record_for_cluster {
                    self.record_running(&mut state);
                }
            }
        }
        if !defer {
            self.flush_inserts();
        }
        results
    }

    /// Cuts the sized drafts of a step to the lengths that pay most against its cost
    /// ([`crate::sizing`]); without a cost, every size costs the same (whole caps).
    fn size(
        &self,
        items: &[StepItem<'_>],
        results: &mut [Result<DraftTree, DraftError>],
        cost: Option<&StepCost>,
    ) {
        let sized: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].shape.is_sized() && results[i].is_ok())
            .collect();
        if sized.is_empty() {
            return;
        }
        let gains: Vec<Vec<f32>> = sized
            .iter()
            .map(|&i| match &results[i] {
                Ok(tree) => tree.best_first_scores(),
                Err(_) => Vec::new(),
            })
            .collect();
        let refs: Vec<&[f32]> = gains.iter().map(Vec::as_slice).collect();
        let decoding = items.iter().filter(|item| !item.finished).count() as u32;
        let lengths = match cost {
            Some(cost) => {
                let step = self.counters.costed_steps.fetch_add(1, Ordering::Relaxed);
                let every = u64::from(cost.explore_every);
                let explore = every > 0 && step % every == every - 1;
                let base = if cost.base_tokens > 0 {
                    cost.base_tokens
                } else {
                    decoding
                };
                sizing::choose(&refs, &cost.curve, cost.layout, base, explore)
            }
            None => sizing::choose(&refs, &CostCurve::flat(), Layout::Ragged, decoding, false),
        };
        for (&i, length) in sized.iter().zip(lengths) {
            if let Ok(tree) = &mut results[i] {
                self.counters
                    .sized_away
                    .fetch_add((tree.len() - length) as u64, Ordering::Relaxed);
                *tree = tree.keep_best(length);
            }
        }
    }

    fn draft_locked(
        &self,
        state: &mut RequestState,
        trie: &NgramTrie,
        item: &StepItem<'_>,
        context: &mut Vec<(u32, u32)>,
    ) -> DraftTree {
        let Some(&root) = state.own_text().last() else {
            return DraftTree::empty(None);
        };
        state.cursor.context_nodes(trie, state.sam.text(), context);
        let group = state.group.lock();
        let sources = DraftSources {
            sam: &state.sam,
            trie,
            calibration: &self.calibration,
            context_nodes: context,
            anchor: state.anchor.position(state.sam.text().len()),
            context_counted: state.fully_inserted(),
            group: group.draft_source(state.member),
        };
        let params = DraftParams {
            budget: item.budget,
            min_score: self.config.min_score,
            chain: self.config.chain || item.shape.is_chain(),
            temperature_band: temperature_band(item.temperature),
        };
        let draft = build(&sources, root, state.sam.longest_earlier_suffix(), params);
        drop(group);
        self.counters.drafts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .draft_nodes
            .fetch_add(draft.tree.len() as u64, Ordering::Relaxed);
        if state.last_draft.text_len == state.sam.text().len() {
            // Drafted again at the same place (a repeated step): the first draft is the one
            // the next tokens score, so that a repeat teaches the calibration nothing twice.
            return draft.tree;
        }
        state.last_draft = LastDraft {
            text_len: state.sam.text().len(),
            tree_tokens: draft.growth_tokens,
            tree_parents: draft.growth_parents,
            tree_realised: draft.growth_realised,
            considered: draft.considered,
        };
        draft.tree
    }
}

/// Moves an atomic total by the change of one part from `before` to `after` bytes.
fn adjust(total: &AtomicUsize, before: usize, after: usize) {
    if after >= before {
        total.fetch_add(after - before, Ordering::Relaxed);
    } else {
        total.fetch_sub(before - after, Ordering::Relaxed);
    }
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
