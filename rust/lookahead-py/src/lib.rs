//! PyO3 bindings: the embedded drafter over `lookahead-core`. A thin layer: argument
//! conversion, GIL release around the core, and core errors turned into the typed exceptions
//! of `lookahead_client.errors`.

use lookahead_core::slots::{self, Placed, SlotTree};
use lookahead_core::{
    ConfigError, DraftError, DraftShape, DraftTree, DrafterConfig, ErrorKind, Origin, StepColumns,
    StepCost, StepItem, Token,
};
use lookahead_server::ServerError;
use lookahead_server::local::LocalDrafter;
use lookahead_server::member::{ClusterMember, MemberSettings};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Raises the `lookahead_client.errors` class `class` with `message`, naming `field`.
fn typed_error(py: Python<'_>, class: &str, message: String, field: &str) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let errors = py.import("lookahead_client.errors")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", field)?;
        let exc = errors
            .getattr(class)?
            .call((message.clone(),), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

fn draft_error(py: Python<'_>, err: &DraftError) -> PyErr {
    let class = match err.kind() {
        ErrorKind::UnknownRequest => "UnknownRequestError",
        ErrorKind::RequestAlreadyActive => "RequestAlreadyActiveError",
        ErrorKind::InvalidArgument => "InvalidArgumentError",
        ErrorKind::ResourceExhausted => "ResourceExhaustedError",
    };
    typed_error(py, class, err.to_string(), err.field())
}

/// Converts Python ints to token ids, refusing negative or too large ones by field name.
fn tokens(py: Python<'_>, field: &str, values: Vec<i64>) -> PyResult<Vec<Token>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            Token::try_from(v)
                .ok()
                .filter(|&t| t != Token::MAX)
                .ok_or_else(|| {
                    typed_error(
                        py,
                        "InvalidArgumentError",
                        format!("{field}[{i}] = {v} is not a valid token id (0 <= id < 2**32 - 1)"),
                        field,
                    )
                })
        })
        .collect()
}

fn tree_tuple<'py>(py: Python<'py>, tree: DraftTree) -> PyResult<Bound<'py, PyTuple>> {
    let root: i64 = tree.root.map_or(-1, i64::from);
    (root, tree.tokens, tree.parents, tree.scores).into_pyobject(py)
}

/// One request of a step as Python passes it: `(request_id, prompt or None, new_tokens,
/// accepted_last, finished, budget, group or None, shape, temperature, offset or None)`.
type PyStepItem = (
    String,
    Option<Vec<i64>>,
    Vec<i64>,
    i64,
    bool,
    usize,
    Option<String>,
    u8,
    f32,
    Option<usize>,
);

/// A step's cost as Python passes it:
/// `(tokens, seconds, padded, base_tokens, explore_every, acceptance)`.
type PyCost = (Vec<u32>, Vec<f64>, bool, u32, u32, f64);

/// One request of a step, as converted from Python.
struct OwnedItem {
    request_id: String,
    prompt: Option<Vec<Token>>,
    new_tokens: Vec<Token>,
    accepted_last: Option<u32>,
    finished: bool,
    budget: usize,
    group: Option<String>,
    shape: DraftShape,
    temperature: f32,
    offset: Option<usize>,
}

/// The draft shape numbered as in the proto's `DraftShape`.
fn shape(py: Python<'_>, value: u8) -> PyResult<DraftShape> {
    DraftShape::from_number(i64::from(value)).ok_or_else(|| {
        let message = format!("shape = {value} is not a DraftShape (0 to 3)");
        typed_error(py, "InvalidArgumentError", message, "shape")
    })
}

/// The step cost from its Python tuple, refused naming the bad field.
fn step_cost(py: Python<'_>, cost: PyCost) -> PyResult<StepCost> {
    let (tokens, seconds, padded, base_tokens, explore_every, acceptance) = cost;
    StepCost::new(
        tokens,
        seconds,
        padded,
        base_tokens,
        explore_every,
        acceptance,
    )
    .map_err(|e| typed_error(py, "InvalidArgumentError", e.to_string(), e.field()))
}

/// A config error as `InvalidArgumentError` naming the field.
fn config_error(py: Python<'_>, err: &ConfigError) -> PyErr {
    let ConfigError::OutOfRange { field, .. } = err;
    typed_error(py, "InvalidArgumentError", err.to_string(), field)
}

