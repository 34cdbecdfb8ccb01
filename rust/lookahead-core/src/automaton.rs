//! The construction shared by every suffix automaton of the core: states, suffix links and
//! transitions, built online, one token at a time.
//!
//! An automaton indexes a set of strings that grow at their ends. Each string is named by the
//! state of its whole text (its *last* state); appending a token to a string returns its new
//! last state. With one string this is the classic suffix automaton; with several, appended in
//! any interleaving, it is the generalized one (a state may then already continue with the
//! token appended, and is reused or split instead of getting a new state).
//!
//! Invariants (checked by the tests of the users):
//! - state 0 is the root (the empty string); `link` of every other state points to a state
//!   with a strictly smaller `len`;
//! - every string indexed is the longest string of its last state;
//! - a state's edges list each of its transitions once; `index` finds every edge by
//!   `(source, token)`.
//!
//! Each state carries some data `D` of its user (occurrence evidence, member sets); a split
//! gives the new state a copy of the data of the state it splits.

use hashbrown::HashTable;

use crate::Token;
use crate::hashing::pair_hash;

/// No state / no edge.
pub(crate) const NONE: u32 = u32::MAX;
/// The root state: the empty string.
pub(crate) const ROOT_STATE: u32 = 0;

/// One state: the strings of one end-position class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct State<D> {
    /// Length of the longest string of the state.
    pub len: u32,
    /// The state of the longest proper suffix outside this state ([`NONE`] for the root).
    pub link: u32,
    first_edge: u32,
    /// The user's data.
    pub data: D,
}

#[derive(Clone, Copy, Debug)]
struct Edge {
    source: u32,
    token: Token,
    target: u32,
    next: u32,
}

/// States, edges and the edge index.
#[derive(Debug)]
pub(crate) struct Automaton<D> {
    states: Vec<State<D>>,
    edges: Vec<Edge>,
    index: HashTable<u32>,
}

impl<D: Copy> Automaton<D> {
    /// An automaton of no string: the root alone, with data `root`.
    pub fn new(root: D) -> Self {
        Self {
            states: vec![State {
                len: 0,
                link: NONE,
                first_edge: NONE,
                data: root,
            }],
            edges: Vec::new(),
            index: HashTable::new(),
        }
    }

    /// Heap bytes held (capacity, not length: what the allocator really gave).
    pub fn heap_bytes(&self) -> usize {
        self.states.capacity() * size_of::<State<D>>()
            + self.edges.capacity() * size_of::<Edge>()
            + self.index.capacity() * (size_of::<u32>() + 1)
    }

    /// Bytes an append may add, at most, amortised (two states, three edges and their index
    /// slots, and the doubling slack of growing vectors).
    pub fn bytes_per_token_bound() -> usize {
        2 * (2 * size_of::<State<D>>() + 3 * (size_of::<Edge>() + 8))
    }

    /// The state `s`.
    #[inline]
    pub fn state(&self, s: u32) -> &State<D> {
        &self.states[s as usize]
    }

    /// The data of state `s`, to update.
    #[inline]
    pub fn data_mut(&mut self, s: u32) -> &mut D {
        &mut self.states[s as usize].data
    }

    /// The state reached from `state` by `token`, if any.
    #[inline]
    pub fn transition(&self, state: u32, token: Token) -> Option<u32> {
        self.edge_id(state, token)
            .map(|e| self.edges[e as usize].target)
    }

