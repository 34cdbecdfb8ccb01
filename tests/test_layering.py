"""The Rust crates' modules depend on each other one way: no import circle in the core or the
server (a module's `crate::x` paths, doc links excluded, name the modules it uses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["rust/lookahead-core/src", "rust/lookahead-server/src"]


def module_graph(src: Path) -> dict[str, set[str]]:
    """Each top-level module and the crate modules its code names."""
    graph: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        rel = path.relative_to(src)
        module = rel.parts[0].removesuffix(".rs")
        if module in ("lib", "main"):
            continue
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")
        )
        uses = set(re.findall(r"crate::([a-z_][a-z0-9_]*)", code))
        graph.setdefault(module, set()).update(uses - {module})
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
