//! The actors: one SDK connection each, every loop bounded by its batch count (consumers also
//! by a no-progress timeout). Each returns its samples; the caller merges them.

use super::stats::{Kind, Sample};
use super::workload::{Pacer, TOPIC_NAME};
use bytes::Bytes;
use iggy::prelude::*;
use indicatif::ProgressBar;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a consumer sleeps after an empty poll before asking again.
const EMPTY_POLL_BACKOFF: Duration = Duration::from_millis(2);

/// Connection settings shared by every actor.
#[derive(Clone)]
pub struct Connection {
    pub address: String,
    pub username: String,
    pub password: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

impl Connection {
    /// Connect and log in, within the connect timeout.
    pub async fn client(&self) -> Result<IggyClient, String> {
        let client = IggyClient::builder()
            .with_tcp()
            .with_server_address(self.address.clone())
            .with_no_delay()
            .with_reconnection_max_retries(Some(0))
            .build()
            .map_err(|e| format!("cannot build an SDK client for {}: {e}", self.address))?;
        let login = async {
            client.connect().await?;
            client.login_user(&self.username, &self.password).await
        };
        match tokio::time::timeout(self.connect_timeout, login).await {
            Ok(Ok(_)) => Ok(client),
            Ok(Err(e)) => Err(format!(
                "cannot connect and log in to {} as {}: {e}",
                self.address, self.username
            )),
            Err(_) => Err(format!(
                "connecting to {} took longer than {:?}",
                self.address, self.connect_timeout
            )),
        }
    }

    /// Run one request within the request timeout.
    pub async fn bounded<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, IggyError>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(format!("{what}: {e}")),
            Err(_) => Err(format!("{what}: no reply within {:?}", self.request_timeout)),
        }
    }
}

/// What every actor gets.
pub struct ActorContext {
    pub connection: Connection,
    /// The common start: sample times are measured from it.
    pub epoch: Instant,
    pub progress: ProgressBar,
}

pub struct ProducerPlan {
    pub actor: usize,
    pub stream: Identifier,
    pub partitions: u32,
    /// Balanced over the partitions by the SDK (else round robin by batch, explicitly).
    pub balanced: bool,
    pub message_size: usize,
    pub messages_per_batch: u32,
    pub batches: u64,
    pub rate_limit: Option<u64>,
}

pub struct ActorResult {
    pub samples: Vec<Sample>,
    pub empty_polls: u64,
}

fn message_batch(plan: &ProducerPlan) -> Result<Vec<IggyMessage>, String> {
    let payload = Bytes::from(vec![0x5a_u8; plan.message_size]);
    (0..plan.messages_per_batch)
        .map(|_| {
            IggyMessage::builder()
                .payload(payload.clone())
                .build()
                .map_err(|e| format!("cannot build a {} B message: {e}", plan.message_size))
        })
        .collect()
}

/// Send `batches` batches, waiting for each acknowledgement before the next.
pub async fn produce(
    context: Arc<ActorContext>,
    client: IggyClient,
    plan: ProducerPlan,
    start: Arc<tokio::sync::Barrier>,
) -> Result<ActorResult, String> {
    // First, so a failure below can never leave the others waiting at the start line.
    start.wait().await;
    let topic = Identifier::named(TOPIC_NAME).map_err(|e| e.to_string())?;
    let mut batch = message_batch(&plan)?;
    let batch_bytes = plan.message_size as u64 * u64::from(plan.messages_per_batch);
    let mut pacer = plan.rate_limit.map(|rate| {
        // One batch of credit, at least 1 ms: smooth, yet a sleep's granularity does not
        // throttle small batches below the rate.
        let one_batch = Duration::from_nanos(
            u64::try_from(u128::from(batch_bytes) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX),
        );
        Pacer::new(rate, one_batch.max(Duration::from_millis(1)))
    });
    let mut samples = Vec::with_capacity(usize::try_from(plan.batches).unwrap_or(0).min(1 << 20));
    // Unique ids without a UUID per message: actor in the high half, a counter in the low.
    let mut next_id: u128 = ((plan.actor as u128 + 1) << 64) + 1;
    let actor_start = Instant::now();
    for index in 0..plan.batches {
        if let Some(pacer) = pacer.as_mut() {
            let due = pacer.next_due(actor_start.elapsed(), batch_bytes);
            tokio::time::sleep_until((actor_start + due).into()).await;
        }
        for message in batch.iter_mut() {
            message.header.id = next_id;
            next_id += 1;
        }
        let partitioning = if plan.balanced {
            Partitioning::balanced()
        } else {
            Partitioning::partition_id((index % u64::from(plan.partitions)) as u32)
        };
        let sent = Instant::now();
        context
            .connection
            .bounded(
                &format!("producer {} send {index}", plan.actor),
                client.send_messages(&plan.stream, &topic, &partitioning, &mut batch),
            )
            .await?;
        let latency = sent.elapsed();
        samples.push(Sample {
            kind: Kind::Send,
            start_us: sent.duration_since(context.epoch).as_micros() as u64,
            latency_us: latency.as_micros() as u64,
            messages: u64::from(plan.messages_per_batch),
            payload_bytes: batch_bytes,
        });
        context.progress.inc(u64::from(plan.messages_per_batch));
    }
    Ok(ActorResult {
        samples,
        empty_polls: 0,
    })
}