/// Why the drafter could not join its cluster: a bad setting names its field.
fn member_error(py: Python<'_>, err: &ServerError) -> PyErr {
    match err {
        ServerError::Config { field, .. } => {
            typed_error(py, "InvalidArgumentError", err.to_string(), field)
        }
        _ => typed_error(py, "LookaheadError", err.to_string(), "cluster"),
    }
}

/// Drafter settings from Python: each `None` is the core's default.
struct Settings {
    memory_budget_bytes: Option<usize>,
    max_ngram: Option<usize>,
    max_budget: Option<usize>,
    min_score: Option<f32>,
    chain: Option<bool>,
    vocab_size: Option<u32>,
    max_request_tokens: Option<usize>,
}

impl Settings {
    /// The core's config, checked by the core (the one home of the ranges).
    fn config(self, py: Python<'_>) -> PyResult<DrafterConfig> {
        let d = DrafterConfig::default();
        let config = DrafterConfig {
            memory_budget_bytes: self.memory_budget_bytes.unwrap_or(d.memory_budget_bytes),
            max_ngram: self.max_ngram.unwrap_or(d.max_ngram),
            max_budget: self.max_budget.unwrap_or(d.max_budget),
            min_score: self.min_score.unwrap_or(d.min_score),
            chain: self.chain.unwrap_or(d.chain),
            vocab_size: self.vocab_size.unwrap_or(d.vocab_size),
            max_request_tokens: self.max_request_tokens.unwrap_or(d.max_request_tokens),
            ..d
        };
        config.validate().map_err(|e| config_error(py, &e))?;
        Ok(config)
    }
}

/// The core's default drafter settings (`DrafterConfig::default()`), by field name.
#[pyfunction]
fn drafter_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = DrafterConfig::default();
    let out = PyDict::new(py);
    out.set_item("memory_budget_bytes", d.memory_budget_bytes)?;
    out.set_item("max_ngram", d.max_ngram)?;
    out.set_item("max_budget", d.max_budget)?;
    // The f32's shortest decimal form (0.02, not 0.019999999552965164).
    let min_score: f64 = d
        .min_score
        .to_string()
        .parse()
        .unwrap_or(f64::from(d.min_score));
    out.set_item("min_score", min_score)?;
    out.set_item("chain", d.chain)?;
    out.set_item("vocab_size", d.vocab_size)?;
    out.set_item("max_request_tokens", d.max_request_tokens)?;
    Ok(out)
}

/// Checks drafter settings as the core does (each `None`: the core's default); raises
/// `InvalidArgumentError` naming the first field out of range.
#[pyfunction]
#[pyo3(signature = (memory_budget_bytes=None, max_ngram=None, max_budget=None, min_score=None, chain=None, vocab_size=None, max_request_tokens=None))]
#[allow(clippy::too_many_arguments)]
fn check_drafter_config(
    py: Python<'_>,
    memory_budget_bytes: Option<usize>,
    max_ngram: Option<usize>,
    max_budget: Option<usize>,
    min_score: Option<f32>,
    chain: Option<bool>,
    vocab_size: Option<u32>,
    max_request_tokens: Option<usize>,
) -> PyResult<()> {
    let settings = Settings {
        memory_budget_bytes,
        max_ngram,
        max_budget,
        min_score,
        chain,
        vocab_size,
        max_request_tokens,
    };
    settings.config(py).map(|_| ())
}

/// The embedded drafter (use `lookahead_client.EmbeddedDrafter`, which wraps it).
#[pyclass(module = "lookahead_client._native", frozen)]
struct NativeDrafter {
    inner: LocalDrafter,
}

