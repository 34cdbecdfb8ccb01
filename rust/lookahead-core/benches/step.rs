//! Criterion benchmarks of the core: one engine step (draft + insert) at batch 1, 8 and 64
//! with 1k-token contexts on a warmed drafter, and the memory cost per stored trie node.
//!
//! The text is synthetic but shaped like real traffic: a vocabulary of 32k ids drawn from a
//! Zipf-like law, with 30% of each request copied from earlier text (so the trie and the
//! requests' own indexes both have matches, as in RAG or code editing).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lookahead_core::{Drafter, DrafterConfig, StepItem, Token};

/// A small deterministic generator (xorshift), so the benchmark needs no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A token with a Zipf-like distribution over 32k ids.
    fn token(&mut self) -> Token {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        (32_000f64.powf(u) as Token).saturating_sub(1)
    }
}

/// `len` tokens, 30% of them copied in runs of 16 from `corpus`.
fn text(rng: &mut Rng, corpus: &[Token], len: usize) -> Vec<Token> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        if !corpus.is_empty() && rng.next() % 10 < 3 {
            let start = (rng.next() as usize) % corpus.len().saturating_sub(16).max(1);
            out.extend_from_slice(&corpus[start..(start + 16).min(corpus.len())]);
        } else {
            out.push(rng.token());
        }
    }
    out.truncate(len);
    out
}

/// A drafter warmed with `warm_tokens` of text and `batch` active requests of 1k tokens.
fn warmed(batch: usize, warm_tokens: usize) -> (Drafter, Vec<String>, Vec<Vec<Token>>) {
    let drafter = Drafter::new(DrafterConfig::default()).expect("default config is valid");
    let mut rng = Rng(0x5eed);
    let corpus = text(&mut rng, &[], warm_tokens);
    drafter.ingest(&corpus).expect("tokens are in range");
    let ids: Vec<String> = (0..batch).map(|i| format!("req-{i}")).collect();
    let futures: Vec<Vec<Token>> = (0..batch).map(|_| text(&mut rng, &corpus, 4096)).collect();
    for (id, future) in ids.iter().zip(&futures) {
        drafter.start(id, &future[..1024]).expect("fresh id");
    }
    (drafter, ids, futures)
}

fn engine_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_step");
    for batch in [1usize, 8, 64] {
        let (drafter, ids, futures) = warmed(batch, 200_000);
        let mut pos = 1024;
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::new("draft_insert_budget8", batch), |b| {
            b.iter(|| {
                // each request advances by 2 tokens (one accepted draft + the model's own)
                if pos + 2 > 4096 {
                    pos = 1024; // wrap: contexts stay around 1k-4k tokens
                }
                let items: Vec<StepItem<'_>> = ids
                    .iter()
                    .zip(&futures)
                    .map(|(id, f)| StepItem {
                        request_id: id,
                        new_tokens: &f[pos..pos + 2],
                        budget: 8,
                        ..Default::default()
                    })
                    .collect();
                pos += 2;
                drafter.step(&items)
            })
        });
    }
    group.finish();
}

fn memory_per_node(c: &mut Criterion) {
    // Not a timing: prints the measured bytes per stored trie node once, then times ingest.
    let drafter = Drafter::new(DrafterConfig::default()).expect("default config is valid");
    let mut rng = Rng(7);
    let corpus = text(&mut rng, &[], 1_000_000);
    drafter.ingest(&corpus).expect("tokens are in range");
    let s = drafter.stats();
    println!(
        "memory: {} trie nodes, {:.1} bytes per node, {} bytes in all for 1M ingested tokens",
        s.trie_nodes, s.trie_bytes_per_node, s.memory_bytes
    );
    let chunk = &corpus[..10_000];
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(chunk.len() as u64));
    group.bench_function("10k_tokens", |b| b.iter(|| drafter.ingest(chunk)));
    group.finish();
}

criterion_group!(benches, engine_step, memory_per_node);
criterion_main!(benches);
