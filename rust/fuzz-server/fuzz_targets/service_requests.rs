//! Arbitrary bytes as the server's wire messages, without the network: decoded as a
//! StepRequest or an IngestRequest (prost), then checked and applied as the service does
//! (`run_step`, `push_tokens`), plus the tokens-file parser and the snapshot file-name
//! decoder. Refusals are fine; panics, hangs and runaway allocations are bugs.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lookahead_core::DrafterConfig;
use lookahead_server::convert::push_tokens;
use lookahead_server::namespaces::Namespaces;
use lookahead_server::pb::{IngestRequest, StepRequest};
use lookahead_server::step::{StepLimits, run_step};
use prost::Message;

const VOCAB: u32 = 50_000;

/// One set of namespaces for the whole run: state carries over from input to input, as in a
/// long-lived server (a small budget keeps eviction busy).
fn namespaces() -> &'static Namespaces {
    static SET: OnceLock<Namespaces> = OnceLock::new();
    SET.get_or_init(|| {
        let config = DrafterConfig {
            memory_budget_bytes: 1 << 22,
            max_ngram: 6,
            vocab_size: VOCAB,
            max_budget: 32,
            max_request_tokens: 1 << 14,
            ..Default::default()
        };
        Namespaces::new(config, 4, std::sync::Arc::default())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 4 {
        0 | 1 => {
            if let Ok(request) = StepRequest::decode(bytes) {
                let limits = StepLimits {
                    max_requests_per_step: 64,
                    vocab_size: VOCAB,
                    max_budget: 32,
                    max_step_tokens: 1 << 14,
                    max_active_requests: 256,
                };
                let n = request.requests.len();
                if let Ok(response) = run_step(namespaces(), &limits, request) {
                    assert_eq!(response.roots.len(), n);
                    assert_eq!(response.sizes.len(), n);
                    let nodes: usize = response.sizes.iter().map(|&s| s as usize).sum();
                    assert_eq!(response.tokens.len(), nodes);
                    assert_eq!(response.parents.len(), nodes);
                }
            }
        }
        2 => {
            if let Ok(request) = IngestRequest::decode(bytes) {
                let mut buffer = Vec::new();
                for document in &request.documents {
                    buffer.clear();
                    if push_tokens(&document.tokens, VOCAB, &mut buffer).is_ok()
                        && let Ok(ns) = namespaces().get_or_create(&request.namespace)
                    {
                        let _ = ns.ingest(&buffer);
                    }
                }
            }
        }
        _ => {
            let text = String::from_utf8_lossy(bytes);
            let _ = lookahead_server::auth::parse(&text);
            if let Some(name) = lookahead_server::persistence::namespace_of(&text) {
                assert_eq!(lookahead_server::persistence::file_name(&name), text);
            }
        }
    }
});
