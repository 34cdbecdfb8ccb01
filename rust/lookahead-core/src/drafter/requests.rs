//! Request lifecycle: checks, starts (and repeated starts), tokens applied once, ends.

use super::*;

impl Drafter {
    pub(super) fn check_tokens(
        &self,
        field: &'static str,
        tokens: &[Token],
    ) -> Result<(), DraftError> {
        let vocab_size = self.config.vocab_size;
        match tokens.iter().position(|&t| t >= vocab_size) {
            Some(index) => Err(DraftError::TokenOutOfRange {
                field,
                index,
                token: tokens[index],
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    pub(super) fn validate(&self, item: &StepItem<'_>) -> Result<(), DraftError> {
        if !(item.temperature.is_finite() && item.temperature >= 0.0) {
            return Err(DraftError::InvalidTemperature {
                value: item.temperature,
            });
        }
        if item.budget > self.config.max_budget {
            return Err(DraftError::BudgetTooLarge {
                budget: item.budget,
                max: self.config.max_budget,
            });
        }
        if let Some(prompt) = item.prompt {
            self.check_tokens("prompt", prompt)?;
            group_key(item.group, prompt)?;
        }
        self.check_tokens("new_tokens", item.new_tokens)
    }

    /// The request of an item: found, or (with a prompt) created. A start with an offset of
    /// an active request holding the same prompt finds it (a repeated first step).
    pub(super) fn request_of(&self, item: &StepItem<'_>) -> Result<SharedRequest, DraftError> {
        let Some(prompt) = item.prompt else {
            return self
                .requests
                .lock()
                .get(item.request_id)
                .cloned()
                .ok_or_else(|| DraftError::UnknownRequest {
                    request_id: item.request_id.to_owned(),
                });
        };
        if let Some(offset) = item.offset
            && offset != prompt.len()
        {
            return Err(DraftError::OffsetNotAfterPrompt {
                offset,
                prompt: prompt.len(),
            });
        }
        match self.begin(item, prompt) {
            Err(DraftError::RequestAlreadyActive { request_id }) if item.offset.is_some() => {
                let existing = self.requests.lock().get(item.request_id).cloned();
                match existing {
                    Some(request) if request.lock().own_text().starts_with(prompt) => Ok(request),
                    _ => Err(DraftError::RequestAlreadyActive { request_id }),
                }
            }
            started => started,
        }
    }

    /// The part of an item's new tokens the request does not hold yet, and whether the whole
    /// step had been applied before (checked against `offset`; see [`StepItem::offset`]).
    pub(super) fn unheld<'t>(
        item: &StepItem<'t>,
        state: &RequestState,
    ) -> Result<(&'t [Token], bool), DraftError> {
        let Some(offset) = item.offset else {
            return Ok((item.new_tokens, false));
        };
        let text = state.own_text();
        let held = text.len();
        if offset > held {
            return Err(DraftError::OffsetGap {
                request_id: item.request_id.to_owned(),
                offset,
                held,
            });
        }
        let overlap = (held - offset).min(item.new_tokens.len());
        if text[offset..offset + overlap] != item.new_tokens[..overlap] {
            return Err(DraftError::TokensDiffer {
                request_id: item.request_id.to_owned(),
                offset,
                held,
            });
        }
        // a repeat: everything it carries was held already (a step that also brings new
        // tokens is a new step, whose feedback counts)
        let repeated = offset < held && overlap == item.new_tokens.len();
        Ok((&item.new_tokens[overlap..], repeated))
    }

    /// Finds (or, with a prompt, creates) the request and applies the item's tokens it does
    /// not hold yet (the feedback of a repeated step is not counted twice).
    pub(super) fn apply(&self, item: &StepItem<'_>) -> Result<SharedRequest, DraftError> {
        let request = self.request_of(item)?;
        {
            let mut state = request.lock();
            let (new_tokens, repeated) = Self::unheld(item, &state)?;
            if let Some(accepted) = item.accepted_last
                && !repeated
            {
                self.counters
                    .accepted_reported
                    .fetch_add(u64::from(accepted), Ordering::Relaxed);
                self.counters.steps_reported.fetch_add(1, Ordering::Relaxed);
                let accepted = &new_tokens[..new_tokens.len().min(accepted as usize)];
                let foreign = state
                    .last_draft
                    .foreign_accepted(state.sam.text().len(), accepted);
                self.replicas
                    .accepted(state.origin, u64::from(accepted.len() as u32), foreign);
            }
            state.last_used = Instant::now();
            // where the new tokens start in the request's output
            let offset = state.response().len() as u32;
            if !new_tokens.is_empty() {
                let held = state.own_text().len() + new_tokens.len();
                if held > self.config.max_request_tokens {
                    return Err(DraftError::RequestTooLong {
                        request_id: item.request_id.to_owned(),
                        tokens: held,
                        max: self.config.max_request_tokens,
                    });
                }
                state.append(new_tokens, &self.calibration);
                self.account(&mut state);
                self.extend_member(&state, offset, new_tokens);
            }
            if self.config.record_for_cluster && (item.finished || !new_tokens.is_empty()) {
                let update = GroupUpdate {
                    group: state.group_key,
                    member: item.request_id.to_owned(),
                    offset,
                    tokens: new_tokens.to_vec(),
                    finished: item.finished,
                };
                self.outboxes.group_update(update, new_tokens.len());
            }
        }
        if item.finished {
            self.remove(item.request_id, true);
        }
        Ok(request)
    }

    /// The tokens (prompt included) an active request holds; `None` when it is not active.
    pub fn held_tokens(&self, request_id: &str) -> Option<usize> {
        let request = self.requests.lock().get(request_id).cloned()?;
        let held = request.lock().own_text().len();
        Some(held)
    }

    /// Removes an active request; a finished one's response becomes a sibling for later
    /// requests of its group. Its queued inserts still happen.
    pub(super) fn remove(&self, request_id: &str, finished: bool) -> bool {
        let removed = self.requests.lock().remove(request_id);
        let Some(request) = removed else { return false };
        let mut state = request.lock();
        self.memory.request_changed(state.accounted_bytes, 0);
        state.accounted_bytes = 0;
        self.leave_group(&state, finished);
        if self.config.record_for_cluster {
            // Tokens of the ending step go out as a part too: out of its group now, the
            // request's queued inserts keep the trie orders they get here.
            self.record_running(&mut state);
            let streamed = state.streamed.take().unwrap_or(0);
            let own = state.own_text();
            let text = LearnedText::Request {
                prompt: own[..state.prompt_len].to_vec(),
                output: state.response().to_vec(),
                finished,
                group: state.group_name.clone(),
                request: request_id.to_owned(),
                streamed,
            };
            self.outboxes.learned(text, own.len());
        }
        true
    }

    /// Takes a removed request out of its group; a finished one's output becomes history for
    /// later requests of the group (now, and as a sibling response once the group is gone).
    /// The last one out drops the group and frees its memory.
    pub(super) fn leave_group(&self, state: &RequestState, finished: bool) {
        let mut groups = self.groups.lock();
        let mut group = state.group.lock();
        if finished && !state.response().is_empty() {
            let output = group
                .finish(state.member)
                .unwrap_or_else(|| state.response().into());
            self.siblings.lock().record(state.group_key, output);
        }
        group.active -= 1;
        if group.active == 0 {
            groups.remove(&state.group_key);
            self.memory.group_changed(group.accounted_bytes, 0);
            group.accounted_bytes = 0;
        }
    }

    /// Ends every request no step has touched for `max_idle` (an engine that went away without
    /// ending them). Their text stays in the shared trie. Returns how many were ended. Other
    /// drafters' running requests no part reached for as long are forgotten too.
    pub fn expire_idle(&self, max_idle: Duration) -> usize {
        let now = Instant::now();
        self.remote.lock().expire(now, max_idle);
        let idle: Vec<String> = self
            .requests
            .lock()
            .iter()
            .filter(|(_, r)| {
                r.try_lock()
                    .is_some_and(|s| now.duration_since(s.last_used) > max_idle)
            })
            .map(|(id, _)| id.clone())
            .collect();
        idle.iter().filter(|id| self.remove(id, false)).count()
    }

    /// The group of a request that starts, which it joins (formed if it has no active
    /// request).
    pub(super) fn join_group(
        &self,
        key: GroupKey,
        request_id: &str,
    ) -> (SharedGroup, u64, Vec<Arc<[Token]>>) {
        let mut groups = self.groups.lock();
        let group = groups
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(Group::new(self.siblings.lock().get(key)))))
            .clone();
        let member = member_key("", request_id);
        let mut g = group.lock();
        g.active += 1;
        let history = g.join_with_history(member);
        self.account_group(&mut g);
        drop(g);
        (group, member, history)
    }

    pub(super) fn begin(
        &self,
        item: &StepItem<'_>,
        prompt: &[Token],
    ) -> Result<SharedRequest, DraftError> {
        let request_id = item.request_id;
        let tokens = prompt.len() + item.new_tokens.len();
        if tokens > self.config.max_request_tokens {
            return Err(DraftError::RequestTooLong {
                request_id: request_id.to_owned(),
                tokens,
                max: self.config.max_request_tokens,
            });
        }
        let needed = self.memory.requests() + tokens * SuffixAutomaton::bytes_per_token_bound();
        if needed > self.request_share() {
            return Err(DraftError::MemoryExhausted {
                needed,
                budget: self.request_share(),
            });
        }
        let already_active = || DraftError::RequestAlreadyActive {
            request_id: request_id.to_owned(),
        };
        if self.requests.lock().contains_key(request_id) {
            return Err(already_active());
        }
        // Built outside the table's lock: indexing a long prompt takes a while.
        let name = item.group.filter(|name| !name.is_empty());
        let key = group_key(name, prompt)?;
        let (group, member, history) = self.join_group(key, request_id);
        let mut state = RequestState::new(self.config.max_ngram, &history, group, member);
        state.append(prompt, &self.calibration);
        state.prompt_len = prompt.len();
        state.id = request_id.to_owned();
        state.group_key = key;
        state.group_name = name.map(str::to_owned);
        state.origin = item.origin;
        let mut requests = self.requests.lock();
        if requests.contains_key(request_id) {
            drop(requests);
            self.leave_group(&state, false);
            return Err(already_active());
        }
        self.account(&mut state);
        let shared = Arc::new(Mutex::new(state));
        requests.insert(request_id.to_owned(), shared.clone());
        Ok(shared)
    }
}
