//! In-flight groups across servers: the new output tokens of every request are published
//! right after its step, on its group's core NATS subject; a server subscribes to the subjects
//! of the groups it has an active request in, for as long as it has one, and feeds what the
//! other servers' members wrote to its drafter's group index.
//!
//! Core NATS keeps nothing, so a server that joins a group late asks for the history: right
//! after subscribing it sends a `want_history` message, and every server with members in the
//! group answers with each member's whole output so far (kept here while the group is active
//! on that server, bounded). The joining server holds what arrives for [`HISTORY_WAIT`] and
//! applies it in output order, so a history that arrives after a newer update is not lost.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lookahead_core::{GroupKey, Token};
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::Shared;
use super::convert::{update_from_wire, update_to_wire};
use super::wire;
use crate::namespaces::Namespace;

/// The longest a change of a namespace's active groups waits to be seen (steps also wake the
/// task at once).
const RESYNC_INTERVAL: Duration = Duration::from_millis(50);
/// How long a server that just joined a group collects the other members' history.
pub const HISTORY_WAIT: Duration = Duration::from_millis(20);
/// Tokens of history kept for all local members together; past it a member's history is
/// dropped (late joiners then draft from its later tokens only).
const MAX_HISTORY_TOKENS: usize = 1 << 22;

/// A group of a namespace.
type GroupId = (String, GroupKey);

/// The output so far of one local member, as published.
#[derive(Default)]
struct MemberHistory {
    /// Output position of `tokens[0]`.
    base: u32,
    tokens: Vec<Token>,
    finished: bool,
    /// Dropped for the bound: not served any more.
    dropped: bool,
}

/// What the local members of active groups have published, and the history requests to
/// answer.
#[derive(Default)]
struct History {
    groups: HashMap<GroupId, HashMap<String, MemberHistory>>,
    tokens: usize,
    /// Groups whose history another server asked for.
    wanted: HashSet<GroupId>,
}

impl History {
    fn record(&mut self, id: &GroupId, update: &wire::GroupUpdate) {
        let member = self
            .groups
            .entry(id.clone())
            .or_default()
            .entry(update.member.clone())
            .or_default();
        if member.dropped {
            return;
        }
        if member.tokens.is_empty() {
            member.base = update.offset;
        }
        let known = member.base as usize + member.tokens.len();
        if update.offset as usize != known || self.tokens + update.tokens.len() > MAX_HISTORY_TOKENS
        {
            // A gap (the core's own bound dropped updates) or the bound: stop serving it.
            self.tokens -= member.tokens.len();
            member.tokens = Vec::new();
            member.dropped = true;
            return;
        }
        member.tokens.extend_from_slice(&update.tokens);
        member.finished |= update.finished;
        self.tokens += update.tokens.len();
    }

    /// The whole output of the group's local members, as updates from their first position.
    fn replay(&self, id: &GroupId) -> Vec<wire::GroupUpdate> {
        let Some(members) = self.groups.get(id) else {
            return Vec::new();
        };
        members
            .iter()
            .filter(|(_, m)| !m.dropped && !m.tokens.is_empty())
            .map(|(member, m)| wire::GroupUpdate {
                group: id.1.0,
                member: member.clone(),
                offset: m.base,
                tokens: m.tokens.clone(),
                finished: m.finished,
            })
            .collect()
    }

    /// Forgets the groups no longer active here.
    fn retain(&mut self, active: &HashSet<GroupId>) {
        let mut freed = 0;
        self.groups.retain(|id, members| {
            let keep = active.contains(id);
            if !keep {
                freed += members.values().map(|m| m.tokens.len()).sum::<usize>();
            }
            keep
        });
        self.tokens -= freed;
        self.wanted.retain(|id| active.contains(id));
    }
}

/// What the subscription tasks share with the main task.
struct GroupsShared {
    cluster: Arc<Shared>,
    history: Mutex<History>,
    /// Wakes the main task (a history to send).
    wake: Arc<Notify>,
}

/// A subscription to one group's subject, held while the group is active here.
struct Subscription {
    task: JoinHandle<()>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Ending the task drops the subscriber, which unsubscribes.
        self.task.abort();
    }
}

