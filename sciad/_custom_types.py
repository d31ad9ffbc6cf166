"""Type aliases for annotations, as diffrax's (`diffrax._custom_types`): the static checker sees plain unions,
the documentation jaxtyping's dtype-and-shape names. Annotations only, never checked at run time."""

from typing import TYPE_CHECKING

import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Int, Real

if TYPE_CHECKING:
    BoolScalarLike = bool | Array | np.ndarray
    IntScalarLike = int | Array | np.ndarray
    RealScalarLike = int | float | Array | np.ndarray
else:
    BoolScalarLike = Bool[ArrayLike, ""]
    IntScalarLike = Int[ArrayLike, ""]
    RealScalarLike = Real[ArrayLike, ""]  # a time, a step, a tolerance: a Python number or a 0-d array
