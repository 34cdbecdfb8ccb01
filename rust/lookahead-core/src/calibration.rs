//! Online calibration: turns the evidence behind a candidate draft token into the probability
//! that it is accepted, learnt from what engines report back.
//!
//! Evidence is bucketed into a local key (the request's own history: match length, share of
//! the continuation, whether the most recent occurrence continued with it) and a global key
//! (the shared trie: n-gram order, share, count). Each key has a counter of trials and hits;
//! so has each pair. An estimate is a count ratio smoothed toward the level above it: the pair
//! toward the noisy-OR of the two single keys, each single key toward a fixed heuristic. With
//! no feedback at all the heuristic alone decides.
//!
//! Sibling evidence (what the other members of the request's group did after its context:
//! match length, how many agree, out of how many) comes on top, in a second stage: its own key
//! is smoothed toward a heuristic, and the pair (bucketed local-and-global estimate, sibling
//! key) toward the noisy-OR of the two. Without sibling evidence the first stage is the
//! estimate, unchanged.
//!
//! In a cluster every drafter also keeps the counts recorded since they were last taken, for
//! the other drafters to add to theirs ([`Calibration::take_recorded`], [`Calibration::add`]).
//!
//! A last stage, [`crate::realise`], scales the estimates by what they realised at the
//! request's sampling temperature.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::realise;
use crate::snapshot::{Reader, SnapshotError, Writer};
use crate::types::{CalibrationCount, CalibrationCounts, Keys};

/// What the request's own history says about a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LocalEvidence {
    /// Tokens of the longest match of the context in the request's history (> 0).
    pub match_len: u32,
    /// Earlier occurrences of the match followed by the candidate (0: never followed).
    pub occ: u32,
    /// Earlier occurrences of the match.
    pub total: u32,
    /// The most recent earlier occurrence continued with the candidate.
    pub most_recent: bool,
    /// The copy anchor continues with the candidate.
    pub anchored: bool,
}

/// What the shared trie says about a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GlobalEvidence {
    /// Order of the matched n-gram (tokens of context matched, > 0).
    pub depth: u32,
    /// Occurrences of the matched n-gram followed by the candidate (0: not among the top).
    pub count: u32,
    /// Occurrences of the matched n-gram.
    pub total: u32,
}

/// What the other members of the request's group say about a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SiblingEvidence {
    /// Tokens of the longest match of the context that another member continued (> 0).
    pub match_len: u32,
    /// Other members whose text has the match followed by the candidate (0: none).
    pub agree: u32,
    /// Other members whose text continues the match.
    pub total: u32,
}

/// Every kind of evidence; any may be missing.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct Evidence {
    pub local: Option<LocalEvidence>,
    pub global: Option<GlobalEvidence>,
    pub siblings: Option<SiblingEvidence>,
}

const LEN_BUCKETS: usize = 8;
const LOCAL_KEYS: usize = 2 * (1 + LEN_BUCKETS * 9);
const DEPTH_BUCKETS: usize = 7;
const GLOBAL_KEYS: usize = 1 + DEPTH_BUCKETS * 6 * 4;
const AGREE_BUCKETS: usize = 5;
const SIBLING_SHARE_BUCKETS: usize = 4;
const SIBLING_KEYS: usize = 1 + LEN_BUCKETS * AGREE_BUCKETS * SIBLING_SHARE_BUCKETS;
/// Buckets of the first-stage estimate in the second stage.
const BASE_BUCKETS: usize = 16;
/// Pseudo-trials given to the level above when smoothing.
const PRIOR_WEIGHT_SINGLE: f32 = 4.0;
const PRIOR_WEIGHT_PAIR: f32 = 8.0;

fn len_bucket(len: u32) -> usize {
    match len {
        0..=1 => 0,
        2 => 1,
        3 => 2,
        4..=5 => 3,
        6..=8 => 4,
        9..=15 => 5,
        16..=31 => 6,
        _ => 7,
    }
}

fn share_bucket(part: u32, total: u32, edges: &[f32]) -> usize {
    let share = part as f32 / total.max(1) as f32;
    edges.iter().take_while(|&&e| share >= e).count()
}

fn sibling_key(s: &SiblingEvidence) -> usize {
    let agree = match s.agree {
        0 => 0,
        1 => 1,
        2 => 2,
        3..=4 => 3,
        _ => 4,
    };
    let share = share_bucket(s.agree, s.total, &[0.34, 0.67, 0.999]);
    1 + (len_bucket(s.match_len) * AGREE_BUCKETS + agree) * SIBLING_SHARE_BUCKETS + share
}

