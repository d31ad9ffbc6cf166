"""`Benchmark`: a problem, where to save it, and the scalar loss to differentiate."""

import dataclasses
from collections.abc import Callable

import numpy as np
from jaxtyping import Array, Float, PyTree, Shaped

from sciad._auto import size
from sciad._ode import ODEProblem
from sciad._solve import solve


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """`loss(us)` maps the saved states us (T, n) (any engine's array) to a
    scalar; `objective(p)` is that loss of the solution at parameters p (m,),
    solved with `solver` at `rtol`, `atol` in at most `max_steps` steps. Tighter tolerances for a
    reference: `dataclasses.replace(bench, rtol=1e-10, atol=1e-10)`."""

    name: str
    problem: ODEProblem
    saveat: Float[np.ndarray, " T"]
    loss: Callable[[PyTree[Shaped[Array, "T ..."]]], Float[Array, ""]]
    rtol: float = 1e-6
    atol: float = 1e-6
    solver: str = "tsit5"
    max_steps: int = 4096

    @property
    def size(self) -> int:
        """States + parameters (entries of their array leaves): the paper's measure of problem size."""
        return size(self.problem.u0) + size(self.problem.p)

    @property
    def inputs(self):
        """What `objective` is differentiated in: the problem's parameters p (m,)."""
        return self.problem.p

    def objective(self, p, sensealg="auto"):
        """loss(us) with us solved at parameters p (m,), differentiated by `sensealg`."""
        sol = solve(
            self.problem,
            p=p,
            saveat=self.saveat,
            solver=self.solver,
            rtol=self.rtol,
            atol=self.atol,
            sensealg=sensealg,
            max_steps=self.max_steps,
        )
        return self.loss(sol.us)
