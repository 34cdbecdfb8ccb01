//! Snapshots on disk: one file per namespace in `--snapshot-dir`, written atomically (a
//! temporary file in the same directory, fsync, rename, fsync of the directory) and read back
//! at start. A corrupt or truncated file is never half-loaded: the server refuses to start
//! (`--on-corrupt fail`) or moves it aside as `*.corrupt` and starts that namespace empty
//! (`--on-corrupt empty`).
//!
//! In a cluster a file also records the last stream sequence its state includes: it starts
//! with [`CLUSTER_HEADER_MAGIC`] and that sequence (u64, little-endian), then the core's
//! snapshot. Files without the header (written outside a cluster) hold the core's snapshot
//! alone, as before.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use lookahead_core::{Drafter, DrafterConfig, SnapshotError};

use crate::namespaces::resolve_name;

/// The name of every snapshot file starts with this...
const FILE_PREFIX: &str = "ns-";
/// ...and ends with this.
const FILE_SUFFIX: &str = ".snap";

/// The first bytes of a snapshot file written in a cluster.
pub const CLUSTER_HEADER_MAGIC: &[u8; 8] = b"LKCLSEQ1";

/// The bytes of a snapshot file: the core's snapshot, after the cluster header when
/// `replicated_through` is above 0.
pub fn encode_file(core_snapshot: &[u8], replicated_through: u64) -> Vec<u8> {
    if replicated_through == 0 {
        return core_snapshot.to_vec();
    }
    let mut out = Vec::with_capacity(16 + core_snapshot.len());
    out.extend_from_slice(CLUSTER_HEADER_MAGIC);
    out.extend_from_slice(&replicated_through.to_le_bytes());
    out.extend_from_slice(core_snapshot);
    out
}

/// Splits a snapshot file into the core's snapshot and the stream sequence it includes (0
/// without the cluster header).
pub fn decode_file(bytes: &[u8]) -> (&[u8], u64) {
    match bytes.strip_prefix(CLUSTER_HEADER_MAGIC.as_slice()) {
        Some(rest) if rest.len() >= 8 => {
            let (seq, core) = rest.split_at(8);
            let seq = u64::from_le_bytes(seq.try_into().unwrap_or_default());
            (core, seq)
        }
        _ => (bytes, 0),
    }
}

/// What to do with a snapshot file that cannot be loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OnCorrupt {
    /// Refuse to start, naming the file and the reason.
    #[default]
    Fail,
    /// Log a warning, rename the file to `*.corrupt` and start the namespace empty.
    Empty,
}

/// Why snapshots could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// A file or directory operation failed.
    #[error("snapshot file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot file was refused by the core.
    #[error(
        "snapshot file {path} cannot be loaded: {source} (use --on-corrupt empty to move it aside and start empty)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why it was refused.
        #[source]
        source: SnapshotError,
    },
}

/// The file name of a namespace's snapshot: `ns-<name>.snap`, with every byte outside
/// `[A-Za-z0-9._-]` written as `%XX` (so `/` and `:` never reach the file system).
pub fn file_name(namespace: &str) -> String {
    let mut out = String::with_capacity(FILE_PREFIX.len() + namespace.len() + FILE_SUFFIX.len());
    out.push_str(FILE_PREFIX);
    for b in namespace.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push_str(FILE_SUFFIX);
    out
}

/// The namespace of a snapshot file name, or `None` if the name is not one this module writes
/// (or decodes to an invalid namespace name).
pub fn namespace_of(file_name: &str) -> Option<String> {
    let escaped = file_name
        .strip_prefix(FILE_PREFIX)?
        .strip_suffix(FILE_SUFFIX)?;
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).ok()?;
    // Only canonical names: the file must be the one `file_name` gives for it.
    (resolve_name(&name).ok() == Some(name.as_str()) && self::file_name(&name) == file_name)
        .then_some(name)
}

