//! One engine step, from the wire message to the wire answer: checks every request, applies
//! the valid ones to the namespace's drafter in one batch, and answers each request with a
//! tree or with its own error.

use std::collections::HashMap;
use std::ops::Range;

use lookahead_core::{DraftShape, Drafted, MAX_GROUP_NAME_BYTES, StepColumns, StepCost, StepItem};

use crate::convert::{core_error, push_tokens, request_error, step_response};
use crate::namespaces::{Namespace, NamespaceError, Namespaces};
use crate::pb::{EngineCost, ErrorCode, RequestError, RequestStep, StepRequest, StepResponse};

/// The longest request id accepted, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 256;

/// The limits a step is checked against.
#[derive(Clone, Debug)]
pub struct StepLimits {
    /// Most requests in one step.
    pub max_requests_per_step: usize,
    /// Token ids must be below this.
    pub vocab_size: u32,
    /// Largest budget accepted.
    pub max_budget: usize,
    /// Most tokens (prompts plus new tokens) in one step.
    pub max_step_tokens: usize,
    /// Most active requests per namespace; prompts past it are refused (RESOURCE_EXHAUSTED).
    /// Concurrent steps may overshoot it by the new prompts of one step each.
    pub max_active_requests: usize,
}

/// A step refused as a whole: nothing of it was applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The gRPC status code of the refusal.
    pub code: tonic::Code,
    /// The offending field of the StepRequest ("namespace", "requests").
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Refusal {
    /// The refusal as a per-step error (for streams, which must not end on it).
    pub fn to_request_error(&self) -> RequestError {
        let code = match self.code {
            tonic::Code::InvalidArgument => ErrorCode::InvalidArgument,
            tonic::Code::ResourceExhausted => ErrorCode::ResourceExhausted,
            _ => ErrorCode::Unspecified,
        };
        request_error(code, self.field, self.message.clone())
    }
}

impl From<NamespaceError> for Refusal {
    fn from(e: NamespaceError) -> Self {
        let code = match e {
            NamespaceError::InvalidName { .. } => tonic::Code::InvalidArgument,
            NamespaceError::LimitReached { .. } => tonic::Code::ResourceExhausted,
            NamespaceError::NotFound { .. } => tonic::Code::NotFound,
            NamespaceError::Config { .. } => tonic::Code::Internal,
        };
        Self {
            code,
            field: "namespace",
            message: e.to_string(),
        }
    }
}

/// A request of the step that passed the checks; its tokens live in the step's token buffer.
struct Checked<'a> {
    index: usize,
    request_id: &'a str,
    prompt: Option<Range<usize>>,
    new_tokens: Range<usize>,
    accepted_last: Option<u32>,
    finished: bool,
    budget: usize,
    reset: bool,
    group: Option<&'a str>,
    shape: DraftShape,
    temperature: f32,
    offset: Option<usize>,
}

/// The longest `StepRequest.replica` accepted, in bytes.
const MAX_REPLICA_NAME_BYTES: usize = 128;

/// Runs one step against `namespaces`.
pub fn run_step(
    namespaces: &Namespaces,
    limits: &StepLimits,
    request: StepRequest,
) -> Result<StepResponse, Refusal> {
    let namespace = namespaces.get_or_create(&request.namespace)?;
    let started = std::time::Instant::now();
    let response = run_checked_step(&namespace, limits, request)?;
    let metrics = namespace.metrics();
    metrics.observe_step(started.elapsed());
    for error in &response.errors {
        let code = ErrorCode::try_from(error.code).unwrap_or(ErrorCode::Unspecified);
        metrics.request_error(code.as_str_name());
    }
    Ok(response)
}

