//! Best-first growth of a draft tree from the request's own history and the shared trie.
//!
//! Every node's score is the estimated probability that the path to it is accepted: the
//! parent's score times the calibrated probability of the node's token given its context. The
//! tree keeps the `budget` highest-scoring nodes: since scores only shrink along a path, the
//! best-first order always yields a connected tree, and it maximises the expected number of
//! accepted tokens under those estimates.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::calibration::{Calibration, Evidence, GlobalEvidence, LocalEvidence, SiblingEvidence};
use crate::group::GroupSource;
use crate::group_index::{GroupMatch, SiblingContinuation};
use crate::provenance::Origin;
use crate::realise::{self, Source};
use crate::suffix_automaton::{Continuation, LocalMatch, SuffixAutomaton};
use crate::tree::DraftTree;
use crate::trie::{Child, NgramTrie, ROOT};
use crate::types::{Considered, Keys};
use crate::{SEPARATOR, Token};

/// Continuations of a local match looked at, at most (the newest first).
const MAX_LOCAL_CONTINUATIONS: usize = 8;
/// Context n-grams a draft node keeps for the next level (plus the unigram), longest first.
const MAX_CONTEXT_NODES: usize = 6;
/// Local matches (the longest, then shorter ones) whose continuations are considered.
const MAX_LOCAL_LEVELS: usize = 1;
/// Candidates kept per expanded node.
const MAX_CANDIDATES: usize = 8;
/// Context n-grams (longest first) whose continuations are considered.
const MAX_CONTEXT_LEVELS: usize = 2;
/// Shorter suffixes of a node's group match tried when no other member continued it.
const MAX_SIBLING_BACKOFF: usize = 4;

/// What the caller wants.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DraftParams {
    pub budget: usize,
    pub min_score: f32,
    pub chain: bool,
    /// The band of the request's sampling temperature ([`temperature_band`]).
    pub temperature_band: usize,
}

/// Where to draft from: the request's index and its context in the shared trie.
pub(crate) struct DraftSources<'a> {
    pub sam: &'a SuffixAutomaton,
    pub trie: &'a NgramTrie,
    pub calibration: &'a Calibration,
    /// Trie nodes of the context's suffixes, longest first, as `(node, length)`.
    pub context_nodes: &'a [(u32, u32)],
    /// The request's copy anchor (a text position aligned with the last token).
    pub anchor: Option<u32>,
    /// Whether the counts of `context_nodes` include the context's own occurrence (its last
    /// token is already in the trie): that occurrence has no continuation yet.
    pub context_counted: bool,
    /// The outputs of the request's group, when it has other members.
    pub group: Option<GroupSource<'a>>,
    /// The replica the request came from (see [`crate::provenance`]).
    pub origin: Origin,
    /// Where the request's own text starts in `sam` (before it: other requests' responses).
    pub own_from: u32,
}

/// The built tree (breadth-first) and, in growth order, what feedback needs.
pub(crate) struct Draft {
    /// Scores realised at the request's temperature ([`crate::realise`]).
    pub tree: DraftTree,
    pub growth_tokens: Vec<Token>,
    pub growth_parents: Vec<i32>,
    /// Per growth node: its realisation cell.
    pub growth_realised: Vec<u16>,
    /// Per growth node: drafted from another replica's text only.
    pub growth_foreign: Vec<bool>,
    pub considered: Vec<Considered>,
}

struct GrowthNode {
    token: Token,
    parent: i32,
    score: f32,
    /// The calibration keys it was estimated with.
    keys: Keys,
    local: LocalMatch,
    group: Option<GroupMatch>,
    anchor: Option<u32>,
    /// Range of this node's context nodes in the shared arena.
    context: std::ops::Range<usize>,
    /// Drafted from another replica's text only ([`crate::provenance`]).
    foreign: bool,
}

struct Candidate {
    score: f32,
    seq: u32,
    parent: i32,
    token: Token,
    /// The request's own text predicted it: a continuation of its history, or its anchor,
    /// found in its own prompt and output (not in the responses of its group before them).
    own: bool,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    /// Higher score first; among equals the earlier candidate, so that drafts are deterministic.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

struct Builder<'a> {
    src: &'a DraftSources<'a>,
    params: DraftParams,
    root_match: LocalMatch,
    nodes: Vec<GrowthNode>,
    contexts: Vec<(u32, u32)>,
    heap: BinaryHeap<Candidate>,
    considered: Vec<Considered>,
    seq: u32,
    // scratch buffers
    local_buf: Vec<Continuation>,
    sibling_buf: Vec<SiblingContinuation>,
    child_buf: Vec<Child>,
    cand_buf: Vec<Proposal>,
}

