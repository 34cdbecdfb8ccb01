//! Realised acceptance: the last stage of calibration, by sampling temperature.
//!
//! The evidence tables ([`crate::calibration`]) estimate how likely a token is to come next
//! whatever the engine samples with. What an engine accepts depends on its temperature: a
//! greedy engine accepts a draft token when it is the argmax, a sampling one with the target's
//! probability of it, so the same evidence is worth less at temperature 1. This stage learns,
//! per temperature band, draft source, depth and predicted band, how many of the tokens
//! predicted were realised, and scales each node's conditional probability by that ratio.
//!
//! Recorded from the true tokens that follow a draft, for every node whose parent path they
//! confirm: what the model produced is known whether or not the engine verified the node, so
//! drafts cut to zero length still teach it. Kept in snapshots (format 4 on); not sent to a
//! cluster, where each drafter learns it from its own engines.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::calibration::Keys;
use crate::snapshot::{Reader, SnapshotError, Writer};

/// Where a draft node's evidence came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The request's own prompt and output.
    Own = 0,
    /// Other members of its group.
    Siblings = 1,
    /// The shared trie only.
    Shared = 2,
}

impl Source {
    /// The source of a candidate with these calibration keys.
    pub fn of(keys: &Keys) -> Self {
        if keys.sibling != 0 {
            Self::Siblings
        } else if keys.local != 0 {
            Self::Own
        } else {
            Self::Shared
        }
    }
}

const TEMPERATURE_BANDS: usize = 4;
const SOURCES: usize = 3;
const DEPTH_BUCKETS: usize = 6;
/// Upper edges of the predicted-probability bands (the last band is open).
const PREDICTED_EDGES: [f32; 7] = [0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9];
const PREDICTED_BANDS: usize = PREDICTED_EDGES.len() + 1;
const CELLS: usize = TEMPERATURE_BANDS * SOURCES * DEPTH_BUCKETS * PREDICTED_BANDS;
/// Predicted acceptances a cell's ratio starts from (at 1: the evidence stage is trusted).
const PRIOR_WEIGHT: f64 = 4.0;
/// The most any conditional probability is scaled to.
const MAX_CONDITIONAL: f32 = 0.99;
/// Fixed-point scale of the predicted sums.
const SCALE: f64 = 1e4;

/// The temperature band of a sampling temperature: greedy, low, medium, high.
pub(crate) fn temperature_band(temperature: f32) -> usize {
    match temperature {
        t if t <= 1e-5 => 0,
        t if t < 0.5 => 1,
        t if t < 0.9 => 2,
        _ => 3,
    }
}

/// The table cell of a node.
pub(crate) fn cell(band: usize, source: Source, depth: usize, predicted: f32) -> u16 {
    let depth = match depth {
        0..=1 => 0,
        2 => 1,
        3 => 2,
        4..=5 => 3,
        6..=8 => 4,
        _ => 5,
    };
    let predicted = PREDICTED_EDGES
        .iter()
        .take_while(|&&e| predicted >= e)
        .count();
    (((band * SOURCES + source as usize) * DEPTH_BUCKETS + depth) * PREDICTED_BANDS + predicted)
        as u16
}

#[derive(Default)]
struct Cell {
    hits: AtomicU32,
    /// Sum of the predicted probabilities recorded, times [`SCALE`].
    predicted: AtomicU64,
}

/// The realised-to-predicted ratios. Lock-free: concurrent records only blur counts.
pub(crate) struct Realisation {
    cells: Box<[Cell]>,
}

impl Default for Realisation {
    fn default() -> Self {
        Self {
            cells: (0..CELLS).map(|_| Cell::default()).collect(),
        }
    }
}

impl Realisation {
    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.cells.len() * size_of::<Cell>()
    }

    /// The conditional probability of a node in `cell` predicted at `predicted`, scaled by
    /// what that cell realised.
    pub fn adjust(&self, cell: u16, predicted: f32) -> f32 {
        let c = &self.cells[cell as usize];
        let hits = f64::from(c.hits.load(Ordering::Relaxed));
        let predicted_sum = c.predicted.load(Ordering::Relaxed) as f64 / SCALE;
        let ratio = (hits + PRIOR_WEIGHT) / (predicted_sum + PRIOR_WEIGHT);
        (predicted * ratio as f32).clamp(0.0, MAX_CONDITIONAL.max(predicted))
    }

    /// Writes every cell to a snapshot.
    pub fn encode(&self, w: &mut Writer) {
        w.len(self.cells.len());
        for c in self.cells.iter() {
            w.u32(c.hits.load(Ordering::Relaxed));
            w.u64(c.predicted.load(Ordering::Relaxed));
        }
    }

    /// Reads cells written by [`Self::encode`]; the table size must match this build's.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, SnapshotError> {
        let realisation = Self::default();
        if r.len(12)? != realisation.cells.len() {
            return Err(SnapshotError::Corrupt("realisation table size"));
        }
        for c in realisation.cells.iter() {
            c.hits.store(r.u32()?, Ordering::Relaxed);
            c.predicted.store(r.u64()?, Ordering::Relaxed);
        }
        Ok(realisation)
    }

    /// Records that a node of `cell` predicted at `predicted` was (`hit`) or was not realised.
    pub fn record(&self, cell: u16, predicted: f32, hit: bool) {
        let c = &self.cells[cell as usize];
        // Halve both once large, so the ratio follows a drifting engine and never overflows.
        let before = c
            .predicted
            .fetch_add((f64::from(predicted) * SCALE) as u64, Ordering::Relaxed);
        if before > (1u64 << 40) {
            c.predicted.store(before / 2, Ordering::Relaxed);
            c.hits
                .store(c.hits.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        }
        if hit {
            c.hits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_bands_are_learnt_apart() {
        let r = Realisation::default();
        let greedy = cell(temperature_band(0.0), Source::Own, 1, 0.7);
        let hot = cell(temperature_band(1.0), Source::Own, 1, 0.7);
        assert_ne!(greedy, hot);
        for i in 0..400 {
            r.record(greedy, 0.7, i % 10 != 0); // 90% realised
            r.record(hot, 0.7, i % 5 == 0); // 20% realised
        }
        let (g, h) = (r.adjust(greedy, 0.7), r.adjust(hot, 0.7));
        assert!((g - 0.89).abs() < 0.05, "greedy {g}");
        assert!((h - 0.2).abs() < 0.05, "hot {h}");
    }

    #[test]
    fn unlearnt_cells_keep_the_prediction() {
        let r = Realisation::default();
        let c = cell(2, Source::Shared, 7, 0.3);
        assert!((r.adjust(c, 0.3) - 0.3).abs() < 1e-6);
    }

    #[test]
    fn cells_are_in_range() {
        let c = cell(TEMPERATURE_BANDS - 1, Source::Shared, 1000, 1.0);
        assert_eq!(c as usize, CELLS - 1);
    }
}
