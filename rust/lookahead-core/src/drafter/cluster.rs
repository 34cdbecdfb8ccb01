//! What a drafter records for, and applies from, the other drafters of a cluster.

use super::*;

impl Drafter {
    /// The texts learnt since the last call, oldest first: ingested documents, the new tokens
    /// of running requests at every step, requests that ended. Empty unless
    /// [`DrafterConfig::record_for_cluster`]; bounded (past 1/64 of the memory budget the
    /// oldest are dropped, counted in [`Stats::cluster_dropped`]).
    pub fn take_learned(&self) -> Vec<LearnedText> {
        self.outboxes.take_learned()
    }

    /// The calibration counts recorded since the last call (engines' feedback on this
    /// drafter's drafts), as a text to apply elsewhere; `None` when there are none or without
    /// [`DrafterConfig::record_for_cluster`]. Counts applied from elsewhere are not included.
    pub fn take_calibration(&self) -> Option<LearnedText> {
        self.calibration
            .take_recorded()
            .map(LearnedText::Calibration)
    }

    /// Applies a text another drafter learnt (`origin` names that drafter), so that this one
    /// learns the same: its shared trie gets the text as that drafter's did (a running
    /// request's parts step by step, then the rest of it when it ends), a finished output
    /// becomes a sibling response of its group, calibration counts add to this drafter's.
    /// Not recorded for the cluster again. Applying a text twice counts it twice: keeping
    /// track of what was applied is the caller's job.
    pub fn apply_learned(&self, origin: &str, text: &LearnedText) -> Result<(), DraftError> {
        match text {
            LearnedText::Document(tokens) => {
                self.check_tokens("tokens", tokens)?;
                self.insert_text(tokens, 0, usize::MAX, Origin::NOBODY);
            }
            LearnedText::Request {
                prompt,
                output,
                finished,
                group,
                request,
                streamed,
            } => {
                self.check_tokens("prompt", prompt)?;
                self.check_tokens("output", output)?;
                let key = group_key(group.as_deref(), prompt)?;
                self.remote.lock().remove(member_key(origin, request));
                let shared =
                    self.groups.lock().contains_key(&key) || self.siblings.lock().contains(key);
                let text: Vec<Token> = prompt.iter().chain(output).copied().collect();
                let from = (*streamed).min(text.len());
                let shared_from = if shared { prompt.len() } else { usize::MAX };
                self.insert_text(&text, from, shared_from, Origin::OTHERS);
                if *finished {
                    self.siblings.lock().record(key, output.as_slice().into());
                }
            }
            LearnedText::Running {
                request,
                offset,
                tokens,
                shared_from,
            } => {
                self.check_tokens("tokens", tokens)?;
                let key = member_key(origin, request);
                let shared_from = shared_from.unwrap_or(usize::MAX);
                for (i, chunk) in tokens.chunks(INGEST_CHUNK).enumerate() {
                    let mut trie = self.trie.write();
                    self.refresh_node_limit(&mut trie);
                    let at = offset.saturating_add(i * INGEST_CHUNK);
                    self.remote
                        .lock()
                        .insert(&mut trie, key, at, chunk, shared_from);
                }
                self.counters
                    .tokens_ingested
                    .fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
            LearnedText::Calibration(counts) => self.apply_calibration(counts)?,
        }
        Ok(())
    }

    pub(super) fn apply_calibration(&self, counts: &CalibrationCounts) -> Result<(), DraftError> {
        use crate::calibration::CountsError;
        self.calibration
            .add(counts)
            .map_err(|e| DraftError::CalibrationCounts {
                reason: match e {
                    CountsError::Layout => "taken from calibration tables of another layout",
                    CountsError::Count => "a counter out of range or with more hits than trials",
                },
            })
    }

    /// New output tokens of the members of every group since the last call, oldest first.
    /// Empty unless [`DrafterConfig::record_for_cluster`]; bounded like
    /// [`Self::take_learned`].
    pub fn take_group_updates(&self) -> Vec<GroupUpdate> {
        self.outboxes.take_group_updates()
    }

    /// The groups with an active request here: those whose members elsewhere matter.
    pub fn active_groups(&self) -> Vec<GroupKey> {
        self.groups.lock().keys().copied().collect()
    }

    /// Applies a member update from another drafter (`origin` names it): the member's new
    /// tokens join its group's index, so that the requests here draft from them. Ignored when
    /// no request of the group is active here. Duplicates are skipped and gaps tolerated.
    pub fn apply_group_update(&self, origin: &str, update: &GroupUpdate) -> Result<(), DraftError> {
        self.check_tokens("tokens", &update.tokens)?;
        let Some(group) = self.groups.lock().get(&update.group).cloned() else {
            return Ok(());
        };
        let mut group = group.lock();
        if group.active == 0 {
            return Ok(()); // the group's last request here ended meanwhile
        }
        let room = self.request_share().saturating_sub(self.memory.requests());
        let member = member_key(origin, &update.member);
        group.extend(member, update.offset, &update.tokens, room);
        if update.finished {
            group.finish(member);
        }
        self.account_group(&mut group);
        Ok(())
    }

    /// Records for the cluster what a running request's step queued for the shared trie: its
    /// text since the last part (nothing once it ended: its ended text carries the rest).
    /// Recorded when queued, not when inserted, so that it can go out as soon as the step is
    /// answered.
    pub(super) fn record_running(&self, state: &mut RequestState) {
        let Some(streamed) = state.streamed else {
            return;
        };
        let written = state.own_text().len();
        if written <= streamed {
            return;
        }
        let shared_from = self.output_start_if_shared(state);
        let part = LearnedText::Running {
            request: state.id.clone(),
            offset: streamed,
            tokens: state.own_text()[streamed..].to_vec(),
            shared_from: (shared_from != usize::MAX).then(|| shared_from - state.prefix_len),
        };
        state.streamed = Some(written);
        self.outboxes.learned(part, written - streamed);
    }

    /// Where a request's output starts in its text when other samples of its group exist
    /// (running, or finished and remembered), else `usize::MAX`: the trie keeps the output of
    /// a shared prompt at more orders, since its other samples are likely to repeat it.
    pub(super) fn output_start_if_shared(&self, state: &RequestState) -> usize {
        let shared =
            state.group.lock().members() >= 2 || self.siblings.lock().contains(state.group_key);
        if shared {
            state.prefix_len + state.prompt_len
        } else {
            usize::MAX
        }
    }
}
