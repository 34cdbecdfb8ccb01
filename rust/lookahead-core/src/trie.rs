//! The shared n-gram trie: counts of every n-gram (n <= `max_ngram`) of all text seen, under a
//! node limit derived from the byte budget, with CLOCK eviction that favours recent and
//! frequent n-grams.
//!
//! Invariants (checked by the tests):
//! - node 0 is the root and is never evicted; every other live node's `parent` is live and one
//!   level shallower;
//! - every live non-root node is found by exactly one of: the dense unigram table at its
//!   token (children of the root with tokens below [`DENSE_UNIGRAMS`]), or one index entry
//!   keyed by `(parent, token)` (all others);
//! - `children(n)` counts the live nodes whose parent is `n` (the root's is not kept);
//! - `top(n)` names up to [`TOP_CHILDREN`] live children of `n`, the most frequent first as far
//!   as the updates that touched them could tell;
//! - `live_nodes() <= node_limit()` after every public call, and `heap_bytes()` stays within the
//!   byte figure the limit was derived from.

use hashbrown::HashTable;

use crate::Token;
use crate::hashing::pair_hash;
use crate::provenance::Origin;
use crate::snapshot::{Reader, SnapshotError, Writer};

/// Node id of the root.
pub(crate) const ROOT: u32 = 0;
const NONE: u32 = u32::MAX;
/// `token` value of a free slot.
const FREE: Token = u32::MAX;
/// How many most frequent children each node remembers.
pub(crate) const TOP_CHILDREN: usize = 3;
const HEAT_BITS: u32 = 3;
const HEAT_MASK: u32 = (1 << HEAT_BITS) - 1;
const MAX_HEAT: u32 = 6;
const WRITERS_MASK: u32 = ((1 << Origin::BITS) - 1) << HEAT_BITS;
const CHILDREN_SHIFT: u32 = 8;
const MAX_CHILDREN: u32 = u32::MAX >> CHILDREN_SHIFT;
const _: () = assert!(MAX_HEAT <= HEAT_MASK && HEAT_BITS + Origin::BITS <= CHILDREN_SHIFT);
/// Tokens below this have their unigram node in a dense table (4 bytes a token, grown to the
/// largest token seen: 1 MiB at most); the root's children are looked up at every level of
/// every draft, and a table read costs one cache miss where a hash probe costs three.
pub(crate) const DENSE_UNIGRAMS: usize = 1 << 18;

#[derive(Clone, Copy, Debug)]
struct Node {
    token: Token,
    count: u32,
    parent: u32,
    top: [u32; TOP_CHILDREN],
    /// Live children (high 24 bits), the writers of the n-gram ([`Origin`] bits, then 5
    /// bits) and CLOCK heat (low 3 bits).
    packed: u32,
}

impl Node {
    fn children(&self) -> u32 {
        self.packed >> CHILDREN_SHIFT
    }
    fn heat(&self) -> u32 {
        self.packed & HEAT_MASK
    }
    fn writers(&self) -> u8 {
        ((self.packed & WRITERS_MASK) >> HEAT_BITS) as u8
    }
    fn set_children(&mut self, c: u32) {
        self.packed =
            (c.min(MAX_CHILDREN) << CHILDREN_SHIFT) | (self.packed & !(u32::MAX << CHILDREN_SHIFT));
    }
    fn set_heat(&mut self, h: u32) {
        self.packed = (self.packed & !HEAT_MASK) | h.min(HEAT_MASK);
    }
    fn add_writer(&mut self, origin: Origin) {
        self.packed |= u32::from(origin.bits()) << HEAT_BITS;
    }
}

/// Heat given on a touch: frequent n-grams survive more CLOCK sweeps.
fn heat_for(count: u32) -> u32 {
    (1 + count.ilog2()).min(MAX_HEAT)
}

/// Bytes a live node may cost at most: its slot plus its index entry at the index's lowest
/// load factor (hashbrown keeps at least 7/16 of its buckets full after growing), plus the
/// free-list slot it may take once evicted.
pub(crate) const BYTES_PER_NODE_BOUND: usize =
    size_of::<Node>() + (size_of::<u32>() + 1) * 16 / 7 + 1 + size_of::<u32>();

/// A child of a node with its count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Child {
    pub node: u32,
    pub token: Token,
    pub count: u32,
}