fn run_checked_step(
    namespace: &Namespace,
    limits: &StepLimits,
    request: StepRequest,
) -> Result<StepResponse, Refusal> {
    let n = request.requests.len();
    if n > limits.max_requests_per_step {
        return Err(Refusal {
            code: tonic::Code::ResourceExhausted,
            field: "requests",
            message: format!(
                "{n} requests in one step, above the server's maximum {} (--max-requests-per-step)",
                limits.max_requests_per_step
            ),
        });
    }
    let step_tokens: usize = request
        .requests
        .iter()
        .map(|r| r.new_tokens.len() + r.prompt.as_ref().map_or(0, |p| p.tokens.len()))
        .sum();
    if step_tokens > limits.max_step_tokens {
        return Err(Refusal {
            code: tonic::Code::ResourceExhausted,
            field: "requests",
            message: format!(
                "{step_tokens} tokens in one step, above the server's maximum {} (--max-step-tokens)",
                limits.max_step_tokens
            ),
        });
    }

    let cost = request.cost.as_ref().map(step_cost).transpose()?;
    if request.replica.len() > MAX_REPLICA_NAME_BYTES {
        return Err(Refusal {
            code: tonic::Code::InvalidArgument,
            field: "replica",
            message: format!(
                "replica: {} bytes, at most {MAX_REPLICA_NAME_BYTES}",
                request.replica.len()
            ),
        });
    }
    let origin = namespace.drafter().origin_of(&request.replica);

    let mut results: Vec<Option<Result<Drafted, RequestError>>> = vec![None; n];
    let mut tokens: Vec<u32> = Vec::new();
    let mut checked: Vec<Checked<'_>> = Vec::with_capacity(n);
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(n);
    for (index, step) in request.requests.iter().enumerate() {
        match check(index, step, limits, &mut tokens, &mut seen) {
            Ok(c) => checked.push(c),
            Err(e) => results[index] = Some(Err(e)),
        }
    }

    // Resets drop the server's state of the request before it restarts from its prompt.
    checked.retain(|c| {
        if !c.reset {
            return true;
        }
        match namespace.end_if_active(c.request_id) {
            Ok(_) => true,
            Err(e) => {
                results[c.index] = Some(Err(core_error(&context(c.index, c.request_id), &e)));
                false
            }
        }
    });

    refuse_starts_over_limit(namespace, limits, &mut checked, &mut results);

    let items: Vec<StepItem<'_>> = checked
        .iter()
        .map(|c| StepItem {
            request_id: c.request_id,
            prompt: c.prompt.clone().map(|r| &tokens[r]),
            new_tokens: &tokens[c.new_tokens.clone()],
            accepted_last: c.accepted_last,
            finished: c.finished,
            budget: c.budget,
            group: c.group,
            shape: c.shape,
            temperature: c.temperature,
            offset: c.offset,
            origin,
        })
        .collect();
    let outcomes = namespace.step(&items, cost.as_ref());
    for (c, outcome) in checked.iter().zip(outcomes) {
        results[c.index] =
            Some(outcome.map_err(|e| core_error(&context(c.index, c.request_id), &e)));
    }

    let mut answer = StepColumns::with_capacity(n);
    for (index, result) in results.into_iter().enumerate() {
        let result = result.unwrap_or_else(|| {
            Err(request_error(
                ErrorCode::Unspecified,
                "",
                format!("requests[{index}]: the drafter returned no result (server bug)"),
            ))
        });
        answer.push(result, |error| error);
    }
    Ok(step_response(request.step_id, answer))
}

/// Refuses the new requests (prompts without reset) that would take the namespace past
/// `max_active_requests`; the first ones of the step are started while there is room.
fn refuse_starts_over_limit(
    namespace: &Namespace,
    limits: &StepLimits,
    checked: &mut Vec<Checked<'_>>,
    results: &mut [Option<Result<Drafted, RequestError>>],
) {
    // Resets were ended already (so they are not in `active`) and restart in any case: they
    // take room first, as they held it before the step.
    let starts = checked
        .iter()
        .filter(|c| c.prompt.is_some() && !c.reset)
        .count();
    if starts == 0 {
        return;
    }
    let resets = checked.iter().filter(|c| c.reset).count();
    let active = namespace.drafter().stats().active_requests;
    let mut room = limits.max_active_requests.saturating_sub(active + resets);
    if room >= starts {
        return;
    }
    checked.retain(|c| {
        if c.prompt.is_none() || c.reset {
            return true;
        }
        if room > 0 {
            room -= 1;
            return true;
        }
        results[c.index] = Some(Err(request_error(
            ErrorCode::ResourceExhausted,
            "prompt",
            format!(
                "{}: the namespace has {active} active requests, the server's maximum is {} (--max-active-requests); finish or end requests first",
                context(c.index, c.request_id),
                limits.max_active_requests
            ),
        )));
        false
    });
}

