//! The cluster's messages (`proto/lookahead/cluster/v1/cluster.proto`), its subjects and
//! stream name, and the checks a received message must pass before it is applied.

use prost::Message;

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    tonic::include_proto!("lookahead.cluster.v1");
}

pub use generated::{
    CalibrationCounts, Document, EndedRequest, GroupUpdate, GroupUpdates, LearnedBatch,
    LearnedText, RunningRequest, learned_text::Kind,
};

/// The subjects and stream of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    cluster: String,
}

impl Names {
    /// The names of cluster `cluster` (a valid `--cluster-name`).
    pub fn new(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_string(),
        }
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The JetStream stream of learnt texts.
    pub fn stream(&self) -> String {
        format!("LOOKAHEAD_{}", self.cluster)
    }

    /// Every subject of the stream.
    pub fn learn_wildcard(&self) -> String {
        format!("lookahead.{}.learn.>", self.cluster)
    }

    /// The subject of one namespace's learnt texts.
    pub fn learn_subject(&self, namespace: &str) -> String {
        format!(
            "lookahead.{}.learn.{}",
            self.cluster,
            subject_token(namespace)
        )
    }

    /// The core NATS subject of one group's in-flight tokens.
    pub fn group_subject(&self, namespace: &str, group: u64) -> String {
        format!(
            "lookahead.{}.group.{}.{group:016x}",
            self.cluster,
            subject_token(namespace)
        )
    }
}

/// A namespace as one subject token: `.` (the subject separator) is written `%2E`; the other
/// characters of namespace names (`[A-Za-z0-9_-:/]`) are valid in subjects as they are.
pub fn subject_token(namespace: &str) -> String {
    namespace.replace('.', "%2E")
}

/// Why a received message is not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Not a message of this protocol (does not decode).
    Malformed,
    /// Of another cluster or namespace than its subject's: never applied.
    Foreign,
    /// Published by this node.
    Own,
}

impl Skip {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Foreign => "foreign",
            Self::Own => "own",
        }
    }
}

/// Decodes a message of namespace `namespace`'s subject and checks that it belongs there and
/// comes from another node.
pub fn accept_batch(
    payload: &[u8],
    names: &Names,
    namespace: &str,
    own_node: &str,
) -> Result<LearnedBatch, Skip> {
    let batch = LearnedBatch::decode(payload).map_err(|_| Skip::Malformed)?;
    if batch.cluster != names.cluster || batch.namespace != namespace || batch.origin.is_empty() {
        return Err(Skip::Foreign);
    }
    if batch.origin == own_node {
        return Err(Skip::Own);
    }
    Ok(batch)
}

/// Decodes a group message and checks it as [`accept_batch`] does.
pub fn accept_group_updates(
    payload: &[u8],
    names: &Names,
    namespace: &str,
    own_node: &str,
) -> Result<GroupUpdates, Skip> {
    let updates = GroupUpdates::decode(payload).map_err(|_| Skip::Malformed)?;
    if updates.cluster != names.cluster
        || updates.namespace != namespace
        || updates.origin.is_empty()
    {
        return Err(Skip::Foreign);
    }
    if updates.origin == own_node {
        return Err(Skip::Own);
    }
    Ok(updates)
}

/// Tokens a text adds to a trie (for the metrics): an ended request's are those its running
/// parts did not carry, so that a running text counts once; calibration counts have none.
pub fn text_tokens(text: &LearnedText) -> u64 {
    match &text.kind {
        Some(Kind::Request(r)) => {
            (r.prompt.len() + r.output.len()).saturating_sub(r.streamed as usize) as u64
        }
        Some(Kind::Document(d)) => d.tokens.len() as u64,
        Some(Kind::Running(r)) => r.tokens.len() as u64,
        Some(Kind::Calibration(_)) | None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(cluster: &str, namespace: &str, origin: &str) -> Vec<u8> {
        LearnedBatch {
            cluster: cluster.into(),
            namespace: namespace.into(),
            origin: origin.into(),
            batch: 1,
            texts: vec![LearnedText {
                kind: Some(Kind::Document(Document {
                    tokens: vec![1, 2, 3],
                })),
            }],
            made_unix_ms: 0,
        }
        .encode_to_vec()
    }

    #[test]
    fn subjects_keep_a_namespace_in_one_token() {
        let names = Names::new("prod");
        assert_eq!(names.stream(), "LOOKAHEAD_prod");
        assert_eq!(
            names.learn_subject("qwen2.5/7b:v1"),
            "lookahead.prod.learn.qwen2%2E5/7b:v1"
        );
        assert_eq!(
            names.group_subject("a", 0xab),
            "lookahead.prod.group.a.00000000000000ab"
        );
    }

    #[test]
    fn only_other_nodes_messages_of_the_subject_are_accepted() {
        let names = Names::new("c");
        let ok = accept_batch(&batch("c", "ns", "b"), &names, "ns", "a").expect("accepted");
        assert_eq!(text_tokens(&ok.texts[0]), 3);
        assert_eq!(
            accept_batch(&batch("c", "ns", "a"), &names, "ns", "a"),
            Err(Skip::Own)
        );
        assert_eq!(
            accept_batch(&batch("c", "other", "b"), &names, "ns", "a"),
            Err(Skip::Foreign)
        );
        assert_eq!(
            accept_batch(&batch("d", "ns", "b"), &names, "ns", "a"),
            Err(Skip::Foreign)
        );
        assert_eq!(
            accept_batch(b"\xff\xff\xff", &names, "ns", "a"),
            Err(Skip::Malformed)
        );
    }
}
