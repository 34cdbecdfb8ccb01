//! Draft lengths chosen by expected value against the engine's cost.
//!
//! An engine step verifies `base` tokens without drafts (one per decoding request, plus any
//! prefill) and emits one token per decoding request; every draft node it also verifies adds
//! its acceptance probability (the node's calibrated path score) to the tokens emitted and
//! its slot to the tokens verified. The step's seconds as a function of the tokens it verifies
//! is the engine's [`CostCurve`], measured by the client. The choice maximises expected tokens
//! emitted per second of the step:
//!
//! * [`Layout::Ragged`] (vLLM): every request its own length. Scores never increase along a
//!   path, so each request's marginal gains are non-increasing and the best `m` draft tokens
//!   of the batch are the `m` highest scores; the best `m` is found by one scan.
//! * [`Layout::Padded`] (the Hugging Face loop, SGLang): one width for every row, since every
//!   row pays for the widest one.
//!
//! Zero draft tokens is always a candidate: where drafting does not pay, plain decoding wins.
//! Every `explore_every`-th step draws a little beyond the best choice, so the curve stays
//! measured at the sizes it chooses among.

use std::cmp::Ordering;

use thiserror::Error;

/// How an engine lays out the draft tokens of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Every request verifies its own number of draft tokens.
    #[default]
    Ragged,
    /// Every request verifies as many slots as the widest one.
    Padded,
}

/// An engine's step time as a function of the tokens it verifies: piecewise linear between
/// measured points, linear beyond the last.
///
/// Invariants (checked by [`CostCurve::new`]): at least one point; token counts strictly
/// increasing and at least 1; seconds finite, positive and non-decreasing.
#[derive(Clone, Debug, PartialEq)]
pub struct CostCurve {
    tokens: Vec<u32>,
    seconds: Vec<f64>,
}

/// Why a cost curve or step cost is refused. Each names the request field at fault.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum CostError {
    /// No point given.
    #[error("cost.tokens is empty: a curve needs at least one (tokens, seconds) point")]
    Empty,
    /// `tokens` and `seconds` differ in length.
    #[error("cost.tokens has {tokens} entries but cost.seconds has {seconds}")]
    Lengths {
        /// Entries of `tokens`.
        tokens: usize,
        /// Entries of `seconds`.
        seconds: usize,
    },
    /// Token counts are not strictly increasing from 1.
    #[error("cost.tokens[{index}] = {value} must be >= 1 and above the entry before it")]
    Tokens {
        /// Position of the bad entry.
        index: usize,
        /// Its value.
        value: u32,
    },
    /// A time is not finite and positive, or smaller than the one before it.
    #[error(
        "cost.seconds[{index}] = {value} must be finite, > 0 and not below the entry before it"
    )]
    Seconds {
        /// Position of the bad entry.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// The acceptance scale is not finite and >= 0.
    #[error("cost.acceptance = {0} must be finite and >= 0 (0: the scores as they are)")]
    Acceptance(f64),
}

impl CostError {
    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Empty | Self::Tokens { .. } => "cost.tokens",
            Self::Lengths { .. } | Self::Seconds { .. } => "cost.seconds",
            Self::Acceptance(_) => "cost.acceptance",
        }
    }
}

impl CostCurve {
    /// A curve through `(tokens[i], seconds[i])`; see the type's invariants.
    pub fn new(tokens: Vec<u32>, seconds: Vec<f64>) -> Result<Self, CostError> {
        if tokens.is_empty() {
            return Err(CostError::Empty);
        }
        if tokens.len() != seconds.len() {
            return Err(CostError::Lengths {
                tokens: tokens.len(),
                seconds: seconds.len(),
            });
        }
        for (index, pair) in tokens.windows(2).enumerate() {
            if pair[1] <= pair[0] {
                return Err(CostError::Tokens {
                    index: index + 1,
                    value: pair[1],
                });
            }
        }
        if tokens[0] == 0 {
            return Err(CostError::Tokens { index: 0, value: 0 });
        }
        let mut before = 0.0;
        for (index, &value) in seconds.iter().enumerate() {
            if !(value.is_finite() && value > 0.0 && value >= before) {
                return Err(CostError::Seconds { index, value });
            }
            before = value;
        }
        Ok(Self { tokens, seconds })
    }

