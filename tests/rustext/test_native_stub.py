"""The typed stub `rustext/_native.pyi` matches the compiled module (all areas)."""

from __future__ import annotations

import ast
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


def test_stubbed_class_members_exist() -> None:
    for name, node in stub_names().items():
        if not isinstance(node, ast.ClassDef) or not hasattr(_native, name):
            continue  # a pending area (see above)
        cls = getattr(_native, name)
        for item in node.body:
            member = None
            if isinstance(item, ast.FunctionDef):
                member = item.name
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                member = item.target.id
            if member is None or (member.startswith("__") and member != "__init__"):
                continue
            if member == "__init__":
                continue
            assert hasattr(cls, member), f"{name}.{member} is stubbed but missing"


def test_facade_reexports_everything() -> None:
    assert set(rustext.__all__) <= module_public_names()
    for name in rustext.__all__:
        assert getattr(rustext, name) is getattr(_native, name)
