//! Arbitrary sequences of drafter operations on a small budget: no panic, every tree valid,
//! memory within the budget after every operation, snapshots restorable. Requests may name
//! groups; what the drafter records for a cluster is fed back to it as if from a peer.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use lookahead_core::{Drafter, DrafterConfig, GroupKey, GroupUpdate, StepItem};

#[derive(Arbitrary, Debug)]
enum Op {
    Start { id: u8, prompt: Vec<u8>, group: Option<u8> },
    Step { id: u8, tokens: Vec<u8>, budget: u8, finished: bool },
    Draft { id: u8, budget: u8 },
    End { id: u8 },
    Ingest { tokens: Vec<u8> },
    Snapshot,
    /// A peer's member of the group of `prompt` wrote `tokens` at `offset`.
    Remote { prompt: Vec<u8>, member: u8, offset: u8, tokens: Vec<u8>, finished: bool },
    /// What the drafter recorded for the cluster comes back to it from a peer.
    Echo,
}

fuzz_target!(|input: (bool, bool, Vec<Op>)| {
    let (small, chain, ops) = input;
    let config = DrafterConfig {
        memory_budget_bytes: if small { 1 << 20 } else { 1 << 24 },
        max_ngram: 6,
        max_budget: 32,
        chain,
        vocab_size: 200, // tokens >= 200 exercise the range check
        record_for_cluster: true,
        ..Default::default()
    };
    let mut drafter = Drafter::new(config.clone()).expect("valid config");
    for op in ops.iter().take(200) {
        let widen = |t: &Vec<u8>| t.iter().map(|&b| u32::from(b)).collect::<Vec<_>>();
        match op {
            Op::Start { id, prompt, group } => {
                let (id, prompt) = (id.to_string(), widen(prompt));
                let name = group.map(|g| format!("g{g}"));
                let item = StepItem {
                    request_id: &id,
                    prompt: Some(&prompt),
                    group: name.as_deref(),
                    ..Default::default()
                };
                drop(drafter.step(&[item]));
            }
            Op::Step { id, tokens, budget, finished } => {
                let id = id.to_string();
                let tokens = widen(tokens);
                let item = StepItem {
                    request_id: &id,
                    new_tokens: &tokens,
                    budget: usize::from(*budget),
                    finished: *finished,
                    ..Default::default()
                };
                for tree in drafter.step(&[item]).into_iter().flatten() {
                    assert!(tree.len() <= usize::from(*budget));
                    for (i, &p) in tree.parents.iter().enumerate() {
                        assert!(p >= -1 && p < i as i32);
                    }
                }
            }
            Op::Draft { id, budget } => drop(drafter.draft(&id.to_string(), usize::from(*budget))),
            Op::End { id } => drop(drafter.end(&id.to_string())),
            Op::Ingest { tokens } => drop(drafter.ingest(&widen(tokens))),
            Op::Remote { prompt, member, offset, tokens, finished } => {
                let update = GroupUpdate {
                    group: GroupKey::of_prompt(&widen(prompt)),
                    member: member.to_string(),
                    offset: u32::from(*offset),
                    tokens: widen(tokens),
                    finished: *finished,
                };
                drop(drafter.apply_group_update("peer", &update));
            }
            Op::Echo => {
                for text in drafter.take_learned() {
                    drafter.apply_learned("peer", &text).expect("own records are valid");
                }
                if let Some(counts) = drafter.take_calibration() {
                    drafter.apply_learned("peer", &counts).expect("own counts are valid");
                }
                for update in drafter.take_group_updates() {
                    drafter.apply_group_update("peer", &update).expect("own records are valid");
                }
            }
            Op::Snapshot => {
                let bytes = drafter.snapshot();
                drafter = Drafter::from_snapshot(config.clone(), &bytes).expect("own snapshot restores");
            }
        }
        let stats = drafter.stats();
        assert!(stats.memory_bytes <= stats.memory_budget_bytes, "{stats:?}");
    }
});