    /// A curve on which every size costs the same: drafting whole caps always pays.
    pub fn flat() -> Self {
        Self {
            tokens: vec![1],
            seconds: vec![1.0],
        }
    }

    /// Predicted seconds of a step verifying `tokens` tokens.
    pub fn seconds(&self, tokens: f64) -> f64 {
        let (t, s) = (&self.tokens, &self.seconds);
        let n = t.len();
        if n == 1 {
            return s[0];
        }
        // the segment holding `tokens` (the first or last one beyond the ends)
        let upper = t
            .partition_point(|&x| f64::from(x) < tokens)
            .clamp(1, n - 1);
        let (t0, t1) = (f64::from(t[upper - 1]), f64::from(t[upper]));
        let slope = (s[upper] - s[upper - 1]) / (t1 - t0);
        let value = s[upper - 1] + slope * (tokens - t0);
        value.max(s[0].min(s[upper - 1]))
    }
}

/// What a step's drafts cost: the curve, the layout, and what the step holds without drafts.
#[derive(Clone, Debug, PartialEq)]
pub struct StepCost {
    /// The engine's step time by tokens verified.
    pub curve: CostCurve,
    /// Ragged or padded verification.
    pub layout: Layout,
    /// Tokens the step verifies without any draft (0: one per item of the step).
    pub base_tokens: u32,
    /// Every this many costed steps, draft a little beyond the best choice (0: never).
    pub explore_every: u32,
    /// What the engine measured of the scores: accepted over expected draft tokens on its
    /// recent steps. Sizing weighs every score by it (1: the scores as they are).
    pub acceptance: f64,
}

impl StepCost {
    /// A step's cost from its parts as the proto's `EngineCost` carries them (`padded`: every
    /// row verifies as many slots as the widest; `acceptance` 0: 1); the curve checked as
    /// [`CostCurve::new`] does.
    pub fn new(
        tokens: Vec<u32>,
        seconds: Vec<f64>,
        padded: bool,
        base_tokens: u32,
        explore_every: u32,
        acceptance: f64,
    ) -> Result<Self, CostError> {
        if !(acceptance.is_finite() && acceptance >= 0.0) {
            return Err(CostError::Acceptance(acceptance));
        }
        Ok(Self {
            curve: CostCurve::new(tokens, seconds)?,
            layout: if padded {
                Layout::Padded
            } else {
                Layout::Ragged
            },
            base_tokens,
            explore_every,
            acceptance: if acceptance == 0.0 { 1.0 } else { acceptance },
        })
    }
}

/// Expected tokens per second of a step emitting `emitted` tokens while verifying `tokens`.
fn rate(curve: &CostCurve, emitted: f64, tokens: f64) -> f64 {
    emitted / curve.seconds(tokens)
}

/// The number of draft tokens each request verifies, given each request's node scores in
/// best-first order (non-increasing; the k-th is the expected gain of its k-th token).
///
/// `base` is the tokens verified (and emitted) without drafts; `explore` draws one step
/// beyond the best choice (ragged: the batch's next-best token, so a full batch explores one
/// size further, not one token per request; padded: one wider).
pub fn choose(
    gains: &[&[f32]],
    curve: &CostCurve,
    layout: Layout,
    base: u32,
    explore: bool,
) -> Vec<usize> {
    let base = f64::from(base.max(1));
    match layout {
        Layout::Ragged => choose_ragged(gains, curve, base, explore),
        Layout::Padded => choose_padded(gains, curve, base, explore),
    }
}

fn choose_ragged(gains: &[&[f32]], curve: &CostCurve, base: f64, explore: bool) -> Vec<usize> {
    // every draft token of the batch, best first; a request's own tokens stay in order
    let mut order: Vec<(f32, usize, usize)> = gains
        .iter()
        .enumerate()
        .flat_map(|(r, g)| g.iter().enumerate().map(move |(k, &v)| (v, r, k)))
        .collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let (mut best, mut best_rate) = (0, rate(curve, base, base));
    let mut emitted = base;
    for (m, &(gain, ..)) in order.iter().enumerate() {
        emitted += f64::from(gain.max(0.0));
        let r = rate(curve, emitted, base + (m + 1) as f64);
        if r.partial_cmp(&best_rate) == Some(Ordering::Greater) {
            (best, best_rate) = (m + 1, r);
        }
    }
    let kept = if explore {
        (best + 1).min(order.len())
    } else {
        best
    };
    let mut lengths = vec![0; gains.len()];
    for &(_, r, k) in &order[..kept] {
        lengths[r] = lengths[r].max(k + 1);
    }
    lengths
}

