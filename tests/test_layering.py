"""The Rust crates' modules depend on each other one way: no import circle in the core or the
server. A module's dependencies are the crate modules its code names: ``crate::x`` paths,
grouped ones (``crate::{x, y::Z}``) and ``super::`` paths that climb to the crate root; comments
(doc links among them) and inline test modules are left out.

The Python package's production code (the library at its top level and the engine
integrations) imports neither the benchmarks (``bench``), the Hugging Face loop (``hf``) nor
the processes tests start (``processes``); the HF loop does not import the benchmarks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["rust/lookahead-core/src", "rust/lookahead-server/src"]

_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
# An inline test module runs to the end of its file here (the crates keep them last).
_TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", re.S)


def module_path(rel: Path) -> list[str]:
    """The module a source file holds, from the crate root (``a/mod.rs`` and ``a.rs``: a)."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return parts


def group_heads(text: str) -> list[str]:
    """The first segment of each path in a ``{...}`` group (``text`` starts after the brace)."""
    heads, depth, item = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                break
            depth -= 1
        if depth == 0 and ch in ",}":
            heads.append(item)
            item = ""
        elif depth == 0:
            item += ch
    heads.append(item)
    return [m.group(0) for h in heads if (m := re.match(_NAME, h.strip()))]


def top_modules_named(code: str, module: list[str]) -> set[str]:
    """The crate's top-level modules that ``code`` (of the module at ``module``) names."""
    names: set[str] = set()
    for m in re.finditer(rf"\bcrate::(?:({_NAME})|\{{)", code):
        names.update([m.group(1)] if m.group(1) else group_heads(code[m.end() :]))
    for m in re.finditer(rf"\b((?:super::)+)(?:({_NAME})|\{{)", code):
        up = m.group(1).count("super::")
        if up < len(module):
            names.add(module[: len(module) - up][0])  # still inside a top-level module
        elif up == len(module):  # at the crate root: the next segment names a module
            names.update([m.group(2)] if m.group(2) else group_heads(code[m.end() :]))
    return names


def module_graph(src: Path) -> dict[str, set[str]]:
    """Each top-level module and the crate modules its code names."""
    graph: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        module = module_path(path.relative_to(src))
        top = module[0]
        if top in ("lib", "main"):
            continue
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")
        )
        code = _TESTS.sub("", code)
        graph.setdefault(top, set()).update(top_modules_named(code, module) - {top})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue  # an item of lib.rs, not a module
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("crate", CRATES)
def test_no_import_circle(crate: str) -> None:
    graph = module_graph(ROOT / crate)
    assert len(graph) > 5, f"{crate}: modules not found"
    assert find_cycle(graph) is None, f"{crate}: import circle {' -> '.join(find_cycle(graph))}"


def test_the_check_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_reader_follows_grouped_and_super_paths() -> None:
    code = "use crate::{trie::Trie, sizing, Token};\nuse super::super::slots::write_row;\n"
    assert top_modules_named(code, ["drafter", "step"]) == {"trie", "sizing", "Token", "slots"}
    assert top_modules_named("use super::{draft, tree::Tree};", ["drafter"]) == {"draft", "tree"}
    assert top_modules_named("use super::wire;", ["cluster", "consumer"]) == {"cluster"}
    assert top_modules_named("let x = crate::config::X;", ["a"]) == {"config"}


PACKAGE = ROOT / "python" / "lookahead_client"
# The parts outside production code, and what each layer must not import ("": production).
_OUTSIDE_PRODUCTION = ("bench", "hf", "processes")
_BANNED = {"": {"bench", "hf", "processes"}, "hf": {"bench", "processes"}}


def python_imports(path: Path, package_root: Path = PACKAGE) -> set[str]:
    """The ``lookahead_client`` modules a Python file imports, at any depth in the file, as
    dotted paths below the package (``bench.sharing``; ``""`` the package itself); relative
    imports are resolved from the file's place under ``package_root``."""
    package = list(path.relative_to(package_root).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] + [node.module or ""]
            module = ".".join(filter(None, ["lookahead_client", *base]))
            # ``from . import x``: x may be a module of the package.
            names = [f"{module}.{a.name}" for a in node.names] if not node.module else [module]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == "lookahead_client" or name.startswith("lookahead_client."):
                found.add(name.removeprefix("lookahead_client").removeprefix("."))
    return found


def test_python_production_code_imports_no_benchmark_loop_or_test_helper() -> None:
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        first = path.relative_to(PACKAGE).parts[0]
        if first == "_proto":
            continue
        banned = _BANNED.get(first if first in _OUTSIDE_PRODUCTION else "", set())
        for module in python_imports(path):
            if module.split(".")[0] in banned:
                broken.append(f"{path.relative_to(PACKAGE)} imports lookahead_client.{module}")
    assert not broken, "\n".join(broken)


def test_the_python_reader_resolves_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    module = tmp_path / "vllm" / "x.py"
    module.write_text(
        "from ..bench import sharing\n"
        "from . import drafting\n"
        "def f():\n"
        "    import lookahead_client.hf.sizing\n"
        "    from lookahead_client.processes.server import ServerProcess\n"
        "import numpy\n"
    )
    assert python_imports(module, tmp_path) == {
        "bench",
        "vllm.drafting",
        "hf.sizing",
        "processes.server",
    }
