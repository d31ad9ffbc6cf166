"""sciad.ad's modules: no import cycles (imports inside functions count), and capabilities, not types."""

import ast
import inspect
import pathlib

import sciad.ad as ad

PACKAGE = pathlib.Path(ad.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """The sciad.ad modules `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sciad.ad"):
            found |= {node.module} if node.module != "sciad.ad" else {f"sciad.ad.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sciad.ad.")}
    return found


def test_no_import_cycles():
    graph = {f"sciad.ad.{p.stem}": _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}

    def reaches(start, target, seen):
        return any(m == target or (m not in seen and reaches(m, target, seen | {m})) for m in graph.get(start, ()))

    cycles = [m for m in graph if reaches(m, m, {m})]
    assert not cycles, f"modules importing a module that imports them back: {cycles}"


def test_no_type_tests_of_engines():
    engines = {cls.__name__ for cls in ad.BACKENDS.values()} | {"_JaxTraced"}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                assert not names & engines, f"{path.name}:{node.lineno} tests an engine's type; ask a capability"


def test_capabilities():
    assert ad.JaxReverse().compiled and not ad.JaxReverse(jit=False).compiled and ad.Enzyme.compiled
    for name in ("torch", "autograd", "finite-differences"):
        assert ad.BACKENDS[name].host and not ad.BACKENDS[name].traced and not ad.BACKENDS[name].compiled
    for name in ("jax-reverse", "jax-forward", "jax-transpose", "enzyme"):
        assert ad.BACKENDS[name].traced and not ad.BACKENDS[name].host
    composed = ad.HigherOrder(ad.FiniteDifferences(), ad.JaxReverse())
    assert composed.host and not composed.traced and not composed.compiled and composed.vmappable


OPERATORS = [
    "derivative",
    "gradient",
    "jacobian",
    "hessian",
    "hvp",
    "jvp",
    "vjp",
    "value_and_derivative",
    "value_and_gradient",
    "value_and_jacobian",
    "value_and_hessian",
    "value_gradient_and_hessian",
    "value_and_jvp",
    "value_and_vjp",
]


def test_operators_are_functions_with_their_signatures():
    """`help(sciad.ad.hvp)` and an IDE show `hvp(backend, f, x, v)` and what it returns."""
    vectors = {"hvp": ["v"], "jvp": ["v"], "value_and_jvp": ["v"], "vjp": ["w"], "value_and_vjp": ["w"]}
    for name in OPERATORS:
        op = getattr(ad, name)
        assert op.__name__ == name and op.__doc__
        assert list(inspect.signature(op).parameters) == ["backend", "f", "x", *vectors.get(name, [])], name