/// The first-stage bucket keys of some evidence: (local, global).
fn keys(e: &Evidence) -> (u16, u16) {
    let local = e.local.map_or(0, |l| {
        let evidence = if l.occ == 0 {
            0
        } else {
            1 + share_bucket(l.occ, l.total, &[0.25, 0.5, 0.75]) * 2 + usize::from(l.most_recent)
        };
        let key = 1 + len_bucket(l.match_len) * 9 + evidence;
        if l.anchored {
            key + LOCAL_KEYS / 2
        } else {
            key
        }
    });
    let global = e.global.map_or(0, |g| {
        let depth = match g.depth {
            0..=1 => 0,
            2 => 1,
            3 => 2,
            4 => 3,
            5..=6 => 4,
            7..=9 => 5,
            _ => 6,
        };
        let ratio = if g.count == 0 {
            0
        } else {
            1 + share_bucket(g.count, g.total, &[0.1, 0.25, 0.5, 0.75])
        };
        let total = match g.total {
            0..=1 => 0,
            2..=3 => 1,
            4..=15 => 2,
            _ => 3,
        };
        1 + (depth * 6 + ratio) * 4 + total
    });
    (local as u16, global as u16)
}

/// A fixed first guess from local evidence alone: the share of earlier occurrences that went
/// on with the candidate, trusted more for longer matches.
fn local_heuristic(l: &LocalEvidence) -> f32 {
    if l.occ == 0 {
        return if l.anchored { 0.3 } else { 0.01 };
    }
    let share = (l.occ as f32 + if l.most_recent { 0.5 } else { 0.0 }) / (l.total as f32 + 0.5);
    let trust = l.match_len as f32 / (l.match_len as f32 + 1.5);
    (share.min(1.0) * trust).clamp(0.01, 0.95)
}

/// A fixed first guess from sibling evidence alone: the share of the other members that went
/// on with the candidate, trusted more for longer matches.
fn sibling_heuristic(s: &SiblingEvidence) -> f32 {
    if s.agree == 0 {
        return 0.01;
    }
    let share = s.agree as f32 / s.total.max(1) as f32;
    let trust = s.match_len as f32 / (s.match_len as f32 + 1.5);
    (share * trust).clamp(0.01, 0.95)
}

/// A fixed first guess from global evidence alone: the n-gram's continuation share, trusted
/// more for higher orders and more occurrences.
fn global_heuristic(g: &GlobalEvidence) -> f32 {
    if g.count == 0 {
        return 0.01;
    }
    let share = g.count as f32 / (g.total as f32 + 1.0);
    let trust = g.depth as f32 / (g.depth as f32 + 1.0);
    (share * trust).clamp(0.01, 0.95)
}

#[derive(Default)]
struct Counter {
    trials: AtomicU32,
    hits: AtomicU32,
}

impl Counter {
    fn smoothed(&self, prior: f32, weight: f32) -> f32 {
        let trials = self.trials.load(Ordering::Relaxed) as f32;
        let hits = self.hits.load(Ordering::Relaxed) as f32;
        (hits + weight * prior) / (trials + weight)
    }

    fn record(&self, hit: bool) {
        self.add(1, u32::from(hit));
    }

    /// Adds `trials` and `hits` (at most `trials`).
    fn add(&self, trials: u32, hits: u32) {
        // Saturation would bias the ratio; halve both instead (an exponential forgetting).
        let before = self.trials.fetch_add(trials, Ordering::Relaxed);
        if before.saturating_add(trials) > u32::MAX / 2 {
            self.trials
                .store(self.trials.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
            self.hits
                .store(self.hits.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// Takes the counts, leaving zeros.
    fn take(&self) -> (u32, u32) {
        let trials = self.trials.swap(0, Ordering::Relaxed);
        // A record between the two swaps may leave its hit without its trial: never more
        // hits than trials.
        (trials, self.hits.swap(0, Ordering::Relaxed).min(trials))
    }
}

/// Where each table starts when all are counted in turn (as [`CalibrationCounts`] do).
const LOCAL_AT: usize = 0;
const GLOBAL_AT: usize = LOCAL_AT + LOCAL_KEYS;
const PAIR_AT: usize = GLOBAL_AT + GLOBAL_KEYS;
const SIBLING_AT: usize = PAIR_AT + LOCAL_KEYS * GLOBAL_KEYS;
const COMBINED_AT: usize = SIBLING_AT + SIBLING_KEYS;
const REALISED_AT: usize = COMBINED_AT + BASE_BUCKETS * SIBLING_KEYS;
/// Counters in all tables: the layout [`CalibrationCounts`] must have to apply here.
const COUNTERS: usize = REALISED_AT + realise::CELLS;
/// The most trials one count may add (counts of one counter above it are refused).
const MAX_ADDED_TRIALS: u32 = u32::MAX / 4;

/// Why calibration counts cannot be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CountsError {
    /// Taken from tables of another layout (another build).
    Layout,
    /// A counter index out of range, more hits than trials, or too many trials.
    Count,
}

/// The learnt tables. Lock-free: concurrent updates may interleave, which only blurs counts.
pub(crate) struct Calibration {
    local: Box<[Counter]>,
    global: Box<[Counter]>,
    pair: Box<[Counter]>,
    sibling: Box<[Counter]>,
    /// Second stage: (first-stage bucket, sibling key).
    combined: Box<[Counter]>,
    /// Counts recorded since last taken, every table's in turn (in a cluster only).
    recorded: Option<Box<[Counter]>>,
    /// The last stage, by temperature: what the estimates realised ([`crate::realise`]).
    realised: Box<[Counter]>,
}

fn table(n: usize) -> Box<[Counter]> {
    (0..n).map(|_| Counter::default()).collect()
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            local: table(LOCAL_KEYS),
            global: table(GLOBAL_KEYS),
            pair: table(LOCAL_KEYS * GLOBAL_KEYS),
            sibling: table(SIBLING_KEYS),
            combined: table(BASE_BUCKETS * SIBLING_KEYS),
            recorded: None,
            realised: table(realise::CELLS),
        }
    }
}

/// 1 - (1 - a)(1 - b): the probability that either of two independent signals is right.
fn noisy_or(a: f32, b: f32) -> f32 {
    1.0 - (1.0 - a) * (1.0 - b)
}

impl Calibration {
    fn tables(&self) -> [&[Counter]; 6] {
        [
            &self.local,
            &self.global,
            &self.pair,
            &self.sibling,
            &self.combined,
            &self.realised,
        ]
    }

