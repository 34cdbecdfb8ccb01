//! A drafter in the engine's own process (the embedded drafter of `lookahead_client`), built
//! like one of a server's namespaces: a step that brings many tokens is answered before its
//! shared-trie inserts, which the namespace's own thread applies while the engine runs its
//! forward pass, and the next step waits for them, so every draft is the one an inline step
//! gives. Optionally a member of a cluster ([`crate::member`]).

use std::sync::Arc;

use lookahead_core::{DraftError, Drafted, Drafter, DrafterConfig, Stats, StepCost, StepItem};

use crate::error::ServerError;
use crate::member::{ClusterMember, MemberSettings};
use crate::metrics::ServerMetrics;
use crate::namespaces::{Namespace, Namespaces};

/// Steps that bring fewer tokens (prompts and new tokens) insert them inline: handing the
/// inserts to the thread costs about as much as inserting 10 tokens (`lookahead-bench
/// proposer`, chat at batch 1: 35 us a step deferred against 27 inline; at batch 32 the mean
/// fell from 1.09 to 0.77 ms).
const DEFER_FROM_TOKENS: usize = 16;

/// The drafter of one engine process.
pub struct LocalDrafter {
    namespace: Arc<Namespace>,
    member: Option<ClusterMember>,
}

impl std::fmt::Debug for LocalDrafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalDrafter")
            .field("namespace", &self.namespace.name())
            .field("member", &self.member)
            .finish()
    }
}

impl LocalDrafter {
    /// A drafter with `config` (checked by the caller) for `namespace` (empty: the default
    /// one), a member of the cluster `cluster` names (None: on its own). Errors are a bad namespace name, bad
    /// cluster settings, and a cluster thread that cannot start.
    pub fn new(
        mut config: DrafterConfig,
        namespace: &str,
        cluster: Option<&MemberSettings>,
    ) -> Result<Self, ServerError> {
        config.record_for_cluster = cluster.is_some();
        let namespaces = Arc::new(Namespaces::new(
            config,
            1,
            Arc::new(ServerMetrics::default()),
        ));
        let invalid = |e: crate::namespaces::NamespaceError| ServerError::Config {
            field: "namespace",
            reason: e.to_string(),
        };
        let ns = namespaces.get_or_create(namespace).map_err(invalid)?;
        let member = cluster
            .map(|settings| ClusterMember::join(Arc::clone(&namespaces), ns.name(), settings))
            .transpose()?;
        Ok(Self {
            namespace: ns,
            member,
        })
    }

    /// One engine step (see [`Drafter::step_drafted`]); the inserts of a step that brings
    /// [`DEFER_FROM_TOKENS`] tokens or more follow on the namespace's thread.
    pub fn step(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
    ) -> Vec<Result<Drafted, DraftError>> {
        let brought: usize = items
            .iter()
            .map(|i| i.new_tokens.len() + i.prompt.map_or(0, <[_]>::len))
            .sum();
        if brought < DEFER_FROM_TOKENS {
            self.namespace.step_inline(items, cost)
        } else {
            self.namespace.step(items, cost)
        }
    }

    /// The drafter, with every answered step's inserts applied (for calls between steps).
    pub fn drafter(&self) -> &Drafter {
        self.namespace.settled()
    }

    /// The drafter's counters, with every answered step's inserts applied.
    pub fn stats(&self) -> Stats {
        self.namespace.stats()
    }

    /// The drafter's membership of a cluster (None: on its own).
    pub fn member(&self) -> Option<&ClusterMember> {
        self.member.as_ref()
    }
}
