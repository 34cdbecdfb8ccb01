"""Tree packing and SGLang verify tensors: the issue's vector, brute-force references, SGLang."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from lookahead_client.errors import InvalidArgumentError
from lookahead_client.tree import (
    build_tree_tensors,
    flashinfer_custom_mask,
    pack_batch,
    pack_trees,
    parents_from_mask,
    tree_tensors,
    unpack_tree,
)
from lookahead_client.types import DraftBatch, DraftTree

# The test vector (derived from SGLang's semantics).
VECTOR_TOKENS = [3, 4, 44, 5, 55, 6, 66, 77]
VECTOR_MASK = [
    [1, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 0, 0, 0],
    [1, 0, 1, 0, 1, 0, 0, 0],
    [1, 1, 0, 1, 0, 1, 0, 0],
    [1, 0, 1, 0, 1, 0, 1, 0],
    [1, 0, 1, 0, 1, 0, 1, 1],
]


def random_tree(rng: random.Random, num_nodes: int, vocab: int = 50) -> DraftTree:
    """A random tree with its nodes in BFS order (children of a node in creation order)."""
    raw_parents = [rng.randrange(-1, i) for i in range(num_nodes)]
    children: dict[int, list[int]] = {}
    for i, p in enumerate(raw_parents):
        children.setdefault(p, []).append(i)
    order, new_index, parents = [], {}, []
    frontier = [-1]
    while frontier:  # breadth-first relabelling
        nxt = []
        for node in frontier:
            for c in children.get(node, []):
                new_index[c] = len(order)
                order.append(c)
                parents.append(-1 if node < 0 else new_index[node])
                nxt.append(c)
        frontier = nxt
    tokens = tuple(rng.randrange(vocab) for _ in order)
    return DraftTree(rng.randrange(vocab), tokens, tuple(parents), (1.0,) * len(order))


def reference_pack(tree: DraftTree, d: int) -> tuple[list[int], list[list[bool]]]:
    """Per-node construction of one request's SGLang arrays."""
    n = min(len(tree), d - 1)
    tokens = [tree.root] + list(tree.tokens[:n]) + [0] * (d - 1 - n)
    rows = [[j == 0 for j in range(d)]]
    for i in range(1, d):
        parent = tree.parents[i - 1] + 1 if i <= n else 0
        rows.append([rows[parent][j] or j == i for j in range(d)])
    return tokens, rows


def reference_kernel(mask: np.ndarray, seq_lens: list[int], d: int):
    """A line-by-line port of SGLang's CUDA ``reconstructIndicesFromTreeMask``."""
    bs = len(seq_lens)
    flat = mask.reshape(-1)
    positions, index = [0] * (bs * d), [0] * (bs * d)
    next_token, next_sibling = [0] * (bs * d), [0] * (bs * d)
    for bid in range(bs):
        base = bid * d * d
        for tid in range(d):
            depth, parent = 0, -1
            for i in range(tid - 1, -1, -1):
                if flat[base + tid * d + i]:
                    depth += 1
                    if parent == -1:
                        parent = i
            index[bid * d + tid] = bid * d + tid
            positions[bid * d + tid] = depth + seq_lens[bid]
            nt = -1
            for i in range(tid + 1, d):
                if flat[base + i * d + tid]:
                    nt = i
                    break
            next_token[bid * d + tid] = nt
            ns = -1
            if parent != -1:
                for i in range(tid + 1, d):
                    start = base + i * d + parent
                    if flat[start]:
                        if not any(flat[start + 1 : base + i * d + i]):
                            ns = i
                            break
            next_sibling[bid * d + tid] = ns
    return positions, index, next_token, next_sibling


def sglang_derive_tree_links():
    """SGLang's own host-side ``_derive_tree_links`` (ngram_worker.py), read from its source.

    Importing ngram_worker needs CUDA kernels, so the pure-numpy function is compiled alone.
    """
    spec = importlib.util.find_spec("sglang")
    assert spec is not None, "sglang 0.5.23 (the 'sglang' extra) must be installed"
    path = pathlib.Path(spec.submodule_search_locations[0], "srt/speculative/ngram_worker.py")
    module = ast.parse(path.read_text())
    func = next(
        n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "_derive_tree_links"
    )
    namespace = {"np": np, "torch": torch}
    exec(compile(ast.Module([func], []), str(path), "exec"), namespace)
    return namespace["_derive_tree_links"]


def test_vector_tensors():
    mask = np.array(VECTOR_MASK, dtype=bool)
    t = tree_tensors(VECTOR_TOKENS, mask.reshape(-1), [100], 8)
    assert t.draft_tokens.tolist() == VECTOR_TOKENS
    assert t.positions.tolist() == [100, 101, 101, 102, 102, 103, 103, 104]
    assert t.retrive_index.tolist() == [list(range(8))]
    assert t.retrive_next_token.tolist() == [[1, 3, 4, 5, 6, -1, 7, -1]]
    assert t.retrive_next_sibling.tolist() == [[-1, 2, -1, -1, -1, -1, -1, -1]]
    assert t.parents.tolist() == [[-1, 0, 0, 1, 2, 3, 4, 6]]
    assert t.draft_tokens.dtype == t.positions.dtype == t.retrive_next_token.dtype == torch.int64
    assert t.tree_mask.dtype == torch.bool and t.tree_mask.shape == (64,)
    custom = t.custom_mask().view(8, 108)
    assert custom[:, :100].all()
    assert torch.equal(custom[:, 100:], torch.from_numpy(mask))


