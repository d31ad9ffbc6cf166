"""The sensealgs by name, and each sensealg as a string that round-trips every option.

    describe(InterpolatingAdjoint("torch", checkpointing=True))
    # 'InterpolatingAdjoint(torch, checkpointing=True)'
    parse("InterpolatingAdjoint(torch, checkpointing=True)") == InterpolatingAdjoint("torch", checkpointing=True)

The engine comes first, by its `sciad.ad` name (with its settings when they
differ from the defaults: `finite-differences(step=0.001)`); the other
options follow as `name=value` (Python literals), only where they differ
from the defaults.
"""

import ast
import dataclasses
import difflib
import inspect

import diffrax as dfx

import sciad.ad as ad
from sciad.adjoints._base import AbstractSensitivity
from sciad.adjoints._continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.adjoints._discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints._forward import ForwardSensitivity
from sciad.adjoints._reversible import ReversibleAdjoint
from sciad.adjoints._steady import SteadyStateAdjoint

SENSEALGS: dict[str, type[AbstractSensitivity]] = {
    cls.__name__: cls
    for cls in (
        ForwardDiffSensitivity,
        ForwardSensitivity,
        BacksolveAdjoint,
        InterpolatingAdjoint,
        GaussAdjoint,
        DiscreteAdjoint,
        ReversibleAdjoint,
    )
}
# The sensealgs that differentiate ODE solves: every one.
ODE_SENSEALGS = dict(SENSEALGS)
# Names that `parse` reads besides the classes': functions returning a configured sensealg.
ALIASES = {"QuadratureAdjoint": QuadratureAdjoint}
# diffrax's adjoints by class name, and what to pass to sciad instead.
DIFFRAX_EQUIVALENTS = {
    "RecursiveCheckpointAdjoint": "sciad.DiscreteAdjoint()",
    "DirectAdjoint": "sciad.DiscreteAdjoint()",
    "BacksolveAdjoint": "sciad.BacksolveAdjoint()",
    "ForwardMode": "sciad.ForwardDiffSensitivity()",
    "ImplicitAdjoint": "sciad.steady_state(prob, sensealg=sciad.SteadyStateAdjoint())",
}
STEADY = "sciad.SteadyStateAdjoint()"


def resolve(sensealg) -> AbstractSensitivity:
    """The sensealg `sensealg` stands for: an instance itself, or the one a name or a `describe`
    string names (`parse`); anything else is refused with an error naming what to pass instead
    (`refusal`). The one place `sciad.solve`'s `sensealg=` becomes a sensealg."""
    if isinstance(sensealg, AbstractSensitivity):
        return sensealg
    if isinstance(sensealg, str):
        return parse(sensealg)
    raise ValueError(refusal(sensealg))


def refusal(sensealg, *, steady: bool = False) -> str:
    """Why `sensealg` is not a sensealg of `sciad.solve` (with `steady`: of `sciad.steady_state`, which
    takes a `SteadyStateAdjoint`), naming exactly what to pass instead: a class's instance, sciad's
    equivalent of one of diffrax's adjoints, the closest name to a misspelt one, else the choices."""
    is_class = isinstance(sensealg, type)
    cls = sensealg if is_class else type(sensealg)
    if isinstance(sensealg, str):
        return (
            f"steady_state takes sensealg={STEADY} (an instance), got {sensealg!r}"
            if steady
            else _unknown_name(sensealg)
        )
    if isinstance(sensealg, dfx.AbstractAdjoint) or (is_class and issubclass(cls, dfx.AbstractAdjoint)):
        equivalent = DIFFRAX_EQUIVALENTS.get(cls.__name__)
        if steady:
            equivalent = STEADY if cls.__name__ == "ImplicitAdjoint" else None
        given = f"sensealg=diffrax.{cls.__name__}{'' if is_class else '()'} is diffrax's"
        return f"{given}; sciad's equivalent is {equivalent}" if equivalent else f"{given}; pass {_choices(steady)}"
    if any(sensealg is alias for alias in ALIASES.values()):
        return f"sensealg=sciad.{sensealg.__name__} is a function: pass what it returns, sciad.{sensealg.__name__}()"
    kind = "steady" if cls is SteadyStateAdjoint else "ode" if issubclass(cls, AbstractSensitivity) else None
    if is_class and kind == ("steady" if steady else "ode"):
        name = ("sciad." if cls.__module__.startswith("sciad.") else "") + cls.__name__
        return f"sensealg={name} is a class: pass an instance, {name}()"
    if steady and kind == "ode":
        return (
            f"steady_state takes sensealg=SteadyStateAdjoint(...) (the implicit function theorem), got "
            f"{cls.__name__}: the ODE sensealgs differentiate a time integration, which a steady state does "
            "not depend on"
        )
    if kind == "steady":
        return (
            f"sensealg=sciad.SteadyStateAdjoint{'' if is_class else '()'} differentiates a steady state: pass "
            f"it to sciad.steady_state; sciad.solve takes {_choices(False)}"
        )
    return f"unknown sensealg {sensealg!r}; pass {_choices(steady)}"