pub enum ConsumerMode {
    /// Poll partitions round robin by offset, as consumer `actor + 1`; stop after `target`
    /// messages.
    Pinned { partitions: u32, target: u64 },
    /// Poll as a member of the group (the server assigns partitions) with auto-commit; stop
    /// when the stream's shared counter reaches `target`.
    Group { consumed: Arc<AtomicU64>, target: u64 },
}

pub struct ConsumerPlan {
    pub actor: usize,
    pub stream: Identifier,
    pub messages_per_batch: u32,
    pub mode: ConsumerMode,
}

/// Poll until the target is read. Bounded: every poll either makes progress towards the target
/// or counts against the no-progress timeout (the request timeout).
pub async fn consume(
    context: Arc<ActorContext>,
    client: IggyClient,
    plan: ConsumerPlan,
    start: Arc<tokio::sync::Barrier>,
) -> Result<ActorResult, String> {
    // First, so a failure below can never leave the others waiting at the start line.
    start.wait().await;
    let topic = Identifier::named(TOPIC_NAME).map_err(|e| e.to_string())?;
    let (consumer, partitions) = match &plan.mode {
        ConsumerMode::Pinned { partitions, .. } => (
            Consumer::new(Identifier::numeric(plan.actor as u32 + 1).map_err(|e| e.to_string())?),
            *partitions,
        ),
        // Joined by the caller before the start.
        ConsumerMode::Group { .. } => (
            Consumer::group(Identifier::named(super::workload::GROUP_NAME).map_err(|e| e.to_string())?),
            0,
        ),
    };
    let mut offsets = vec![0u64; partitions as usize];
    let mut read = 0u64;
    let mut empty_polls = 0u64;
    let mut samples = Vec::new();
    let mut turn = 0usize;
    let mut last_progress = Instant::now();
    loop {
        let (partition, strategy, target) = match &plan.mode {
            ConsumerMode::Pinned { target, .. } => {
                if read >= *target {
                    break;
                }
                let partition = turn % offsets.len().max(1);
                turn = turn.wrapping_add(1);
                (
                    Some(partition as u32),
                    PollingStrategy::offset(offsets[partition]),
                    *target,
                )
            }
            ConsumerMode::Group { consumed, target } => {
                if consumed.load(Ordering::Relaxed) >= *target {
                    break;
                }
                (None, PollingStrategy::next(), *target)
            }
        };
        let count = match &plan.mode {
            ConsumerMode::Pinned { .. } => {
                u32::try_from((target - read).min(u64::from(plan.messages_per_batch))).unwrap_or(1)
            }
            ConsumerMode::Group { .. } => plan.messages_per_batch,
        };
        let auto_commit = matches!(plan.mode, ConsumerMode::Group { .. });
        let sent = Instant::now();
        let polled = context
            .connection
            .bounded(
                &format!("consumer {} poll", plan.actor),
                client.poll_messages(
                    &plan.stream,
                    &topic,
                    partition,
                    &consumer,
                    &strategy,
                    count,
                    auto_commit,
                ),
            )
            .await?;
        let latency = sent.elapsed();
        if polled.messages.is_empty() {
            empty_polls += 1;
            if last_progress.elapsed() > context.connection.request_timeout {
                return Err(format!(
                    "consumer {} saw no new messages for {:?} after reading {read} of {target}",
                    plan.actor, context.connection.request_timeout
                ));
            }
            tokio::time::sleep(EMPTY_POLL_BACKOFF).await;
            continue;
        }
        last_progress = Instant::now();
        let messages = polled.messages.len() as u64;
        let payload_bytes: u64 = polled.messages.iter().map(|m| m.payload.len() as u64).sum();
        if let (Some(partition), Some(last)) = (partition, polled.messages.last()) {
            offsets[partition as usize] = last.header.offset + 1;
        }
        read += messages;
        if let ConsumerMode::Group { consumed, .. } = &plan.mode {
            consumed.fetch_add(messages, Ordering::Relaxed);
        }
        samples.push(Sample {
            kind: Kind::Poll,
            start_us: sent.duration_since(context.epoch).as_micros() as u64,
            latency_us: latency.as_micros() as u64,
            messages,
            payload_bytes,
        });
        context.progress.inc(messages);
    }
    Ok(ActorResult { samples, empty_polls })
}