/// Publishes the group updates of every step, answers history requests and keeps the
/// subscriptions in line with the active groups, until `stop`. `stepped` is notified by every
/// step of every namespace.
pub async fn run(
    shared: Arc<Shared>,
    client: async_nats::Client,
    stepped: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let groups = Arc::new(GroupsShared {
        cluster: shared,
        history: Mutex::new(History::default()),
        wake: stepped,
    });
    let mut subscriptions: HashMap<GroupId, Subscription> = HashMap::new();
    let mut ticker = tokio::time::interval(RESYNC_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = groups.wake.notified() => {}
            _ = ticker.tick() => {}
        }
        let namespaces = groups.cluster.namespaces.all();
        // Histories first: what a joining server gets before our next updates comes first.
        send_histories(&groups, &client).await;
        for ns in &namespaces {
            publish_updates(&groups, &client, ns).await;
        }
        // While disconnected the client renews the existing subscriptions by itself.
        if groups.cluster.is_connected() {
            resubscribe(&groups, &client, &namespaces, &mut subscriptions).await;
        }
        groups
            .cluster
            .metrics
            .set_group_subscriptions(subscriptions.len());
    }
}

async fn publish(
    groups: &GroupsShared,
    client: &async_nats::Client,
    id: &GroupId,
    message: wire::GroupUpdates,
) {
    let cluster = &groups.cluster;
    let tokens: u64 = message.updates.iter().map(|u| u.tokens.len() as u64).sum();
    let subject = cluster.names.group_subject(&id.0, id.1.0);
    // Core NATS: no acknowledgement, nothing kept while disconnected (in-flight tokens are
    // only useful now).
    let sent = cluster.is_connected()
        && client
            .publish(subject, message.encode_to_vec().into())
            .await
            .is_ok();
    cluster.metrics.group_published(sent, tokens);
}

fn message(
    groups: &GroupsShared,
    namespace: &str,
    updates: Vec<wire::GroupUpdate>,
) -> wire::GroupUpdates {
    wire::GroupUpdates {
        cluster: groups.cluster.names.cluster().to_string(),
        namespace: namespace.to_string(),
        origin: groups.cluster.node_id.clone(),
        updates,
        want_history: false,
    }
}

/// Answers the history requests received since the last call.
async fn send_histories(groups: &GroupsShared, client: &async_nats::Client) {
    let replies: Vec<(GroupId, Vec<wire::GroupUpdate>)> = {
        let mut history = groups.history.lock();
        let wanted: Vec<GroupId> = history.wanted.drain().collect();
        wanted
            .into_iter()
            .map(|id| {
                let updates = history.replay(&id);
                (id, updates)
            })
            .filter(|(_, updates)| !updates.is_empty())
            .collect()
    };
    for (id, updates) in replies {
        let reply = message(groups, &id.0, updates);
        publish(groups, client, &id, reply).await;
    }
}

/// Publishes what the namespace's drafter recorded since the last call, one message per group.
async fn publish_updates(groups: &GroupsShared, client: &async_nats::Client, ns: &Namespace) {
    let updates = ns.drafter().take_group_updates();
    if updates.is_empty() {
        return;
    }
    let mut by_group: HashMap<GroupKey, Vec<wire::GroupUpdate>> = HashMap::new();
    for update in updates {
        by_group
            .entry(update.group)
            .or_default()
            .push(update_to_wire(update));
    }
    for (group, updates) in by_group {
        let id = (ns.name().to_string(), group);
        {
            let mut history = groups.history.lock();
            for update in &updates {
                history.record(&id, update);
            }
        }
        let update = message(groups, ns.name(), updates);
        publish(groups, client, &id, update).await;
    }
}