/// The trie. Not thread-safe by itself: the drafter wraps it in a lock.
#[derive(Debug)]
pub(crate) struct NgramTrie {
    nodes: Vec<Node>,
    /// `unigrams[token]`: the root's child by `token`, or `NONE`.
    unigrams: Vec<u32>,
    index: HashTable<u32>,
    free: Vec<u32>,
    max_depth: usize,
    node_limit: usize,
    clock_hand: usize,
    /// Bumped by every eviction pass: node ids cached before it may be stale.
    epoch: u64,
    evicted: u64,
}

impl NgramTrie {
    /// An empty trie of n-grams up to `max_depth` tokens.
    pub fn new(max_depth: usize, node_limit: usize) -> Self {
        let root = Node {
            token: 0,
            count: 0,
            parent: NONE,
            top: [NONE; TOP_CHILDREN],
            packed: 0,
        };
        Self {
            nodes: vec![root],
            unigrams: Vec::new(),
            index: HashTable::new(),
            free: Vec::new(),
            max_depth,
            node_limit: node_limit.max(2),
            clock_hand: 1,
            epoch: 0,
            evicted: 0,
        }
    }

    /// The deepest n-gram kept.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Live nodes, the root excluded.
    pub fn live_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// Changes the node limit; evicts at once when the trie is above the new one.
    pub fn set_node_limit(&mut self, limit: usize) {
        self.node_limit = limit.max(2);
        if self.live_nodes() > self.node_limit {
            self.evict_to(self.low_watermark());
        }
    }

