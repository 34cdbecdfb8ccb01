//! The state the drafter keeps for one active request.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::anchor::Anchor;
use crate::calibration::Calibration;
use crate::group::Group;
use crate::provenance::Origin;
use crate::suffix_automaton::SuffixAutomaton;
use crate::trie::{NgramTrie, ROOT};
use crate::types::Considered;
use crate::types::GroupKey;
use crate::{SEPARATOR, Token};

/// Sentinel of a missing trie node in a suffix-node list.
pub(crate) const NO_NODE: u32 = u32::MAX;
/// Orders up to which the output of a prompt sampled more than once is kept at once. Samples
/// running side by side learn each other's text only from the shared trie; measured on the
/// replay workloads, orders up to 8 gain 3 to 5% accepted tokens on the rollouts and hold
/// under tight memory budgets, where every order (up to 16) costs 5 to 7 times the nodes and
/// loses up to 2.5% once eviction sets in.
const SHARED_OUTPUT_ORDERS: usize = 8;

/// The last draft of a request, as needed to score it once the true tokens arrive.
#[derive(Debug, Default)]
pub(crate) struct LastDraft {
    /// Text length when the draft was made: only the append right after it can score it.
    pub text_len: usize,
    pub tree_tokens: Vec<Token>,
    pub tree_parents: Vec<i32>,
    /// Per tree node: its realisation cell.
    pub tree_realised: Vec<u16>,
    /// Per tree node: drafted from another replica's text only ([`crate::provenance`]).
    pub tree_foreign: Vec<bool>,
    pub considered: Vec<Considered>,
}

impl LastDraft {
    /// How many of `accepted` (the draft tokens an engine accepted, in order) are nodes
    /// drafted from another replica's text; 0 unless the draft was made at `text_len`.
    pub fn foreign_accepted(&self, text_len: usize, accepted: &[Token]) -> u64 {
        if self.text_len != text_len {
            return 0;
        }
        let mut parent = -1;
        let mut foreign = 0;
        for &token in accepted {
            let node = (0..self.tree_tokens.len())
                .find(|&i| self.tree_parents[i] == parent && self.tree_tokens[i] == token);
            let Some(node) = node else { break };
            foreign += u64::from(self.tree_foreign[node]);
            parent = node as i32;
        }
        foreign
    }
}

/// One active request: its own index, its place in the shared trie, its last draft.
#[derive(Debug)]
pub(crate) struct RequestState {
    /// The engine's id of the request.
    pub id: String,
    pub sam: SuffixAutomaton,
    /// Tokens of sibling responses (and separators) before the request's own text.
    pub prefix_len: usize,
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// The request's group: requests with equal keys are samples of one prompt, or share the
    /// group name they started with.
    pub group_key: GroupKey,
    /// The group name the request started with (`None`: its group is its prompt).
    pub group_name: Option<String>,
    /// The group, and the request's key among its members.
    pub group: Arc<Mutex<Group>>,
    pub member: u64,
    /// Where in its own history the request is copying from.
    pub anchor: Anchor,
    /// Where the request's text stands in the shared trie.
    pub cursor: TrieCursor,
    /// The replica that started the request: the writer of its text in the trie.
    pub origin: Origin,
    /// Whether the request sits in the drafter's queue of pending inserts.
    pub queued: bool,
    /// Tokens of its own text recorded for the cluster as running parts so far; `None` once
    /// it ended (its ended text carries the rest).
    pub streamed: Option<usize>,
    /// Heap bytes last reported to the drafter's total.
    pub accounted_bytes: usize,
    pub last_draft: LastDraft,
    /// When a step last touched the request (for expiring idle ones).
    pub last_used: std::time::Instant,
}