/// A candidate child of the node being expanded: its evidence, then its estimate.
struct Proposal {
    token: Token,
    evidence: Evidence,
    p: f32,
    keys: Keys,
    /// The request's own text predicted it (see [`Candidate::own`]).
    own: bool,
}

/// `token` among the proposals, added without evidence when it is new.
fn proposal(proposals: &mut Vec<Proposal>, token: Token) -> &mut Proposal {
    let i = match proposals.iter().position(|c| c.token == token) {
        Some(i) => i,
        None => {
            proposals.push(Proposal {
                token,
                evidence: Evidence::default(),
                p: 0.0,
                keys: Keys::default(),
                own: false,
            });
            proposals.len() - 1
        }
    };
    &mut proposals[i]
}

/// Grows a draft tree for a context whose last token is `root` and whose longest match in the
/// request's own history is `root_match`.
pub(crate) fn build(
    src: &DraftSources<'_>,
    root: Token,
    root_match: LocalMatch,
    params: DraftParams,
) -> Draft {
    let mut b = Builder {
        src,
        params,
        root_match,
        nodes: Vec::with_capacity(params.budget),
        contexts: src.context_nodes.to_vec(),
        heap: BinaryHeap::new(),
        considered: Vec::new(),
        seq: 0,
        local_buf: Vec::new(),
        sibling_buf: Vec::new(),
        child_buf: Vec::new(),
        cand_buf: Vec::new(),
    };
    if params.budget > 0 {
        let group = src.group.map(|g| g.root);
        b.expand(
            -1,
            1.0,
            root_match,
            group,
            src.anchor,
            0..src.context_nodes.len(),
        );
        b.grow();
    }
    b.finish(root)
}

