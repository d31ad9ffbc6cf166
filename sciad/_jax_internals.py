"""JAX's internal machinery sciad uses, in one place, with the JAX versions it was tested on.

Mostly through `jax.extend` and `jax.interpreters`, the view of its internals JAX offers to
libraries (equinox and lineax define their primitives with them; no compatibility guarantee, so the
range below holds for them too); three names only `jax._src` has:

- sciad.ad._linear defines a primitive, `linear_map`, with its own JVP, transpose, batching and
  lowering rules: the public `jax.custom_jvp`/`custom_vjp` cannot declare a transpose that is
  itself differentiable, and `jax.custom_derivatives.linear_call` asserts zero tangents in its
  residuals. `convert_constvars_jaxpr` (jax._src): the traced `fun` and `transpose` take the
  values they close over as leading arguments, so a traced value they close over is a residual
  (differentiated) and never a constant leaked into a primitive's parameters.
- sciad._host_lu lowers its primitive to a host call that receives NumPy arrays
  (`mlir.emit_python_callback`): `jax.pure_callback` first copies its arguments into jax.Arrays
  (`device_put`), a copy that costs several times the host call itself, and a sparse Newton makes a thousand
  such calls a solve. `callback_op_sharding` (jax._src): the sharding that call needs in a sharded
  program, as `jax.pure_callback` gives it.
- `callback_logger` (jax._src): the logger JAX's callbacks log an exception to before re-raising it
  (sciad.errors keeps a SolveError from appearing twice, as `equinox.filter_jit` does for its own).

equinox's `filter_primitive_def/jvp/transpose/batching/bind` (equinox.internal) do not serve here:
they put PyTrees with static leaves through a primitive's rules, but both primitives take flat arrays
with static parameters already; they neither register a primitive nor lower it (the host call), and
their abstract evaluation declares no effects (`linear_map` carries its callee's).

pyproject.toml pins the same range (jax and jaxlib).
"""

from sciad._surfaces import private_surface

PACKAGE = "jax"
TESTED = ("0.10.2", "0.11")  # [lowest, first untested)

with private_surface(PACKAGE, TESTED):
    import jax.extend.core as core  # Primitive, ClosedJaxpr, Jaxpr, no_effects: define the primitive
    import jax.extend.linear_util as lu  # wrap_init: the traced function's wrapper trace_to_jaxpr_dynamic takes
    from jax._src.callback import _callback_op_sharding as callback_op_sharding  # the host call's sharding
    from jax._src.callback import logger as callback_logger
    from jax._src.interpreters.partial_eval import convert_constvars_jaxpr  # closed-over values as arguments
    from jax.api_util import debug_info  # required by lu.wrap_init (names the function in JAX's errors)
    from jax.interpreters import ad as jax_ad  # Zero, primitive_jvps/primitive_transposes: JVP and transpose rules
    from jax.interpreters import batching, mlir  # the vmap rule; the lowering (emit_python_callback: the host call)
    from jax.interpreters import partial_eval as pe  # trace_to_jaxpr_dynamic: `fun` and `transpose` as jaxprs
