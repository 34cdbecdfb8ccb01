//! The copy anchor: where in its own history a request is copying from.
//!
//! Answers that copy their prompt (code edits, quotes) leave the copy for a few tokens (an
//! inserted type hint, a replaced word) and then come back to it. A suffix match is lost at
//! each such edit and found again only once enough copied tokens follow it; the anchor keeps
//! the position instead: it advances while the output copies, stays put across an insertion,
//! and jumps a few tokens ahead across a replacement, so the next draft can resume the copy
//! at once.
//!
//! Invariant: `position < text.len() - 1`, i.e. the anchor's continuation
//! `text[position + 1]` is known text, never the token being drafted from.

use crate::Token;
use crate::suffix_automaton::SuffixAutomaton;

/// Tokens ahead of the anchor searched for a resumed copy after a replacement.
const RESYNC_WINDOW: usize = 16;
/// Tokens compared to tell whether the anchor agrees with the suffix match.
const CONSISTENCY_TAIL: usize = 16;
/// A suffix match at least this long re-anchors to its occurrence.
const REANCHOR_MATCH: u32 = 4;

/// A position in the request's text aligned with its last token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Anchor {
    position: Option<u32>,
}

impl Anchor {
    /// The aligned position, when there is one whose continuation is known.
    pub fn position(&self, text_len: usize) -> Option<u32> {
        self.position
            .filter(|&p| (p as usize) + 1 < text_len.saturating_sub(1))
    }

    /// Follows tokens just appended to `sam` (the last `appended` tokens of its text).
    pub fn follow(&mut self, sam: &SuffixAutomaton, appended: usize) {
        let text = sam.text();
        let first_new = text.len() - appended;
        for (i, &token) in text.iter().enumerate().skip(first_new) {
            if let Some(p) = self.position {
                self.position = resync(&text[..i], p as usize, token);
            }
        }
        let m = sam.longest_earlier_suffix();
        if m.len >= REANCHOR_MATCH {
            // Compare a bounded tail only: an append must not cost the match's length.
            let consistent = self.position.is_some_and(|p| {
                let len = (m.len as usize).min(CONSISTENCY_TAIL);
                let p = p as usize;
                p + 1 >= len && text[p + 1 - len..=p] == text[text.len() - len..]
            });
            if !consistent {
                self.position = sam.recent_end(m);
            }
        }
    }
}

/// The anchor after `token` follows `known` (the text before it) with the anchor at `p`.
fn resync(known: &[Token], p: usize, token: Token) -> Option<u32> {
    let ahead = known.get(p + 1..).unwrap_or(&[]);
    match ahead.iter().take(RESYNC_WINDOW).position(|&t| t == token) {
        Some(j) => Some((p + 1 + j) as u32),
        None => Some(p as u32), // an insertion: stay, the copy may resume after it
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchored(prompt: &[Token], output: &[Token]) -> (SuffixAutomaton, Anchor) {
        let mut sam = SuffixAutomaton::new();
        let mut anchor = Anchor::default();
        sam.extend(prompt);
        anchor.follow(&sam, prompt.len());
        for &t in output {
            sam.extend(&[t]);
            anchor.follow(&sam, 1);
        }
        (sam, anchor)
    }

    #[test]
    fn resumes_after_an_insertion() {
        // prompt: 10 11 12 13 14 15 16 | output copies 10..13, inserts 90 91
        let prompt = [5, 10, 11, 12, 13, 14, 15, 16, 6];
        let (sam, anchor) = anchored(&prompt, &[10, 11, 12, 13, 90, 91]);
        let p = anchor.position(sam.text().len()).unwrap() as usize;
        assert_eq!(sam.text()[p + 1], 14);
    }

    #[test]
    fn skips_replaced_tokens() {
        let prompt = [5, 10, 11, 12, 13, 14, 15, 16, 6];
        // 12 replaced by 77, then 13 follows: the anchor jumps to 13
        let (sam, anchor) = anchored(&prompt, &[10, 11, 12, 13, 14, 77, 16]);
        let p = anchor.position(sam.text().len()).unwrap() as usize;
        assert_eq!(sam.text()[p + 1], 6);
    }
}