    /// Heap bytes of the tables.
    pub fn heap_bytes(&self) -> usize {
        let recorded = self.recorded.as_ref().map_or(0, |r| r.len());
        (COUNTERS + recorded) * size_of::<Counter>()
    }

    /// The same tables, also keeping the counts recorded from now on for
    /// [`Self::take_recorded`].
    pub fn recording(mut self) -> Self {
        self.recorded = Some(table(COUNTERS));
        self
    }

    /// The counts recorded since the last call (with [`Self::recording`]), `None` if none.
    pub fn take_recorded(&self) -> Option<CalibrationCounts> {
        let recorded = self.recorded.as_ref()?;
        let counts: Vec<CalibrationCount> = recorded
            .iter()
            .enumerate()
            .filter(|(_, c)| c.trials.load(Ordering::Relaxed) > 0)
            .map(|(index, c)| {
                let (trials, hits) = c.take();
                CalibrationCount {
                    index: index as u32,
                    trials,
                    hits,
                }
            })
            .filter(|c| c.trials > 0)
            .collect();
        (!counts.is_empty()).then_some(CalibrationCounts {
            layout: COUNTERS as u32,
            counts,
        })
    }

    /// Adds counts another drafter recorded (not recorded here again). Checked whole first:
    /// refused counts change nothing.
    pub fn add(&self, counts: &CalibrationCounts) -> Result<(), CountsError> {
        if counts.layout as usize != COUNTERS {
            return Err(CountsError::Layout);
        }
        let valid = |c: &CalibrationCount| {
            (c.index as usize) < COUNTERS && c.hits <= c.trials && c.trials <= MAX_ADDED_TRIALS
        };
        if !counts.counts.iter().all(valid) {
            return Err(CountsError::Count);
        }
        for c in &counts.counts {
            self.counter(c.index as usize).add(c.trials, c.hits);
        }
        Ok(())
    }

    /// Counter `index` of all tables in turn.
    fn counter(&self, mut index: usize) -> &Counter {
        for table in self.tables() {
            if index < table.len() {
                return &table[index];
            }
            index -= table.len();
        }
        unreachable!("counter index checked against COUNTERS")
    }

    /// Probability that a candidate with this evidence is accepted given its parent is, and
    /// the keys to record its outcome under.
    pub fn estimate(&self, e: &Evidence) -> (f32, Keys) {
        let (lk, gk) = keys(e);
        let p_local = e.local.map_or(0.0, |l| {
            self.local[lk as usize].smoothed(local_heuristic(&l), PRIOR_WEIGHT_SINGLE)
        });
        let p_global = e.global.map_or(0.0, |g| {
            self.global[gk as usize].smoothed(global_heuristic(&g), PRIOR_WEIGHT_SINGLE)
        });
        let prior = noisy_or(p_local, p_global);
        let base =
            self.pair[lk as usize * GLOBAL_KEYS + gk as usize].smoothed(prior, PRIOR_WEIGHT_PAIR);
        let mut keys = Keys {
            local: lk,
            global: gk,
            ..Keys::default()
        };
        let Some(s) = &e.siblings else {
            return (base, keys);
        };
        let sk = sibling_key(s);
        let p_sibling = self.sibling[sk].smoothed(sibling_heuristic(s), PRIOR_WEIGHT_SINGLE);
        let bucket = ((base * BASE_BUCKETS as f32) as usize).min(BASE_BUCKETS - 1);
        keys.sibling = sk as u16;
        keys.base = bucket as u8;
        let p = self.combined[bucket * SIBLING_KEYS + sk]
            .smoothed(noisy_or(base, p_sibling), PRIOR_WEIGHT_PAIR);
        (p, keys)
    }

