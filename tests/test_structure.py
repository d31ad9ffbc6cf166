"""The library's shape: no import cycles among sciad's modules, and no benchmark-product
packages (plotting, SciPy, optax, torch peers) imported by the library at import time."""

import ast
import pathlib
import subprocess
import sys

import pytest

import sciad

ROOT = pathlib.Path(sciad.__file__).parent


def modules() -> dict[str, pathlib.Path]:
    """sciad's modules by dotted name (packages by their own name)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known) -> set[str]:
    """The sciad modules `name` imports anywhere in its file (lazy imports in functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["sciad.solve"], "the import walk found nothing: it is broken"
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_the_library_pulls_no_benchmark_packages():
    code = ("import sys, sciad, sciad.problems, sciad.select; "
            "print(sorted(m for m in ('matplotlib', 'scipy', 'optax', 'torchdiffeq', 'sciad_bench') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bench_commands_name_the_extra_when_the_benchmark_product_is_missing(monkeypatch):
    from sciad.cli import main

    monkeypatch.setitem(sys.modules, "sciad_bench.cli", None)  # as if it could not be imported
    with pytest.raises(SystemExit, match=r"pip install 'sciad\[bench\]'"):
        main(["bench", "lotka-volterra", "--quick"])
