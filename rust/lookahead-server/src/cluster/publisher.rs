//! Publishing what this server learns: the texts each namespace's drafter recorded (running
//! requests' new tokens, ended requests, documents) are taken, encoded into batches and
//! queued in the bounded [`Outbox`], with the calibration counts recorded since the last ones
//! every [`CALIBRATION_INTERVAL`]; a sender publishes the queue to JetStream in order,
//! waiting for each acknowledgement. Steps never wait for any of it: the drafters only
//! record, and the network is this task's.
//!
//! When: right after a step while nothing waits to be sent (a running request's tokens reach
//! the other servers' tries within a step or so), else as soon as the sender has sent what
//! waited (so batches grow with the load instead of queueing), and at least every
//! `--cluster-batch-ms` (texts recorded outside steps; batches while NATS is away).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream;
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::{Notify, watch};

use super::Shared;
use super::convert::text_to_wire;
use super::outbox::{Outbox, Outgoing};
use super::wire;

/// The largest payload a batch is made with (NATS servers take 1 MiB by default). A single
/// text above it is dropped and counted.
pub const MAX_BATCH_BYTES: usize = 512 << 10;
/// Time between two takes of a namespace's calibration counts: they move slowly, and each
/// take sends every counter that changed since the last.
pub const CALIBRATION_INTERVAL: Duration = Duration::from_millis(200);
/// Time given to JetStream to acknowledge a message before it is sent again.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The queue between the collector and the sender.
pub struct Queue {
    outbox: Mutex<Outbox>,
    /// Wakes the sender: batches were queued.
    ready: Notify,
    /// Wakes the collector: the sender emptied the queue.
    drained: Notify,
}

impl Queue {
    /// An empty queue of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            outbox: Mutex::new(Outbox::new(limit)),
            ready: Notify::new(),
            drained: Notify::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.outbox.lock().front().is_none()
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Batches made by this process so far, and the process's incarnation (part of every message
/// id, so that a restarted server's ids never repeat).
struct Numbering {
    incarnation: String,
    batches: u64,
    /// When calibration counts were last taken.
    calibrated: Instant,
}

/// Takes the drafters' records and queues them: after a step (`stepped`) unless batches wait
/// to be sent, when the sender emptied the queue, and every batch interval.
pub async fn collect(
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    stepped: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(shared.config.batch_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut numbering = Numbering {
        incarnation: nuid::next().to_string(),
        batches: 0,
        calibrated: Instant::now(),
    };
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {
                collect_once(&shared, &queue, &mut numbering);
                return;
            }
            _ = ticker.tick() => {}
            () = queue.drained.notified() => {}
            // While batches wait, the sender's drain collects what this step recorded.
            () = stepped.notified() => if !queue.is_empty() { continue },
        }
        collect_once(&shared, &queue, &mut numbering);
    }
}

fn collect_once(shared: &Shared, queue: &Queue, numbering: &mut Numbering) {
    let mut queued = false;
    let calibrate = numbering.calibrated.elapsed() >= CALIBRATION_INTERVAL;
    if calibrate {
        numbering.calibrated = Instant::now();
    }
    for ns in shared.namespaces.all() {
        let mut texts = ns.drafter().take_learned();
        if calibrate {
            texts.extend(ns.drafter().take_calibration());
        }
        if texts.is_empty() {
            continue;
        }
        let subject = shared.names.learn_subject(ns.name());
        for batch in split(texts.into_iter().map(text_to_wire), shared, ns.name()) {
            numbering.batches += 1;
            let batch = wire::LearnedBatch {
                cluster: shared.names.cluster().to_string(),
                namespace: ns.name().to_string(),
                origin: shared.node_id.clone(),
                batch: numbering.batches,
                texts: batch,
                made_unix_ms: unix_ms(),
            };
            let tokens = batch.texts.iter().map(wire::text_tokens).sum();
            let message = Outgoing {
                subject: subject.clone(),
                msg_id: format!(
                    "{}/{}/{}",
                    shared.node_id, numbering.incarnation, numbering.batches
                ),
                payload: batch.encode_to_vec(),
                tokens,
            };
            let dropped = queue.outbox.lock().push(message);
            if dropped.messages > 0 {
                shared.metrics.dropped(dropped.messages, dropped.tokens);
            }
            queued = true;
        }
    }
    shared
        .metrics
        .set_outgoing_bytes(queue.outbox.lock().bytes());
    if queued {
        queue.ready.notify_one();
    }
}

/// Groups texts into batches of at most [`MAX_BATCH_BYTES`] encoded; a text larger than that
/// alone is dropped (and counted).
fn split(
    texts: impl Iterator<Item = wire::LearnedText>,
    shared: &Shared,
    namespace: &str,
) -> Vec<Vec<wire::LearnedText>> {
    let mut batches = Vec::new();
    let (mut current, mut bytes) = (Vec::new(), 0usize);
    for text in texts {
        let size = text.encoded_len() + 4;
        if size > MAX_BATCH_BYTES {
            tracing::warn!(
                namespace,
                bytes = size,
                "cluster: a text too large for one message was not published"
            );
            shared.metrics.dropped(1, wire::text_tokens(&text));
            continue;
        }
        if bytes + size > MAX_BATCH_BYTES {
            batches.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(text);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Publishes the queue in order until `stop`; then tries for a moment to publish what is
/// left (a graceful shutdown loses nothing NATS could take).
pub async fn send(
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    js: jetstream::Context,
    mut connected: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0usize;
    loop {
        let next = queue.outbox.lock().front().cloned();
        let Some(message) = next else {
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                () = queue.ready.notified() => {}
            }
            continue;
        };
        if !*connected.borrow() {
            if *stop.borrow() {
                return;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = connected.wait_for(|c| *c) => {}
            }
            continue;
        }
        match publish(&js, &message).await {
            Ok(()) => {
                failures = 0;
                let mut outbox = queue.outbox.lock();
                // The message may have been dropped meanwhile (the buffer was full).
                if outbox.front().is_some_and(|m| m.msg_id == message.msg_id) {
                    outbox.pop();
                }
                shared.metrics.set_outgoing_bytes(outbox.bytes());
                let drained = outbox.front().is_none();
                drop(outbox);
                shared.metrics.published(message.tokens);
                if drained {
                    queue.drained.notify_one();
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %e, subject = %message.subject, "cluster: publish failed; retrying with backoff (messages wait in the bounded buffer)");
                }
                if *stop.borrow() {
                    return;
                }
                tokio::time::sleep(super::connection::reconnect_delay(failures)).await;
            }
        }
    }
}

async fn publish(js: &jetstream::Context, message: &Outgoing) -> Result<(), String> {
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, message.msg_id.as_str());
    let ack = js
        .publish_with_headers(
            message.subject.clone(),
            headers,
            message.payload.clone().into(),
        )
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(ACK_TIMEOUT, ack).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no acknowledgement within 5 s".into()),
    }
}