#[pymethods]
impl NativeDrafter {
    /// A drafter with the given settings; each `None` is the core's default. With `cluster`
    /// (NATS server URLs) the drafter joins that cluster as a member
    /// (`lookahead_server::member`): `cluster_name`, `node_id` and `namespace` as a server's
    /// `--cluster-name`, `--node-id` and a client's namespace (each `None`: the server's
    /// default).
    #[new]
    #[pyo3(signature = (memory_budget_bytes=None, max_ngram=None, max_budget=None, min_score=None, chain=None, vocab_size=None, max_request_tokens=None, cluster=None, cluster_name=None, node_id=None, namespace=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        memory_budget_bytes: Option<usize>,
        max_ngram: Option<usize>,
        max_budget: Option<usize>,
        min_score: Option<f32>,
        chain: Option<bool>,
        vocab_size: Option<u32>,
        max_request_tokens: Option<usize>,
        cluster: Option<Vec<String>>,
        cluster_name: Option<String>,
        node_id: Option<String>,
        namespace: Option<String>,
    ) -> PyResult<Self> {
        let settings = Settings {
            memory_budget_bytes,
            max_ngram,
            max_budget,
            min_score,
            chain,
            vocab_size,
            max_request_tokens,
        };
        let config = settings.config(py)?;
        let member = cluster.map(|servers| MemberSettings {
            servers,
            name: cluster_name,
            node_id,
        });
        // "": the server's default namespace
        let namespace = namespace.unwrap_or_default();
        let inner = py.detach(|| LocalDrafter::new(config, &namespace, member.as_ref()));
        Ok(Self {
            inner: inner.map_err(|e| member_error(py, &e))?,
        })
    }

    /// This drafter's node id in its cluster (None: not in one).
    #[getter]
    fn node_id(&self) -> Option<&str> {
        self.inner.member().map(ClusterMember::node_id)
    }

    fn start(&self, py: Python<'_>, request_id: &str, prompt: Vec<i64>) -> PyResult<()> {
        let prompt = tokens(py, "prompt", prompt)?;
        py.detach(|| self.inner.drafter().start(request_id, &prompt))
            .map_err(|e| draft_error(py, &e))
    }

    fn append(&self, py: Python<'_>, request_id: &str, new_tokens: Vec<i64>) -> PyResult<()> {
        let new_tokens = tokens(py, "new_tokens", new_tokens)?;
        py.detach(|| self.inner.drafter().append(request_id, &new_tokens))
            .map_err(|e| draft_error(py, &e))
    }

    fn draft<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
        budget: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let tree = py
            .detach(|| self.inner.drafter().draft(request_id, budget))
            .map_err(|e| draft_error(py, &e))?;
        tree_tuple(py, tree)
    }

    fn end(&self, py: Python<'_>, request_id: &str) -> PyResult<()> {
        py.detach(|| self.inner.drafter().end(request_id))
            .map_err(|e| draft_error(py, &e))
    }

    fn ingest(&self, py: Python<'_>, tokens_: Vec<i64>) -> PyResult<()> {
        let text = tokens(py, "tokens", tokens_)?;
        py.detach(|| self.inner.drafter().ingest(&text))
            .map_err(|e| draft_error(py, &e))
    }

    /// One engine step. `items` holds tuples `(request_id, prompt or None, new_tokens,
    /// accepted_last (-1: unknown), finished, budget, group or None, shape, temperature,
    /// offset or None)`;
    /// `cost` is None or `(tokens, seconds, padded, base_tokens, explore_every, acceptance)`.
    /// Returns `(roots, sizes, tokens, parents, scores, held, errors)`: the trees as NumPy
    /// columns (a failed item has root -1 and size 0), the tokens each request holds after
    /// the step (0: failed or ended), and `[(index, exception)]` for the items that failed.
    #[pyo3(signature = (items, cost=None))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        items: Vec<Bound<'py, PyTuple>>,
        cost: Option<PyCost>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let mut owned = Vec::with_capacity(items.len());
        for item in &items {
            let (request_id, prompt, new_tokens, accepted_last, finished, budget, group, shape_, temperature, offset): PyStepItem =
                item.extract().map_err(|e| {
                PyValueError::new_err(format!(
                    "step item must be (request_id, prompt|None, new_tokens, accepted_last, finished, budget, group|None, shape, temperature, offset|None): {e}"
                ))
            })?;
            owned.push(OwnedItem {
                prompt: prompt.map(|p| tokens(py, "prompt", p)).transpose()?,
                new_tokens: tokens(py, "new_tokens", new_tokens)?,
                accepted_last: u32::try_from(accepted_last).ok(),
                request_id,
                finished,
                budget,
                group,
                shape: shape(py, shape_)?,
                temperature,
                offset,
            });
        }
        let cost = cost.map(|c| step_cost(py, c)).transpose()?;
        let results = py.detach(|| {
            let items: Vec<StepItem<'_>> = owned
                .iter()
                .map(|o| StepItem {
                    request_id: &o.request_id,
                    prompt: o.prompt.as_deref(),
                    new_tokens: &o.new_tokens,
                    accepted_last: o.accepted_last,
                    finished: o.finished,
                    budget: o.budget,
                    group: o.group.as_deref(),
                    shape: o.shape,
                    temperature: o.temperature,
                    offset: o.offset,
                    origin: Origin::default(), // one process, one replica
                })
                .collect();
            self.inner.step(&items, cost.as_ref())
        });
        let mut answer = StepColumns::with_capacity(results.len());
        for result in results {
            answer.push(result, |e| draft_error(py, &e).into_value(py));
        }
        (
            answer.roots.into_pyarray(py),
            answer.sizes.into_pyarray(py),
            answer.tokens.into_pyarray(py),
            answer.parents.into_pyarray(py),
            answer.scores.into_pyarray(py),
            answer.held.into_pyarray(py),
            answer.errors,
        )
            .into_pyobject(py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("active_requests", s.active_requests)?;
        d.set_item("trie_nodes", s.trie_nodes)?;
        d.set_item("memory_bytes", s.memory_bytes)?;
        d.set_item("memory_budget_bytes", s.memory_budget_bytes)?;
        d.set_item("trie_bytes_per_node", s.trie_bytes_per_node)?;
        d.set_item("evicted_nodes", s.evicted_nodes)?;
        d.set_item("tokens_ingested", s.tokens_ingested)?;
        d.set_item("drafts", s.drafts)?;
        d.set_item("draft_nodes", s.draft_nodes)?;
        d.set_item("accepted_reported", s.accepted_reported)?;
        d.set_item("steps_reported", s.steps_reported)?;
        d.set_item("accepted_cross_replica", s.accepted_cross_replica)?;
        // one process, one replica: its own counts are the drafter's
        d.set_item("replica_accepted_reported", s.accepted_reported)?;
        d.set_item("replica_accepted_cross_replica", s.accepted_cross_replica)?;
        d.set_item("sized_away", s.sized_away)?;
        d.set_item("active_groups", s.active_groups)?;
        d.set_item("group_bytes", s.group_bytes)?;
        if let Some(member) = self.inner.member() {
            let c = member.counts();
            d.set_item("cluster_connected", c.connected)?;
            d.set_item("cluster_published_messages", c.published_messages)?;
            d.set_item("cluster_consumed_messages", c.consumed_messages)?;
            d.set_item("cluster_consumed_tokens", c.consumed_tokens)?;
            d.set_item("cluster_group_applied_tokens", c.group_applied_tokens)?;
        }
        Ok(d)
    }
}

