//! Memory accounting: the trie's node limit from what the requests and groups use.

use super::*;

impl Drafter {
    /// The calibration tables, recording what they learn for the cluster if the drafter does.
    pub(super) fn calibration_for(config: &DrafterConfig, calibration: Calibration) -> Calibration {
        if config.record_for_cluster {
            calibration.recording()
        } else {
            calibration
        }
    }

    /// Tokens each cluster outbox holds at most: 1/64 of the budget.
    pub(super) fn outbox_tokens(config: &DrafterConfig) -> usize {
        config.memory_budget_bytes / 64 / size_of::<Token>()
    }

    /// Trie nodes allowed now: what the budget leaves after requests and fixed tables.
    pub(super) fn trie_node_limit(&self, trie: &NgramTrie) -> usize {
        let cluster = if self.config.record_for_cluster {
            2 * Self::outbox_tokens(&self.config) * size_of::<Token>()
                + self.remote.lock().heap_bytes()
        } else {
            0
        };
        let fixed = self.calibration.heap_bytes()
            + self.siblings.lock().heap_bytes()
            + trie.unigram_table_bytes()
            + cluster
            + (64 << 10);
        let used = fixed + self.memory.requests();
        self.config.memory_budget_bytes.saturating_sub(used) / BYTES_PER_NODE_BOUND
    }

    /// Brings the trie's node limit up to date with the memory used elsewhere.
    pub(super) fn refresh_node_limit(&self, trie: &mut NgramTrie) {
        let limit = self.trie_node_limit(trie);
        trie.set_node_limit(limit);
    }

    /// Active requests may use up to half the budget; the trie always keeps the other half.
    pub(super) fn request_share(&self) -> usize {
        self.config.memory_budget_bytes / 2
    }

    /// Adds output tokens of a request (from output position `offset`) to its group.
    pub(super) fn extend_member(&self, state: &RequestState, offset: u32, tokens: &[Token]) {
        let mut group = state.group.lock();
        let room = self.request_share().saturating_sub(self.memory.requests());
        group.extend(state.member, offset, tokens, room);
        self.account_group(&mut group);
    }

    /// Brings the drafter's totals of request and group bytes up to date with a group.
    pub(super) fn account_group(&self, group: &mut Group) {
        let (before, after) = (group.accounted_bytes, group.heap_bytes());
        self.memory.group_changed(before, after);
        group.accounted_bytes = after;
    }

    /// Brings the drafter's total of request bytes up to date with an active request.
    pub(super) fn account(&self, state: &mut RequestState) {
        self.memory
            .request_changed(state.accounted_bytes, state.heap_bytes());
        state.accounted_bytes = state.heap_bytes();
    }
}