    /// Writes every counter to a snapshot.
    pub fn encode(&self, w: &mut Writer) {
        for table in self.tables() {
            w.len(table.len());
            for c in table.iter() {
                w.u32(c.trials.load(Ordering::Relaxed));
                w.u32(c.hits.load(Ordering::Relaxed));
            }
        }
    }

    /// Reads counters written by [`Self::encode`]; table sizes must match this build's.
    /// Snapshots of format 1 have no sibling tables, those before format 4 no realisation
    /// table: those start empty.
    pub fn decode(r: &mut Reader<'_>, version: u32) -> Result<Self, SnapshotError> {
        let cal = Self::default();
        let tables = match version {
            1 => 3,
            2..=3 => 5,
            _ => 6,
        };
        for table in cal.tables().into_iter().take(tables) {
            if r.len(8)? != table.len() {
                return Err(SnapshotError::Corrupt("calibration table size"));
            }
            for c in table.iter() {
                let (trials, hits) = (r.u32()?, r.u32()?);
                if hits > trials {
                    return Err(SnapshotError::Corrupt("calibration hits above trials"));
                }
                c.trials.store(trials, Ordering::Relaxed);
                c.hits.store(hits, Ordering::Relaxed);
            }
        }
        Ok(cal)
    }

    /// A draft node's conditional probability, predicted at `predicted`, as realised in its
    /// cell ([`crate::realise`]).
    pub fn realised(&self, cell: u16, predicted: f32) -> f32 {
        let c = &self.realised[cell as usize];
        let trials = c.trials.load(Ordering::Relaxed) as f32;
        let hits = c.hits.load(Ordering::Relaxed) as f32;
        realise::adjust(cell, predicted, trials, hits)
    }

    /// Records whether a draft node of realisation cell `cell` was realised.
    pub fn record_realised(&self, cell: u16, hit: bool) {
        self.count(&self.realised, REALISED_AT, cell as usize, hit);
    }

    /// Counts an outcome in `table` (at `offset` among all tables), and for the cluster.
    fn count(&self, table: &[Counter], offset: usize, i: usize, hit: bool) {
        table[i].record(hit);
        if let Some(recorded) = &self.recorded {
            recorded[offset + i].record(hit);
        }
    }

    /// Records whether a candidate with these keys was accepted.
    pub fn record(&self, keys: Keys, hit: bool) {
        let count = |table: &[Counter], offset: usize, i: usize| self.count(table, offset, i, hit);
        let (lk, gk) = (keys.local as usize, keys.global as usize);
        if lk != 0 {
            count(&self.local, LOCAL_AT, lk);
        }
        if gk != 0 {
            count(&self.global, GLOBAL_AT, gk);
        }
        count(&self.pair, PAIR_AT, lk * GLOBAL_KEYS + gk);
        if keys.sibling != 0 {
            let sk = keys.sibling as usize;
            count(&self.sibling, SIBLING_AT, sk);
            count(
                &self.combined,
                COMBINED_AT,
                keys.base as usize * SIBLING_KEYS + sk,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_from_feedback() {
        let cal = Calibration::default();
        let e = Evidence {
            local: Some(LocalEvidence {
                match_len: 3,
                occ: 1,
                total: 1,
                most_recent: true,
                anchored: false,
            }),
            global: None,
            siblings: None,
        };
        let (before, keys) = cal.estimate(&e);
        for _ in 0..200 {
            cal.record(keys, false);
        }
        let (after, _) = cal.estimate(&e);
        assert!(after < before / 5.0, "{before} -> {after}");
    }

    #[test]
    fn keys_are_in_range() {
        let l = LocalEvidence {
            match_len: 1000,
            occ: 5,
            total: 5,
            most_recent: true,
            anchored: true,
        };
        let g = GlobalEvidence {
            depth: 64,
            count: 9,
            total: 9,
        };
        let s = SiblingEvidence {
            match_len: 1000,
            agree: 70,
            total: 64,
        };
        let e = Evidence {
            local: Some(l),
            global: Some(g),
            siblings: Some(s),
        };
        let (_, k) = Calibration::default().estimate(&e);
        assert!((k.local as usize) < LOCAL_KEYS && (k.global as usize) < GLOBAL_KEYS);
        assert!((k.sibling as usize) < SIBLING_KEYS && (k.base as usize) < BASE_BUCKETS);
    }
}
