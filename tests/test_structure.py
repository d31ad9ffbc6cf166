"""The library's shape: no import cycles among sciad's modules, no benchmark-product
packages (plotting, SciPy, optax, torch peers) imported by the library at import time, no
side effects of importing it, and dependencies' private names used only where they are pinned
(sciad/_<package>_internals.py, tested in tests/test_private_surfaces.py)."""

import ast
import json
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
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
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
    assert graph["sciad._solve"], "the import walk found nothing: it is broken"
    assert cycles(graph) == []


# The layers of docs/how-it-fits-together.md, lowest first: a module imports from its own layer and those below.
LAYERS = {
    "dependencies' private parts": ["_surfaces", "_diffrax_internals", "_equinox_internals", "_jax_internals"],
    "run-time checks": ["_errors", "_custom_types"],
    "AD choice": ["ad", "ad.*"],
    "numerics": [
        "_pytrees",
        "_bdf",
        "_rosenbrock",
        "_rosenbrock_tableaus",
        "_sparsity",
        "_host_lu",
        "_stiff",
        "_dae",
        "_stability",
    ],
    "sensealgs": ["adjoints", "adjoints.*"],
    "choice rules": ["_timing", "_auto", "_solver_choice"],
    "solve": [
        "_problem",
        "_vector_field",
        "_dense",
        "_events",
        "_solve",
        "_ode",
        "_sde",
        "_dde",
        "_dae_problem",
        "_sde_solvers",
        "_brownian",
        "_steady",
        "_ensemble",
        "_diffrax_adjoint",
    ],
    "public": [
        "",
        "errors",
        "select",
        "sparsity",
        "stiff",
        "timing",
        "problems",
        "problems.*",
        "_select",
        "_demo",
        "_cli",
    ],
}


def layer_of(name: str) -> int:
    """The index in LAYERS of sciad's module `name` (ValueError: it has no place yet)."""
    short = name.removeprefix("sciad").removeprefix(".")
    for i, members in enumerate(LAYERS.values()):
        for member in members:
            if short == member or (member.endswith(".*") and short.startswith(member[:-1])):
                return i
    raise ValueError(f"{name} is in no layer: add it to LAYERS and to docs/how-it-fits-together.md")


def test_each_module_imports_only_from_its_layer_and_those_below():
    known = {name: path for name, path in modules().items() if name != "sciad.__main__"}
    upward = [
        f"{name} ({list(LAYERS)[layer_of(name)]}) imports {other} ({list(LAYERS)[layer_of(other)]})"
        for name, path in known.items()
        for other in sorted(imports(name, path, known))
        if layer_of(other) > layer_of(name)
    ]
    assert upward == []


def external_imports(path: pathlib.Path) -> set[str]:
    """The top-level packages outside sciad that the module at `path` imports anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"sciad"}


def test_the_ad_layer_needs_no_solver_library():
    """`sciad.ad` and what it imports (its errors, the run-time checks) import neither diffrax nor a solve layer."""
    known = modules()
    reached, todo = set(), [name for name in known if name == "sciad.ad" or name.startswith("sciad.ad.")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += imports(name, known[name], known)
    assert max(layer_of(name) for name in reached) == list(LAYERS).index("AD choice")
    assert not [name for name in reached if {"diffrax", "lineax", "optimistix"} & external_imports(known[name])]


@pytest.fixture(scope="module")
def imported() -> dict:
    """What importing the library does, in a fresh process (tests/programs/import_sciad.py)."""
    program = pathlib.Path(__file__).parent / "programs" / "import_sciad.py"
    return json.loads(subprocess.run([sys.executable, str(program)], capture_output=True, text=True, check=True).stdout)


def test_importing_the_library_pulls_no_benchmark_packages(imported):
    assert imported["benchmark_packages"] == []


def test_importing_the_library_leaves_logging_and_jax_config_as_they_were(imported):
    assert imported["changed_loggers"] == [] and imported["config_and_filters_unchanged"]


def private_uses(path: pathlib.Path) -> list[str]:
    """Where `path` imports another package's private module or name (a part starting with one
    underscore, or `internal`), or reads a private attribute through an imported module."""
    tree = ast.parse(path.read_text())
    private = lambda name: any(
        (part.startswith("_") and not part.startswith("__")) or part == "internal" for part in name.split(".")
    )
    foreign, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if not alias.name.startswith("sciad")]
            foreign |= {alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name in names}
        elif isinstance(node, ast.ImportFrom) and not node.level and not node.module.startswith("sciad"):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            foreign |= {alias.asname or alias.name for alias in node.names}
        else:
            continue
        found += [f"{path.name}:{node.lineno} imports {name}" for name in names if private(name)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                found.append(f"{path.name}:{node.lineno} reads {ast.unparse(node)}")
    return found


def test_private_names_of_dependencies_are_used_only_in_their_pinned_modules():
    paths = [
        path
        for package in (ROOT, ROOT.parent / "sciad_bench")
        for path in package.rglob("*.py")
        if not path.name.endswith("_internals.py")
    ]
    assert [use for path in paths for use in private_uses(path)] == [], (
        "use a dependency's private name through sciad/_<package>_internals.py (which states the versions "
        "it was tested on) and pin it in tests/test_private_surfaces.py"
    )


def test_private_uses_finds_private_imports_and_attributes(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import diffrax as dfx\nimport equinox.internal as eqxi\nfrom jax._src import core\n"
        "from __future__ import annotations\nfrom sciad._jax_internals import core\n"
        "x = dfx.RESULTS._index_to_message\ny = self._cache\n"
    )
    assert private_uses(path) == [
        "m.py:2 imports equinox.internal",
        "m.py:3 imports jax._src.core",
        "m.py:6 reads dfx.RESULTS._index_to_message",
    ]


def test_bench_commands_name_the_extra_when_the_benchmark_product_is_missing(monkeypatch):
    from sciad._cli import main

    monkeypatch.setitem(sys.modules, "sciad_bench.cli", None)  # as if it could not be imported
    with pytest.raises(SystemExit, match=r"pip install 'sciad\[bench\]'"):
        main(["bench", "lotka-volterra", "--quick"])


def test_the_solve_pipeline_names_no_problem_kind():
    """One pipeline for every kind (`sciad._problem.AbstractProblem`): `sciad._solve` imports no kind's module."""
    known = modules()
    assert not imports("sciad._solve", known["sciad._solve"], known) & {"sciad._ode", "sciad._sde"}
    assert {"sciad._problem", "sciad._events"} <= imports("sciad._solve", known["sciad._solve"], known)
