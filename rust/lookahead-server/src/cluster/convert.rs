//! The core's cluster records as wire messages and back.

use lookahead_core::{GroupKey, GroupUpdate, LearnedText};

use super::wire;

/// A learnt text as its wire message.
pub fn text_to_wire(text: LearnedText) -> wire::LearnedText {
    let kind = match text {
        LearnedText::Request {
            prompt,
            output,
            finished,
            group,
        } => wire::Kind::Request(wire::EndedRequest {
            prompt,
            output,
            finished,
            group,
        }),
        LearnedText::Document(tokens) => wire::Kind::Document(wire::Document { tokens }),
    };
    wire::LearnedText { kind: Some(kind) }
}

/// A wire text as the core's, or `None` when it carries nothing (a newer kind of text this
/// server does not know).
pub fn text_from_wire(text: wire::LearnedText) -> Option<LearnedText> {
    Some(match text.kind? {
        wire::Kind::Request(r) => LearnedText::Request {
            prompt: r.prompt,
            output: r.output,
            finished: r.finished,
            group: r.group,
        },
        wire::Kind::Document(d) => LearnedText::Document(d.tokens),
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
            },
            LearnedText::Request {
                prompt: vec![],
                output: vec![],
                finished: false,
                group: None,
            },
            LearnedText::Document(vec![9, 8, 7]),
        ];
        for text in texts {
            assert_eq!(text_from_wire(text_to_wire(text.clone())), Some(text));
        }
        assert_eq!(text_from_wire(wire::LearnedText { kind: None }), None);
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