fn choose_padded(gains: &[&[f32]], curve: &CostCurve, base: f64, explore: bool) -> Vec<usize> {
    let widest = gains.iter().map(|g| g.len()).max().unwrap_or(0);
    let (mut best, mut best_rate) = (0, rate(curve, base, base));
    let mut emitted = base;
    for w in 1..=widest {
        emitted += gains
            .iter()
            .filter_map(|g| g.get(w - 1))
            .map(|&v| f64::from(v.max(0.0)))
            .sum::<f64>();
        let r = rate(curve, emitted, base * (1 + w) as f64);
        if r.partial_cmp(&best_rate) == Some(Ordering::Greater) {
            (best, best_rate) = (w, r);
        }
    }
    if explore {
        best = (best + 1).min(widest);
    }
    gains.iter().map(|g| best.min(g.len())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn linear(per_token: f64) -> CostCurve {
        CostCurve::new(vec![1, 1000], vec![1.0, 1.0 + 999.0 * per_token]).unwrap()
    }

    #[test]
    fn drafting_never_pays_gives_nothing() {
        // every verified token costs a whole step: a draft token worth < 1 loses
        let curve = CostCurve::new(vec![1, 2], vec![1.0, 2.0]).unwrap();
        let gains: [&[f32]; 2] = [&[0.9, 0.8], &[0.5]];
        for layout in [Layout::Ragged, Layout::Padded] {
            assert_eq!(choose(&gains, &curve, layout, 2, false), vec![0, 0]);
        }
    }

    #[test]
    fn flat_curve_gives_whole_caps() {
        let gains: [&[f32]; 2] = [&[0.9, 0.8, 0.1], &[0.5]];
        let flat = CostCurve::flat();
        assert_eq!(choose(&gains, &flat, Layout::Ragged, 2, false), vec![3, 1]);
        assert_eq!(choose(&gains, &flat, Layout::Padded, 2, false), vec![3, 1]);
    }

    #[test]
    fn ragged_keeps_the_best_tokens_of_the_batch() {
        // a token costs 0.3 of a step: only gains above about 0.3 pay
        let gains: [&[f32]; 2] = [&[0.9, 0.8, 0.2], &[0.6, 0.1]];
        assert_eq!(
            choose(&gains, &linear(0.3), Layout::Ragged, 2, false),
            vec![2, 1]
        );
    }

    #[test]
    fn exploration_draws_beyond_the_best() {
        let curve = CostCurve::new(vec![1, 2], vec![1.0, 2.0]).unwrap();
        let gains: [&[f32]; 2] = [&[0.9, 0.8], &[0.5]];
        // ragged: the batch's next-best token only (one size further), not one per request
        assert_eq!(choose(&gains, &curve, Layout::Ragged, 2, true), vec![1, 0]);
        assert_eq!(choose(&gains, &curve, Layout::Padded, 2, true), vec![1, 1]);
        // beyond a choice: one token more in all, wherever the next-best one is
        let pays = linear(0.3);
        let gains: [&[f32]; 3] = [&[0.9, 0.8, 0.2], &[0.6, 0.25], &[0.1]];
        assert_eq!(
            choose(&gains, &pays, Layout::Ragged, 3, false),
            vec![2, 0, 0]
        );
        assert_eq!(
            choose(&gains, &pays, Layout::Ragged, 3, true),
            vec![2, 1, 0]
        );
        // every token already chosen: nothing further to draw
        let flat = CostCurve::flat();
        assert_eq!(
            choose(&gains, &flat, Layout::Ragged, 3, true),
            vec![3, 2, 1]
        );
    }

    #[test]
    fn bad_curves_are_refused_naming_the_field() {
        let err = CostCurve::new(vec![1, 2], vec![2.0, 1.0]).unwrap_err();
        assert_eq!(err.field(), "cost.seconds");
        let err = CostCurve::new(vec![1, 2], vec![f64::NAN, 1.0]).unwrap_err();
        assert_eq!(err.field(), "cost.seconds");
        let err = CostCurve::new(vec![2, 2], vec![1.0, 1.0]).unwrap_err();
        assert_eq!(err.field(), "cost.tokens");
        assert_eq!(CostCurve::new(vec![], vec![]), Err(CostError::Empty));
        assert!(CostCurve::new(vec![0], vec![1.0]).is_err());
        assert!(CostCurve::new(vec![1], vec![-1.0]).is_err());
    }

    #[test]
    fn curve_interpolates_and_extrapolates() {
        let c = CostCurve::new(vec![1, 3], vec![1.0, 2.0]).unwrap();
        assert!((c.seconds(2.0) - 1.5).abs() < 1e-9);
        assert!((c.seconds(5.0) - 3.0).abs() < 1e-9);
        assert!((c.seconds(0.0) - 1.0).abs() < 1e-9);
    }

    /// Every length vector within the requests' caps.
    fn all_lengths(gains: &[&[f32]]) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new()];
        for g in gains {
            out = out
                .into_iter()
                .flat_map(|prefix| {
                    (0..=g.len()).map(move |n| {
                        let mut v = prefix.clone();
                        v.push(n);
                        v
                    })
                })
                .collect();
        }
        out
    }

    fn sorted_gains() -> impl Strategy<Value = Vec<Vec<f32>>> {
        prop::collection::vec(prop::collection::vec(0.0f32..1.0, 0..6), 1..5).prop_map(|mut v| {
            for g in &mut v {
                g.sort_by(|a, b| b.total_cmp(a));
            }
            v
        })
    }

    proptest! {
        /// The choice is never worse than plain decoding, never above a cap, and no other
        /// length vector of the same layout does better (brute force over small batches).
        #[test]
        fn choice_is_optimal(gains in sorted_gains(), per_token in 0.0f64..1.5) {
            let curve = linear(per_token);
            let refs: Vec<&[f32]> = gains.iter().map(Vec::as_slice).collect();
            let base = refs.len() as u32;
            let value = |lengths: &[usize], tokens: f64| {
                let emitted: f64 = f64::from(base) + lengths.iter().zip(&refs)
                    .map(|(&n, g)| g[..n].iter().map(|&v| f64::from(v)).sum::<f64>())
                    .sum::<f64>();
                emitted / curve.seconds(tokens)
            };
            let ragged = choose(&refs, &curve, Layout::Ragged, base, false);
            let ragged_tokens = f64::from(base) + ragged.iter().sum::<usize>() as f64;
            let best = value(&ragged, ragged_tokens);
            prop_assert!(best >= value(&vec![0; refs.len()], f64::from(base)) - 1e-9);
            for (n, g) in ragged.iter().zip(&refs) {
                prop_assert!(*n <= g.len());
            }
            for lengths in all_lengths(&refs) {
                let tokens = f64::from(base) + lengths.iter().sum::<usize>() as f64;
                prop_assert!(value(&lengths, tokens) <= best + 1e-9);
            }
            // exploring keeps one token of the batch more than the choice, where one is left
            let explored = choose(&refs, &curve, Layout::Ragged, base, true);
            let total: usize = refs.iter().map(|g| g.len()).sum();
            let chosen: usize = ragged.iter().sum();
            prop_assert_eq!(explored.iter().sum::<usize>(), (chosen + 1).min(total));
            for (e, n) in explored.iter().zip(&ragged) {
                prop_assert!(e >= n);
            }
            let padded = choose(&refs, &curve, Layout::Padded, base, false);
            let width = padded.iter().copied().max().unwrap_or(0);
            for w in 0..=refs.iter().map(|g| g.len()).max().unwrap_or(0) {
                let lengths: Vec<usize> = refs.iter().map(|g| w.min(g.len())).collect();
                let tokens = f64::from(base) * (1 + w) as f64;
                let chosen_tokens = f64::from(base) * (1 + width) as f64;
                prop_assert!(value(&lengths, tokens) <= value(&padded, chosen_tokens) + 1e-9);
            }
        }
    }
}
