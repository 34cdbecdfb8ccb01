//! The gRPC service: [`LookaheadService`] implements `lookahead.v1.Lookahead` over the
//! namespaces' drafters.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::auth::{Auth, Grant};
use crate::convert::push_tokens;
use crate::metrics::ServerMetrics;
use crate::namespaces::{NamespaceError, Namespaces};
use crate::pb::lookahead_server::Lookahead;
use crate::pb::{
    InfoRequest, InfoResponse, IngestRequest, IngestResponse, ReplicaStats, StatsRequest,
    StatsResponse, StepRequest, StepResponse,
};
use crate::status::field_status;
use crate::step::{Refusal, StepLimits, run_step};

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Self {
        field_status(r.code, r.field, r.message)
    }
}

/// Settings of the service that are not the drafter's.
#[derive(Clone, Debug)]
pub struct ServiceLimits {
    /// Most requests in one step.
    pub max_requests_per_step: usize,
    /// Largest message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Most tokens in one step.
    pub max_step_tokens: usize,
    /// Most active requests per namespace.
    pub max_active_requests: usize,
}

/// The `lookahead.v1.Lookahead` service. Cheap to clone (shared state behind an `Arc`).
#[derive(Clone)]
pub struct LookaheadService {
    inner: Arc<Inner>,
}

struct Inner {
    namespaces: Arc<Namespaces>,
    auth: Arc<Auth>,
    metrics: Arc<ServerMetrics>,
    step_limits: StepLimits,
    limits: ServiceLimits,
    /// Becomes true when the server shuts down: open streams end with UNAVAILABLE.
    shutdown: watch::Receiver<bool>,
}

impl LookaheadService {
    /// A service over `namespaces`; open streams end when `shutdown` becomes true. Calls
    /// are checked against `auth` and counted in `metrics`.
    pub fn new(
        namespaces: Arc<Namespaces>,
        limits: ServiceLimits,
        shutdown: watch::Receiver<bool>,
        auth: Arc<Auth>,
        metrics: Arc<ServerMetrics>,
    ) -> Self {
        let drafter = namespaces.drafter_config();
        let step_limits = StepLimits {
            max_requests_per_step: limits.max_requests_per_step,
            vocab_size: drafter.vocab_size,
            max_budget: drafter.max_budget,
            max_step_tokens: limits.max_step_tokens,
            max_active_requests: limits.max_active_requests,
        };
        Self {
            inner: Arc::new(Inner {
                namespaces,
                auth,
                metrics,
                step_limits,
                limits,
                shutdown,
            }),
        }
    }

    /// One step of a stream: a refusal becomes `StepResponse.error`, not the end of the stream.
    fn stream_step(&self, request: StepRequest) -> StepResponse {
        let step_id = request.step_id;
        match run_step(&self.inner.namespaces, &self.inner.step_limits, request) {
            Ok(response) => response,
            Err(refusal) => {
                tracing::debug!(field = refusal.field, message = %refusal.message, "stream step refused");
                StepResponse {
                    step_id,
                    error: Some(refusal.to_request_error()),
                    ..StepResponse::default()
                }
            }
        }
    }
}

impl LookaheadService {
    /// Counts a failed call in the metrics and passes the outcome on.
    fn counted<T>(&self, method: &'static str, outcome: Result<T, Status>) -> Result<T, Status> {
        if let Err(status) = &outcome {
            self.inner.metrics.call_error(method, status.code());
        }
        outcome
    }

    fn unary_step(&self, request: Request<StepRequest>) -> Result<StepResponse, Status> {
        let grant = self.inner.auth.authenticate(request.metadata())?;
        let request = request.into_inner();
        grant.check(&request.namespace)?;
        Ok(run_step(
            &self.inner.namespaces,
            &self.inner.step_limits,
            request,
        )?)
    }

    async fn ingest_all(
        &self,
        request: Request<Streaming<IngestRequest>>,
    ) -> Result<IngestResponse, Status> {
        let grant = self.inner.auth.authenticate(request.metadata())?;
        let mut inbound = request.into_inner();
        let vocab_size = self.inner.step_limits.vocab_size;
        let mut documents: u64 = 0;
        let mut tokens: u64 = 0;
        let mut last_namespace = crate::namespaces::DEFAULT_NAMESPACE.to_string();
        while let Some(message) = inbound.message().await? {
            grant.check(&message.namespace)?;
            let namespace = self
                .inner
                .namespaces
                .get_or_create(&message.namespace)
                .map_err(namespace_status)?;
            last_namespace = namespace.name().to_string();
            // Inserting a corpus is CPU work: keep it off the async workers.
            let outcome = tokio::task::spawn_blocking(move || {
                let mut buffer = Vec::new();
                let mut done: (u64, u64) = (0, 0);
                for (index, document) in message.documents.iter().enumerate() {
                    buffer.clear();
                    let field = format!("documents[{index}].tokens");
                    if let Err(bad) = push_tokens(&document.tokens, vocab_size, &mut buffer) {
                        return Err((done, Code::InvalidArgument, bad.describe(&field), field));
                    }
                    if let Err(e) = namespace.ingest(&buffer) {
                        let code = match e {
                            lookahead_core::DraftError::MemoryExhausted { .. }
                            | lookahead_core::DraftError::RequestTooLong { .. } => {
                                Code::ResourceExhausted
                            }
                            _ => Code::InvalidArgument,
                        };
                        return Err((
                            done,
                            code,
                            format!("documents[{index}]: {e}"),
                            format!("documents[{index}]"),
                        ));
                    }
                    done.0 += 1;
                    done.1 += buffer.len() as u64;
                }
                Ok(done)
            })
            .await
            .map_err(|e| Status::internal(format!("ingest task failed: {e}")))?;
            match outcome {
                Ok((d, t)) => {
                    documents += d;
                    tokens += t;
                }
                Err(((d, _), code, what, field)) => {
                    let ingested = documents + d;
                    let message = format!(
                        "{what}; {ingested} documents of this call were ingested before it"
                    );
                    return Err(field_status(code, &field, message));
                }
            }
        }
        tracing::info!(namespace = %last_namespace, documents, tokens, "ingested");
        Ok(IngestResponse {
            namespace: last_namespace,
            documents,
            tokens,
        })
    }
}

