//! Snapshots: a drafter's learnt state (shared trie, calibration, sibling responses) as bytes,
//! and back. No I/O here: the server writes the bytes atomically and reads them back.
//!
//! Layout (little-endian): magic `LKAHSNAP`, format version (u32), payload length (u64),
//! payload, CRC-32 of the payload (u32). Active requests are not saved: engines re-send them.
//! Decoding checks the checksum first and then every structural invariant, so a corrupt or
//! truncated snapshot is refused whole, never half-loaded.

use thiserror::Error;

use crate::config::ConfigError;

/// The magic bytes that open every snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"LKAHSNAP";
/// The snapshot format this build writes; it reads this one and every earlier one (format 1
/// had no sibling calibration; format 2 no place of other drafters' running requests, which
/// format 3 added; format 4 adds the realised acceptance by temperature).
pub const SNAPSHOT_VERSION: u32 = 4;

/// Why a snapshot was refused.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SnapshotError {
    /// The bytes do not start with [`SNAPSHOT_MAGIC`].
    #[error("not a lookahead snapshot (bad magic bytes)")]
    BadMagic,
    /// Written by a format this build does not read.
    #[error("snapshot format version {found} is not supported (this build reads {supported})")]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The bytes end early.
    #[error("snapshot is truncated")]
    Truncated,
    /// The payload does not match its checksum.
    #[error("snapshot checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    ChecksumMismatch {
        /// Checksum stored in the file.
        stored: u32,
        /// Checksum of the payload read.
        computed: u32,
    },
    /// The payload decodes to an impossible state.
    #[error("snapshot is corrupt: {0}")]
    Corrupt(&'static str),
    /// The configuration given with the snapshot is itself invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The snapshot was taken with a setting the drafter cannot take over.
    #[error("snapshot was taken with {field} = {snapshot}, but the drafter has {config}")]
    IncompatibleConfig {
        /// The setting.
        field: &'static str,
        /// Its value in the snapshot.
        snapshot: u64,
        /// Its value in the configuration.
        config: u64,
    },
}

/// Appends little-endian values to a buffer.
#[derive(Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn len(&mut self, v: usize) {
        self.u64(v as u64);
    }
}

/// Reads little-endian values, failing with [`SnapshotError::Truncated`] at the end.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(SnapshotError::Truncated)?;
        self.bytes = rest;
        Ok(*head)
    }
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.take().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.take().map(u64::from_le_bytes)
    }
    /// A length, refused when more items than bytes left (each item takes at least
    /// `min_item_bytes`): a corrupt length must not trigger a huge allocation.
    pub fn len(&mut self, min_item_bytes: usize) -> Result<usize, SnapshotError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| SnapshotError::Corrupt("length overflows"))?;
        if n.saturating_mul(min_item_bytes.max(1)) > self.bytes.len() {
            return Err(SnapshotError::Truncated);
        }
        Ok(n)
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Frames a payload of format `version`: magic, version, length, payload, checksum.
pub(crate) fn frame(payload: &[u8], version: u32) -> Vec<u8> {
    let mut w = Writer {
        buf: Vec::with_capacity(payload.len() + 24),
    };
    w.buf.extend_from_slice(SNAPSHOT_MAGIC);
    w.u32(version);
    w.len(payload.len());
    w.buf.extend_from_slice(payload);
    w.u32(crc32fast::hash(payload));
    w.buf
}

/// Checks the frame and returns the format version and the payload.
pub(crate) fn unframe(bytes: &[u8]) -> Result<(u32, &[u8]), SnapshotError> {
    let rest = bytes
        .strip_prefix(SNAPSHOT_MAGIC.as_slice())
        .ok_or(if bytes.len() < 8 {
            SnapshotError::Truncated
        } else {
            SnapshotError::BadMagic
        })?;
    let mut r = Reader::new(rest);
    let version = r.u32()?;
    if !(1..=SNAPSHOT_VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion {
            found: version,
            supported: SNAPSHOT_VERSION,
        });
    }
    let len = r.len(1)?;
    let body = &rest[12..];
    if body.len() < len + 4 {
        return Err(SnapshotError::Truncated);
    }
    if body.len() > len + 4 {
        return Err(SnapshotError::Corrupt("trailing bytes after the checksum"));
    }
    let (payload, crc) = body.split_at(len);
    let stored = u32::from_le_bytes(crc.try_into().map_err(|_| SnapshotError::Truncated)?);
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(SnapshotError::ChecksumMismatch { stored, computed });
    }
    Ok((version, payload))
}
