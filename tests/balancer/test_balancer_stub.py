"""The typed stub of rustext.Balancer matches the compiled class."""

from __future__ import annotations

import ast
import os

import rustext


def test_stub_lists_every_public_member():
    stub = os.path.join(os.path.dirname(rustext.__file__), "_native.pyi")
    with open(stub) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Balancer")
    in_stub = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
    in_module = {n for n in dir(rustext.Balancer) if not n.startswith("_")}
    assert in_stub == in_module
    assert "Balancer" in rustext.__all__