impl Builder<'_> {
    fn grow(&mut self) {
        while self.nodes.len() < self.params.budget {
            let Some(c) = self.heap.pop() else { break };
            if c.score < self.params.min_score {
                break;
            }
            if self.params.chain {
                self.heap.clear();
            }
            let (parent_local, parent_group, parent_anchor, parent_ctx) = match c.parent {
                -1 => (
                    None,
                    self.src.group.map(|g| g.root),
                    self.src.anchor,
                    0..self.src.context_nodes.len(),
                ),
                p => {
                    let n = &self.nodes[p as usize];
                    (Some(n.local), n.group, n.anchor, n.context.clone())
                }
            };
            let anchor = parent_anchor
                .map(|a| a + 1)
                .filter(|&a| self.anchor_token(a) == Some(c.token));
            let local = match parent_local {
                Some(m) => self.src.sam.advance(m, c.token),
                None => self.src.sam.advance(self.root_match, c.token),
            };
            let group = self
                .src
                .group
                .zip(parent_group)
                .map(|(g, m)| g.index.advance(m, c.token));
            let id = self.nodes.len() as i32;
            // the last node is never expanded: its context would be wasted lookups
            let expanded = self.nodes.len() + 1 < self.params.budget;
            let context = if expanded {
                self.extend_context(parent_ctx.clone(), c.token)
            } else {
                0..0
            };
            let foreign = !c.own
                && self
                    .longest_ngram(parent_ctx, &context, c.token)
                    .is_some_and(|n| self.src.origin.foreign(self.src.trie.writers(n)));
            self.nodes.push(GrowthNode {
                token: c.token,
                parent: c.parent,
                score: c.score,
                keys: self.considered[c.seq as usize].keys,
                local,
                group,
                anchor,
                context: context.clone(),
                foreign,
            });
            if expanded {
                self.expand(id, c.score, local, group, anchor, context);
            }
        }
    }

    /// Context nodes of a child: each parent context node (shallower than the trie's depth)
    /// followed by `token`, plus the unigram of `token`; longest first.
    fn extend_context(
        &mut self,
        parent: std::ops::Range<usize>,
        token: Token,
    ) -> std::ops::Range<usize> {
        let trie = self.src.trie;
        let start = self.contexts.len();
        for i in parent {
            if self.contexts.len() - start == MAX_CONTEXT_NODES {
                break; // longer contexts are kept; the unigram below is the last resort
            }
            let (node, depth) = self.contexts[i];
            if (depth as usize) < trie.max_depth()
                && let Some(child) = trie.child(node, token)
            {
                self.contexts.push((child, depth + 1));
            }
        }
        if let Some(unigram) = trie.child(ROOT, token)
            && self.contexts[start..].last().is_none_or(|&(_, d)| d > 1)
        {
            self.contexts.push((unigram, 1));
        }
        start..self.contexts.len()
    }

    /// The trie node of the longest n-gram ending in a node's `token`: the first of its own
    /// context nodes, or, for a node not expanded, looked up from its parent's.
    fn longest_ngram(
        &self,
        parent: std::ops::Range<usize>,
        own: &std::ops::Range<usize>,
        token: Token,
    ) -> Option<u32> {
        if !own.is_empty() {
            return Some(self.contexts[own.start].0);
        }
        let trie = self.src.trie;
        parent
            .filter(|&i| (self.contexts[i].1 as usize) < trie.max_depth())
            .find_map(|i| trie.child(self.contexts[i].0, token))
            .or_else(|| trie.child(ROOT, token))
    }

    /// Occurrences of a context n-gram of node `id` that had a chance to be continued.
    fn continued_count(&self, id: i32, node: u32) -> u32 {
        let count = self.src.trie.count(node);
        if id == -1 && self.src.context_counted {
            count.saturating_sub(1).max(1)
        } else {
            count
        }
    }

    /// The token at text position `position`, when it is known text.
    fn anchor_token(&self, position: u32) -> Option<Token> {
        self.src
            .sam
            .text()
            .get(position as usize)
            .copied()
            .filter(|&t| t != SEPARATOR)
    }

    /// Scores the candidate children of a node and queues the best.
    fn expand(
        &mut self,
        id: i32,
        score: f32,
        local: LocalMatch,
        group: Option<GroupMatch>,
        anchor: Option<u32>,
        context: std::ops::Range<usize>,
    ) {
        let src = self.src;
        self.cand_buf.clear();
        // local evidence: the longest match, then shorter ones for tokens it never saw
        let mut level = (local.len > 0).then_some(local);
        for _ in 0..MAX_LOCAL_LEVELS {
            let Some(m) = level else { break };
            src.sam
                .continuations(m, MAX_LOCAL_CONTINUATIONS, &mut self.local_buf);
            let total = src.sam.occurrences(m);
            for c in &self.local_buf {
                if c.token == SEPARATOR {
                    continue;
                }
                let p = proposal(&mut self.cand_buf, c.token);
                p.own |= c.recent_end >= src.own_from;
                p.evidence.local.get_or_insert(LocalEvidence {
                    match_len: m.len,
                    occ: c.occ,
                    total,
                    most_recent: c.most_recent,
                    anchored: false,
                });
            }
            level = src.sam.shorter(m);
        }
        // global evidence: the two longest context n-grams that were ever continued
        let mut primary: Option<(u32, u32)> = None;
        let mut used = 0;
        for &(node, depth) in &self.contexts[context] {
            if used == MAX_CONTEXT_LEVELS {
                break;
            }
            if (depth as usize) >= src.trie.max_depth() || !src.trie.has_children(node) {
                continue;
            }
            used += 1;
            primary.get_or_insert((node, depth));
            let total = self.continued_count(id, node);
            src.trie.top_children(node, &mut self.child_buf);
            for ch in &self.child_buf {
                let e = &mut proposal(&mut self.cand_buf, ch.token).evidence;
                e.global.get_or_insert(GlobalEvidence {
                    depth,
                    count: ch.count,
                    total,
                });
            }
        }
        // sibling evidence: what the group's other members did after this context
        let sibling_match = src.group.zip(group).and_then(|(g, m)| {
            g.index
                .sibling_continuations(m, g.own, MAX_SIBLING_BACKOFF, &mut self.sibling_buf)
        });
        if let Some(m) = sibling_match {
            for c in &self.sibling_buf {
                let e = &mut proposal(&mut self.cand_buf, c.token).evidence;
                e.siblings = Some(SiblingEvidence {
                    match_len: m.len,
                    agree: c.agree,
                    total: m.total,
                });
            }
        }
        // the copy anchor's continuation
        let anchored = anchor.and_then(|a| self.anchor_token(a + 1));
        if let Some(token) = anchored {
            let from_own_text = anchor.is_some_and(|a| a + 1 >= src.own_from);
            proposal(&mut self.cand_buf, token).own |= from_own_text;
        }
        // evidence of absence where a source matched but did not predict the token
        let local_total = src.sam.occurrences(local);
        let primary = primary.map(|(node, depth)| (depth, self.continued_count(id, node)));
        for c in &mut self.cand_buf {
            let e = &mut c.evidence;
            if e.local.is_none() && (local.len > 0 || anchored.is_some()) {
                e.local = Some(LocalEvidence {
                    match_len: local.len,
                    occ: 0,
                    total: local_total,
                    most_recent: false,
                    anchored: false,
                });
            }
            if let Some(l) = &mut e.local {
                l.anchored = anchored == Some(c.token);
            }
            if e.global.is_none()
                && let Some((depth, total)) = primary
            {
                e.global = Some(GlobalEvidence {
                    depth,
                    count: 0,
                    total,
                });
            }
            if e.siblings.is_none()
                && let Some(m) = sibling_match
            {
                e.siblings = Some(SiblingEvidence {
                    match_len: m.len,
                    agree: 0,
                    total: m.total,
                });
            }
            (c.p, c.keys) = src.calibration.estimate(e);
        }
        // the estimates of one node's children are exclusive events: keep their sum <= 1
        let sum: f32 = self.cand_buf.iter().map(|c| c.p).sum();
        if sum > 1.0 {
            self.cand_buf.iter_mut().for_each(|c| c.p /= sum);
        }
        self.cand_buf
            .sort_by(|a, b| b.p.total_cmp(&a.p).then(a.token.cmp(&b.token)));
        // A chain grows from a node's best candidate only, but every candidate is considered:
        // the calibration learns each key from all the candidates it was given to, not only
        // from those that came out on top (which would teach a key that rarely wins the rate
        // of its wins, and let it crowd out better candidates elsewhere).
        let grown = if self.params.chain { 1 } else { MAX_CANDIDATES };
        for (rank, c) in self.cand_buf.iter().take(MAX_CANDIDATES).enumerate() {
            self.considered.push(Considered {
                parent: id,
                token: c.token,
                keys: c.keys,
            });
            if rank < grown {
                self.heap.push(Candidate {
                    score: score * c.p,
                    seq: self.seq,
                    parent: id,
                    token: c.token,
                    own: c.own,
                });
            }
            self.seq += 1;
        }
    }

    /// Realises the scores at the request's temperature and reorders the grown nodes
    /// breadth-first (by depth, then score) into a [`DraftTree`].
    fn finish(self, root: Token) -> Draft {
        let n = self.nodes.len();
        let mut depth = vec![0u32; n];
        let mut score = vec![0f32; n];
        let mut realised = Vec::with_capacity(n);
        for (i, node) in self.nodes.iter().enumerate() {
            let (parent_depth, raw_parent, parent_score) = match node.parent {
                -1 => (0, 1.0, 1.0),
                p => {
                    let p = p as usize;
                    (depth[p], self.nodes[p].score, score[p])
                }
            };
            depth[i] = parent_depth + 1;
            let predicted = (node.score / raw_parent.max(f32::MIN_POSITIVE)).min(1.0);
            let cell = realise::cell(
                self.params.temperature_band,
                Source::of(&node.keys),
                depth[i] as usize,
                predicted,
            );
            realised.push(cell);
            score[i] = parent_score * self.src.calibration.realised(cell, predicted);
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            depth[a]
                .cmp(&depth[b])
                .then(score[b].total_cmp(&score[a]))
                .then(a.cmp(&b))
        });
        let mut new_index = vec![0i32; n];
        for (new, &old) in order.iter().enumerate() {
            new_index[old] = new as i32;
        }
        let tree = DraftTree {
            root: Some(root),
            tokens: order.iter().map(|&i| self.nodes[i].token).collect(),
            parents: order
                .iter()
                .map(|&i| match self.nodes[i].parent {
                    -1 => -1,
                    p => new_index[p as usize],
                })
                .collect(),
            scores: order.iter().map(|&i| score[i]).collect(),
        };
        Draft {
            tree,
            growth_tokens: self.nodes.iter().map(|n| n.token).collect(),
            growth_parents: self.nodes.iter().map(|n| n.parent).collect(),
            growth_realised: realised,
            growth_foreign: self.nodes.iter().map(|n| n.foreign).collect(),
            considered: self.considered,
        }
    }
}
