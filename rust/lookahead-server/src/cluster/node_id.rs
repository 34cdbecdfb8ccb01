//! This server's id in the cluster: `--node-id`, or a random id kept in the snapshot
//! directory so that a restarted server is the same node (it then skips its own messages when
//! it replays the stream).

use std::path::Path;

/// The file of the snapshot directory that keeps the id.
pub const NODE_ID_FILE: &str = "node-id";

/// The node id: `given`, else the one in `snapshot_dir/node-id`, else a new random one
/// (written there when there is a snapshot directory). Errors name the file.
pub fn resolve(given: Option<&str>, snapshot_dir: Option<&Path>) -> Result<String, String> {
    if let Some(id) = given {
        return Ok(id.to_string());
    }
    let Some(dir) = snapshot_dir else {
        let id = random_id();
        tracing::warn!(node_id = %id, "no --node-id and no --snapshot-dir: this node id changes at every start");
        return Ok(id);
    };
    let path = dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if valid(id) {
                return Ok(id.to_string());
            }
            Err(format!(
                "{}: {id:?} is not a node id (1 to 64 letters, digits, '_' or '-')",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = random_id();
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&path, format!("{id}\n")))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            tracing::info!(node_id = %id, path = %path.display(), "new node id");
            Ok(id)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A fresh random id (22 characters from NATS's unique id generator).
fn random_id() -> String {
    nuid::next().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_given_or_kept_in_the_snapshot_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(resolve(Some("n1"), Some(dir.path())), Ok("n1".into()));
        let first = resolve(None, Some(dir.path())).expect("new id");
        assert!(valid(&first), "{first}");
        assert_eq!(resolve(None, Some(dir.path())), Ok(first.clone()), "stable");
        assert_ne!(resolve(None, None).expect("random"), first);
        std::fs::write(dir.path().join(NODE_ID_FILE), "bad id\n").expect("write");
        assert!(resolve(None, Some(dir.path())).is_err());
    }
}