/// Refuses columns whose lengths disagree, naming the field.
fn same_length(py: Python<'_>, field: &str, len: usize, expected: usize) -> PyResult<()> {
    if len == expected {
        return Ok(());
    }
    let message = format!("{field} has {len} entries, expected {expected}");
    Err(typed_error(py, "InvalidArgumentError", message, field))
}

/// The engine's arrays for one step, in the slot layout of tree verification
/// (`lookahead_core::slots`): row `i` lays out tree `rows[i]` of the columns `roots`, `sizes`,
/// `tokens`, `parents`, `scores` (those of `step`; `-1`: no tree, a root-only row) under the
/// request's last token `expected_roots[i]`, in `num_slots` slots.
///
/// Returns `(tokens, mask, placed, depths, expected, problems)`: int64 `[n * num_slots]`,
/// int64 `[n * num_slots * num_slots]`, per row the nodes placed and the levels they span
/// (uint32 `[n]`) and the sum of the placed nodes' scores (float64 `[n]`), and
/// `[(row, kind, message)]` for the trees laid out root-only because they failed a check.
#[pyfunction]
#[pyo3(signature = (roots, sizes, tokens, parents, scores, rows, expected_roots, num_slots, vocab_size))]
#[allow(clippy::too_many_arguments)]
fn pack_slots<'py>(
    py: Python<'py>,
    roots: PyReadonlyArray1<'py, i64>,
    sizes: PyReadonlyArray1<'py, u32>,
    tokens: PyReadonlyArray1<'py, i64>,
    parents: PyReadonlyArray1<'py, i32>,
    scores: PyReadonlyArray1<'py, f32>,
    rows: PyReadonlyArray1<'py, i64>,
    expected_roots: PyReadonlyArray1<'py, i64>,
    num_slots: usize,
    vocab_size: u32,
) -> PyResult<Bound<'py, PyTuple>> {
    let (roots, sizes, tokens, parents, scores, rows, expected) = (
        roots.as_slice()?,
        sizes.as_slice()?,
        tokens.as_slice()?,
        parents.as_slice()?,
        scores.as_slice()?,
        rows.as_slice()?,
        expected_roots.as_slice()?,
    );
    if num_slots == 0 {
        let message = "num_slots must be >= 1, got 0".to_string();
        return Err(typed_error(
            py,
            "InvalidArgumentError",
            message,
            "num_slots",
        ));
    }
    same_length(py, "sizes", sizes.len(), roots.len())?;
    same_length(py, "expected_roots", expected.len(), rows.len())?;
    let mut starts = Vec::with_capacity(sizes.len() + 1);
    starts.push(0usize);
    for &size in sizes {
        starts.push(starts[starts.len() - 1] + size as usize);
    }
    let nodes = starts[sizes.len()];
    same_length(py, "tokens", tokens.len(), nodes)?;
    same_length(py, "parents", parents.len(), nodes)?;
    same_length(py, "scores", scores.len(), nodes)?;
    if let Some(&row) = rows.iter().find(|&&r| r < -1 || r >= roots.len() as i64) {
        let message = format!(
            "rows holds {row}, not a tree of the {} given (or -1)",
            roots.len()
        );
        return Err(typed_error(py, "InvalidArgumentError", message, "rows"));
    }
    let n = rows.len();
    let mut out_tokens = vec![0i64; n * num_slots];
    let mut out_mask = vec![0i64; n * num_slots * num_slots];
    let (mut placed, mut depths, mut sums) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut problems = Vec::new();
    let out_rows = out_tokens
        .chunks_exact_mut(num_slots)
        .zip(out_mask.chunks_exact_mut(num_slots * num_slots));
    for (i, (row_tokens, row_mask)) in out_rows.enumerate() {
        // Row -1 lays out an empty tree under an unknown root.
        let (root, nodes) = match usize::try_from(rows[i]) {
            Ok(tree) => (roots[tree], starts[tree]..starts[tree + 1]),
            Err(_) => (-1, 0..0),
        };
        let tree = SlotTree {
            root,
            tokens: &tokens[nodes.clone()],
            parents: &parents[nodes.clone()],
        };
        let row = slots::write_row(tree, expected[i], vocab_size, row_tokens, row_mask);
        let done = row
            .as_ref()
            .copied()
            .unwrap_or(Placed { nodes: 0, depth: 0 });
        placed.push(done.nodes as u32);
        depths.push(done.depth as u32);
        // The kept nodes are the tree's first ones.
        let kept = &scores[nodes][..done.nodes];
        sums.push(kept.iter().map(|&s| f64::from(s)).sum::<f64>());
        if let Err(e) = row {
            problems.push((i, e.kind(), e.to_string()));
        }
    }
    (
        out_tokens.into_pyarray(py),
        out_mask.into_pyarray(py),
        placed.into_pyarray(py),
        depths.into_pyarray(py),
        sums.into_pyarray(py),
        problems,
    )
        .into_pyobject(py)
}

/// Runs `lookahead-server` with a command line (`argv[0]` is the program name) until it shuts
/// down, with the GIL released; SIGINT and SIGTERM are handled in Rust. Returns the exit
/// status: 0 clean, 1 failure, 2 bad command line.
#[pyfunction]
fn run_server(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| lookahead_server::run_with_args(argv))
}

/// The native module `lookahead_client._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeDrafter>()?;
    m.add_function(wrap_pyfunction!(run_server, m)?)?;
    m.add_function(wrap_pyfunction!(pack_slots, m)?)?;
    m.add_function(wrap_pyfunction!(drafter_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_drafter_config, m)?)?;
    Ok(())
}
