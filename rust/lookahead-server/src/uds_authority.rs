//! The Unix socket front: makes stock gRPC clients work over `unix://`.
//!
//! Over a Unix socket, grpcio (C-core since 1.57), grpc-java and others send the socket path,
//! percent-encoded or not, as the HTTP/2 `:authority` of every call. That is not a valid
//! `host[:port]`, and h2 (under tonic) answers such a request with `RST_STREAM(PROTOCOL_ERROR)`
//! before any service sees it: every call fails, health checks included, unless the client
//! overrides the authority. h2 has no setting to accept it (hyperium/h2#487 is open).
//!
//! [`AuthorityFix`] sits between a Unix socket connection and the HTTP/2 server. It reads the
//! client's frames and re-encodes each header block (HEADERS and its CONTINUATIONs) with
//! an `:authority` that is not a valid authority replaced by `localhost`, the authority gRPC
//! itself documents for Unix sockets. HPACK is stateful, so every block is decoded with the
//! client's table and encoded again with a table of its own for the server; all other frames
//! and everything the server writes pass through unchanged. A byte stream that does not start
//! with the HTTP/2 preface is passed through untouched.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a client sends first on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The size of a frame header.
const FRAME_HEADER_LEN: usize = 9;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Header frames are re-emitted in pieces of at most this (the smallest frame size every
/// HTTP/2 endpoint accepts).
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The HPACK table size both ends start with; the server never advertises another.
const HPACK_TABLE_SIZE: usize = 4096;
/// The largest header block accepted (encoded); gRPC metadata is far smaller.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// The authority put in place of an invalid one.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a connection was closed by the front.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// A header block could not be decoded (the server would close the connection too).
    #[error("HTTP/2 header block of stream {stream_id} cannot be decoded: {reason}")]
    Hpack {
        /// The stream of the block.
        stream_id: u32,
        /// The decoder's reason.
        reason: String,
    },
    /// The frames break HTTP/2 framing rules the front relies on.
    #[error("HTTP/2 framing error: {0}")]
    Framing(&'static str),
}

impl From<FrontError> for io::Error {
    fn from(e: FrontError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Where the rewriter is in the client's byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the connection preface.
    Preface,
    /// At the start of a frame.
    FrameHeader,
    /// Inside the payload of a frame that passes through: this many bytes are left.
    Passthrough(usize),
    /// Not HTTP/2 (no preface): everything passes through untouched.
    Disabled,
}

/// A header block waiting for its CONTINUATION frames.
struct PendingBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The sans-IO part of [`AuthorityFix`]: turns the client's bytes into the bytes the server
/// reads. Public for the fuzz target.
pub struct Rewriter {
    state: State,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    pending: Option<PendingBlock>,
    /// Authorities replaced so far.
    replaced: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
        let mut encoder = loona_hpack::Encoder::new();
        encoder.set_max_table_size(HPACK_TABLE_SIZE);
        Self {
            state: State::Preface,
            decoder,
            encoder,
            pending: None,
            replaced: 0,
        }
    }
}

impl Rewriter {
    /// How many `:authority` values were replaced.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// Consumes what it can of `input` (complete frame headers and header blocks, any part of
    /// other payloads) and appends the bytes for the server to `output`. What is left in
    /// `input` needs more bytes.
    pub fn process(
        &mut self,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> Result<(), FrontError> {
        loop {
            match self.state {
                State::Disabled => {
                    output.extend_from_slice(&input.split());
                    return Ok(());
                }
                State::Preface => {
                    let n = input.len().min(PREFACE.len());
                    if input[..n] != PREFACE[..n] {
                        self.state = State::Disabled;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    output.extend_from_slice(&input.split_to(PREFACE.len()));
                    self.state = State::FrameHeader;
                }
                State::Passthrough(remaining) => {
                    let n = remaining.min(input.len());
                    output.extend_from_slice(&input.split_to(n));
                    if n < remaining {
                        self.state = State::Passthrough(remaining - n);
                        return Ok(());
                    }
                    self.state = State::FrameHeader;
                }
                State::FrameHeader => {
                    if input.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let len = usize::from(input[0]) << 16
                        | usize::from(input[1]) << 8
                        | usize::from(input[2]);
                    let kind = input[3];
                    if self.pending.is_some() && kind != FRAME_CONTINUATION {
                        return Err(FrontError::Framing(
                            "a header block was interrupted by another frame",
                        ));
                    }
                    if kind != FRAME_HEADERS && kind != FRAME_CONTINUATION {
                        output.extend_from_slice(&input.split_to(FRAME_HEADER_LEN));
                        self.state = State::Passthrough(len);
                        continue;
                    }
                    if len > MAX_HEADER_BLOCK {
                        return Err(FrontError::Framing("header frame above 1 MiB"));
                    }
                    if input.len() < FRAME_HEADER_LEN + len {
                        return Ok(());
                    }
                    let flags = input[4];
                    let stream_id =
                        u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    input.advance(FRAME_HEADER_LEN);
                    let payload = input.split_to(len);
                    self.header_frame(kind, flags, stream_id, &payload, output)?;
                }
            }
        }
    }

    /// Handles one HEADERS or CONTINUATION frame.
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream_id: u32,
        payload: &[u8],
        output: &mut BytesMut,
    ) -> Result<(), FrontError> {
        let mut block = match (kind, self.pending.take()) {
            (FRAME_HEADERS, None) => {
                let mut body = payload;
                let mut pad = 0;
                if flags & FLAG_PADDED != 0 {
                    let (&len, rest) = body
                        .split_first()
                        .ok_or(FrontError::Framing("padded HEADERS without pad length"))?;
                    pad = usize::from(len);
                    body = rest;
                }
                let mut priority = None;
                if flags & FLAG_PRIORITY != 0 {
                    let (fields, rest) = body
                        .split_first_chunk::<5>()
                        .ok_or(FrontError::Framing("HEADERS too short for its priority"))?;
                    priority = Some(*fields);
                    body = rest;
                }
                let end = body
                    .len()
                    .checked_sub(pad)
                    .ok_or(FrontError::Framing("HEADERS padding longer than the frame"))?;
                PendingBlock {
                    stream_id,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    priority,
                    fragment: body[..end].to_vec(),
                }
            }
            (FRAME_CONTINUATION, Some(mut block)) if block.stream_id == stream_id => {
                if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(FrontError::Framing("header block above 1 MiB"));
                }
                block.fragment.extend_from_slice(payload);
                block
            }
            _ => return Err(FrontError::Framing("CONTINUATION out of place")),
        };
        if flags & FLAG_END_HEADERS == 0 {
            self.pending = Some(block);
            return Ok(());
        }
        let encoded = self.reencode(&block)?;
        block.fragment.clear();
        write_header_frames(&block, &encoded, output);
        Ok(())
    }

    /// Decodes a complete block with the client's table and encodes it for the server.
    fn reencode(&mut self, block: &PendingBlock) -> Result<Vec<u8>, FrontError> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut replaced = false;
        self.decoder
            .decode_with_cb(&block.fragment, |name: Cow<[u8]>, value: Cow<[u8]>| {
                let value = if &*name == b":authority" && !valid_authority(&value) {
                    replaced = true;
                    Cow::Borrowed(REPLACEMENT_AUTHORITY)
                } else {
                    value
                };
                headers.push((name.into_owned(), value.into_owned()));
            })
            .map_err(|e| FrontError::Hpack {
                stream_id: block.stream_id,
                reason: e.to_string(),
            })?;
        if replaced {
            self.replaced += 1;
        }
        Ok(self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
    }
}

/// Whether `value` is an authority h2 accepts (`host[:port]`).
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Writes a re-encoded header block as one HEADERS frame and as many CONTINUATION frames as
/// its size needs.
fn write_header_frames(block: &PendingBlock, encoded: &[u8], output: &mut BytesMut) {
    let prefix = block.priority.as_ref().map_or(0, |p| p.len());
    let first_room = MAX_FRAME_PAYLOAD - prefix;
    let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    put_frame_header(
        output,
        prefix + first.len(),
        FRAME_HEADERS,
        flags,
        block.stream_id,
    );
    if let Some(priority) = &block.priority {
        output.put_slice(priority);
    }
    output.put_slice(first);
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
        put_frame_header(
            output,
            piece.len(),
            FRAME_CONTINUATION,
            flags,
            block.stream_id,
        );
        output.put_slice(piece);
        rest = tail;
    }
}

