//! Criterion benchmarks of the core: one engine step (draft + insert) at batch 1, 8 and 64
//! with contexts of 1k to 3k tokens on a warmed drafter, the native step as vLLM drives it
//! (chains of 8, whole or sized against a cost curve, at batch 1, 32 and 64), and the memory
//! cost per stored trie node. Requests finish and new ones start as in an engine, so the
//! drafter stays in a steady state however many iterations criterion runs.
//!
//! The text is synthetic but shaped like real traffic: a vocabulary of 32k ids drawn from a
//! Zipf-like law, with 30% of each request copied from earlier text (so the trie and the
//! requests' own indexes both have matches, as in RAG or code editing).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lookahead_core::{
    CostCurve, DraftShape, Drafter, DrafterConfig, Layout, StepCost, StepItem, Token,
};

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

/// Tokens in the text of one simulated request: a 1k-token prompt, then its output.
const REQUEST_TOKENS: usize = 3072;
/// Prompt tokens of a simulated request.
const PROMPT_TOKENS: usize = 1024;
/// Distinct request texts per batch slot; a slot cycles through them.
const TEXTS_PER_SLOT: usize = 4;

/// An engine at batch `batch` on a drafter warmed with `warm_tokens` of text. Each batch slot
/// runs requests one after the other: a request starts with a 1k prompt, emits 2 tokens a step
/// (one accepted draft token + the model's own) and, at the end of its text, finishes and makes
/// room for the next, so the drafter stays in a steady state however long criterion runs.
struct Engine {
    drafter: Drafter,
    texts: Vec<Vec<Token>>,
    slots: Vec<Slot>,
    started: usize,
    /// The shape of every draft, its cap, and the step's cost (for sized shapes).
    shape: DraftShape,
    budget: usize,
    cost: Option<StepCost>,
}

struct Slot {
    id: String,
    text: usize,
    pos: usize,
}

impl Engine {
    fn new(batch: usize, warm_tokens: usize) -> Self {
        let drafter = Drafter::new(DrafterConfig::default()).expect("default config is valid");
        let mut rng = Rng(0x5eed);
        let corpus = text(&mut rng, &[], warm_tokens);
        drafter.ingest(&corpus).expect("tokens are in range");
        let texts = (0..batch * TEXTS_PER_SLOT)
            .map(|_| text(&mut rng, &corpus, REQUEST_TOKENS))
            .collect();
        let mut engine = Self {
            drafter,
            texts,
            slots: Vec::with_capacity(batch),
            started: 0,
            shape: DraftShape::Tree,
            budget: 8,
            cost: None,
        };
        for slot in 0..batch {
            // stagger the slots so that requests do not all finish at the same step
            let pos = PROMPT_TOKENS + slot * (REQUEST_TOKENS - PROMPT_TOKENS) / batch;
            let s = engine.begin(slot * TEXTS_PER_SLOT, pos);
            engine.slots.push(s);
        }
        engine
    }

    fn begin(&mut self, text: usize, pos: usize) -> Slot {
        let id = format!("req-{}", self.started);
        self.started += 1;
        let t = &self.texts[text];
        self.drafter.start(&id, &t[..pos]).expect("fresh id");
        Slot { id, text, pos }
    }

    /// Drafts of `shape` up to `budget`, sized against `cost`.
    fn drafting(mut self, shape: DraftShape, budget: usize, cost: Option<StepCost>) -> Self {
        (self.shape, self.budget, self.cost) = (shape, budget, cost);
        self
    }

    /// One engine step: 2 new tokens and a draft per request, then the inserts.
    fn step(&mut self) {
        let items: Vec<StepItem<'_>> = self
            .slots
            .iter()
            .map(|s| StepItem {
                request_id: &s.id,
                new_tokens: &self.texts[s.text][s.pos..s.pos + 2],
                budget: self.budget,
                shape: self.shape,
                finished: s.pos + 4 > REQUEST_TOKENS,
                ..Default::default()
            })
            .collect();
        match &self.cost {
            Some(cost) => black_box(self.drafter.step_costed(&items, cost)),
            None => black_box(self.drafter.step(&items)),
        };
        for i in 0..self.slots.len() {
            self.slots[i].pos += 2;
            if self.slots[i].pos + 2 > REQUEST_TOKENS {
                let slot = &self.slots[i];
                let next =
                    slot.text - slot.text % TEXTS_PER_SLOT + (slot.text + 1) % TEXTS_PER_SLOT;
                self.slots[i] = self.begin(next, PROMPT_TOKENS);
            }
        }
    }
}

fn engine_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_step");
    for batch in [1usize, 8, 64] {
        let mut engine = Engine::new(batch, 200_000);
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::new("draft_insert_budget8", batch), |b| {
            b.iter(|| engine.step())
        });
    }
    group.finish();
}

/// The native step as vLLM drives it: a chain of K = 8 per request, whole or sized against a
/// CPU-like cost curve (a verified token costs a tenth of a step), at batch 1, 32 and 64.
fn native_step(c: &mut Criterion) {
    let curve = CostCurve::new(vec![1, 64, 512], vec![0.05, 0.1, 0.5]).expect("valid curve");
    let sized = StepCost {
        curve,
        layout: Layout::Ragged,
        base_tokens: 0,
        explore_every: 32,
        acceptance: 1.0,
    };
    let mut group = c.benchmark_group("native_step");
    for batch in [1usize, 32, 64] {
        group.throughput(Throughput::Elements(batch as u64));
        for (name, shape, cost) in [
            ("chain8", DraftShape::Chain, None),
            ("sized_chain8", DraftShape::SizedChain, Some(sized.clone())),
        ] {
            let mut engine = Engine::new(batch, 200_000).drafting(shape, 8, cost);
            group.bench_function(BenchmarkId::new(name, batch), |b| b.iter(|| engine.step()));
        }
    }
    group.finish();
}

fn start_request(c: &mut Criterion) {
    // Indexing a prompt: the request's own automaton plus the shared-trie inserts.
    let drafter = Drafter::new(DrafterConfig::default()).expect("default config is valid");
    let mut rng = Rng(11);
    let corpus = text(&mut rng, &[], 200_000);
    drafter.ingest(&corpus).expect("tokens are in range");
    let prompt = text(&mut rng, &corpus, 4096);
    let mut group = c.benchmark_group("start_request");
    group.throughput(Throughput::Elements(prompt.len() as u64));
    group.bench_function("4k_prompt", |b| {
        b.iter(|| {
            drafter.start("prompt", &prompt).expect("fresh id");
            drafter.end("prompt").expect("active")
        })
    });
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

criterion_group!(
    benches,
    engine_step,
    native_step,
    start_request,
    memory_per_node
);
criterion_main!(benches);
