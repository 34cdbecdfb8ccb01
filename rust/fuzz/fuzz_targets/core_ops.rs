//! Arbitrary sequences of drafter operations on a small budget: no panic, every tree valid,
//! memory within the budget after every operation, snapshots restorable.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use lookahead_core::{Drafter, DrafterConfig, StepItem};

#[derive(Arbitrary, Debug)]
enum Op {
    Start { id: u8, prompt: Vec<u8> },
    Step { id: u8, tokens: Vec<u8>, budget: u8, finished: bool },
    Draft { id: u8, budget: u8 },
    End { id: u8 },
    Ingest { tokens: Vec<u8> },
    Snapshot,
}

fuzz_target!(|input: (bool, bool, Vec<Op>)| {
    let (small, chain, ops) = input;
    let config = DrafterConfig {
        memory_budget_bytes: if small { 1 << 20 } else { 1 << 24 },
        max_ngram: 6,
        max_budget: 32,
        chain,
        vocab_size: 200, // tokens >= 200 exercise the range check
        ..Default::default()
    };
    let mut drafter = Drafter::new(config.clone()).expect("valid config");
    for op in ops.iter().take(200) {
        let widen = |t: &Vec<u8>| t.iter().map(|&b| u32::from(b)).collect::<Vec<_>>();
        match op {
            Op::Start { id, prompt } => drop(drafter.start(&id.to_string(), &widen(prompt))),
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
            Op::Snapshot => {
                let bytes = drafter.snapshot();
                drafter = Drafter::from_snapshot(config.clone(), &bytes).expect("own snapshot restores");
            }
        }
        let stats = drafter.stats();
        assert!(stats.memory_bytes <= stats.memory_budget_bytes, "{stats:?}");
    }
});
