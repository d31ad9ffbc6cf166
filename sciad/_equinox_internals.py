"""equinox's internal names sciad uses, in one place, with the equinox versions they were tested on.

- `unvmap_any`, `unvmap_max` (equinox.internal, no stability promise): a reduction over a
  `jax.vmap` batch too, so a `lax.cond` on it stays a cond under vmap (sciad.errors' warnings,
  `batch_any`).
- `prevbefore` (equinox.internal): the float just below t, its derivative the identity: where
  `diffrax.ClipStepSizeController` ends a step before a jump time (sciad's loop gives such a step the
  jump time's derivative).
- a behaviour, no name: equinox formats the message of a check that fires into its run-time error
  (`f"{msg}..."`); sciad.errors' messages raise their SolveError there, so it is the last line.
- `enumeration_messages`, `item_index`: the messages and an item's index of an
  `equinox.Enumeration` (diffrax.RESULTS is one), which equinox keeps private; sciad.errors
  raises a failed diffrax solve's own message, chosen by its index inside compiled code.

pyproject.toml pins the same range.
"""

import jax

from sciad._surfaces import private_surface

PACKAGE = "equinox"
TESTED = ("0.13.8", "0.14")  # [lowest, first untested)

with private_surface(PACKAGE, TESTED):
    from equinox.internal import prevbefore, unvmap_any, unvmap_max


def enumeration_messages(enumeration) -> tuple[str, ...]:
    """The messages of an `equinox.Enumeration`'s items, in the order of their indices."""
    with private_surface(PACKAGE, TESTED):
        return tuple(enumeration._index_to_message)


def item_index(item) -> jax.Array:
    """The index of an `equinox.Enumeration` item (an integer array, traced under `jax.jit`):
    its message is `enumeration_messages(enumeration)[index]`."""
    with private_surface(PACKAGE, TESTED):
        return item._value
