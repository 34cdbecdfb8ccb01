"""The hand-written stub of the native module names exactly what the module has (and the
parameters of each function and method), so that it cannot go stale silently."""

from __future__ import annotations

import ast
import inspect
import pathlib

from lookahead_client import _native

STUB = pathlib.Path(_native.__file__).with_name("_native.pyi")


def _signatures(body: list[ast.stmt]) -> dict[str, list[str]]:
    out = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[node.name] = [a.arg for a in node.args.args if a.arg != "self"]
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            out["__init__"] = [a.arg for a in node.args.args if a.arg != "self"]
    return out


def _parameters(obj: object) -> list[str]:
    return [p for p in inspect.signature(obj).parameters if p != "self"]  # type: ignore[arg-type]


def test_the_stub_names_the_modules_functions_and_their_parameters():
    tree = ast.parse(STUB.read_text())
    functions = _signatures(tree.body)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert public == set(functions) | set(classes)
    for name, params in functions.items():
        assert params == _parameters(getattr(_native, name)), name
    for name, node in classes.items():
        methods = _signatures(node.body)
        native = getattr(_native, name)
        exposed = {m for m in dir(native) if not m.startswith("_")}
        assert exposed == set(methods) - {"__init__"}, name
        properties = {
            n.name
            for n in node.body
            if isinstance(n, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)
        }
        for method, params in methods.items():
            target = native if method == "__init__" else getattr(native, method)
            if method in properties:
                assert inspect.isdatadescriptor(target), f"{name}.{method} is no property"
                continue
            assert params == _parameters(target), f"{name}.{method}"
