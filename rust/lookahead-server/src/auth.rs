//! Access control: bearer tokens from a file (`--auth-tokens`), each granting some namespaces
//! or all of them. Calls carry `authorization: Bearer TOKEN`. Without the flag every call is
//! allowed everything.
//!
//! File format: one grant per line, `TOKEN NAMESPACE[,NAMESPACE...]` or `TOKEN *`; blank lines
//! and text after `#` are ignored; the default namespace is `default`. The file is reloaded on
//! SIGHUP and when its modification time or size changes; a reload that fails keeps the
//! previous grants (and logs why).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::namespaces::resolve_name;

/// What one token may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Every namespace.
    All,
    /// These namespaces (resolved names).
    Only(HashSet<String>),
}

impl Grant {
    /// Whether the grant covers the namespace a call named (empty: the default one). An
    /// invalid name is allowed here: the call refuses it with INVALID_ARGUMENT afterwards.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(set) => match resolve_name(namespace) {
                Ok(name) => set.contains(name),
                Err(_) => true,
            },
        }
    }

    /// `Status::permission_denied` naming the namespace, unless the grant covers it.
    pub fn check(&self, namespace: &str) -> Result<(), Status> {
        if self.allows(namespace) {
            return Ok(());
        }
        let name = resolve_name(namespace).unwrap_or(namespace);
        Err(crate::status::field_status(
            tonic::Code::PermissionDenied,
            "namespace",
            format!("the token does not grant namespace {name:?}"),
        ))
    }
}

/// Parses a tokens file.
pub fn parse(text: &str) -> Result<HashMap<String, Grant>, String> {
    let mut tokens = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(token), Some(spec), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `TOKEN NAMESPACE[,NAMESPACE...]` or `TOKEN *`",
                number + 1
            ));
        };
        let grant = if spec == "*" {
            Grant::All
        } else {
            let mut set = HashSet::new();
            for name in spec.split(',') {
                let resolved =
                    resolve_name(name).map_err(|e| format!("line {}: {e}", number + 1))?;
                set.insert(resolved.to_string());
            }
            Grant::Only(set)
        };
        if tokens.insert(token.to_string(), grant).is_some() {
            return Err(format!("line {}: token repeated", number + 1));
        }
    }
    Ok(tokens)
}

/// The token table of the server, reloadable.
pub struct Auth {
    path: Option<PathBuf>,
    tokens: RwLock<Arc<HashMap<String, Grant>>>,
    /// Modification time and size of the file when last loaded.
    seen: Mutex<Option<(SystemTime, u64)>>,
}

fn file_version(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

impl Auth {
    /// No access control: every call is allowed everything.
    pub fn disabled() -> Self {
        Self {
            path: None,
            tokens: RwLock::new(Arc::new(HashMap::new())),
            seen: Mutex::new(None),
        }
    }

    /// Loads the tokens file (an error names the file and the line).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let auth = Self {
            path: Some(path.to_path_buf()),
            tokens: RwLock::new(Arc::new(HashMap::new())),
            seen: Mutex::new(None),
        };
        auth.reload()?;
        Ok(auth)
    }

    /// Whether tokens are required.
    pub fn enabled(&self) -> bool {
        self.path.is_some()
    }

    /// Reads the file again. On error the previous tokens stay in force.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let version = file_version(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("tokens file {}: {e}", path.display()))?;
        let tokens = parse(&text).map_err(|e| format!("tokens file {}: {e}", path.display()))?;
        let count = tokens.len();
        *self.tokens.write() = Arc::new(tokens);
        *self.seen.lock() = version;
        Ok(count)
    }

    /// Reloads the file if its modification time or size changed since the last load.
    pub fn reload_if_changed(&self) {
        let Some(path) = &self.path else { return };
        let now = file_version(path);
        if now.is_none() || *self.seen.lock() == now {
            return;
        }
        self.reload_logged("file changed");
    }

    /// Reloads and logs the outcome.
    pub fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(tokens) => tracing::info!(tokens, reason = why, "auth tokens reloaded"),
            Err(e) => {
                tracing::error!(error = %e, reason = why, "auth tokens NOT reloaded; the previous ones stay in force");
            }
        }
    }

    /// The grant of the call's bearer token: UNAUTHENTICATED when tokens are required and the
    /// call has none or an unknown one.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Grant, Status> {
        if self.path.is_none() {
            return Ok(Grant::All);
        }
        let header = metadata.get("authorization").ok_or_else(|| {
            Status::unauthenticated("missing `authorization: Bearer TOKEN` metadata")
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated("the authorization metadata is not `Bearer TOKEN`")
            })?;
        self.tokens
            .read()
            .get(token)
            .cloned()
            .ok_or_else(|| Status::unauthenticated("unknown bearer token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_parse_and_grants_apply() {
        let tokens = parse("# comment\nabc m1,m2/x\n\nroot *  # all\nd default\n").expect("parses");
        assert!(tokens["abc"].allows("m1"));
        assert!(tokens["abc"].allows("m2/x"));
        assert!(!tokens["abc"].allows("other"));
        assert!(!tokens["abc"].allows(""));
        assert!(tokens["d"].allows(""));
        assert!(tokens["root"].allows("anything"));
        assert!(parse("lonely\n").is_err());
        assert!(parse("t bad name\n").is_err());
        assert!(parse("t a\nt b\n").is_err());
        assert!(parse("t a b c\n").is_err());
    }

    #[test]
    fn bearer_tokens_are_checked_and_reloaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, "t1 a\n").expect("write");
        let auth = Auth::from_file(&path).expect("loads");
        let mut md = MetadataMap::new();
        assert_eq!(
            auth.authenticate(&md).expect_err("no token").code(),
            tonic::Code::Unauthenticated
        );
        md.insert("authorization", "Bearer t1".parse().expect("ascii"));
        assert_eq!(
            auth.authenticate(&md).expect("known"),
            Grant::Only(["a".to_string()].into())
        );
        std::fs::write(&path, "t2 *\n# longer file so the size changes\n").expect("write");
        auth.reload_if_changed();
        assert!(auth.authenticate(&md).is_err());
        std::fs::write(&path, "broken line here x\n").expect("write");
        auth.reload_logged("test");
        md.insert("authorization", "Bearer t2".parse().expect("ascii"));
        assert_eq!(auth.authenticate(&md).expect("kept"), Grant::All);
        assert!(Auth::disabled().authenticate(&MetadataMap::new()).is_ok());
    }
}