/// How errors name a request: `requests[3] ("req-7")`.
/// The step's cost curve, or the whole step refused naming the bad field.
fn step_cost(cost: &EngineCost) -> Result<StepCost, Refusal> {
    StepCost::new(
        cost.tokens.clone(),
        cost.seconds.clone(),
        cost.padded,
        cost.base_tokens,
        cost.explore_every,
        cost.acceptance,
    )
    .map_err(|e| Refusal {
        code: tonic::Code::InvalidArgument,
        field: e.field(),
        message: e.to_string(),
    })
}

fn context(index: usize, request_id: &str) -> String {
    format!("requests[{index}] ({request_id:?})")
}

/// Checks one request and copies its tokens into `tokens`.
fn check<'a>(
    index: usize,
    step: &'a RequestStep,
    limits: &StepLimits,
    tokens: &mut Vec<u32>,
    seen: &mut HashMap<&'a str, usize>,
) -> Result<Checked<'a>, RequestError> {
    let id = step.request_id.as_str();
    let invalid = |field: &str, what: String| {
        request_error(
            ErrorCode::InvalidArgument,
            field,
            format!("{}: {what}", context(index, id)),
        )
    };
    if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN {
        return Err(invalid(
            "request_id",
            format!(
                "request_id must be 1 to {MAX_REQUEST_ID_LEN} bytes, got {}",
                id.len()
            ),
        ));
    }
    if let Some(first) = seen.insert(id, index) {
        seen.insert(id, first);
        return Err(invalid(
            "request_id",
            format!(
                "request id repeated (first at requests[{first}]); a request may appear once per step"
            ),
        ));
    }
    let budget = usize::try_from(step.budget)
        .map_err(|_| invalid("budget", format!("budget = {} is negative", step.budget)))?;
    if budget > limits.max_budget {
        return Err(invalid(
            "budget",
            format!(
                "budget = {budget} is above the server's maximum {}",
                limits.max_budget
            ),
        ));
    }
    let shape = DraftShape::from_number(i64::from(step.shape)).ok_or_else(|| {
        invalid(
            "shape",
            format!("shape = {} is not a DraftShape", step.shape),
        )
    })?;
    if !(step.temperature.is_finite() && step.temperature >= 0.0) {
        return Err(invalid(
            "temperature",
            format!(
                "temperature = {} must be a finite number >= 0 (0: greedy)",
                step.temperature
            ),
        ));
    }
    if step.group.len() > MAX_GROUP_NAME_BYTES {
        return Err(invalid(
            "group",
            format!(
                "group must be at most {MAX_GROUP_NAME_BYTES} bytes, got {}",
                step.group.len()
            ),
        ));
    }
    if step.reset && step.prompt.is_none() {
        return Err(invalid(
            "reset",
            "reset needs a prompt to restart the request from".into(),
        ));
    }
    let start = tokens.len();
    let prompt = match &step.prompt {
        Some(list) => {
            push_tokens(&list.tokens, limits.vocab_size, tokens)
                .map_err(|bad| invalid("prompt", bad.describe("prompt")))?;
            Some(start..tokens.len())
        }
        None => None,
    };
    let mid = tokens.len();
    if let Err(bad) = push_tokens(&step.new_tokens, limits.vocab_size, tokens) {
        tokens.truncate(start);
        return Err(invalid("new_tokens", bad.describe("new_tokens")));
    }
    Ok(Checked {
        index,
        request_id: id,
        prompt,
        new_tokens: mid..tokens.len(),
        accepted_last: step.accepted_last,
        finished: step.finished,
        budget,
        reset: step.reset,
        group: Some(step.group.as_str()).filter(|g| !g.is_empty()),
        shape,
        temperature: step.temperature,
        offset: step
            .offset
            .map(|o| usize::try_from(o).unwrap_or(usize::MAX)),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lookahead_core::DrafterConfig;

    use super::*;
    use crate::pb::{self, TokenList};

    fn limits() -> StepLimits {
        StepLimits {
            max_requests_per_step: 4,
            vocab_size: 1000,
            max_budget: 8,
            max_step_tokens: 64,
            max_active_requests: 3,
        }
    }

    fn rs(id: &str, prompt: Option<Vec<i64>>, new_tokens: Vec<i64>, budget: i32) -> RequestStep {
        RequestStep {
            request_id: id.into(),
            prompt: prompt.map(|tokens| TokenList { tokens }),
            new_tokens,
            budget,
            ..RequestStep::default()
        }
    }

    fn step(requests: Vec<RequestStep>) -> StepRequest {
        StepRequest {
            namespace: String::new(),
            step_id: 9,
            requests,
            cost: None,
            replica: String::new(),
        }
    }

    #[test]
    fn the_core_numbers_shapes_as_the_proto_does() {
        let wire = [
            (pb::DraftShape::Tree, DraftShape::Tree),
            (pb::DraftShape::Chain, DraftShape::Chain),
            (pb::DraftShape::SizedTree, DraftShape::SizedTree),
            (pb::DraftShape::SizedChain, DraftShape::SizedChain),
        ];
        for (proto, core) in wire {
            assert_eq!(
                DraftShape::from_number(proto as i64),
                Some(core),
                "{proto:?}"
            );
        }
        assert_eq!(DraftShape::from_number(4), None);
        assert_eq!(DraftShape::from_number(-1), None);
    }

    #[test]
    fn shapes_temperatures_and_costs_are_checked() {
        let set = Namespaces::new(DrafterConfig::default(), 2, Arc::default());
        let text: Vec<i64> = (0..28).map(|i| 10 + i % 4).collect();
        let mut requests = vec![
            rs("sized", Some(text.clone()), vec![], 8),
            rs("tree", Some(text.clone()), vec![], 8),
            rs("hot", Some(vec![1, 2]), vec![], 4),
            rs("shape", Some(vec![1, 2]), vec![], 4),
        ];
        requests[0].shape = pb::DraftShape::SizedChain as i32;
        requests[2].temperature = f32::NAN;
        requests[3].shape = 7;
        let mut request = step(requests);
        // every verified token costs a whole step: sized drafts are cut to nothing
        request.cost = Some(EngineCost {
            tokens: vec![1, 100],
            seconds: vec![1.0, 100.0],
            ..EngineCost::default()
        });
        let response = run_step(&set, &limits(), request.clone()).expect("answered");
        assert_eq!(response.sizes[0], 0, "sized away");
        assert!(response.sizes[1] > 0, "an unsized tree keeps its nodes");
        assert_eq!(
            code(&response, 2),
            Some((ErrorCode::InvalidArgument, "temperature".into()))
        );
        assert_eq!(
            code(&response, 3),
            Some((ErrorCode::InvalidArgument, "shape".into()))
        );
        // a decreasing curve refuses the whole step, naming the field; nothing is applied
        request.cost = Some(EngineCost {
            tokens: vec![1, 2],
            seconds: vec![2.0, 1.0],
            ..EngineCost::default()
        });
        request.requests.truncate(1);
        request.requests[0].prompt = None;
        request.requests[0].new_tokens = vec![11];
        let refusal = run_step(&set, &limits(), request.clone()).expect_err("refused");
        assert_eq!(refusal.field, "cost.seconds");
        assert_eq!(refusal.code, tonic::Code::InvalidArgument);
        // so does an acceptance scale below zero
        request.cost = Some(EngineCost {
            tokens: vec![1, 2],
            seconds: vec![1.0, 2.0],
            acceptance: -0.5,
            ..EngineCost::default()
        });
        let refusal = run_step(&set, &limits(), request).expect_err("refused");
        assert_eq!(refusal.field, "cost.acceptance");
        assert_eq!(refusal.code, tonic::Code::InvalidArgument);
    }

    /// The error of request `index`, as (code, field).
    fn code(r: &StepResponse, index: u32) -> Option<(ErrorCode, String)> {
        r.errors.iter().find(|e| e.index == index).map(|e| {
            (
                ErrorCode::try_from(e.code).unwrap_or(ErrorCode::Unspecified),
                e.field.clone(),
            )
        })
    }

    #[test]
    fn one_bad_request_does_not_fail_the_others() {
        let set = Namespaces::new(DrafterConfig::default(), 2, Arc::default());
        let response = run_step(
            &set,
            &limits(),
            step(vec![
                rs("ok", Some(vec![1, 2, 3, 1, 2]), vec![], 4),
                rs("neg", Some(vec![1, -1]), vec![], 4),
                rs("big", None, vec![1000], 4),
                rs("budget", Some(vec![1]), vec![], 9),
            ]),
        )
        .expect("answered");
        assert_eq!(response.step_id, 9);
        assert_eq!(response.roots.len(), 4);
        assert_eq!(response.sizes.len(), 4);
        assert_eq!(code(&response, 0), None);
        assert_eq!(response.roots[0], 2);
        assert_eq!(
            code(&response, 1),
            Some((ErrorCode::InvalidArgument, "prompt".into()))
        );
        assert!(
            response.errors[0].message.contains("prompt[1] = -1"),
            "{:?}",
            response.errors
        );
        assert_eq!(&response.sizes[1..], &[0, 0, 0]);
        assert_eq!(
            code(&response, 2),
            Some((ErrorCode::InvalidArgument, "new_tokens".into()))
        );
        assert_eq!(
            code(&response, 3),
            Some((ErrorCode::InvalidArgument, "budget".into()))
        );
        // Only the valid request was started.
        assert_eq!(set.get("").expect("exists").stats().active_requests, 1);
    }

    #[test]
    fn repeated_ids_unknown_requests_and_resets() {
        let set = Namespaces::new(DrafterConfig::default(), 1, Arc::default());
        let response = run_step(
            &set,
            &limits(),
            step(vec![
                rs("a", Some(vec![1, 2]), vec![], 0),
                rs("a", None, vec![3], 0),
                rs("ghost", None, vec![3], 2),
            ]),
        )
        .expect("answered");
        assert_eq!(code(&response, 0), None);
        assert_eq!(
            code(&response, 1),
            Some((ErrorCode::InvalidArgument, "request_id".into()))
        );
        assert_eq!(
            code(&response, 2),
            Some((ErrorCode::UnknownRequest, "request_id".into()))
        );

        let again = run_step(
            &set,
            &limits(),
            step(vec![rs("a", Some(vec![1, 2, 3]), vec![], 0)]),
        )
        .expect("answered");
        assert_eq!(
            code(&again, 0),
            Some((ErrorCode::RequestAlreadyActive, "request_id".into()))
        );

        let mut reset = rs("a", Some(vec![1, 2, 3]), vec![4], 0);
        reset.reset = true;
        let response = run_step(&set, &limits(), step(vec![reset])).expect("answered");
        assert_eq!(code(&response, 0), None);
        assert_eq!(response.roots[0], 4);

        let mut bad_reset = rs("a", None, vec![4], 0);
        bad_reset.reset = true;
        let response = run_step(&set, &limits(), step(vec![bad_reset])).expect("answered");
        assert_eq!(
            code(&response, 0),
            Some((ErrorCode::InvalidArgument, "reset".into()))
        );
    }

    #[test]
    fn whole_step_refusals() {
        let set = Namespaces::new(DrafterConfig::default(), 1, Arc::default());
        let too_many = step(
            (0..5)
                .map(|i| rs(&format!("r{i}"), Some(vec![1]), vec![], 0))
                .collect(),
        );
        let refusal = run_step(&set, &limits(), too_many).expect_err("refused");
        assert_eq!(
            (refusal.code, refusal.field),
            (tonic::Code::ResourceExhausted, "requests")
        );

        let mut bad_ns = step(vec![]);
        bad_ns.namespace = "no spaces allowed".into();
        let refusal = run_step(&set, &limits(), bad_ns).expect_err("refused");
        assert_eq!(
            (refusal.code, refusal.field),
            (tonic::Code::InvalidArgument, "namespace")
        );

        run_step(&set, &limits(), step(vec![])).expect("default namespace created");
        let mut second = step(vec![]);
        second.namespace = "second".into();
        let refusal = run_step(&set, &limits(), second).expect_err("limit");
        assert_eq!(
            (refusal.code, refusal.field),
            (tonic::Code::ResourceExhausted, "namespace")
        );
        assert_eq!(
            refusal.to_request_error().code,
            ErrorCode::ResourceExhausted as i32
        );
    }

    #[test]
    fn step_token_and_active_request_limits() {
        let metrics = Arc::new(crate::metrics::ServerMetrics::default());
        let set = Arc::new(Namespaces::new(
            DrafterConfig::default(),
            1,
            Arc::clone(&metrics),
        ));
        let big = step(vec![rs("a", Some(vec![1; 40]), vec![2; 25], 0)]);
        let refusal = run_step(&set, &limits(), big).expect_err("too many tokens");
        assert_eq!(
            (refusal.code, refusal.field),
            (tonic::Code::ResourceExhausted, "requests")
        );
        let response = run_step(
            &set,
            &limits(),
            step(vec![
                rs("a", Some(vec![1]), vec![], 0),
                rs("b", Some(vec![1]), vec![], 0),
            ]),
        )
        .expect("answered");
        assert!(response.errors.is_empty());
        let mut reset = rs("a", Some(vec![1, 2]), vec![], 0);
        reset.reset = true;
        let response = run_step(
            &set,
            &limits(),
            step(vec![
                reset,
                rs("c", Some(vec![1]), vec![], 0),
                rs("d", Some(vec![1]), vec![], 0),
            ]),
        )
        .expect("answered");
        assert_eq!(code(&response, 0), None);
        assert_eq!(code(&response, 1), None);
        assert_eq!(
            code(&response, 2),
            Some((ErrorCode::ResourceExhausted, "prompt".into()))
        );
        assert_eq!(set.get("").expect("exists").stats().active_requests, 3);
        // The refused step is not timed; the two answered ones are.
        let text = crate::metrics::encode(&crate::metrics::registry(&metrics, None, set));
        assert!(
            text.contains("lookahead_step_latency_seconds_count{namespace=\"default\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn finished_requests_end_and_later_tokens_are_unknown() {
        let set = Namespaces::new(DrafterConfig::default(), 1, Arc::default());
        run_step(
            &set,
            &limits(),
            step(vec![rs("f", Some(vec![1, 2]), vec![], 0)]),
        )
        .expect("started");
        let mut fin = rs("f", None, vec![3], 4);
        fin.finished = true;
        let response = run_step(&set, &limits(), step(vec![fin])).expect("answered");
        assert_eq!(code(&response, 0), None);
        assert_eq!(response.sizes, vec![0]);
        assert!(response.tokens.is_empty());
        let response =
            run_step(&set, &limits(), step(vec![rs("f", None, vec![4], 4)])).expect("answered");
        assert_eq!(
            code(&response, 0),
            Some((ErrorCode::UnknownRequest, "request_id".into()))
        );
    }
}
