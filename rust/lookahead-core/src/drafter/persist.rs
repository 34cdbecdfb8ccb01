//! Snapshots of the learnt state, and drafters restored from them.

use super::*;

impl Drafter {
    /// The learnt state (shared trie, calibration, sibling responses; in a cluster also where
    /// other drafters' running requests stand in the trie) as snapshot bytes. Active requests
    /// are not included. Drafts go on meanwhile; inserts wait for it.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.config.max_ngram as u32);
        let trie = self.trie.read();
        trie.encode(&mut w);
        self.calibration.encode(&mut w);
        self.siblings.lock().encode(&mut w);
        self.remote.lock().encode(&mut w);
        frame(&w.buf, SNAPSHOT_VERSION)
    }

    /// A drafter with `config` and the learnt state of a snapshot. The snapshot is checked
    /// whole before anything is built: a corrupt one is refused, never half-loaded.
    pub fn from_snapshot(config: DrafterConfig, bytes: &[u8]) -> Result<Self, SnapshotError> {
        let mut drafter = Self::new(config)?;
        let (version, payload) = unframe(bytes)?;
        let mut r = Reader::new(payload);
        let max_ngram = r.u32()?;
        if max_ngram as usize != drafter.config.max_ngram {
            return Err(SnapshotError::IncompatibleConfig {
                field: "max_ngram",
                snapshot: u64::from(max_ngram),
                config: drafter.config.max_ngram as u64,
            });
        }
        let limit = drafter.trie_node_limit(&drafter.trie.read());
        let trie = NgramTrie::decode(&mut r, drafter.config.max_ngram, limit)?;
        let calibration = Calibration::decode(&mut r, version)?;
        drafter.calibration = Self::calibration_for(&drafter.config, calibration);
        let max_sibling_tokens = drafter.siblings.get_mut().max_tokens();
        drafter.siblings = Mutex::new(SiblingResponses::decode(&mut r, max_sibling_tokens)?);
        if version >= 3 {
            let remote = drafter.remote.get_mut();
            *remote = RemoteTexts::decode(&mut r, remote.max_entries(), drafter.config.max_ngram)?;
        }
        if !r.is_empty() {
            return Err(SnapshotError::Corrupt("bytes left after the last section"));
        }
        drafter.trie = RwLock::new(trie);
        drafter.refresh_node_limit(&mut drafter.trie.write());
        Ok(drafter)
    }
}
