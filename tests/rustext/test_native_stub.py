"""The typed stub `rustext/_native.pyi` matches the compiled module (all
areas): every name both ways, every class's public members both ways, the
parameters of every function and constructor whose signature the module
reports, and the facade ``rustext`` re-exports every public name."""

from __future__ import annotations

import ast
import inspect
import os

import rustext
from rustext import _native

STUB = os.path.join(os.path.dirname(rustext.__file__), "_native.pyi")


def stub_sections() -> dict[str, set[str]]:
    """Names stubbed per area (the ``# --- <area> ---`` sections of the stub)."""
    with open(STUB) as f:
        source = f.read()
    starts: list[tuple[int, str]] = []
    for lineno, line in enumerate(source.splitlines(), 1):
        if line.startswith("# --- "):
            starts.append((lineno, line.strip("# -").strip()))
    sections: dict[str, set[str]] = {area: set() for _, area in starts}
    for name, node in stub_names().items():
        area = [a for line, a in starts if line <= node.lineno]
        if area:
            sections[area[-1]].add(name)
    return sections


def stub_names() -> dict[str, ast.stmt]:
    with open(STUB) as f:
        tree = ast.parse(f.read())
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = node
    return names


def module_public_names() -> set[str]:
    return {n for n in dir(_native) if not n.startswith("_")}


def test_every_stubbed_name_exists() -> None:
    """Strict for every area built into this tree. An area none of whose names
    exist yet is a contract another branch implements (parallel work): it is
    reported, not failed; once merged it is checked like the others."""
    public = module_public_names()
    pending = []
    for area, names in stub_sections().items():
        present = names & public
        if names and not present:
            pending.append(area)
            continue
        missing = sorted(names - public)
        assert missing == [], f"{area}: stubbed but not in rustext._native: {missing}"
    for area in ("errors", "framing", "rpcx", "timer"):
        assert area not in pending, f"{area} must be built"


def test_every_public_name_is_stubbed() -> None:
    unstubbed = sorted(module_public_names() - set(stub_names()))
    assert unstubbed == [], f"in rustext._native but not in _native.pyi: {unstubbed}"


def _params(fn: ast.FunctionDef, *, method: bool) -> list[str]:
    args = fn.args.posonlyargs + fn.args.args
    if method:
        args = args[1:]  # self
    return [a.arg for a in args + fn.args.kwonlyargs]


def _signature(obj: object) -> list[str] | None:
    try:
        return list(inspect.signature(obj).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None  # the module reports none for it


def test_stubbed_class_members_match() -> None:
    for name, node in stub_names().items():
        if not isinstance(node, ast.ClassDef) or not hasattr(_native, name):
            continue  # a pending area (see above)
        cls = getattr(_native, name)
        stubbed = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                stubbed.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                stubbed.add(item.target.id)
        stubbed = {m for m in stubbed if not m.startswith("_")}
        actual = {m for m in dir(cls) if not m.startswith("_")}
        if issubclass(cls, BaseException):
            actual -= set(dir(BaseException))
        assert stubbed == actual, f"{name}: stubbed {sorted(stubbed - actual)}, unstubbed {sorted(actual - stubbed)}"
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        got = _signature(cls)
        if init is not None and got is not None:
            assert got == _params(init, method=True), f"{name}.__init__"


def test_function_signatures_match() -> None:
    for name, node in stub_names().items():
        if not isinstance(node, ast.FunctionDef) or not hasattr(_native, name):
            continue
        got = _signature(getattr(_native, name))
        if got is not None:
            assert got == _params(node, method=False), name


def test_facade_reexports_everything() -> None:
    assert set(rustext.__all__) == module_public_names()
    for name in rustext.__all__:
        assert getattr(rustext, name) is getattr(_native, name)
