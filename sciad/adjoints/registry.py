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
import inspect

import sciad.ad as ad
from sciad.adjoints.base import AbstractSensitivity
from sciad.adjoints.continuous import BacksolveAdjoint, GaussAdjoint, InterpolatingAdjoint, QuadratureAdjoint
from sciad.adjoints.discrete import DiscreteAdjoint, ForwardDiffSensitivity
from sciad.adjoints.forward import ForwardSensitivity

SENSEALGS: dict[str, type[AbstractSensitivity]] = {
    cls.__name__: cls
    for cls in (ForwardDiffSensitivity, ForwardSensitivity, BacksolveAdjoint,
                InterpolatingAdjoint, GaussAdjoint, DiscreteAdjoint)
}
# Names that `parse` reads besides the classes': functions returning a configured sensealg.
ALIASES = {"QuadratureAdjoint": QuadratureAdjoint}


def engine_option(sensealg: AbstractSensitivity | type[AbstractSensitivity] | str) -> str | None:
    """The option holding the sensealg's engine ("vjp", "jvp"), or None when it takes none;
    `sensealg` is one, its class, or its name as `describe` writes it."""
    default = _class(parse(sensealg) if isinstance(sensealg, str) else sensealg)()
    return next((f.name for f in dataclasses.fields(default) if isinstance(getattr(default, f.name), ad.AbstractBackend)),
                None)


def describe(sensealg: AbstractSensitivity, *, engine: bool = True) -> str:
    """`Name(engine, option=value, ...)`: every option that differs from its default
    (`engine=False` leaves the engine out; `Name` alone when nothing is left). `parse`
    rebuilds the sensealg from it."""
    default = type(sensealg)()
    parts = []
    for field in dataclasses.fields(sensealg):
        value = getattr(sensealg, field.name)
        if isinstance(value, ad.AbstractBackend):
            parts += [_engine(value)] if engine else []
        elif value != getattr(default, field.name):
            parts.append(f"{field.name}={value!r}")
    return type(sensealg).__name__ + (f"({', '.join(parts)})" if parts else "")


def parse(text: str, **options) -> AbstractSensitivity:
    """The sensealg `describe` wrote as `text` (or just its name); `options` (e.g. `vjp="torch"`)
    override those in `text`."""
    name, positional, keywords = _call(text)
    make = ALIASES.get(name) or _class(name)
    engine = engine_option(type(make()))
    if len(positional) > (engine is not None):
        raise ValueError(f"sensealg {text!r}: {name} takes {'its engine as its only' if engine else 'no'} "
                         "positional argument; give the other options as name=value")
    kwargs = {k: _literal(text, v) for k, v in keywords.items()}
    if positional:
        engine_name, _, settings = _call(positional[0])
        kwargs[engine] = ad.get(engine_name, **{k: _literal(text, v) for k, v in settings.items()})
    kwargs.update(options)
    known = list(inspect.signature(make).parameters)
    unknown = set(kwargs) - set(known)
    if unknown:
        raise ValueError(f"sensealg {text!r}: {name} has no option {', '.join(sorted(unknown))}; its options are "
                         f"{', '.join(known) or 'none'}")
    return make(**kwargs)


def _class(sensealg) -> type[AbstractSensitivity]:
    if isinstance(sensealg, AbstractSensitivity):
        return type(sensealg)
    if isinstance(sensealg, type) and issubclass(sensealg, AbstractSensitivity):
        return sensealg
    if sensealg not in SENSEALGS:
        raise ValueError(f"unknown sensealg {sensealg!r}; choose one of {', '.join([*SENSEALGS, *ALIASES])}")
    return SENSEALGS[sensealg]


def _engine(backend: ad.AbstractBackend) -> str:
    default = type(backend)()
    settings = [f"{f.name}={getattr(backend, f.name)!r}" for f in dataclasses.fields(backend)
                if getattr(backend, f.name) != getattr(default, f.name)]
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
        raise ValueError(f"sensealg {text!r}: option value {value!r} is not a Python literal "
                         "(write strings in quotes: on_instability='warn')") from None
