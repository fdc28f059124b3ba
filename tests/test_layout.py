"""Rules of the code's shape that keep it easy to change, checked on every run.

- No import cycle inside a package (imports under ``TYPE_CHECKING`` count:
  a type that needs one says the two modules are one concept, or that one
  should name a protocol of what it needs).
- No source file over 900 lines (Python, Rust, the browser client): past
  that a module holds more than one concept; split it along a seam.
- The balancer's data plane (``rustext/src/balancer``): its modules form no
  cycle either, each top-level file or folder one module (see the
  contributing guide for its layers).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("juggler", "rpc", "seq", "balancer", "cli", "rustext")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The modules of the same package `path` imports (``from pkg import mod`` is an import of ``pkg.mod``)."""
    mod = _module(path)
    package = mod.split(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [s for s in subs if _exists(s)]
            names = found if len(found) == len(subs) else [node.module, *found]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] == package and n != mod and _exists(n))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_a_package() -> None:
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "fuzz" in path.parts or "_proto" in path.parts:
                continue
            graph[_module(path)] = _imports(path)
    assert _cycles(graph) == []


MAX_LINES = 900


def test_no_source_file_over_900_lines() -> None:
    sources = [p for d in (*PACKAGES, "tests", "benches") for p in (ROOT / d).rglob("*")
               if p.suffix in (".py", ".pyi", ".rs", ".js", ".mjs")
               and not {"node_modules", "target", "__pycache__"} & set(p.parts)]
    assert len(sources) > 100, "the walk found too few sources: has the layout moved?"
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text(errors="replace").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split along a seam): {long}"


BALANCER = ROOT / "rustext" / "src" / "balancer"


def _rust_imports(path: Path) -> set[str]:
    """The top-level modules of ``balancer`` a file names (``super::x`` from
    its depth, ``crate::balancer::x``), outside comments and unit tests."""
    rel = path.relative_to(BALANCER).with_suffix("").parts
    depth = len(rel) - 1 - (rel[-1] == "mod")
    text = re.sub(r"//[^\n]*", "", path.read_text()).split("#[cfg(test)]", 1)[0]
    from_super = re.findall(r"(?<![\w:])" + "super::" * (depth + 1) + r"([a-z0-9_]+)", text)
    return {*from_super, *re.findall(r"crate::balancer::([a-z0-9_]+)", text)}


def test_the_balancers_modules_have_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in BALANCER.rglob("*.rs"):
        rel = path.relative_to(BALANCER).parts
        if rel[-1] == "tests.rs" or rel == ("mod.rs",):
            continue
        top = rel[0].removesuffix(".rs")
        graph.setdefault(top, set()).update(_rust_imports(path))
    assert {"config", "route", "h1", "proxy", "worker"} <= set(graph), "the walk found too few modules"
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    assert _cycles(graph) == []
    # the HTTP/1 codec sits below everything: the caller decides, it rewrites
    assert graph["h1"] == set(), f"h1 imports {graph['h1']}"
    # the decision core is sans-I/O: no worker state, no path, no runtime
    assert not graph["decide"] & {"worker", "fast", "proxy", "serve", "fastio", "h2pool"}, graph["decide"]
    code = re.sub(r"//[^\n]*", "", (BALANCER / "decide.rs").read_text())
    assert not re.search(r"\b(tokio|hyper)::", code), "decide.rs does I/O"
    # so is the compression decision: it imports no module of the balancer at all
    assert graph["encode"] == set(), f"encode imports {graph['encode']}"
    code = re.sub(r"//[^\n]*", "", (BALANCER / "encode.rs").read_text())
    assert not re.search(r"\b(tokio|hyper)::", code), "encode.rs does I/O"


def test_every_browser_client_test_file_runs_in_the_test_command() -> None:
    """A tests/js/*.test.mjs that scripts/test does not name would never run."""
    listed = set(re.findall(r"tests/js/([\w.-]+\.test\.mjs)", (ROOT / "scripts" / "test").read_text()))
    present = {p.name for p in (ROOT / "tests" / "js").glob("*.test.mjs")}
    assert listed == present, f"in tests/js but not run: {present - listed}; run but missing: {listed - present}"
