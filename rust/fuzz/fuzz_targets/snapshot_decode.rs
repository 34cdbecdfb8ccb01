//! Arbitrary bytes as a snapshot: refused or restored, never a panic or a runaway allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lookahead_core::{Drafter, DrafterConfig, SNAPSHOT_MAGIC, SNAPSHOT_VERSION};

fuzz_target!(|data: &[u8]| {
    let config = DrafterConfig { memory_budget_bytes: 1 << 22, max_ngram: 6, ..Default::default() };
    // half the inputs get a valid header so the fuzzer reaches the payload decoder
    let mut framed = Vec::with_capacity(data.len() + 24);
    if data.first().is_some_and(|b| b & 1 == 1) {
        framed.extend_from_slice(SNAPSHOT_MAGIC);
        framed.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        let payload = &data[1..];
        framed.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        framed.extend_from_slice(payload);
        framed.extend_from_slice(&crc32(payload).to_le_bytes());
    } else {
        framed.extend_from_slice(data);
    }
    if let Ok(drafter) = Drafter::from_snapshot(config, &framed) {
        let _ = drafter.snapshot();
    }
});

/// CRC-32 (IEEE), bitwise: the fuzz target stays free of extra dependencies.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