impl RequestState {
    /// A request of `group` (member `member`) whose history starts with `siblings`: earlier
    /// responses of its group.
    pub fn new(
        max_depth: usize,
        siblings: &[Arc<[Token]>],
        group: Arc<Mutex<Group>>,
        member: u64,
    ) -> Self {
        let mut sam = SuffixAutomaton::new();
        for response in siblings.iter().rev() {
            sam.extend(response);
            sam.extend(&[SEPARATOR]);
        }
        let prefix_len = sam.text().len();
        Self {
            id: String::new(),
            sam,
            prefix_len,
            prompt_len: 0,
            group_key: GroupKey(0),
            group_name: None,
            group,
            member,
            anchor: Anchor::default(),
            cursor: TrieCursor::starting_at(max_depth, prefix_len),
            origin: Origin::default(),
            queued: false,
            streamed: Some(0),
            accounted_bytes: 0,
            last_draft: LastDraft::default(),
            last_used: std::time::Instant::now(),
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.sam.heap_bytes()
            + self.cursor.suffix_nodes.capacity() * 4
            + self.last_draft.tree_tokens.capacity() * 8
            + self.last_draft.tree_realised.capacity() * 2
            + self.last_draft.tree_foreign.capacity()
            + self.last_draft.considered.capacity() * size_of::<Considered>()
    }

    /// Appends tokens to the request's own index, first scoring the last draft against them.
    pub fn append(&mut self, tokens: &[Token], calibration: &Calibration) {
        if tokens.is_empty() {
            return;
        }
        if self.last_draft.text_len == self.sam.text().len() {
            score_draft(&self.last_draft, tokens, calibration);
        }
        self.last_draft.text_len = usize::MAX;
        self.sam.extend(tokens);
        self.anchor.follow(&self.sam, tokens.len());
    }

    /// The request's own tokens: prompt, then outputs.
    pub fn own_text(&self) -> &[Token] {
        &self.sam.text()[self.prefix_len..]
    }

    /// The request's output so far.
    pub fn response(&self) -> &[Token] {
        &self.own_text()[self.prompt_len..]
    }

    /// Whether the whole text is in the shared trie.
    pub fn fully_inserted(&self) -> bool {
        self.pending() == 0
    }

    /// Tokens not yet in the shared trie.
    pub fn pending(&self) -> usize {
        self.sam.text().len() - self.cursor.inserted
    }
}

/// A text's place in the shared trie: the nodes of its last inserted n-grams, so that each
/// further token costs `max_depth` lookups whatever the text's length.
#[derive(Debug)]
pub(crate) struct TrieCursor {
    /// `suffix_nodes[k]`: the trie node of the last `k` inserted tokens (`[0]` is the root),
    /// or [`NO_NODE`]; valid while `epoch` equals the trie's epoch.
    suffix_nodes: Vec<u32>,
    epoch: u64,
    /// How many tokens of the text are in the trie.
    inserted: usize,
}

impl TrieCursor {
    /// A cursor at the start of a text.
    pub fn new(max_depth: usize) -> Self {
        Self::starting_at(max_depth, 0)
    }

    /// A cursor that leaves the first `offset` tokens of its text out of the trie.
    pub fn starting_at(max_depth: usize, offset: usize) -> Self {
        let mut suffix_nodes = vec![NO_NODE; max_depth + 1];
        suffix_nodes[0] = ROOT;
        Self {
            suffix_nodes,
            epoch: u64::MAX,
            inserted: offset,
        }
    }

    /// Tokens of the text already inserted.
    pub fn inserted(&self) -> usize {
        self.inserted
    }

    /// The text lost its first `tokens` tokens (already inserted): positions move down.
    pub fn rebase(&mut self, tokens: usize) {
        self.inserted -= tokens;
    }