    /// The transitions of `state` as `(token, target)`, the newest first.
    pub fn transitions(&self, state: u32) -> Transitions<'_, D> {
        Transitions {
            automaton: self,
            edge: self.states[state as usize].first_edge,
        }
    }

    fn edge_id(&self, state: u32, token: Token) -> Option<u32> {
        let edges = &self.edges;
        self.index
            .find(pair_hash(state, token), |&e| {
                let e = &edges[e as usize];
                e.source == state && e.token == token
            })
            .copied()
    }

    fn add_edge(&mut self, source: u32, token: Token, target: u32) {
        let id = self.edges.len() as u32;
        let next = self.states[source as usize].first_edge;
        self.edges.push(Edge {
            source,
            token,
            target,
            next,
        });
        self.states[source as usize].first_edge = id;
        let edges = &self.edges;
        self.index
            .insert_unique(pair_hash(source, token), id, |&e| {
                let e = &edges[e as usize];
                pair_hash(e.source, e.token)
            });
    }

    fn new_state(&mut self, len: u32, link: u32, data: D) -> u32 {
        self.states.push(State {
            len,
            link,
            first_edge: NONE,
            data,
        });
        (self.states.len() - 1) as u32
    }

    /// Appends `token` to the string whose last state is `last`; returns the new last state.
    /// A new state gets the data `fresh`.
    pub fn append(&mut self, last: u32, token: Token, fresh: D) -> u32 {
        // Another string already went on from here with `token` (generalized use only; with
        // one string the last state has no transitions, and this is the walk's first lookup).
        if let Some(edge) = self.edge_id(last, token) {
            return self.split_if_needed(last, edge, token);
        }
        let cur = self.new_state(self.states[last as usize].len + 1, NONE, fresh);
        self.add_edge(last, token, cur);
        // walk up until a state already continues with `token`
        let mut p = self.states[last as usize].link;
        let mut found = None;
        while p != NONE {
            if let Some(edge) = self.edge_id(p, token) {
                found = Some(edge);
                break;
            }
            self.add_edge(p, token, cur);
            p = self.states[p as usize].link;
        }
        let link = match found {
            None => ROOT_STATE,
            Some(edge) => self.split_if_needed(p, edge, token),
        };
        self.states[cur as usize].link = link;
        cur
    }

    /// The state of `p`'s longest string extended by `token`, where `p` goes on with `token`
    /// through `edge`: the edge's target when it is solid (one token longer than `p`), else a
    /// clone of the target that takes over the shorter strings (the classic split).
    fn split_if_needed(&mut self, mut p: u32, edge: u32, token: Token) -> u32 {
        let q = self.edges[edge as usize].target;
        let (p_len, q_state) = (self.states[p as usize].len, self.states[q as usize]);
        if p_len + 1 == q_state.len {
            return q;
        }
        let clone = self.new_state(p_len + 1, q_state.link, q_state.data);
        let mut e = q_state.first_edge;
        while e != NONE {
            let Edge {
                token,
                target,
                next,
                ..
            } = self.edges[e as usize];
            self.add_edge(clone, token, target);
            e = next;
        }
        // redirect to the clone every transition by `token` into `q` up the suffix links
        let mut redirect = Some(edge);
        while let Some(e) = redirect.filter(|&e| self.edges[e as usize].target == q) {
            self.edges[e as usize].target = clone;
            p = self.states[p as usize].link;
            redirect = if p == NONE {
                None
            } else {
                self.edge_id(p, token)
            };
        }
        self.states[q as usize].link = clone;
        clone
    }

    /// The match of `len` tokens at `state` extended by `token`: the transition when the
    /// extended string is indexed, else the longest shorter suffix that continues with it.
    /// Returns `(state, len)`; `(ROOT_STATE, 0)` when not even `token` alone is indexed.
    pub fn advance(&self, mut state: u32, mut len: u32, token: Token) -> (u32, u32) {
        loop {
            if let Some(next) = self.transition(state, token) {
                return (next, len + 1);
            }
            if state == ROOT_STATE {
                return (ROOT_STATE, 0);
            }
            state = self.states[state as usize].link;
            len = self.states[state as usize].len;
        }
    }
}

/// The transitions of one state, newest first (see [`Automaton::transitions`]).
pub(crate) struct Transitions<'a, D> {
    automaton: &'a Automaton<D>,
    edge: u32,
}

impl<D> Iterator for Transitions<'_, D> {
    type Item = (Token, u32);

    fn next(&mut self) -> Option<Self::Item> {
        if self.edge == NONE {
            return None;
        }
        let e = &self.automaton.edges[self.edge as usize];
        self.edge = e.next;
        Some((e.token, e.target))
    }
}
