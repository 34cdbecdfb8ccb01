//! In-flight groups across servers: the new output tokens of every request are published
//! right after its step, on its group's core NATS subject; a server subscribes to the subjects
//! of the groups it has an active request in, for as long as it has one, and feeds what the
//! other servers' members wrote to its drafter's group index. Nothing is stored: a server
//! that joins a group late drafts from what it receives from then on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lookahead_core::GroupKey;
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

/// Publishes the group updates of every step and keeps the subscriptions in line with the
/// active groups, until `stop`. `stepped` is notified by every step of every namespace.
pub async fn run(
    shared: Arc<Shared>,
    client: async_nats::Client,
    stepped: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut subscriptions: HashMap<(String, GroupKey), Subscription> = HashMap::new();
    let mut ticker = tokio::time::interval(RESYNC_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = stepped.notified() => {}
            _ = ticker.tick() => {}
        }
        let namespaces = shared.namespaces.all();
        for ns in &namespaces {
            publish_updates(&shared, &client, ns).await;
        }
        // While disconnected the client renews the existing subscriptions by itself.
        if shared.is_connected() {
            resubscribe(&shared, &client, &namespaces, &mut subscriptions).await;
        }
        shared.metrics.set_group_subscriptions(subscriptions.len());
    }
}

/// Publishes what the namespace's drafter recorded since the last call, one message per group.
async fn publish_updates(shared: &Shared, client: &async_nats::Client, ns: &Namespace) {
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
        let tokens: u64 = updates.iter().map(|u| u.tokens.len() as u64).sum();
        let message = wire::GroupUpdates {
            cluster: shared.names.cluster().to_string(),
            namespace: ns.name().to_string(),
            origin: shared.node_id.clone(),
            updates,
        };
        let subject = shared.names.group_subject(ns.name(), group.0);
        // Core NATS: no acknowledgement, nothing kept while disconnected (in-flight tokens are
        // only useful now).
        let sent = shared.is_connected()
            && client
                .publish(subject, message.encode_to_vec().into())
                .await
                .is_ok();
        shared.metrics.group_published(sent, tokens);
    }
}

/// Subscribes to the groups that became active and drops the subscriptions of those that
/// ended.
async fn resubscribe(
    shared: &Arc<Shared>,
    client: &async_nats::Client,
    namespaces: &[Arc<Namespace>],
    subscriptions: &mut HashMap<(String, GroupKey), Subscription>,
) {
    let mut active = std::collections::HashSet::new();
    for ns in namespaces {
        for group in ns.drafter().active_groups() {
            let key = (ns.name().to_string(), group);
            if !subscriptions.contains_key(&key) {
                let subject = shared.names.group_subject(ns.name(), group.0);
                match client.subscribe(subject).await {
                    Ok(subscriber) => {
                        let task =
                            tokio::spawn(receive(Arc::clone(shared), Arc::clone(ns), subscriber));
                        subscriptions.insert(key.clone(), Subscription { task });
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cluster: group subscription failed; retried at the next step");
                        continue;
                    }
                }
            }
            active.insert(key);
        }
    }
    subscriptions.retain(|key, _| active.contains(key));
}

/// Applies the other servers' updates of one group to `ns` while subscribed.
async fn receive(shared: Arc<Shared>, ns: Arc<Namespace>, mut subscriber: async_nats::Subscriber) {
    while let Some(message) = subscriber.next().await {
        match wire::accept_group_updates(
            &message.payload,
            &shared.names,
            ns.name(),
            &shared.node_id,
        ) {
            Ok(updates) => {
                let mut tokens = 0u64;
                for update in updates.updates {
                    let update = update_from_wire(update);
                    tokens += update.tokens.len() as u64;
                    if ns
                        .drafter()
                        .apply_group_update(&updates.origin, &update)
                        .is_err()
                    {
                        shared.metrics.skipped(ns.name(), "refused");
                    }
                }
                shared.metrics.group_applied(tokens);
            }
            Err(wire::Skip::Own) => {}
            Err(skip) => shared.metrics.skipped(ns.name(), skip.as_str()),
        }
    }
}
