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
//! drafts cut to zero length still teach it. Its counters are a table of the calibration
//! (in snapshots from format 4, and sent to the other drafters of a cluster).

use crate::types::Keys;

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
/// Cells of the realisation table.
pub(crate) const CELLS: usize = TEMPERATURE_BANDS * SOURCES * DEPTH_BUCKETS * PREDICTED_BANDS;
/// Pseudo-trials at the band's prediction a cell starts from (the evidence stage is trusted).
const PRIOR_WEIGHT: f32 = 8.0;
/// The most any conditional probability is scaled to.
const MAX_CONDITIONAL: f32 = 0.99;

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

/// Representative predicted probability of each predicted band: a cell's realised rate is
/// compared with it.
const BAND_MIDS: [f32; PREDICTED_BANDS] = [0.05, 0.15, 0.275, 0.425, 0.575, 0.725, 0.85, 0.95];

/// The conditional probability of a node of `cell` predicted at `predicted`, scaled by the
/// cell's realised rate (`hits` of `trials`) against its band's prediction.
pub(crate) fn adjust(cell: u16, predicted: f32, trials: f32, hits: f32) -> f32 {
    let mid = BAND_MIDS[cell as usize % PREDICTED_BANDS];
    let realised = (hits + PRIOR_WEIGHT * mid) / (trials + PRIOR_WEIGHT);
    (predicted * realised / mid).clamp(0.0, MAX_CONDITIONAL.max(predicted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_bands_have_their_own_cells() {
        let greedy = cell(temperature_band(0.0), Source::Own, 1, 0.7);
        let hot = cell(temperature_band(1.0), Source::Own, 1, 0.7);
        assert_ne!(greedy, hot);
        // 90% realised against 20%, over 400 trials each
        let (g, h) = (
            adjust(greedy, 0.7, 400.0, 360.0),
            adjust(hot, 0.7, 400.0, 80.0),
        );
        assert!(g > 0.85 && g <= MAX_CONDITIONAL, "greedy {g}");
        assert!((h - 0.7 * 0.2 / 0.725).abs() < 0.02, "hot {h}");
    }

    #[test]
    fn unlearnt_cells_keep_the_prediction() {
        let c = cell(2, Source::Shared, 7, 0.3);
        assert!((adjust(c, 0.3, 0.0, 0.0) - 0.3).abs() < 1e-6);
    }

    #[test]
    fn cells_are_in_range() {
        let c = cell(TEMPERATURE_BANDS - 1, Source::Shared, 1000, 1.0);
        assert_eq!(c as usize, CELLS - 1);
    }
}
