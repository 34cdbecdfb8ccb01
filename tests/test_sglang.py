"""The SGLang integration against the installed sglang==0.5.23, on CPU.

The worker is built by SGLang's own ``NGRAMWorker.__init__`` from a published SGLang config;
its per-step methods run on real ``Req`` / ``ScheduleBatch`` / ``NgramVerifyInput`` objects;
its arrays are checked against SGLang's C++ ``NgramCorpus`` and fed to SGLang's host-side
tree reference (``ngram_worker._derive_tree_links``). Only ``TpModelWorker`` (GPU and weights)
is stood in for, by the two attributes ``NGRAMWorker.__init__`` reads.
"""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lookahead_client import EmbeddedDrafter
from lookahead_client.engine.config import SGLANG_ENV as ENV_VAR
from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.errors import InvalidArgumentError
from lookahead_client.tree import parents_from_mask, tree_tensors, unpack_tree
from lookahead_client.types import DraftShape
from test_sglang_support import (
    VOCAB,
    BrokenDrafter,
    ForeignVocabDrafter,
    RecordingDrafter,
    SlowDrafter,
    TargetWorkerStandIn,
    decode_batch,
    ensure_sglang_importable,
    make_req,
    probe_scheduler,
    server_args,
    write_tiny_model_config,
)

D = 8  # speculative_num_draft_tokens of the published config
LOG = "lookahead_client"

# A phrase that recurs in prompts, and unrelated filler.
PHRASE = [301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311, 312]
FILLER = list(range(20, 90))