def test_vector_pack_unpack_roundtrip():
    tree = unpack_tree(VECTOR_TOKENS, VECTOR_MASK)
    assert tree.root == 3
    assert tree.tokens == (4, 44, 5, 55, 6, 66, 77)
    assert tree.parents == (-1, -1, 0, 1, 2, 3, 5)
    tokens, mask = pack_trees([tree], 8)
    assert tokens.dtype == np.int64 and mask.dtype == bool
    assert tokens.tolist() == VECTOR_TOKENS
    assert mask.reshape(8, 8).tolist() == np.array(VECTOR_MASK, dtype=bool).tolist()


def test_pack_matches_reference_on_random_trees():
    rng = random.Random(1)
    for _ in range(200):
        d = rng.randrange(1, 14)
        trees = [random_tree(rng, rng.randrange(0, 16)) for _ in range(rng.randrange(1, 5))]
        tokens, mask = pack_trees(trees, d)
        assert tokens.shape == (len(trees) * d,) and mask.shape == (len(trees) * d * d,)
        for b, tree in enumerate(trees):
            ref_tokens, ref_rows = reference_pack(tree, d)
            assert tokens[b * d : (b + 1) * d].tolist() == ref_tokens
            assert mask.reshape(-1, d, d)[b].tolist() == ref_rows
            # Cut to d - 1 nodes, the rows still describe the same (prefix of the) tree.
            n = min(len(tree), d - 1)
            back = unpack_tree(tokens[b * d : (b + 1) * d], mask.reshape(-1, d, d)[b], n)
            assert (back.tokens, back.parents) == (tree.tokens[:n], tree.parents[:n])


def test_tensors_match_cuda_kernel_port_on_random_trees():
    rng = random.Random(2)
    for _ in range(150):
        d = rng.randrange(1, 12)
        trees = [random_tree(rng, rng.randrange(0, 14)) for _ in range(rng.randrange(1, 5))]
        seq_lens = [rng.randrange(0, 500) for _ in trees]
        tokens, mask = pack_trees(trees, d)
        t = tree_tensors(tokens, mask, seq_lens, d)
        positions, index, next_token, next_sibling = reference_kernel(mask, seq_lens, d)
        assert t.positions.tolist() == positions
        assert t.retrive_index.reshape(-1).tolist() == index
        assert t.retrive_next_token.reshape(-1).tolist() == next_token
        assert t.retrive_next_sibling.reshape(-1).tolist() == next_sibling
        assert t.parents.tolist() == parents_from_mask(mask.reshape(-1, d, d)).tolist()


def test_links_match_sglang_host_derivation():
    derive = sglang_derive_tree_links()
    rng = random.Random(3)
    for _ in range(100):
        d = rng.randrange(1, 12)
        trees = [random_tree(rng, rng.randrange(0, 14)) for _ in range(rng.randrange(1, 5))]
        tokens, mask = pack_trees(trees, d)
        next_token, next_sibling = derive(mask, len(trees), d)
        t = tree_tensors(tokens, mask, [7] * len(trees), d)
        assert torch.equal(t.retrive_next_token, next_token)
        assert torch.equal(t.retrive_next_sibling, next_sibling)


def test_custom_mask_matches_sglang_loop():
    rng = random.Random(4)
    for _ in range(30):
        d = rng.randrange(1, 9)
        trees = [random_tree(rng, rng.randrange(0, 10)) for _ in range(rng.randrange(1, 4))]
        seq_lens = [rng.randrange(0, 40) for _ in trees]
        tokens, mask = pack_trees(trees, d)
        per_request = mask.reshape(-1, d, d)
        # What NGRAMWorker._prepare_for_speculative_decoding builds with USE_FULL_MASK.
        expected = torch.cat(
            [
                torch.cat((torch.ones(d, s), torch.from_numpy(per_request[b])), dim=1)
                .to(torch.bool)
                .flatten()
                for b, s in enumerate(seq_lens)
            ]
        )
        got = flashinfer_custom_mask(torch.from_numpy(mask), torch.tensor(seq_lens), d)
        assert got.dtype == torch.bool and torch.equal(got, expected)


def test_build_tree_tensors_roots_and_device():
    trees = [DraftTree(-1, (5, 6), (-1, 0), (0.9, 0.5)), DraftTree(7, (8,), (-1,), (0.4,))]
    with pytest.raises(InvalidArgumentError) as err:
        build_tree_tensors(trees, 4, [10, 20])
    assert err.value.field == "roots"
    t = build_tree_tensors(trees, 4, [10, 20], roots=[1, 2], device="cpu")
    assert t.draft_tokens.tolist() == [1, 5, 6, 0, 2, 8, 0, 0]
    assert t.positions.tolist() == [10, 11, 12, 11, 20, 21, 21, 21]
    assert t.batch_size == 2 and t.num_slots == 4
    # Tensors in, tensors out, on the same device.
    again = tree_tensors(t.draft_tokens, t.tree_mask, t.seq_lens, 4)
    assert torch.equal(again.retrive_next_sibling, t.retrive_next_sibling)


