//! Arbitrary bytes as what a client sends on the Unix socket, through the front that
//! re-encodes HTTP/2 header blocks (`uds_authority::Rewriter`), fed in pieces whose sizes come
//! from the input. Errors are fine (the connection is closed); panics, hangs and unbounded
//! buffering are bugs. Inputs starting with the HTTP/2 preface reach the frame parser.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use lookahead_server::uds_authority::{MAX_HEADER_BLOCK, Rewriter};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(split).max(1);
    let mut rewriter = Rewriter::default();
    let (mut raw, mut out) = (BytesMut::from(PREFACE), BytesMut::new());
    for piece in rest.chunks(chunk) {
        raw.extend_from_slice(piece);
        if rewriter.process(&mut raw, &mut out).is_err() {
            return;
        }
        // What waits for more bytes is at most one header frame and its frame header.
        assert!(raw.len() <= MAX_HEADER_BLOCK + 9, "{} bytes held", raw.len());
        out.clear();
    }
});