    /// Heap bytes held (capacities).
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
            + self.unigram_table_bytes()
            + self.index.capacity() * (size_of::<u32>() + 1)
            + self.free.capacity() * size_of::<u32>()
    }

    /// Heap bytes of the dense unigram table, which is not counted per node.
    pub fn unigram_table_bytes(&self) -> usize {
        self.unigrams.capacity() * size_of::<u32>()
    }

    /// Eviction passes so far; node ids obtained before a pass may have been reused.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Nodes evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The child of `node` by `token`, if the trie has it.
    pub fn child(&self, node: u32, token: Token) -> Option<u32> {
        if node != ROOT {
            // The node's top list usually answers without a hash probe: it names the children
            // most likely asked for, and when it names all of them a miss there is final.
            let n = &self.nodes[node as usize];
            let mut listed = 0;
            for &c in &n.top {
                if c == NONE {
                    break;
                }
                if self.nodes[c as usize].token == token {
                    return Some(c);
                }
                listed += 1;
            }
            if n.children() <= listed {
                return None;
            }
        }
        self.indexed_child(node, token)
    }

    /// The child of `node` by `token`, from the unigram table or the index.
    fn indexed_child(&self, node: u32, token: Token) -> Option<u32> {
        if node == ROOT && (token as usize) < DENSE_UNIGRAMS {
            return self
                .unigrams
                .get(token as usize)
                .copied()
                .filter(|&c| c != NONE);
        }
        let nodes = &self.nodes;
        self.index
            .find(pair_hash(node, token), |&id| {
                let n = &nodes[id as usize];
                n.parent == node && n.token == token
            })
            .copied()
    }

    /// Grows the unigram table to hold `token`, if it is dense; what the table takes comes
    /// off the node limit, so that the byte figure the limit was derived from still holds.
    fn cover_unigram(&mut self, token: Token) {
        let slot = token as usize;
        if slot < self.unigrams.len() || slot >= DENSE_UNIGRAMS {
            return;
        }
        let before = self.unigram_table_bytes();
        let len = (slot + 1).next_power_of_two().min(DENSE_UNIGRAMS);
        self.unigrams.reserve_exact(len - self.unigrams.len());
        self.unigrams.resize(len, NONE);
        let grown = (self.unigram_table_bytes() - before).div_ceil(BYTES_PER_NODE_BOUND);
        self.node_limit = self.node_limit.saturating_sub(grown).max(2);
    }

    /// Makes live node `id` findable by its `(parent, token)`.
    fn link(&mut self, id: u32) {
        let Node { parent, token, .. } = self.nodes[id as usize];
        if parent == ROOT && (token as usize) < DENSE_UNIGRAMS {
            self.cover_unigram(token);
            self.unigrams[token as usize] = id;
            return;
        }
        let nodes = &self.nodes;
        self.index
            .insert_unique(pair_hash(parent, token), id, |&i| {
                let n = &nodes[i as usize];
                pair_hash(n.parent, n.token)
            });
    }

    /// Undoes [`Self::link`] for node `id`, about to be freed.
    fn unlink(&mut self, id: u32) {
        let Node { parent, token, .. } = self.nodes[id as usize];
        if parent == ROOT && (token as usize) < DENSE_UNIGRAMS {
            self.unigrams[token as usize] = NONE;
        } else if let Ok(entry) = self
            .index
            .find_entry(pair_hash(parent, token), |&i| i == id)
        {
            entry.remove();
        }
    }

    /// Occurrences of the n-gram of `node`.
    pub fn count(&self, node: u32) -> u32 {
        self.nodes[node as usize].count
    }

    /// The writers of the n-gram of `node`, as [`Origin`] bits.
    pub fn writers(&self, node: u32) -> u8 {
        self.nodes[node as usize].writers()
    }

    /// Whether `node` has live children.
    pub fn has_children(&self, node: u32) -> bool {
        let n = &self.nodes[node as usize];
        n.top[0] != NONE || n.children() > 0
    }

    /// The remembered most frequent children of `node`, most frequent first.
    pub fn top_children(&self, node: u32, out: &mut Vec<Child>) {
        out.clear();
        for &c in &self.nodes[node as usize].top {
            if c == NONE {
                break;
            }
            let n = &self.nodes[c as usize];
            out.push(Child {
                node: c,
                token: n.token,
                count: n.count,
            });
        }
    }

    /// Follows `tokens` from `node`; `None` as soon as a step is missing.
    pub fn walk(&self, node: u32, tokens: &[Token]) -> Option<u32> {
        tokens.iter().try_fold(node, |n, &t| self.child(n, t))
    }

    /// Makes room for `n` new nodes of n-grams ending in `token`, evicting when the trie would
    /// pass its limit. Returns whether it evicted (node ids cached by callers may then be
    /// stale).
    pub fn reserve(&mut self, n: usize, token: Token) -> bool {
        self.cover_unigram(token);
        if self.live_nodes() + n <= self.node_limit {
            return false;
        }
        self.evict_to(self.low_watermark().min(self.node_limit.saturating_sub(n)));
        true
    }

    /// Records one occurrence of the n-gram `node`+`token`, written by `origin`, and returns
    /// its node. `node` must be live and shallower than `max_depth`; call [`Self::reserve`]
    /// first, as this never evicts.
    pub fn record(&mut self, node: u32, token: Token, origin: Origin) -> u32 {
        let id = match self.child(node, token) {
            Some(id) => id,
            None => self.create(node, token),
        };
        let n = &mut self.nodes[id as usize];
        n.count = n.count.saturating_add(1);
        n.add_writer(origin);
        let heat = heat_for(n.count);
        if n.heat() < heat {
            n.set_heat(heat);
        }
        self.promote(node, id);
        id
    }

    #[cfg(test)]
    fn is_live(&self, node: u32) -> bool {
        node == ROOT
            || self
                .nodes
                .get(node as usize)
                .is_some_and(|n| n.token != FREE)
    }

    fn low_watermark(&self) -> usize {
        // Evict in batches so that the epoch, which invalidates cached node ids, moves rarely;
        // small batches keep the pause short.
        let batch = (self.node_limit / 64).clamp(1, 1 << 16);
        self.node_limit.saturating_sub(batch)
    }

    fn create(&mut self, parent: u32, token: Token) -> u32 {
        let node = Node {
            token,
            count: 0,
            parent,
            top: [NONE; TOP_CHILDREN],
            packed: 0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                if self.nodes.len() == self.nodes.capacity() {
                    // Grow by doubling, but never past the limit: capacity is what we pay for.
                    let room = (self.node_limit + 1).saturating_sub(self.nodes.len());
                    self.nodes.reserve_exact(self.nodes.len().min(room).max(1));
                }
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.link(id);
        if parent != ROOT {
            let p = &mut self.nodes[parent as usize];
            p.set_children(p.children() + 1);
        }
        id
    }

    /// Moves `child` into its parent's top list if its count earns it a place.
    fn promote(&mut self, parent: u32, child: u32) {
        if parent == ROOT {
            return; // unigram continuations of nothing are never drafted
        }
        let count = self.nodes[child as usize].count;
        let mut top = self.nodes[parent as usize].top;
        let pos = top
            .iter()
            .position(|&c| c == child || c == NONE)
            .unwrap_or(TOP_CHILDREN - 1);
        top[pos] = child;
        let mut i = pos;
        while i > 0 && self.nodes[top[i - 1] as usize].count < count {
            top.swap(i - 1, i);
            i -= 1;
        }
        self.nodes[parent as usize].top = top;
    }

    /// CLOCK sweep: evicts cold leaves until at most `target` nodes are live. Always succeeds:
    /// every pass cools each leaf, and a node whose children are all gone becomes a leaf.
    fn evict_to(&mut self, target: usize) {
        self.epoch += 1;
        while self.live_nodes() > target {
            if self.clock_hand >= self.nodes.len() {
                self.clock_hand = 1;
            }
            let id = self.clock_hand as u32;
            self.clock_hand += 1;
            let n = self.nodes[id as usize];
            if n.token == FREE || n.children() > 0 {
                continue;
            }
            if n.heat() > 0 {
                self.nodes[id as usize].set_heat(n.heat() - 1);
                continue;
            }
            self.remove_leaf(id);
        }
    }

    fn remove_leaf(&mut self, id: u32) {
        let n = self.nodes[id as usize];
        self.unlink(id);
        if n.parent != ROOT {
            let p = &mut self.nodes[n.parent as usize];
            p.set_children(p.children().saturating_sub(1));
            if let Some(pos) = p.top.iter().position(|&c| c == id) {
                p.top.copy_within(pos + 1.., pos);
                p.top[TOP_CHILDREN - 1] = NONE;
            }
        }
        self.nodes[id as usize].token = FREE;
        self.free.push(id);
        self.evicted += 1;
    }

    /// Writes the trie's nodes (free slots included, so ids stay valid) to a snapshot.
    pub fn encode(&self, w: &mut Writer) {
        w.len(self.nodes.len());
        for n in &self.nodes {
            w.u32(n.token);
            w.u32(n.count);
            w.u32(n.parent);
            n.top.iter().for_each(|&c| w.u32(c));
            w.u32(n.heat()); // writers are not kept: see crate::provenance
        }
    }

    /// Reads a trie written by [`Self::encode`], checking every invariant: parents live and
    /// shallower than `max_depth`, one node per `(parent, token)`, top children real children.
    /// Child counts and the index are rebuilt, never trusted.
    pub fn decode(
        r: &mut Reader<'_>,
        max_depth: usize,
        node_limit: usize,
    ) -> Result<Self, SnapshotError> {
        const NODE_BYTES: usize = 4 * (4 + TOP_CHILDREN);
        let n = r.len(NODE_BYTES)?;
        if n == 0 || n > (NONE as usize) {
            return Err(SnapshotError::Corrupt("trie node count"));
        }
        let mut trie = Self::new(max_depth, node_limit);
        trie.nodes.clear();
        trie.nodes.reserve_exact(n);
        for _ in 0..n {
            let (token, count, parent) = (r.u32()?, r.u32()?, r.u32()?);
            let mut top = [NONE; TOP_CHILDREN];
            for t in &mut top {
                *t = r.u32()?;
            }
            let heat = r.u32()? & HEAT_MASK;
            trie.nodes.push(Node {
                token,
                count,
                parent,
                top,
                packed: heat,
            });
        }
        let corrupt = SnapshotError::Corrupt;
        if trie.nodes[0].parent != NONE {
            return Err(corrupt("the root has a parent"));
        }
        // depths by walking parents, bounded so that a cycle cannot loop forever
        for id in 1..n {
            let node = trie.nodes[id];
            if node.token == FREE {
                trie.free.push(id as u32);
                continue;
            }
            let mut depth = 0;
            let mut p = id;
            while p != ROOT as usize {
                depth += 1;
                let parent = trie.nodes[p].parent as usize;
                if depth > max_depth
                    || parent >= n
                    || parent == p
                    || trie.nodes[parent].token == FREE
                {
                    return Err(corrupt("a node's parent chain is broken or too deep"));
                }
                p = parent;
            }
            if trie.indexed_child(node.parent, node.token).is_some() {
                return Err(corrupt("two nodes for one n-gram"));
            }
            trie.link(id as u32);
            if node.parent != ROOT {
                let parent = &mut trie.nodes[node.parent as usize];
                parent.set_children(parent.children() + 1);
            }
        }
        for id in 0..n {
            let top = trie.nodes[id].top;
            let valid = |c: u32| {
                (c as usize) < n
                    && trie.nodes[c as usize].token != FREE
                    && trie.nodes[c as usize].parent == id as u32
            };
            let mut kept: Vec<u32> = top
                .iter()
                .copied()
                .filter(|&c| c != NONE && valid(c))
                .collect();
            // a child listed twice would pass for two: keep the first mention only
            let mut seen = Vec::with_capacity(TOP_CHILDREN);
            kept.retain(|&c| {
                let first = !seen.contains(&c);
                seen.push(c);
                first
            });
            let mut new_top = [NONE; TOP_CHILDREN];
            new_top[..kept.len()].copy_from_slice(&kept);
            trie.nodes[id].top = new_top;
        }
        trie.epoch = 1;
        if trie.live_nodes() > trie.node_limit {
            trie.evict_to(trie.low_watermark());
        }
        Ok(trie)
    }

    /// Checks every invariant of the module doc; for tests.
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut children = vec![0u32; self.nodes.len()];
        let mut live = 0;
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if n.token == FREE {
                continue;
            }
            live += 1;
            assert!(self.is_live(n.parent), "node {id} has a dead parent");
            assert_eq!(
                self.indexed_child(n.parent, n.token),
                Some(id as u32),
                "index misses node {id}"
            );
            assert_eq!(self.child(n.parent, n.token), Some(id as u32));
            children[n.parent as usize] += 1;
        }
        assert_eq!(live, self.live_nodes());
        let dense = self.unigrams.iter().filter(|&&c| c != NONE).count();
        assert_eq!(self.index.len() + dense, live);
        // the top-list shortcut of `child` answers exactly as the index, misses included
        let mut tokens: Vec<Token> = self.nodes.iter().skip(1).map(|n| n.token).collect();
        tokens.retain(|&t| t != FREE);
        tokens.sort_unstable();
        tokens.dedup();
        for (id, n) in self.nodes.iter().enumerate() {
            if id != ROOT as usize && n.token == FREE {
                continue;
            }
            for &t in &tokens {
                assert_eq!(self.child(id as u32, t), self.indexed_child(id as u32, t));
            }
        }
        assert!(live <= self.node_limit);
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if n.token == FREE {
                continue;
            }
            assert_eq!(n.children(), children[id], "child count of {id}");
            for &c in n.top.iter().filter(|&&c| c != NONE) {
                assert!(self.is_live(c) && self.nodes[c as usize].parent == id as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn insert(trie: &mut NgramTrie, text: &[Token]) {
        let d = trie.max_depth();
        for end in 1..=text.len() {
            let start = end.saturating_sub(d);
            // (re)walk each window from the root: simple, for tests only
            trie.reserve(d, text[end - 1]);
            for s in start..end {
                if let Some(parent) = trie.walk(ROOT, &text[s..end - 1]) {
                    trie.record(parent, text[end - 1], Origin::UNNAMED);
                }
            }
        }
    }

    #[test]
    fn counts_and_top_children() {
        let mut trie = NgramTrie::new(4, 1000);
        for _ in 0..3 {
            insert(&mut trie, &[1, 2, 3]);
        }
        insert(&mut trie, &[1, 2, 9]);
        let n12 = trie.walk(ROOT, &[1, 2]).unwrap();
        assert_eq!(trie.count(n12), 4);
        let mut out = Vec::new();
        trie.top_children(n12, &mut out);
        assert_eq!(
            out.iter().map(|c| (c.token, c.count)).collect::<Vec<_>>(),
            vec![(3, 3), (9, 1)]
        );
        trie.check_invariants();
    }

    #[test]
    fn tiny_limit_never_exceeded() {
        let mut trie = NgramTrie::new(8, 5);
        insert(&mut trie, &(0..200).map(|i| i % 17).collect::<Vec<_>>());
        trie.check_invariants();
        assert!(trie.live_nodes() <= 5);
    }

    /// Mostly a few small tokens (so that n-grams recur), sometimes one above the dense
    /// unigram table's range.
    fn small_or_sparse_token() -> impl Strategy<Value = Token> {
        let sparse = DENSE_UNIGRAMS as Token;
        prop_oneof![8 => 0u32..6, 1 => sparse - 1..sparse + 2]
    }

    proptest! {
        #[test]
        fn invariants_hold_under_eviction(
            texts in prop::collection::vec(prop::collection::vec(small_or_sparse_token(), 0..40), 1..8),
            limit in 2usize..200,
        ) {
            let mut trie = NgramTrie::new(5, limit);
            for text in &texts {
                insert(&mut trie, text);
                trie.check_invariants();
            }
        }

        #[test]
        fn counts_are_exact_without_eviction(text in prop::collection::vec(0u32..4, 1..60)) {
            let mut trie = NgramTrie::new(3, 1 << 20);
            insert(&mut trie, &text);
            for n in 1..=3usize {
                for w in text.windows(n) {
                    let expected = text.windows(n).filter(|x| x == &w).count() as u32;
                    let node = trie.walk(ROOT, w).unwrap();
                    prop_assert_eq!(trie.count(node), expected);
                }
            }
        }
    }
}
