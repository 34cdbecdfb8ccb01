//! One engine step: tokens applied, drafts built under one read of the trie, sized
//! drafts cut against the step's cost, inserts queued.

use super::*;

impl Drafter {
    pub(super) fn run_step(
        &self,
        items: &[StepItem<'_>],
        cost: Option<&StepCost>,
        defer: bool,
    ) -> Vec<Result<Drafted, DraftError>> {
        // 1. validate and apply tokens (each request under its own lock)
        let applied: Vec<Result<SharedRequest, DraftError>> = items
            .iter()
            .map(|item| self.validate(item).and_then(|()| self.apply(item)))
            .collect();
        // 2. draft, all under one read section of the trie
        let mut results = Vec::with_capacity(items.len());
        {
            let trie = self.trie.read();
            let mut context = Vec::new();
            for (item, applied) in items.iter().zip(&applied) {
                results.push(applied.as_ref().map_err(Clone::clone).map(|request| {
                    let mut state = request.lock();
                    // a finished request was removed when its tokens were applied
                    let held = if item.finished {
                        0
                    } else {
                        state.own_text().len()
                    };
                    if item.finished || item.budget == 0 {
                        let tree = DraftTree::empty(state.own_text().last().copied());
                        return Drafted { tree, held };
                    }
                    let tree = self.draft_locked(&mut state, &trie, item, &mut context);
                    if state.accounted_bytes != 0 {
                        self.account(&mut state); // not once ended: its bytes left the total
                    }
                    Drafted { tree, held }
                }));
            }
        }
        self.size(items, &mut results, cost);
        // 3. queue the inserts, then apply them unless deferred
        {
            let mut pending = self.pending.lock();
            for request in applied.iter().flatten() {
                let mut state = request.lock();
                if state.pending() > 0 && !state.queued {
                    state.queued = true;
                    pending.push(request.clone());
                }
                if self.config.record_for_cluster {
                    self.record_running(&mut state);
                }
            }
        }
        if !defer {
            self.flush_inserts();
        }
        results
    }

    /// Cuts the sized drafts of a step to the lengths that pay most against its cost
    /// ([`crate::sizing`]); without a cost, every size costs the same (whole caps).
    pub(super) fn size(
        &self,
        items: &[StepItem<'_>],
        results: &mut [Result<Drafted, DraftError>],
        cost: Option<&StepCost>,
    ) {
        let sized: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].shape.is_sized() && results[i].is_ok())
            .collect();
        if sized.is_empty() {
            return;
        }
        // the engine's measured acceptance of the scores weighs them (1 without a cost)
        let weight = cost.map_or(1.0, |c| c.acceptance as f32);
        let gains: Vec<Vec<f32>> = sized
            .iter()
            .map(|&i| match &results[i] {
                Ok(drafted) => {
                    let mut scores = drafted.tree.best_first_scores();
                    scores.iter_mut().for_each(|s| *s *= weight);
                    scores
                }
                Err(_) => Vec::new(),
            })
            .collect();
        let refs: Vec<&[f32]> = gains.iter().map(Vec::as_slice).collect();
        let decoding = items.iter().filter(|item| !item.finished).count() as u32;
        let lengths = match cost {
            Some(cost) => {
                let step = self.counters.costed_steps.fetch_add(1, Ordering::Relaxed);
                let every = u64::from(cost.explore_every);
                let explore = every > 0 && step % every == every - 1;
                let base = if cost.base_tokens > 0 {
                    cost.base_tokens
                } else {
                    decoding
                };
                sizing::choose(&refs, &cost.curve, cost.layout, base, explore)
            }
            None => sizing::choose(&refs, &CostCurve::flat(), Layout::Ragged, decoding, false),
        };
        for (&i, length) in sized.iter().zip(lengths) {
            if let Ok(Drafted { tree, .. }) = &mut results[i]
                && length < tree.len()
            {
                self.counters
                    .sized_away
                    .fetch_add((tree.len() - length) as u64, Ordering::Relaxed);
                *tree = tree.keep_best(length);
            }
        }
    }

    pub(super) fn draft_locked(
        &self,
        state: &mut RequestState,
        trie: &NgramTrie,
        item: &StepItem<'_>,
        context: &mut Vec<(u32, u32)>,
    ) -> DraftTree {
        let Some(&root) = state.own_text().last() else {
            return DraftTree::empty(None);
        };
        state.cursor.context_nodes(trie, state.sam.text(), context);
        let group = state.group.lock();
        let sources = DraftSources {
            sam: &state.sam,
            trie,
            calibration: &self.calibration,
            context_nodes: context,
            anchor: state.anchor.position(state.sam.text().len()),
            context_counted: state.fully_inserted(),
            group: group.draft_source(state.member),
            origin: state.origin,
            own_from: state.prefix_len as u32,
        };
        let params = DraftParams {
            budget: item.budget,
            min_score: self.config.min_score,
            chain: self.config.chain || item.shape.is_chain(),
            temperature_band: temperature_band(item.temperature),
        };
        let draft = build(&sources, root, state.sam.longest_earlier_suffix(), params);
        drop(group);
        self.counters.drafts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .draft_nodes
            .fetch_add(draft.tree.len() as u64, Ordering::Relaxed);
        if state.last_draft.text_len == state.sam.text().len() {
            // Drafted again at the same place (a repeated step): the first draft is the one
            // the next tokens score, so that a repeat teaches the calibration nothing twice.
            return draft.tree;
        }
        state.last_draft = LastDraft {
            text_len: state.sam.text().len(),
            tree_tokens: draft.growth_tokens,
            tree_parents: draft.growth_parents,
            tree_realised: draft.growth_realised,
            tree_foreign: draft.growth_foreign,
            considered: draft.considered,
        };
        draft.tree
    }
}