def _choices(steady: bool) -> str:
    if steady:
        return STEADY
    return f"one of {sorted([*SENSEALGS, *ALIASES])} (an instance, e.g. sciad.GaussAdjoint(), or its name)"


def _unknown_name(name: str) -> str:
    """`unknown sensealg 'name'`, with the closest name where it is a misspelling (or another case)."""
    names = sorted([*SENSEALGS, *ALIASES])
    close = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=1, cutoff=0.8)
    guess = f" (did you mean {next(n for n in names if n.lower() == close[0])!r}?)" if close else ""
    return f"unknown sensealg {name!r}{guess}; pass {_choices(False)}"


def engine_option(sensealg: AbstractSensitivity | type[AbstractSensitivity] | str) -> str | None:
    """The option holding the sensealg's engine ("vjp", "jvp"), or None when it takes none;
    `sensealg` is one, its class, or its name as `describe` writes it."""
    default = _class(parse(sensealg) if isinstance(sensealg, str) else sensealg)()
    return next(
        (name for name in options(type(default)) if isinstance(getattr(default, name), ad.AbstractBackend)), None
    )


def options(cls: type[AbstractSensitivity]) -> list[str]:
    """The options of a sensealg class: its constructor's parameters, each readable as an attribute."""
    return list(inspect.signature(cls).parameters)


def describe(sensealg: AbstractSensitivity, *, engine: bool = True) -> str:
    """`Name(engine, option=value, ...)`: every option that differs from its default
    (`engine=False` leaves the engine out; `Name` alone when nothing is left). `parse`
    rebuilds the sensealg from it."""
    default = type(sensealg)()
    parts = []
    for name in options(type(sensealg)):
        value = getattr(sensealg, name)
        if isinstance(value, ad.AbstractBackend):
            parts += [_engine(value)] if engine else []
        elif value != getattr(default, name):
            parts.append(f"{name}={value!r}")
    return type(sensealg).__name__ + (f"({', '.join(parts)})" if parts else "")


def parse(text: str, **options) -> AbstractSensitivity:
    """The sensealg `describe` wrote as `text` (or just its name); `options` (e.g. `vjp="torch"`)
    override those in `text`."""
    name, positional, keywords = _call(text)
    make = ALIASES.get(name) or _class(name)
    engine = engine_option(type(make()))
    if len(positional) > (engine is not None):
        raise ValueError(
            f"sensealg {text!r}: {name} takes {'its engine as its only' if engine else 'no'} "
            "positional argument; give the other options as name=value"
        )
    kwargs = {k: _literal(text, v) for k, v in keywords.items()}
    if positional and engine is not None:  # engine: not None where positional (raised above otherwise)
        engine_name, _, settings = _call(positional[0])
        kwargs[engine] = ad.get(engine_name, **{k: _literal(text, v) for k, v in settings.items()})
    kwargs.update(options)
    known = list(inspect.signature(make).parameters)
    unknown = set(kwargs) - set(known)
    if unknown:
        raise ValueError(
            f"sensealg {text!r}: {name} has no option {', '.join(sorted(unknown))}; its options are "
            f"{', '.join(known) or 'none'}"
        )
    return make(**kwargs)


def _class(sensealg) -> type[AbstractSensitivity]:
    if isinstance(sensealg, AbstractSensitivity):
        return type(sensealg)
    if isinstance(sensealg, type) and issubclass(sensealg, AbstractSensitivity):
        return sensealg
    if sensealg not in SENSEALGS:
        raise ValueError(refusal(sensealg))
    return SENSEALGS[sensealg]


def _engine(backend: ad.AbstractBackend) -> str:
    default = type(backend)()
    settings = [
        f"{f.name}={getattr(backend, f.name)!r}"
        for f in dataclasses.fields(backend)  # pyright: ignore[reportArgumentType]  # a backend: a frozen dataclass
        if getattr(backend, f.name) != getattr(default, f.name)
    ]
    return backend.name + (f"({', '.join(settings)})" if settings else "")


def _call(text: str) -> tuple[str, list[str], dict[str, str]]:
    """`Name(a, k=v)` as ("Name", ["a"], {"k": "v"}); a bare `Name` as ("Name", [], {})."""
    text = text.strip()
    name, paren, rest = text.partition("(")
    if paren and not rest.endswith(")"):
        raise ValueError(f"cannot read {text!r}: expected Name or Name(engine, option=value, ...)")
    positional, keywords = [], {}
    for arg in _split(rest[:-1]) if paren else []:
        key, eq, value = arg.partition("=")
        if eq and key.strip().isidentifier():
            keywords[key.strip()] = value.strip()
        else:
            positional.append(arg.strip())
    return name.strip(), positional, keywords


def _split(args: str) -> list[str]:
    """Split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(args):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    parts.append(args[start:])
    return [p for p in parts if p.strip()]


def _literal(text: str, value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise ValueError(
            f"sensealg {text!r}: option value {value!r} is not a Python literal "
            "(write strings in quotes: on_instability='warn')"
        ) from None