@pytest.fixture(scope="module", autouse=True)
def sglang_imported():
    """SGLang is imported when the first test runs, not when tests are collected."""
    ensure_sglang_importable()
    import sglang.srt.speculative.ngram_worker  # noqa: F401

    import lookahead_client.sglang.worker  # noqa: F401


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model_config(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def published(model_dir):
    from sglang.srt.runtime_context import publish

    args = server_args(model_dir)
    publish(args, role="scheduler")
    return args


@pytest.fixture
def make_worker(published):
    from lookahead_client.sglang.worker import LookaheadNGRAMWorker

    def make(drafter=None, config: LookaheadConfig | None = None, overlap: bool = False):
        # Without sizing every lookup drafts whole trees (with it, the first one drafts
        # nothing, so that the step runs plain and measures one: see the sizing test).
        cls = LookaheadNGRAMWorker.with_config(config or LookaheadConfig(sizing=False))
        worker = cls(
            server_args=published,
            gpu_id=0,
            nccl_port=0,
            target_worker=TargetWorkerStandIn(),
            drafter=drafter,
        )
        # The CPU config resolves overlap scheduling off; SGLang's worker reads it into this
        # attribute, which the overlap tests switch on.
        worker.enable_overlap = overlap
        return worker

    return make


def embedded() -> EmbeddedDrafter:
    return EmbeddedDrafter(memory_budget_bytes=64 << 20, max_budget=64)


def slots(arrays: tuple[np.ndarray, np.ndarray], bs: int):
    tokens, mask = arrays
    return tokens.reshape(bs, D), mask.reshape(bs, D, D).astype(bool)


def longest_path(tokens, mask) -> list[int]:
    """The longest root-to-node token path of one request's arrays."""
    return max(unpack_tree(tokens, mask).paths(), key=len)


def assert_root_only(arrays, roots):
    tokens, mask = slots(arrays, len(roots))
    assert tokens[:, 0].tolist() == list(roots)
    assert not tokens[:, 1:].any()
    expected = np.eye(D, dtype=bool)
    expected[:, 0] = True
    assert (mask == expected).all()


def assert_sglang_contract(arrays, roots, seq_lens):
    """Shapes, dtypes, root slot, ancestor-or-self masks, BFS order, padding; and SGLang's
    host-side reference agrees with the tree tensors derived from the arrays."""
    tokens, mask = arrays
    bs = len(roots)
    assert tokens.dtype == np.int64 and tokens.shape == (bs * D,)
    assert mask.dtype == np.int64 and mask.shape == (bs * D * D,)
    t, m = slots(arrays, bs)
    assert t[:, 0].tolist() == list(roots)
    parents = parents_from_mask(m)
    for b in range(bs):
        assert parents[b, 0] == -1 and (parents[b, 1:] >= 0).all()
        for i in range(D):
            row = np.zeros(D, dtype=bool)
            row[i] = True
            if i:
                row |= m[b, parents[b, i]]
            assert (m[b, i] == row).all(), f"request {b} slot {i}: not ancestor-or-self"
        depth = m[b].sum(1) - 1
        padding = (t[b] == 0) & (depth == 1)
        real = D - int(np.argmin(padding[::-1])) if not padding.all() else 1
        assert padding[real:].all()  # padding (token 0 under the root) fills the tail
        assert (np.diff(depth[:real]) >= 0).all(), "draft slots are not level by level"
    from sglang.srt.speculative.ngram_worker import _derive_tree_links

    next_token, next_sibling = _derive_tree_links(m, bs, D)
    ours = tree_tensors(tokens, mask, seq_lens, D)
    assert torch.equal(ours.retrive_next_token, next_token)
    assert torch.equal(ours.retrive_next_sibling, next_sibling)
    expected_positions = (np.asarray(seq_lens)[:, None] + m.sum(2) - 1).reshape(-1)
    assert ours.positions.tolist() == expected_positions.tolist()


# -- the worker class ------------------------------------------------------------------------


def test_worker_is_sglang_ngram_worker_with_its_corpus_lookup_and_step_kind_replaced(make_worker):
    from sglang.srt.speculative import ngram_worker as sglang_ngram_worker
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    from lookahead_client.sglang.corpus import DrafterCorpus
    from lookahead_client.sglang.worker import LookaheadNGRAMWorker

    assert issubclass(LookaheadNGRAMWorker, NGRAMWorker)
    for name in (
        "_update_ngram_corpus",
        "clear_cache_pool",
        "add_external_corpus",
        "alloc_memory_pool",
        "on_verify_complete_cpu",
    ):
        assert getattr(LookaheadNGRAMWorker, name) is getattr(NGRAMWorker, name), name
    overridden = {
        n
        for n in set(vars(LookaheadNGRAMWorker)) & set(vars(NGRAMWorker))
        if not n.startswith("__") and n != "_abc_impl"
    }
    # the lookup, and plain decode steps around SGLang's own step (see test_engines.py)
    assert overridden == {
        "_prepare_draft_tokens",
        "_prepare_for_speculative_decoding",
        "forward_batch_generation",
    }
    worker = make_worker(embedded())
    assert isinstance(worker.ngram_corpus, DrafterCorpus)
    assert worker.draft_token_num == D and worker.max_trie_depth == 18
    # SGLang's module-level corpus class is back once the worker is built.
    assert sglang_ngram_worker.NgramCorpus is NgramCorpus
    assert LookaheadNGRAMWorker.with_config(LookaheadConfig(sizing=False)) is type(worker)


# -- the arrays ------------------------------------------------------------------------------


def test_arrays_follow_sglang_corpus_contract(make_worker):
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    drafter = embedded()
    drafter.ingest([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    drafter.ingest([1, 2, 3, 44, 55, 66, 77, 88, 99, 100])
    worker = make_worker(drafter)
    reqs = [
        make_req("rep", PHRASE + FILLER + PHRASE[:3]),  # the prompt body continues it
        make_req("none", list(range(400, 460))),  # nothing to match: padding only
        make_req("branch", [200, 201, 1, 2], output=[3]),  # two ingested continuations
    ]
    batch = decode_batch(reqs)
    arrays = worker._prepare_draft_tokens(batch)
    roots = [PHRASE[2], 459, 3]
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
    assert_sglang_contract(arrays, roots, seq_lens)

    tokens, mask = arrays
    assert longest_path(tokens[:D], mask[: D * D]) == PHRASE[3:10]  # from the prompt body
    assert not tokens[D : 2 * D][1:].any()
    branch = unpack_tree(tokens[2 * D :], mask[2 * D * D :])
    firsts = {path[0] for path in branch.paths() if len(path) == 1}
    assert {4, 44} <= firsts

    # SGLang's own corpus, fed the way its worker feeds it (the last 18 tokens), returns the
    # same kinds of arrays; it cannot see the prompt body, so "rep" gets no draft there.
    corpus = NgramCorpus(max_trie_depth=18, draft_token_num=D, capacity=100_000)
    corpus.batch_put([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 44, 55, 66, 77, 88, 99, 100]])
    corpus.synchronize()
    tails = [(list(r.origin_input_ids) + list(r.output_ids))[-18:] for r in reqs]
    theirs = corpus.batch_get([r.rid for r in reqs], tails, [len(t) for t in tails])
    for ours_array, their_array in zip(arrays, theirs, strict=True):
        assert ours_array.dtype == their_array.dtype and ours_array.shape == their_array.shape
    assert_sglang_contract(theirs, roots, seq_lens)
    assert not theirs[0][1:D].any()


# -- what the drafter is told ----------------------------------------------------------------


def test_drafter_gets_whole_requests_overlap_tokens_feedback_and_departures(make_worker):
    drafter = RecordingDrafter(embedded())
    worker = make_worker(drafter, overlap=True)
    prompt = PHRASE + FILLER + PHRASE[:2]
    req = make_req("a", prompt)
    other = make_req("b", list(range(400, 430)))

    # First decode step: the prefill's token is only in spec_info (overlap scheduler).
    worker._prepare_draft_tokens(decode_batch([req, other], spliced=[[PHRASE[2]], [430]]))
    first = drafter.steps[-1]
    assert [list(r.prompt) for r in first] == [prompt, list(range(400, 430))]
    assert [list(r.new_tokens) for r in first] == [[PHRASE[2]], [430]]
    assert all(r.budget == D - 1 and r.accepted_last == -1 for r in first)
    worker._update_ngram_corpus(decode_batch([req, other], spliced=[[PHRASE[2]], [430]]))
    assert len(drafter.steps) == 1  # SGLang's insert after verify reaches no drafter

    # Next step: the first token is committed; 3 drafts + the bonus token were accepted.
    req.output_ids.append(PHRASE[2])
    other.output_ids.append(430)
    accepted = PHRASE[3:7]
    arrays = worker._prepare_draft_tokens(decode_batch([req, other], spliced=[accepted, [431]]))
    second = drafter.steps[-1]
    assert [r.prompt for r in second] == [None, None]
    assert [list(r.new_tokens) for r in second] == [accepted, [431]]
    assert second[0].accepted_last == 3
    assert second[1].accepted_last == 0  # its tree was empty: nothing to accept
    tokens, mask = arrays
    assert tokens[0] == PHRASE[6]
    assert longest_path(tokens[:D], mask[: D * D]) == (PHRASE + FILLER)[7 : 7 + D - 1]

    # "b" leaves the batch: SGLang's worker erases its match state; the drafter is told.
    ended_id = second[1].request_id
    worker.ngram_corpus.erase_match_state(["b"])
    req.output_ids.extend(accepted)
    worker._prepare_draft_tokens(decode_batch([req], spliced=[[PHRASE[7]]]))
    third = drafter.steps[-1]
    assert [(r.request_id, r.finished) for r in third[:1]] == [(ended_id, True)]
    assert list(third[1].new_tokens) == [PHRASE[7]] and third[1].accepted_last == 0

    # SGLang flushing its cache finishes every request (the shared statistics stay).
    live_id = third[1].request_id
    worker.clear_cache_pool()
    req.output_ids.append(PHRASE[7])
    worker._prepare_draft_tokens(decode_batch([req], spliced=[[PHRASE[8]]]))
    fourth = drafter.steps[-1]
    assert (fourth[0].request_id, fourth[0].finished) == (live_id, True)
    assert fourth[1].prompt is not None and fourth[1].request_id != live_id
    assert worker.lookahead_stats()["resyncs"] == 0


def test_samples_of_one_prompt_draft_from_each_other_in_the_worker(make_worker):
    # SGLang expands n > 1 into requests with one prompt: they form a group with no flag, and
    # a sample drafts what a sibling running ahead of it wrote.
    drafter = embedded()
    worker = make_worker(drafter)
    prompt = FILLER[:12]
    answer = list(range(100, 140))  # tokens no prompt has: only a sibling predicts them
    ahead = make_req("q-0", prompt, answer[:30])
    behind = make_req("q-1", prompt, answer[:10])
    stranger = make_req("r-0", FILLER[12:24], answer[:10])
    arrays = worker._prepare_draft_tokens(decode_batch([ahead, behind, stranger]))
    tokens, mask = slots(arrays, 3)
    assert longest_path(tokens[1], mask[1])[:5] == answer[10:15]
    assert longest_path(tokens[2], mask[2])[:5] != answer[10:15], "another prompt's group"
    assert drafter.stats()["active_groups"] == 2


def test_without_overlap_the_committed_outputs_are_the_new_tokens(make_worker):
    drafter = RecordingDrafter(embedded())
    worker = make_worker(drafter, overlap=False)
    req = make_req("s", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
    # spec_info carries accept tokens, but without overlap SGLang does not splice them.
    worker._prepare_draft_tokens(decode_batch([req], spliced=[[999]]))
    assert list(drafter.steps[-1][0].new_tokens) == [PHRASE[2]]
    req.output_ids.extend(PHRASE[3:5])
    worker._prepare_draft_tokens(decode_batch([req], spliced=[[999]]))
    step = drafter.steps[-1][0]
    assert list(step.new_tokens) == PHRASE[3:5] and step.accepted_last == 1


def test_with_sizing_the_first_lookup_drafts_nothing_then_whole_trees(make_worker):
    """Sizing on (the default): no tree pays before a plain step was measured, so the first
    decode step runs plain; with a plain step measured and no verify yet, trees are whole."""
    drafter = RecordingDrafter(embedded())
    worker = make_worker(drafter, config=LookaheadConfig())
    req = make_req("z", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
    assert_root_only(worker._prepare_draft_tokens(decode_batch([req])), [PHRASE[2]])
    assert drafter.steps[-1][0].shape == DraftShape.SIZED_TREE
    assert worker.ngram_corpus.last_nodes == 0
    modes = worker.step_modes
    modes.begin(0.0)
    modes.started(0.0, plain=True, bs=1)
    modes.begin(0.1)  # the plain step took 0.1 s
    req.output_ids.append(PHRASE[3])
    worker._prepare_draft_tokens(decode_batch([req]))
    assert worker.ngram_corpus.last_nodes > 0


# -- never failing a generation ------------------------------------------------------------


def test_raising_drafter_gives_root_only_trees_warns_once_and_recovers(make_worker, caplog):
    drafter = BrokenDrafter(embedded())
    worker = make_worker(drafter)
    req = make_req("x", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
    assert worker._prepare_draft_tokens(decode_batch([req]))[0][1:].any()

    drafter.broken = True
    with caplog.at_level(logging.INFO, logger=LOG):
        for k in range(3, 7):
            req.output_ids.append(PHRASE[k])
            assert_root_only(worker._prepare_draft_tokens(decode_batch([req])), [PHRASE[k]])
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "drafter crashed" in warnings[0].getMessage()

        drafter.broken = False
        time.sleep(0.2)  # past the backoff: the next step probes the drafter
        req.output_ids.append(PHRASE[7])
        tokens, mask = worker._prepare_draft_tokens(decode_batch([req]))
    # The request was started again with everything known, and drafts continue from it.
    assert longest_path(tokens, mask) == PHRASE[8:12] + FILLER[:3]
    assert drafter.steps[-1][-1].prompt is not None
    assert any("answers again" in r.getMessage() for r in caplog.records)
    stats = worker.lookahead_stats()
    assert stats["outages"] == 1 and stats["fallback_steps"] == 4 and stats["healthy"]


def test_slow_drafter_is_cut_at_the_deadline_and_its_late_answer_used(make_worker, caplog):
    drafter = SlowDrafter(embedded())
    worker = make_worker(drafter, config=LookaheadConfig(timeout=0.05, sizing=False))
    req = make_req("s", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
    drafter.delay = 0.4
    with caplog.at_level(logging.WARNING, logger=LOG):
        t0 = time.monotonic()
        assert_root_only(worker._prepare_draft_tokens(decode_batch([req])), [PHRASE[2]])
        assert time.monotonic() - t0 < 0.3
        req.output_ids.append(PHRASE[3])  # while the late call runs: not sent, no draft
        assert_root_only(worker._prepare_draft_tokens(decode_batch([req])), [PHRASE[3]])
        assert len(drafter.steps) == 0  # still sleeping in the first call
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    drafter.delay = 0.0
    time.sleep(0.5)
    req.output_ids.append(PHRASE[4])
    tokens, mask = worker._prepare_draft_tokens(decode_batch([req]))
    # The late start was kept: this step only sent what came after it.
    assert drafter.steps[-1][0].prompt is None
    assert list(drafter.steps[-1][0].new_tokens) == PHRASE[3:5]
    assert longest_path(tokens, mask) == PHRASE[5:12]
    stats = worker.lookahead_stats()
    assert stats["late_steps"] == 1 and stats["skipped_steps"] == 1 and stats["resyncs"] == 0


def test_remote_drafter_on_a_dead_socket_decodes_plainly_with_one_warning(
    make_worker, tmp_path, caplog
):
    config = LookaheadConfig(target=f"unix://{tmp_path}/nobody.sock", timeout=0.05)
    with caplog.at_level(logging.WARNING, logger=LOG):
        worker = make_worker(config=config)
        req = make_req("r", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
        for k in range(3, 9):
            arrays = worker._prepare_draft_tokens(decode_batch([req]))
            assert_root_only(arrays, [PHRASE[k - 1]])
            req.output_ids.append(PHRASE[k])
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert type(worker.ngram_corpus.guard.drafter).__name__ == "RemoteDrafter"


def test_drafts_outside_the_vocabulary_are_dropped(make_worker, caplog):
    worker = make_worker(ForeignVocabDrafter(embedded()))
    req = make_req("v", PHRASE + FILLER + PHRASE[:2], output=[PHRASE[2]])
    with caplog.at_level(logging.WARNING, logger=LOG):
        for k in range(3, 6):
            assert_root_only(worker._prepare_draft_tokens(decode_batch([req])), [PHRASE[k - 1]])
            req.output_ids.append(PHRASE[k])
    assert len([r for r in caplog.records if "vocabulary" in r.getMessage()]) == 1
    assert worker.ngram_corpus.vocab_size == VOCAB


# -- SGLang's external corpora ---------------------------------------------------------------


def test_external_corpus_is_ingested_into_the_drafter(make_worker):
    worker = make_worker(embedded())
    document = [450 + i for i in range(40)]
    assert worker.add_external_corpus("docs", [document[:20], document[20:]]) == 40
    worker.commit_corpus_load("docs", 40)
    assert worker.list_external_corpora() == {"docs": 40}
    req = make_req("e", [7, 8, 9] + document[:5])
    tokens, mask = worker._prepare_draft_tokens(decode_batch([req]))
    path = longest_path(tokens, mask)
    assert len(path) >= 2 and path == document[5 : 5 + len(path)]
    with pytest.raises(ValueError, match="cannot remove"):
        worker.remove_external_corpus("docs")


# -- activation ------------------------------------------------------------------------------


def test_spawned_scheduler_builds_the_lookahead_worker(model_dir):
    from lookahead_client.sglang.activate import scheduler_process_func

    config = LookaheadConfig(timeout=0.07)
    ctx = multiprocessing.get_context("spawn")  # what SGLang uses for its schedulers
    reader, writer = ctx.Pipe(duplex=False)
    entry = scheduler_process_func(config, inner=probe_scheduler)
    proc = ctx.Process(target=entry, args=(str(model_dir), writer))
    proc.start()
    writer.close()
    try:
        assert reader.poll(240), "the spawned scheduler probe did not answer"
        got = reader.recv()
    finally:
        proc.join(30)
    assert proc.exitcode == 0
    assert got["name"] == "lookahead_client.sglang.worker.LookaheadNGRAMWorker"
    assert got["is_ngram_worker"] and got["config"] == config


def test_sglang_plugin_entry_point_installs_the_hook(published, tmp_path, monkeypatch):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dist = tmp_path / "lookahead_plugin_test-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lookahead-plugin-test\nVersion: 0.0\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[{GENERAL_PLUGINS_GROUP}]\nlookahead = lookahead_client.sglang.plugin:register\n"
    )
    from lookahead_client.sglang import activate
    from lookahead_client.sglang.worker import LookaheadNGRAMWorker

    monkeypatch.setattr(activate, "_active", None)  # restored afterwards: hook passes through
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SGLANG_PLUGINS", "lookahead")
    config = LookaheadConfig(timeout=0.09, namespace="plugin-test")
    monkeypatch.setenv(ENV_VAR, config.to_env())

    plugins = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert list(plugins) == ["lookahead"]
    register, _dist = plugins["lookahead"]
    register()
    HookRegistry.apply_hooks()  # what load_plugins() does after running the plugins
    cls = SpeculativeAlgorithm.NGRAM.create_worker(published)
    assert issubclass(cls, LookaheadNGRAMWorker) and cls.lookahead_config == config


def test_launcher_splits_flags_and_sglang_accepts_the_rest(model_dir):
    from sglang.srt.server_args import prepare_server_args

    from lookahead_client.sglang.args import split_argv

    config, rest = split_argv(
        [
            "--model-path",
            str(model_dir),
            "--lookahead-target",
            "unix:///run/lookahead.sock",
            "--lookahead-timeout",
            "0.02",
            "--device",
            "cpu",
            "--skip-tokenizer-init",
        ]
    )
    assert config == LookaheadConfig(target="unix:///run/lookahead.sock", timeout=0.02)
    args = prepare_server_args(rest)
    assert args.speculative_algorithm == "NGRAM" and args.model_path == str(model_dir)
    with pytest.raises(InvalidArgumentError) as e:
        split_argv(["--model-path", "m", "--speculative-algorithm", "EAGLE"])
    assert e.value.field == "speculative_algorithm"


def test_engine_hands_sglang_the_lookahead_scheduler_entry(model_dir):
    from lookahead_client.sglang.activate import run_scheduler_process
    from lookahead_client.sglang.engine import Engine

    with pytest.raises(InvalidArgumentError) as e:
        Engine(model_path=str(model_dir), speculative_algorithm="EAGLE")
    assert e.value.field == "speculative_algorithm"
    # SGLang refuses an unknown setting after the entry is in place, before launching.
    engine = Engine.__new__(Engine)
    config = LookaheadConfig(timeout=0.03)
    with pytest.raises(TypeError):
        engine.__init__(lookahead=config, model_path=str(model_dir), no_such_setting=1)
    entry = engine.run_scheduler_process_func
    assert entry.func is run_scheduler_process and entry.args == (config, None)


def test_lookahead_client_imports_without_sglang():
    code = (
        "import sys, lookahead_client, lookahead_client.sglang; "
        "assert not any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
