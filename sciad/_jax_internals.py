"""JAX's private modules sciad uses (jax._src), in one place, with the JAX versions they were tested on.

- sciad.ad._linear defines a primitive, `linear_map`, with its own JVP, transpose, batching and
  lowering rules: the public `jax.custom_jvp`/`custom_vjp` cannot declare a transpose that is
  itself differentiable, and `jax.custom_derivatives.linear_call` asserts zero tangents in its
  residuals. It uses the modules below by their attributes (`core.Primitive`,
  `pe.trace_to_jaxpr_dynamic`, ...); tests/test_private_surfaces.py checks each one it names.
- `callback_logger`: the logger JAX's callbacks log an exception to before re-raising it
  (sciad.errors keeps a SolveError from appearing twice).
- `emit_python_callback`, `callback_op_sharding`: sciad._host_lu lowers its primitive to a host call
  that receives NumPy arrays. `jax.pure_callback` first copies its arguments into jax.Arrays
  (`device_put`), about 200 µs a call on CPU against 20 µs: a sparse Newton makes a thousand
  such calls a solve.

pyproject.toml pins the same range (jax and jaxlib).
"""

from sciad._surfaces import private_surface

PACKAGE = "jax"
TESTED = ("0.10.2", "0.11")  # [lowest, first untested)

with private_surface(PACKAGE, TESTED):
    from jax._src import core  # Primitive, eval_jaxpr, ClosedJaxpr, typeof: define and run the primitive
    from jax._src import linear_util as lu  # wrap_init: the traced function's wrapper trace_to_jaxpr_dynamic takes
    from jax._src.ad_util import Zero  # the symbolic-zero tangents and cotangents the rules receive
    from jax._src.api_util import debug_info  # required by lu.wrap_init (names the function in JAX's errors)
    from jax._src.callback import _callback_op_sharding as callback_op_sharding  # the host call's sharding
    from jax._src.callback import emit_python_callback  # a host call in the lowering, NumPy in and out
    from jax._src.callback import logger as callback_logger
    from jax._src.interpreters import ad as jax_ad  # primitive_jvps/primitive_transposes: the JVP and transpose rules
    from jax._src.interpreters import batching, mlir  # the vmap rule and the lowering of the primitive
    from jax._src.interpreters import partial_eval as pe  # trace_to_jaxpr_dynamic: `fun` and `transpose` as jaxprs
