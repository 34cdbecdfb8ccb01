//! Learning from the other servers: one ordered JetStream consumer per namespace this server
//! serves, on that namespace's subject only, starting right after the last stream sequence
//! the namespace applied (restored from its snapshot, 0 for a new namespace: the whole
//! retained window). Each message of another node is applied once: a sequence at or before
//! the namespace's position is a redelivery and is skipped. Own, foreign and malformed
//! messages are counted and skipped; nothing here can stop the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::{self, Message};
use futures_util::StreamExt;
use tokio::sync::watch;

use super::Shared;
use super::convert::text_from_wire;
use super::publisher::unix_ms;
use super::wire;
use crate::namespaces::Namespace;

/// Consumes `ns`'s subject until `stop`; recreates the consumer after any error and after
/// every reconnection (from the namespace's position, so nothing is skipped or repeated).
pub async fn run(
    shared: Arc<Shared>,
    js: jetstream::Context,
    ns: Arc<Namespace>,
    mut epoch: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0usize;
    loop {
        if *stop.borrow() {
            return;
        }
        // Wait for a connection with the stream in place (the epoch moves at each one).
        if !shared.is_connected() || *epoch.borrow() == 0 {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = epoch.changed() => {}
            }
            continue;
        }
        epoch.borrow_and_update();
        match consume(&shared, &js, &ns, &mut epoch, &mut stop).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(namespace = %ns.name(), error = %e, "cluster: consumer failed; recreating it with backoff");
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(super::connection::reconnect_delay(failures)) => {}
                }
            }
        }
    }
}

/// Where to start: after the namespace's position, or at the stream's first message when
/// the position is 0, older than what the stream keeps, or past its end (another stream).
async fn start_policy(
    shared: &Shared,
    js: &jetstream::Context,
    ns: &Namespace,
) -> Result<DeliverPolicy, String> {
    let stream_name = shared.names.stream();
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| format!("stream {stream_name}: {e}"))?;
    let state = stream
        .get_info()
        .await
        .map_err(|e| format!("stream {stream_name}: {e}"))?
        .state;
    let applied = ns.replicated_through();
    if applied == 0 {
        return Ok(DeliverPolicy::All);
    }
    if applied > state.last_sequence {
        tracing::warn!(namespace = %ns.name(), applied, stream_last = state.last_sequence, "cluster: the snapshot is past the stream's end (the stream was recreated?); replaying the stream from its start");
        ns.restart_replication();
        return Ok(DeliverPolicy::All);
    }
    if applied + 1 < state.first_sequence {
        tracing::warn!(
            namespace = %ns.name(),
            missed = state.first_sequence - applied - 1,
            "cluster: messages after the snapshot expired from the stream before this server caught up (--cluster-max-age / --cluster-max-bytes)"
        );
    }
    Ok(DeliverPolicy::ByStartSequence {
        start_sequence: (applied + 1).max(state.first_sequence),
    })
}

/// Catch-up progress of one consumer (logged every few seconds while behind).
struct Progress {
    started: Instant,
    last_log: Instant,
    behind_at_start: Option<u64>,
    applied: u64,
}

async fn consume(
    shared: &Arc<Shared>,
    js: &jetstream::Context,
    ns: &Arc<Namespace>,
    epoch: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let deliver_policy = start_policy(shared, js, ns).await?;
    let stream_name = shared.names.stream();
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| format!("stream {stream_name}: {e}"))?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: shared.names.learn_subject(ns.name()),
            deliver_policy,
            ..pull::OrderedConfig::default()
        })
        .await
        .map_err(|e| format!("consumer: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("consumer: {e}"))?;
    let mut progress = Progress {
        started: Instant::now(),
        last_log: Instant::now(),
        behind_at_start: None,
        applied: 0,
    };
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            // A new connection: the consumer may be gone with the old one; start over.
            _ = epoch.changed() => return Ok(()),
            next = messages.next() => next,
        };
        match next {
            Some(Ok(message)) => handle(shared, ns, message, &mut progress).await?,
            Some(Err(e)) => return Err(format!("consumer: {e}")),
            None => return Err("consumer: the message stream ended".into()),
        }
    }
}

async fn handle(
    shared: &Arc<Shared>,
    ns: &Arc<Namespace>,
    message: Message,
    progress: &mut Progress,
) -> Result<(), String> {
    let info = message.info().map_err(|e| format!("message info: {e}"))?;
    let (seq, pending) = (info.stream_sequence, info.pending);
    let published = info.published;
    let metrics = &shared.metrics;
    match wire::accept_batch(&message.payload, &shared.names, ns.name(), &shared.node_id) {
        Err(skip) => {
            if skip != wire::Skip::Own {
                tracing::debug!(namespace = %ns.name(), seq, reason = skip.as_str(), "cluster: message skipped");
            }
            // Not applied, but passed: the position moves on.
            let advanced = ns.apply_replicated(seq, |_| ());
            metrics.skipped(
                ns.name(),
                if advanced.is_some() {
                    skip.as_str()
                } else {
                    "duplicate"
                },
            );
        }
        Ok(batch) => {
            let tokens: u64 = batch.texts.iter().map(wire::text_tokens).sum();
            let made_ms = batch.made_unix_ms;
            let texts: Vec<_> = batch.texts.into_iter().filter_map(text_from_wire).collect();
            let (target, origin) = (Arc::clone(ns), batch.origin);
            let outcome = tokio::task::spawn_blocking(move || {
                target.apply_replicated(seq, |drafter| {
                    texts
                        .iter()
                        .filter(|text| drafter.apply_learned(&origin, text).is_err())
                        .count()
                })
            })
            .await
            .map_err(|e| format!("apply task: {e}"))?;
            match outcome {
                None => metrics.skipped(ns.name(), "duplicate"),
                Some(refused) => {
                    let lag = (made_ms > 0)
                        .then(|| Duration::from_millis(unix_ms().saturating_sub(made_ms)));
                    metrics.consumed(ns.name(), tokens, lag);
                    if refused > 0 {
                        // Tokens out of this server's vocabulary: another model's namespace
                        // of the same name, most likely.
                        metrics.skipped(ns.name(), "refused");
                        tracing::debug!(namespace = %ns.name(), seq, refused, "cluster: texts refused by the drafter");
                    }
                }
            }
        }
    }
    let behind = if pending > 0 {
        let published_ms = u64::try_from(published.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        Duration::from_millis(unix_ms().saturating_sub(published_ms))
    } else {
        Duration::ZERO
    };
    metrics.set_position(ns.name(), seq, pending, behind);
    report_progress(ns.name(), pending, progress);
    Ok(())
}

fn report_progress(namespace: &str, pending: u64, progress: &mut Progress) {
    progress.applied += 1;
    let start = match progress.behind_at_start {
        Some(start) => start,
        None => {
            let start = pending + 1;
            progress.behind_at_start = Some(start);
            if start >= 100 {
                tracing::info!(
                    namespace,
                    messages = start,
                    "cluster: catching up on the stream"
                );
            }
            start
        }
    };
    if start < 100 {
        return;
    }
    if pending == 0 {
        tracing::info!(
            namespace,
            messages = progress.applied,
            seconds = progress.started.elapsed().as_secs_f64(),
            "cluster: caught up"
        );
        progress.behind_at_start = Some(0);
    } else if progress.last_log.elapsed() > Duration::from_secs(5) {
        progress.last_log = Instant::now();
        tracing::info!(
            namespace,
            applied = progress.applied,
            pending,
            "cluster: catching up"
        );
    }
}
