"""The private names sciad takes from its dependencies, one module per package
(sciad/_<package>_internals.py), are pinned here: the installed version lies in the range the
module was tested on, pyproject.toml pins that range (constraints.txt a version in it), and each
name still does what sciad uses it for. A failure names the package, its installed version, the
tested range and the fix."""

import ast
import contextlib
import logging
import pathlib
import re
import tomllib

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad
from sciad import _diffrax_internals, _equinox_internals, _jax_internals
from sciad._surfaces import in_range, private_surface, untested, version

SURFACES = (_diffrax_internals, _equinox_internals, _jax_internals)
REPO = pathlib.Path(__file__).parents[1]


@contextlib.contextmanager
def pinned(surface):
    """Any failure inside fails the test with the surface's message (package, version, range, fix)."""
    try:
        yield
    except Exception as error:
        pytest.fail(f"{untested(surface.PACKAGE, surface.TESTED)}\n{type(error).__name__}: {error}")


@contextlib.contextmanager
def records(logger: logging.Logger):
    """The records `logger` handles (after its filters) while the block runs."""
    out, handler = [], logging.Handler()
    handler.emit = out.append
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("surface", SURFACES, ids=lambda surface: surface.PACKAGE)
def test_installed_version_is_in_the_tested_range(surface):
    assert in_range(surface.PACKAGE, surface.TESTED), untested(surface.PACKAGE, surface.TESTED)


@pytest.mark.parametrize("surface", SURFACES, ids=lambda surface: surface.PACKAGE)
def test_pyproject_pins_the_tested_range_and_ci_a_version_in_it(surface):
    lowest, first_untested = surface.TESTED
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = f"{surface.PACKAGE}>={lowest},<{first_untested}"
    assert pin in [dependency.replace(" ", "") for dependency in dependencies], (
        f"pyproject.toml should require {pin}, the range sciad/_{surface.PACKAGE}_internals.py was tested on"
    )
    constraints = dict(
        line.split("==")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert version(lowest) <= version(constraints[surface.PACKAGE]) < version(first_untested), (
        f"constraints.txt installs {surface.PACKAGE}=={constraints[surface.PACKAGE]}, outside {pin}"
    )


def test_surface_versions_compare_by_release_numbers():
    assert version("0.13.8") < version("0.14") <= version("0.14.0rc1") < version("0.14.1.dev3") < version("1.0")


def test_a_private_name_gone_fails_naming_the_package_its_version_and_the_tested_range():
    lowest, first_untested = _diffrax_internals.TESTED
    expected = (
        f"tested on diffrax>={lowest},<{first_untested}; the installed diffrax {dfx.__version__} lies in that "
        "range, yet they differ. Install"
    )
    with pytest.raises(ImportError, match=re.escape(expected) + r".*\(cannot import name 'gone'"):
        with private_surface("diffrax", _diffrax_internals.TESTED):
            from diffrax._root_finder import gone  # noqa: F401
    assert f"the installed diffrax {dfx.__version__} is outside that range" in untested("diffrax", ("0.1", "0.2"))


def test_diffrax_implicit_solvers_leave_their_root_finders_tolerances_to_the_controller():
    with pinned(_diffrax_internals):
        finder = dfx.Kvaerno5().root_finder
        assert all(getattr(finder, name) is _diffrax_internals.use_stepsize_tol for name in ("rtol", "atol", "norm"))


def test_equinox_enumerations_give_their_messages_and_item_indices_under_jit():
    class Outcome(eqx.Enumeration):
        fine = ""
        broken = "it broke"

    messages, item_index = _equinox_internals.enumeration_messages, _equinox_internals.item_index
    with pinned(_equinox_internals):
        assert messages(Outcome) == ("", "it broke")
        index = jax.jit(lambda broke: item_index(Outcome.where(broke, Outcome.broken, Outcome.fine)))(True)
        assert messages(Outcome)[int(index)] == "it broke"
        reached = dfx.RESULTS.max_steps_reached  # diffrax's RESULTS, as sciad.errors reads them
        assert messages(dfx.RESULTS)[int(item_index(reached))] == dfx.RESULTS[reached]


def test_equinox_unvmap_reduces_over_a_vmap_batch_too():
    with pinned(_equinox_internals):
        x = jnp.arange(4.0)
        np.testing.assert_array_equal(jax.vmap(lambda x: _equinox_internals.unvmap_any(x > 2.5))(x), True)
        np.testing.assert_array_equal(jax.vmap(_equinox_internals.unvmap_max)(x), 3.0)


def test_equinox_formats_a_firing_checks_message_into_its_run_time_error():
    """sciad.errors' messages raise the SolveError when equinox formats them: JAX's error ends with it."""
    with pinned(_equinox_internals):
        checked = jax.jit(lambda x: sciad._errors.error_if(x, x > 0, "the message"))
        with pytest.raises(jax.errors.JaxRuntimeError) as info:
            jax.block_until_ready(checked(jnp.ones(())))
        assert str(info.value).strip().splitlines()[-1] == "SolveError: the message"


def test_jax_convert_constvars_jaxpr_makes_closed_over_values_arguments():
    with pinned(_jax_internals):
        c = jnp.arange(2.0)
        jaxpr = _jax_internals.pe.trace_to_jaxpr_dynamic(
            _jax_internals.lu.wrap_init(
                lambda x: [x * c], debug_info=_jax_internals.debug_info("test", lambda x: x, (1.0,), {})
            ),
            [jax.core.ShapedArray((2,), c.dtype)],
        )[0]
        converted = _jax_internals.convert_constvars_jaxpr(jaxpr)
        assert len(converted.invars) == 2 and not converted.constvars
        np.testing.assert_array_equal(jax.core.eval_jaxpr(converted, [], c, jnp.ones(2)), [c])


def test_every_jax_internal_sciad_names_exists():
    """sciad uses the modules `_jax_internals` hands out by their attributes
    (`core.Primitive`, ...): each attribute named anywhere in sciad is there."""
    missing = []
    for path in pathlib.Path(sciad.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {
            alias.asname or alias.name: getattr(_jax_internals, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "sciad._jax_internals"
            for alias in node.names
        }
        missing += [
            f"{path.name}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and not hasattr(aliases[node.value.id], node.attr)
        ]
    assert not missing, f"{untested('jax', _jax_internals.TESTED)}\nmissing: {', '.join(missing)}"


def test_jax_logs_a_failing_callback_to_callback_logger():
    def fail(x):
        raise ValueError("from the callback")

    with pinned(_jax_internals), records(_jax_internals.callback_logger) as logged:
        with pytest.raises(Exception, match="from the callback"):
            jax.block_until_ready(
                jax.jit(lambda x: jax.pure_callback(fail, jax.ShapeDtypeStruct((), x.dtype), x))(jnp.ones(()))
            )
        assert [type(record.exc_info[1]) for record in logged] == [ValueError]


def test_a_solve_error_reaches_the_user_once_not_logged_by_jax_too():
    prob = sciad.ODEProblem(lambda u, p, t: -p * u, np.ones(2), (0.0, 10.0), np.array([0.5, 1.0]))
    with records(_jax_internals.callback_logger) as logged:
        with pytest.raises(Exception, match="SolveError: .* needed more than max_steps=2"):
            jax.block_until_ready(jax.jit(lambda p: sciad.solve(prob, p=p, saveat=[10.0], max_steps=2).us)(prob.p))
    assert logged == []