/// Writes `bytes` to `dir/file_name(namespace)` atomically: a crash leaves either the old file
/// or the new one, never a mix. Returns the path written.
pub fn write_atomic(dir: &Path, namespace: &str, bytes: &[u8]) -> Result<PathBuf, PersistError> {
    let path = dir.join(file_name(namespace));
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        file_name(namespace),
        std::process::id()
    ));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PersistError::Io { path, source }
    };
    let result = (|| {
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        drop(file);
        fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
    })();
    if result.is_err() {
        // Best effort: a leftover temporary file is harmless (ignored at start) but untidy.
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

/// A namespace read back from its snapshot file.
pub struct Restored {
    /// The namespace's name.
    pub namespace: String,
    /// Its drafter, with the learnt state of the file.
    pub drafter: Drafter,
    /// The file it came from.
    pub path: PathBuf,
    /// The last cluster stream sequence its state includes (0: none).
    pub replicated_through: u64,
}

/// Reads every snapshot file of `dir` (created if missing). Files that are not snapshots of
/// this server (other names, temporary files, `*.corrupt`) are left alone. A file the core
/// refuses is an error (`OnCorrupt::Fail`) or is renamed `*.corrupt` with a warning
/// (`OnCorrupt::Empty`). At most `limit` namespaces are restored (sorted by name; the rest are
/// warned about and left on disk).
pub fn load_all(
    dir: &Path,
    config: &DrafterConfig,
    on_corrupt: OnCorrupt,
    limit: usize,
) -> Result<Vec<Restored>, PersistError> {
    let io = |source| PersistError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::create_dir_all(dir).map_err(io)?;
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(namespace) = name.to_str().and_then(namespace_of) else {
            continue;
        };
        found.push((namespace, entry.path()));
    }
    found.sort();
    let mut restored = Vec::with_capacity(found.len().min(limit));
    for (namespace, path) in found {
        if restored.len() >= limit {
            tracing::warn!(path = %path.display(), limit, "snapshot not restored: --max-namespaces reached");
            continue;
        }
        let bytes = fs::read(&path).map_err(|source| PersistError::Io {
            path: path.clone(),
            source,
        })?;
        let (core, replicated_through) = decode_file(&bytes);
        match Drafter::from_snapshot(config.clone(), core) {
            Ok(drafter) => {
                tracing::info!(namespace = %namespace, path = %path.display(), bytes = bytes.len(), replicated_through, "snapshot restored");
                restored.push(Restored {
                    namespace,
                    drafter,
                    path,
                    replicated_through,
                });
            }
            Err(source) => match on_corrupt {
                OnCorrupt::Fail => return Err(PersistError::Corrupt { path, source }),
                OnCorrupt::Empty => {
                    let aside = corrupt_path(&path);
                    fs::rename(&path, &aside).map_err(|source| PersistError::Io {
                        path: path.clone(),
                        source,
                    })?;
                    tracing::warn!(
                        namespace = %namespace,
                        path = %path.display(),
                        moved_to = %aside.display(),
                        error = %source,
                        "CORRUPT SNAPSHOT SKIPPED: the namespace starts empty; the file was moved aside"
                    );
                }
            },
        }
    }
    Ok(restored)
}

/// `file.snap` → `file.snap.corrupt` (or `.corrupt.1`, `.2`... if taken).
fn corrupt_path(path: &Path) -> PathBuf {
    let base = path.as_os_str().to_owned();
    let mut n = 0u32;
    loop {
        let mut candidate = base.clone();
        candidate.push(if n == 0 {
            ".corrupt".to_string()
        } else {
            format!(".corrupt.{n}")
        });
        let candidate = PathBuf::from(candidate);
        if !candidate.exists() {
            return candidate;
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_escape_and_round_trip() {
        for name in ["default", "qwen2.5/7b:v1", "a..b", "..", "x%y"] {
            let file = file_name(name);
            assert!(!file.contains('/'), "{file}");
            if resolve_name(name).is_ok() {
                assert_eq!(namespace_of(&file).as_deref(), Some(name), "{file}");
            }
        }
        assert_eq!(file_name("m/7b:v1"), "ns-m%2F7b%3Av1.snap");
        assert_eq!(namespace_of("ns-default.snap.corrupt"), None);
        assert_eq!(namespace_of(".ns-default.snap.tmp.7"), None);
        assert_eq!(namespace_of("ns-%2.snap"), None);
        assert_eq!(namespace_of("ns-%20.snap"), None);
        assert_eq!(namespace_of("ns-%2f.snap"), None);
    }

    fn learnt_drafter() -> Drafter {
        let d = Drafter::new(DrafterConfig::default()).expect("drafter");
        d.ingest(&[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])
            .expect("ingest");
        d
    }

    #[test]
    fn written_snapshots_load_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = learnt_drafter();
        write_atomic(dir.path(), "m/1", &d.snapshot()).expect("written");
        write_atomic(dir.path(), "m/1", &d.snapshot()).expect("overwritten");
        fs::write(dir.path().join("unrelated.txt"), b"x").expect("write");
        let restored =
            load_all(dir.path(), &DrafterConfig::default(), OnCorrupt::Fail, 8).expect("load");
        assert_eq!(restored.len(), 1);
        assert_eq!(restored[0].namespace, "m/1");
        assert_eq!(restored[0].drafter.stats().trie_nodes, d.stats().trie_nodes);
    }

    #[test]
    fn cluster_files_carry_their_stream_sequence() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = learnt_drafter();
        let file = encode_file(&d.snapshot(), 41);
        assert_eq!(decode_file(&file).1, 41);
        assert_eq!(
            encode_file(&d.snapshot(), 0),
            d.snapshot(),
            "no header outside a cluster"
        );
        write_atomic(dir.path(), "c", &file).expect("written");
        let restored =
            load_all(dir.path(), &DrafterConfig::default(), OnCorrupt::Fail, 8).expect("load");
        assert_eq!(restored[0].replicated_through, 41);
        assert_eq!(restored[0].drafter.stats().trie_nodes, d.stats().trie_nodes);
    }

    #[test]
    fn corrupt_snapshots_fail_or_are_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = learnt_drafter().snapshot();
        let path = write_atomic(dir.path(), "x", &bytes[..bytes.len() / 2]).expect("written");
        match load_all(dir.path(), &DrafterConfig::default(), OnCorrupt::Fail, 8) {
            Err(PersistError::Corrupt { path: p, .. }) => assert_eq!(p, path),
            Err(e) => panic!("expected a corrupt-file error, got {e}"),
            Ok(_) => panic!("a truncated snapshot was loaded"),
        }
        assert!(path.exists());
        let restored =
            load_all(dir.path(), &DrafterConfig::default(), OnCorrupt::Empty, 8).expect("skipped");
        assert!(restored.is_empty());
        assert!(!path.exists());
        assert!(dir.path().join("ns-x.snap.corrupt").exists());
    }
}