def test_cut_tree_keeps_first_nodes():
    tree = DraftTree(9, (1, 2, 3, 4), (-1, 0, 0, 2), (1.0,) * 4)
    tokens, mask = pack_trees([tree], 3)
    assert tokens.tolist() == [9, 1, 2]
    assert mask.reshape(3, 3).astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    tokens, mask = pack_trees([tree], 1)
    assert tokens.tolist() == [9] and mask.tolist() == [True]


def test_best_first_trees_are_laid_out_level_by_level():
    best_first = DraftTree(9, (1, 2, 3, 4), (-1, 0, -1, 1), (0.9, 0.8, 0.5, 0.4))
    tokens, mask = pack_trees([best_first], 5)
    assert tokens.tolist() == [9, 1, 3, 2, 4]
    back = unpack_tree(tokens, mask)
    assert sorted(back.paths()) == sorted(best_first.paths())


def test_pack_batch_lays_out_refused_trees_root_only_and_says_why():
    trees = [
        DraftTree(5, (6, 7), (-1, 0), (0.9, 0.5)),  # fine
        DraftTree(4, (6,), (-1,), (0.9,)),  # under another token
        DraftTree(-1, (6, 99), (-1, 0), (0.9, 0.5)),  # 99 is outside a vocabulary of 50
        DraftTree(5, (6, 7), (-1, 0), (0.9, 0.5)),  # its parents are broken below
        DraftTree(-1, (6, 7, 99), (-1, 0, 1), (0.9, 0.5, 0.2)),  # 99 does not fit
    ]
    batch = DraftBatch.from_trees(trees)
    batch.parents[6] = 1  # a parent after its child (a foreign drafter's columns)
    packed = pack_batch(batch, 3, [5] * 5, vocab_size=50)
    assert [(i, kind) for i, kind, _ in packed.problems] == [(1, "root"), (2, "vocab"), (3, "tree")]
    assert "outside the model's vocabulary (50)" in packed.problems[1][2]
    assert packed.placed.tolist() == [2, 0, 0, 0, 2] and packed.depths.tolist() == [2, 0, 0, 0, 2]
    rows = packed.tokens.reshape(5, 3)
    assert rows.tolist() == [[5, 6, 7], [5, 0, 0], [5, 0, 0], [5, 0, 0], [5, 6, 7]]
    assert packed.mask.dtype == np.int64
    root_only = [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert packed.mask.reshape(5, 3, 3)[1].tolist() == root_only
    assert packed.expected.tolist() == pytest.approx([1.4, 0, 0, 0, 1.4])
    # Requests pick their trees (-1: none).
    picked = pack_batch(batch, 3, [5, 5], vocab_size=50, rows=[4, -1])
    assert picked.tokens.tolist() == [5, 6, 7, 5, 0, 0] and picked.problems == []
    with pytest.raises(InvalidArgumentError) as e:
        pack_batch(batch, 3, [5] * 4, vocab_size=50)
    assert e.value.field == "expected_roots"
    with pytest.raises(InvalidArgumentError) as e:
        pack_batch(batch, 3, [5], vocab_size=50, rows=[5])
    assert e.value.field == "rows"


def test_invalid_arguments_name_their_field():
    tree = DraftTree(1, (2,), (-1,), (1.0,))
    cases = [
        (lambda: pack_trees([tree], 0), "num_slots"),
        (lambda: pack_trees([tree], 2, roots=[1, 2]), "roots"),
        (lambda: unpack_tree([1, 2], [1, 0, 0, 1]), "mask"),  # node 1 is not under the root
        (lambda: unpack_tree([1, 2], [1, 0, 1]), "mask"),
        (lambda: unpack_tree([1, 2], [1, 0, 1, 1], num_nodes=2), "num_nodes"),
        (lambda: unpack_tree([], []), "tokens"),
        (lambda: tree_tensors([1, 2], [True] * 4, [0, 0], 2), "draft_tokens"),
        (lambda: tree_tensors([1, 2], [True] * 3, [0], 2), "tree_mask"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidArgumentError) as err:
            call()
        assert err.value.field == field


def test_module_imports_without_torch():
    code = (
        "import sys, lookahead_client.tree as t; "
        "t.pack_trees([], 4); assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_select_renumbers_the_chosen_nodes_and_refuses_an_orphan():
    tree = DraftTree(9, (1, 2, 3, 4), (-1, 0, -1, 1), (0.9, 0.5, 0.4, 0.2))
    picked = tree.select([0, 2, 1])
    assert picked == DraftTree(9, (1, 3, 2), (-1, -1, 0), (0.9, 0.4, 0.5))
    with pytest.raises(ValueError, match="parent 1 is not selected"):
        tree.select([0, 3])
