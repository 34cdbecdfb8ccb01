//! The core's cluster records as wire messages and back.

use lookahead_core::{CalibrationCount, CalibrationCounts, GroupKey, GroupUpdate, LearnedText};

use super::wire;

/// A learnt text as its wire message.
pub fn text_to_wire(text: LearnedText) -> wire::LearnedText {
    let kind = match text {
        LearnedText::Request {
            prompt,
            output,
            finished,
            group,
            request,
            streamed,
        } => wire::Kind::Request(wire::EndedRequest {
            prompt,
            output,
            finished,
            group,
            request,
            streamed: position(streamed),
        }),
        LearnedText::Document(tokens) => wire::Kind::Document(wire::Document { tokens }),
        LearnedText::Running {
            request,
            offset,
            tokens,
            shared_from,
        } => wire::Kind::Running(wire::RunningRequest {
            request,
            offset: position(offset),
            tokens,
            shared_from: shared_from.map(position),
        }),
        LearnedText::Calibration(counts) => {
            let (mut index, mut trials, mut hits) = (Vec::new(), Vec::new(), Vec::new());
            for c in counts.counts {
                index.push(c.index);
                trials.push(c.trials);
                hits.push(c.hits);
            }
            wire::Kind::Calibration(wire::CalibrationCounts {
                layout: counts.layout,
                index,
                trials,
                hits,
            })
        }
    };
    wire::LearnedText { kind: Some(kind) }
}

/// A text position on the wire (requests hold at most `u32::MAX / 4` tokens).
fn position(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

/// A wire text as the core's, or `None` when it carries nothing (a newer kind of text this
/// server does not know) or is malformed (calibration lists of different lengths).
pub fn text_from_wire(text: wire::LearnedText) -> Option<LearnedText> {
    Some(match text.kind? {
        wire::Kind::Request(r) => LearnedText::Request {
            prompt: r.prompt,
            output: r.output,
            finished: r.finished,
            group: r.group,
            request: r.request,
            streamed: r.streamed as usize,
        },
        wire::Kind::Document(d) => LearnedText::Document(d.tokens),
        wire::Kind::Running(r) => LearnedText::Running {
            request: r.request,
            offset: r.offset as usize,
            tokens: r.tokens,
            shared_from: r.shared_from.map(|at| at as usize),
        },
        wire::Kind::Calibration(c) => {
            if c.index.len() != c.trials.len() || c.index.len() != c.hits.len() {
                return None;
            }
            let counts = (c.index.into_iter().zip(c.trials).zip(c.hits))
                .map(|((index, trials), hits)| CalibrationCount {
                    index,
                    trials,
                    hits,
                })
                .collect();
            LearnedText::Calibration(CalibrationCounts {
                layout: c.layout,
                counts,
            })
        }
    })
}

/// A group update as its wire message.
pub fn update_to_wire(update: GroupUpdate) -> wire::GroupUpdate {
    wire::GroupUpdate {
        group: update.group.0,
        member: update.member,
        offset: update.offset,
        tokens: update.tokens,
        finished: update.finished,
    }
}

/// A wire group update as the core's.
pub fn update_from_wire(update: wire::GroupUpdate) -> GroupUpdate {
    GroupUpdate {
        group: GroupKey(update.group),
        member: update.member,
        offset: update.offset,
        tokens: update.tokens,
        finished: update.finished,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_updates_survive_the_wire() {
        let texts = [
            LearnedText::Request {
                prompt: vec![1, 2],
                output: vec![3],
                finished: true,
                group: Some("g".into()),
                request: "r7".into(),
                streamed: 2,
            },
            LearnedText::Request {
                prompt: vec![],
                output: vec![],
                finished: false,
                group: None,
                request: String::new(),
                streamed: 0,
            },
            LearnedText::Document(vec![9, 8, 7]),
            LearnedText::Running {
                request: "r7".into(),
                offset: 2,
                tokens: vec![4, 5],
                shared_from: Some(2),
            },
            LearnedText::Running {
                request: "r8".into(),
                offset: 0,
                tokens: vec![6],
                shared_from: None,
            },
            LearnedText::Calibration(CalibrationCounts {
                layout: 99,
                counts: vec![CalibrationCount {
                    index: 3,
                    trials: 5,
                    hits: 2,
                }],
            }),
        ];
        for text in texts {
            assert_eq!(text_from_wire(text_to_wire(text.clone())), Some(text));
        }
        assert_eq!(text_from_wire(wire::LearnedText { kind: None }), None);
        let uneven = wire::Kind::Calibration(wire::CalibrationCounts {
            layout: 1,
            index: vec![0, 1],
            trials: vec![1],
            hits: vec![0, 0],
        });
        let uneven = wire::LearnedText { kind: Some(uneven) };
        assert_eq!(text_from_wire(uneven), None, "malformed counts are skipped");
        let update = GroupUpdate {
            group: GroupKey(0xfeed),
            member: "r1".into(),
            offset: 4,
            tokens: vec![5, 6],
            finished: true,
        };
        assert_eq!(update_from_wire(update_to_wire(update.clone())), update);
    }
}