fn put_frame_header(output: &mut BytesMut, len: usize, kind: u8, flags: u8, stream_id: u32) {
    // `len` is at most MAX_FRAME_PAYLOAD, so it fits the 24-bit length field.
    output.put_slice(&(len as u32).to_be_bytes()[1..]);
    output.put_u8(kind);
    output.put_u8(flags);
    output.put_u32(stream_id);
}

/// A Unix socket connection seen through the front: reads give the client's bytes with
/// header blocks re-encoded (see the module docs), writes go straight to the socket.
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    /// Bytes read from the client and not yet processed.
    raw: BytesMut,
    /// Processed bytes the server has not read yet.
    ready: BytesMut,
    /// The client closed its side.
    eof: bool,
}

/// How much is read from the socket at once.
const READ_CHUNK: usize = 16 << 10;

impl<S> AuthorityFix<S> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            raw: BytesMut::new(),
            ready: BytesMut::new(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let start = this.raw.len();
            this.raw.resize(start + READ_CHUNK, 0);
            let mut chunk = ReadBuf::new(&mut this.raw[start..]);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut chunk);
            let filled = chunk.filled().len();
            this.raw.truncate(start + filled);
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if filled == 0 => {
                    // The client is gone: what is left is an incomplete frame; the server
                    // sees it as the client sent it, then the end.
                    this.eof = true;
                    this.ready.extend_from_slice(&this.raw.split());
                }
                Poll::Ready(Ok(())) => {
                    this.rewriter.process(&mut this.raw, &mut this.ready)?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn headers(authority: &str, extra: usize) -> Headers {
        let mut h = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/grpc.health.v1.Health/Check".to_vec()),
            (b":authority".to_vec(), authority.as_bytes().to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
        ];
        h.push((b"x-big".to_vec(), vec![b'a'; extra]));
        h
    }

    fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_frame_header(&mut out, payload.len(), kind, flags, stream_id);
        out.put_slice(payload);
        out.to_vec()
    }

    /// The frames of `bytes` (after the preface) as (kind, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let sid = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], sid, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    /// Decodes the header blocks of the server-side frames with a fresh decoder (as h2 does).
    fn server_headers(frames: &[(u8, u8, u32, Vec<u8>)]) -> Vec<(u32, u8, Headers)> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut out = Vec::new();
        let mut block = Vec::new();
        let mut first_flags = 0;
        for (kind, flags, sid, payload) in frames {
            match *kind {
                FRAME_HEADERS => {
                    first_flags = *flags;
                    let skip = if flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
                    assert_eq!(flags & FLAG_PADDED, 0, "the front never pads");
                    block.extend_from_slice(&payload[skip..]);
                }
                FRAME_CONTINUATION => block.extend_from_slice(payload),
                _ => continue,
            }
            if flags & FLAG_END_HEADERS != 0 {
                out.push((*sid, first_flags, decoder.decode(&block).expect("decodes")));
                block.clear();
            }
        }
        out
    }

    fn run(input: &[u8], chunk: usize) -> (Vec<u8>, Rewriter) {
        let mut rewriter = Rewriter::default();
        let (mut raw, mut out) = (BytesMut::new(), BytesMut::new());
        for piece in input.chunks(chunk) {
            raw.extend_from_slice(piece);
            rewriter.process(&mut raw, &mut out).expect("valid stream");
        }
        assert!(raw.is_empty(), "everything consumed");
        (out.to_vec(), rewriter)
    }

    #[test]
    fn socket_path_authorities_become_localhost_and_the_rest_is_kept() {
        let mut client = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
        // Stream 1: the percent-encoded path, padded, with priority, END_STREAM.
        let block = client.encode(
            headers("%2Ftmp%2Fl.sock", 10)
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        let mut payload = vec![3u8];
        payload.extend([0, 0, 0, 0, 16]);
        payload.extend(&block);
        payload.extend([0, 0, 0]);
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &payload,
        ));
        input.extend(frame(0x0, 0x1, 1, b"data passes through"));
        // Stream 3: the raw path (now indexed in the client's table), split over a
        // CONTINUATION, with a header large enough to need CONTINUATIONs on the way out.
        let block = client.encode(
            headers("/tmp/l.sock", 40_000)
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        let (a, b) = block.split_at(block.len() / 2);
        input.extend(frame(FRAME_HEADERS, 0, 3, a));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 3, b));
        // Stream 5: a valid authority is left alone.
        let block = client.encode(
            headers("localhost:50051", 1)
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 5, &block));

        for chunk in [1, 7, 4096, input.len()] {
            let (out, rewriter) = run(&input, chunk);
            assert_eq!(rewriter.replaced(), 2);
            let frames = frames(&out);
            assert_eq!(frames[0].0, 0x4, "SETTINGS first, untouched");
            assert!(
                frames
                    .iter()
                    .any(|f| f.0 == 0x0 && f.3 == b"data passes through")
            );
            assert!(frames.iter().all(|f| f.3.len() <= MAX_FRAME_PAYLOAD));
            let blocks = server_headers(&frames);
            let sids: Vec<u32> = blocks.iter().map(|b| b.0).collect();
            assert_eq!(sids, vec![1, 3, 5]);
            assert_eq!(
                blocks[0].1 & (FLAG_END_STREAM | FLAG_PRIORITY),
                FLAG_END_STREAM | FLAG_PRIORITY
            );
            assert_eq!(blocks[0].2, headers("localhost", 10));
            assert_eq!(blocks[1].2, headers("localhost", 40_000));
            assert_eq!(blocks[2].2, headers("localhost:50051", 1));
        }
    }

    #[test]
    fn other_protocols_pass_untouched() {
        let input = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let (out, _) = run(input, 3);
        assert_eq!(out, input);
    }

    #[test]
    fn broken_streams_are_errors_not_panics() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        let mut rewriter = Rewriter::default();
        let (mut raw, mut out) = (BytesMut::from(&input[..]), BytesMut::new());
        assert!(rewriter.process(&mut raw, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_PADDED,
            1,
            &[9, 0x82],
        ));
        let (mut raw, mut out) = (BytesMut::from(&input[..]), BytesMut::new());
        assert!(Rewriter::default().process(&mut raw, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        let (mut raw, mut out) = (BytesMut::from(&input[..]), BytesMut::new());
        assert!(Rewriter::default().process(&mut raw, &mut out).is_err());
    }
}