/// Subscribes to the groups that became active (and asks for their history), and drops the
/// subscriptions and histories of those that ended.
async fn resubscribe(
    groups: &Arc<GroupsShared>,
    client: &async_nats::Client,
    namespaces: &[Arc<Namespace>],
    subscriptions: &mut HashMap<GroupId, Subscription>,
) {
    let mut active = HashSet::new();
    for ns in namespaces {
        for group in ns.drafter().active_groups() {
            let id = (ns.name().to_string(), group);
            if !subscriptions.contains_key(&id) {
                let subject = groups.cluster.names.group_subject(ns.name(), group.0);
                let subscriber = match client.subscribe(subject).await {
                    Ok(subscriber) => subscriber,
                    Err(e) => {
                        tracing::debug!(error = %e, "cluster: group subscription failed; retried at the next step");
                        continue;
                    }
                };
                let mut ask = message(groups, ns.name(), Vec::new());
                ask.want_history = true;
                publish(groups, client, &id, ask).await;
                let task = tokio::spawn(receive(
                    Arc::clone(groups),
                    Arc::clone(ns),
                    id.clone(),
                    subscriber,
                ));
                subscriptions.insert(id.clone(), Subscription { task });
            }
            active.insert(id);
        }
    }
    subscriptions.retain(|id, _| active.contains(id));
    groups.history.lock().retain(&active);
}

/// Applies the other servers' updates of one group to `ns` while subscribed: for the first
/// [`HISTORY_WAIT`] in output order (histories and updates may cross), then as they come.
/// History requests of other servers are handed to the main task.
async fn receive(
    groups: Arc<GroupsShared>,
    ns: Arc<Namespace>,
    id: GroupId,
    mut subscriber: async_nats::Subscriber,
) {
    let cluster = &groups.cluster;
    let mut held: Vec<(String, wire::GroupUpdate)> = Vec::new();
    let deadline = tokio::time::Instant::now() + HISTORY_WAIT;
    let mut holding = true;
    loop {
        let next = if holding {
            match tokio::time::timeout_at(deadline, subscriber.next()).await {
                Ok(next) => next,
                Err(_) => {
                    holding = false;
                    // Per member in output order: an earlier start first.
                    held.sort_by_key(|(origin, u)| (origin.clone(), u.member.clone(), u.offset));
                    for (origin, update) in held.drain(..) {
                        apply(cluster, &ns, &origin, update);
                    }
                    continue;
                }
            }
        } else {
            subscriber.next().await
        };
        let Some(message) = next else { return };
        match wire::accept_group_updates(
            &message.payload,
            &cluster.names,
            ns.name(),
            &cluster.node_id,
        ) {
            Ok(updates) if updates.want_history => {
                groups.history.lock().wanted.insert(id.clone());
                groups.wake.notify_one();
            }
            Ok(updates) => {
                for update in updates.updates {
                    if holding {
                        held.push((updates.origin.clone(), update));
                    } else {
                        apply(cluster, &ns, &updates.origin, update);
                    }
                }
            }
            Err(wire::Skip::Own) => {}
            Err(skip) => cluster.metrics.skipped(ns.name(), skip.as_str()),
        }
    }
}

fn apply(cluster: &Shared, ns: &Namespace, origin: &str, update: wire::GroupUpdate) {
    let update = update_from_wire(update);
    let tokens = update.tokens.len() as u64;
    if ns.drafter().apply_group_update(origin, &update).is_err() {
        cluster.metrics.skipped(ns.name(), "refused");
    } else {
        cluster.metrics.group_applied(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(member: &str, offset: u32, tokens: &[Token], finished: bool) -> wire::GroupUpdate {
        wire::GroupUpdate {
            group: 7,
            member: member.into(),
            offset,
            tokens: tokens.to_vec(),
            finished,
        }
    }

    #[test]
    fn histories_hold_each_members_output_until_the_group_ends() {
        let id: GroupId = ("ns".into(), GroupKey(7));
        let mut history = History::default();
        history.record(&id, &update("a", 0, &[1, 2], false));
        history.record(&id, &update("a", 2, &[3], true));
        history.record(&id, &update("b", 0, &[9], false));
        history.record(&id, &update("b", 5, &[8], false)); // a gap: b is not served
        let mut replay = history.replay(&id);
        replay.sort_by(|x, y| x.member.cmp(&y.member));
        assert_eq!(replay, vec![update("a", 0, &[1, 2, 3], true)]);
        assert_eq!(history.tokens, 3);
        history.retain(&HashSet::new());
        assert!(history.replay(&id).is_empty());
        assert_eq!(history.tokens, 0);
    }
}
