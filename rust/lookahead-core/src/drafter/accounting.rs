//! The drafter's memory account: heap bytes of the active requests and of their groups.
//!
//! Invariant: `requests` counts every active request's bytes and every live group's bytes
//! (groups are part of what requests hold); `groups` counts the groups alone. Each request and
//! group keeps the bytes it last reported (`accounted_bytes`), so a change moves the totals by
//! the difference and a removal by what was reported.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Totals of heap bytes, updated without a lock.
#[derive(Debug, Default)]
pub(super) struct MemoryAccount {
    requests: AtomicUsize,
    groups: AtomicUsize,
}

impl MemoryAccount {
    /// Heap bytes of the active requests, their groups included.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// Heap bytes of the groups alone.
    pub fn groups(&self) -> usize {
        self.groups.load(Ordering::Relaxed)
    }

    /// A request went from `before` to `after` bytes (0: it was removed).
    pub fn request_changed(&self, before: usize, after: usize) {
        adjust(&self.requests, before, after);
    }

    /// A group went from `before` to `after` bytes (0: it was dropped).
    pub fn group_changed(&self, before: usize, after: usize) {
        adjust(&self.requests, before, after);
        adjust(&self.groups, before, after);
    }
}

/// Moves an atomic total by the change of one part from `before` to `after` bytes.
fn adjust(total: &AtomicUsize, before: usize, after: usize) {
    if after >= before {
        total.fetch_add(after - before, Ordering::Relaxed);
    } else {
        total.fetch_sub(before - after, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_count_in_both_totals_and_removals_take_back_what_was_reported() {
        let account = MemoryAccount::default();
        account.request_changed(0, 100);
        account.group_changed(0, 40);
        assert_eq!((account.requests(), account.groups()), (140, 40));
        account.request_changed(100, 60);
        account.group_changed(40, 50);
        assert_eq!((account.requests(), account.groups()), (110, 50));
        account.request_changed(60, 0);
        account.group_changed(50, 0);
        assert_eq!((account.requests(), account.groups()), (0, 0));
    }
}