    /// Inserts `text[self.inserted()..end]`, written by `origin`, into the trie (under its write
    /// lock); `text` is the whole text, of which earlier calls inserted a prefix. Orders of 4
    /// and more get a node once their prefix has occurred before; n-grams ending at or after
    /// `shared_from` (the output of a prompt sampled more than once) get one at once up to
    /// order [`SHARED_OUTPUT_ORDERS`].
    pub fn insert(
        &mut self,
        trie: &mut NgramTrie,
        text: &[Token],
        end: usize,
        shared_from: usize,
        origin: Origin,
    ) {
        let max_depth = trie.max_depth();
        while self.inserted < end {
            // Reserve first so that no eviction happens while the suffix nodes are in use.
            let token = text[self.inserted];
            if trie.reserve(max_depth, token) || self.epoch != trie.epoch() {
                self.resolve(trie, &text[..self.inserted]);
            }
            for k in (0..max_depth).rev() {
                let parent = self.suffix_nodes[k];
                // An n-gram gets a node only once its prefix has occurred before: text seen
                // once costs a node or two per token instead of `max_depth`, and recurring
                // text (what drafts are made of) is counted from its second occurrence on.
                let shared = k < SHARED_OUTPUT_ORDERS && self.inserted >= shared_from;
                let kept = parent != NO_NODE && (k < 3 || shared || trie.count(parent) >= 2);
                self.suffix_nodes[k + 1] = if kept {
                    trie.record(parent, token, origin)
                } else {
                    NO_NODE
                };
            }
            self.inserted += 1;
        }
    }

    /// Recomputes the suffix nodes of the inserted text from the root.
    fn resolve(&mut self, trie: &NgramTrie, inserted: &[Token]) {
        for (k, slot) in self.suffix_nodes.iter_mut().enumerate().skip(1) {
            *slot = if k > inserted.len() {
                NO_NODE
            } else {
                trie.walk(ROOT, &inserted[inserted.len() - k..])
                    .unwrap_or(NO_NODE)
            };
        }
        self.epoch = trie.epoch();
    }

    /// The trie nodes of the suffixes of the whole `text` (its uninserted tail included),
    /// longest first, as `(node, length)`; read-only.
    pub fn context_nodes(&self, trie: &NgramTrie, text: &[Token], out: &mut Vec<(u32, u32)>) {
        out.clear();
        let max_depth = trie.max_depth();
        let pending = &text[self.inserted..];
        if self.epoch == trie.epoch() && pending.len() < max_depth {
            let mut nodes = self.suffix_nodes.clone();
            for &t in pending {
                for k in (0..max_depth).rev() {
                    let parent = nodes[k];
                    nodes[k + 1] = if parent == NO_NODE {
                        NO_NODE
                    } else {
                        trie.child(parent, t).unwrap_or(NO_NODE)
                    };
                }
            }
            let found = nodes.iter().enumerate().skip(1).rev();
            out.extend(
                found
                    .filter(|(_, n)| **n != NO_NODE)
                    .map(|(k, &n)| (n, k as u32)),
            );
        } else {
            for k in (1..=max_depth.min(text.len())).rev() {
                if let Some(n) = trie.walk(ROOT, &text[text.len() - k..]) {
                    out.push((n, k as u32));
                }
            }
        }
    }
}

/// Records, for each considered candidate whose parent lies on the accepted path, whether it
/// was the true next token.
fn score_draft(draft: &LastDraft, truth: &[Token], calibration: &Calibration) {
    // depth of each tree node on the accepted path, or None when off it
    let mut on_path: Vec<Option<usize>> = Vec::with_capacity(draft.tree_tokens.len());
    for (&tok, &p) in draft.tree_tokens.iter().zip(&draft.tree_parents) {
        let parent_depth = if p < 0 { Some(0) } else { on_path[p as usize] };
        on_path.push(
            parent_depth
                .filter(|&d| truth.get(d) == Some(&tok))
                .map(|d| d + 1),
        );
    }
    for (i, &cell) in draft.tree_realised.iter().enumerate() {
        let p = draft.tree_parents[i];
        let parent_depth = if p < 0 { Some(0) } else { on_path[p as usize] };
        if let Some(d) = parent_depth
            && let Some(&truth_token) = truth.get(d)
        {
            calibration.record_realised(cell, truth_token == draft.tree_tokens[i]);
        }
    }
    for c in &draft.considered {
        let parent_depth = if c.parent < 0 {
            Some(0)
        } else {
            on_path[c.parent as usize]
        };
        if let Some(d) = parent_depth
            && let Some(&truth_token) = truth.get(d)
        {
            calibration.record(c.keys, truth_token == c.token);
        }
    }
}