fn namespace_status(e: NamespaceError) -> Status {
    Status::from(Refusal::from(e))
}

/// The stream of answers of `StepStream`.
pub type StepStream = Pin<Box<dyn Stream<Item = Result<StepResponse, Status>> + Send + 'static>>;

/// What the answer stream carries from one message to the next.
struct StreamState {
    grant: Grant,
    inbound: Streaming<StepRequest>,
    shutdown: watch::Receiver<bool>,
    service: LookaheadService,
}

fn shutting_down() -> Status {
    Status::unavailable("the server is shutting down; reconnect to another instance or retry later")
}

#[tonic::async_trait]
impl Lookahead for LookaheadService {
    async fn step(&self, request: Request<StepRequest>) -> Result<Response<StepResponse>, Status> {
        let outcome = self.unary_step(request);
        self.counted("Step", outcome).map(Response::new)
    }

    type StepStreamStream = StepStream;

    async fn step_stream(
        &self,
        request: Request<Streaming<StepRequest>>,
    ) -> Result<Response<Self::StepStreamStream>, Status> {
        let grant = self.counted(
            "StepStream",
            self.inner.auth.authenticate(request.metadata()),
        )?;
        let state = StreamState {
            grant,
            inbound: request.into_inner(),
            shutdown: self.inner.shutdown.clone(),
            service: self.clone(),
        };
        // Each answer is produced when tonic polls for it: no task or channel in between.
        let answers = futures_util::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            if *state.shutdown.borrow() {
                return Some((Err(shutting_down()), None));
            }
            tokio::select! {
                biased;
                _ = state.shutdown.changed() => Some((Err(shutting_down()), None)),
                message = state.inbound.message() => match message {
                    Ok(Some(request)) => {
                        if let Err(status) = state.grant.check(&request.namespace) {
                            state.service.inner.metrics.call_error("StepStream", status.code());
                            return Some((Err(status), None));
                        }
                        let response = state.service.stream_step(request);
                        Some((Ok(response), Some(state)))
                    }
                    Ok(None) => None,
                    Err(status) => {
                        tracing::debug!(%status, "step stream ended by a bad message");
                        Some((Err(status), None))
                    }
                },
            }
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn ingest(
        &self,
        request: Request<Streaming<IngestRequest>>,
    ) -> Result<Response<IngestResponse>, Status> {
        let outcome = self.ingest_all(request).await;
        self.counted("Ingest", outcome).map(Response::new)
    }

    async fn stats(
        &self,
        request: Request<StatsRequest>,
    ) -> Result<Response<StatsResponse>, Status> {
        let outcome = self
            .inner
            .auth
            .authenticate(request.metadata())
            .and_then(|grant| {
                let name = &request.get_ref().namespace;
                grant.check(name)?;
                self.inner.namespaces.get(name).map_err(namespace_status)
            });
        let namespace = self.counted("Stats", outcome)?;
        let s = namespace.stats();
        let n = |v: usize| v as u64;
        Ok(Response::new(StatsResponse {
            namespace: namespace.name().to_string(),
            active_requests: n(s.active_requests),
            trie_nodes: n(s.trie_nodes),
            memory_bytes: n(s.memory_bytes),
            memory_budget_bytes: n(s.memory_budget_bytes),
            trie_bytes_per_node: s.trie_bytes_per_node,
            evicted_nodes: s.evicted_nodes,
            tokens_ingested: s.tokens_ingested,
            drafts: s.drafts,
            draft_nodes: s.draft_nodes,
            accepted_reported: s.accepted_reported,
            steps_reported: s.steps_reported,
            active_groups: n(s.active_groups),
            group_bytes: n(s.group_bytes),
            sized_away: s.sized_away,
            accepted_cross_replica: s.accepted_cross_replica,
            replicas: s
                .replicas
                .into_iter()
                .map(|r| ReplicaStats {
                    replica: r.replica,
                    accepted_reported: r.accepted_reported,
                    accepted_cross_replica: r.accepted_cross_replica,
                })
                .collect(),
        }))
    }

    async fn info(&self, request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let grant = self.counted("Info", self.inner.auth.authenticate(request.metadata()))?;
        let drafter = self.inner.namespaces.drafter_config();
        let saturate = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(Response::new(InfoResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            vocab_size: u64::from(drafter.vocab_size),
            max_budget: saturate(drafter.max_budget),
            max_ngram: saturate(drafter.max_ngram),
            max_requests_per_step: saturate(self.inner.limits.max_requests_per_step),
            max_message_bytes: self.inner.limits.max_message_bytes as u64,
            max_namespaces: saturate(self.inner.namespaces.limit()),
            namespace_memory_budget_bytes: drafter.memory_budget_bytes as u64,
            namespaces: self
                .inner
                .namespaces
                .names()
                .into_iter()
                .filter(|name| grant.allows(name))
                .collect(),
        }))
    }
}
