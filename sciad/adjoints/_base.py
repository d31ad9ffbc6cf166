"""What every sensitivity algorithm shares: the solve setup, diffrax calls,
the products of f from a chosen engine, and the custom rules that make a
solve differentiable."""

import abc
import dataclasses
import typing
from collections.abc import Callable

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

import sciad.ad as ad
from sciad._dae import MassMatrix, consistent_derivative, held_mass, initialise, released_mass, solver_mass
from sciad._equinox_internals import enumeration_messages, item_index
from sciad._errors import batch_any, branched_check, error_if, warn_if
from sciad._pytrees import Layout
from sciad._stability import (
    STABILITY_CHECKED_STEPS,
    STABILITY_LIMITED,
    STABILITY_STEPS_MIN,
    stability_boundary,
    stability_steps,
)
from sciad._stiff import is_implicit
from sciad.ad._linear import REVERSE_OVER_REVERSE, forward_mode_only, summed_in_batches
from sciad.adjoints._loop import GridSteps, Stepper, Trajectory, integrate


class Setup(eqx.Module):
    """Everything about a solve except u0 and p: `f(u, p, t)` on flat vectors u (n,), p (m,), and
    with an integrand, F = [f; g] (n + k,): the state is then y = (u, q) (n + k,), q the running
    integral ∫ g dt from q(t0) = 0. Time runs forward, t0 < t1 (a backward problem arrives with t
    negated); `ts` (T,) the save times, increasing inside [t0, t1]. A PyTree: its traced parts
    (t0, t1, the save times, values f closes over) are leaves, so a custom rule can take it as an
    argument. `adjoint_rtol`, `adjoint_atol` (default: rtol, atol): the backward systems' tolerances,
    on the adjoint state of a cotangent divided by its largest entry (`normalised`). `mass`: a bare
    setup's mass matrix (`bare`), else None (the solver holds it). `consistent`: u0 arrives with a
    DAE's algebraic states still to solve (`initialised`, in every forward solve): for the sensealgs
    whose tangents pass through the initialisation (`AbstractSensitivity.initialises`).
    `stepsize_controller`: a `diffrax.PIDController` whose gains and limits every solve takes (None: sciad's,
    `step_controller`); `dt0`: the forward solve's first step (None: the controller selects it);
    `steps_at_saves`: adaptive steps clipped to land on the save times."""

    f: Callable
    solver: dfx.AbstractSolver
    t0: typing.Any
    t1: typing.Any
    ts: typing.Any
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    adjoint_rtol: float | None = eqx.field(static=True, default=None)
    adjoint_atol: float | None = eqx.field(static=True, default=None)
    mass: MassMatrix | None = eqx.field(static=True, default=None)  # a bare setup's (`bare`)
    consistent: bool = eqx.field(static=True, default=False)  # u0's algebraic states are solved here (`initialised`)
    # The rules' inputs whose cotangent p's is (`AbstractSensitivity.solve`: p, and c where merged): the slots a
    # pullback accumulates p's cotangent into (`sciad.ad._linear.accumulate_pullback`).
    parameter_slots: tuple = eqx.field(static=True, default=(1,))
    # the user's PIDController, in this setup's time (else `step_controller`'s), or a kind's own (an SDE's)
    stepsize_controller: dfx.AbstractStepSizeController | None = None
    dt0: typing.Any = None  # the forward solve's first step (None: the controller's choice)
    members: "Members | None" = eqx.field(static=True, default=None)  # a batch as one state (`batched`)
    steps_at_saves: bool = eqx.field(static=True, default=False)  # adaptive steps land on the save times (SDEs)

    @property
    def adjoint_tolerances(self) -> tuple[float, float]:
        """(rtol, atol) of the backward systems."""
        return (
            self.rtol if self.adjoint_rtol is None else self.adjoint_rtol,
            self.atol if self.adjoint_atol is None else self.adjoint_atol,
        )

    def controller(
        self, rtol: float | None = None, atol: float | None = None, norm=None
    ) -> dfx.AbstractStepSizeController:
        """The step-size controller at rtol, atol (default: the forward solve's) and `norm` (None: the
        user's controller's, else the RMS norm)."""
        controller = step_controller(
            self.solver,
            self.rtol if rtol is None else rtol,
            self.atol if atol is None else atol,
            norm,
            self.stepsize_controller,
        )
        if self.steps_at_saves:  # from the bound save times: a custom rule's own inputs
            return dfx.ClipStepSizeController(controller, step_ts=self.ts)  # pyright: ignore[reportArgumentType]  # adaptive
        return controller

    @property
    def implicit(self) -> bool:
        """Whether the solver is implicit (then the adjoint systems are solved implicitly too)."""
        return is_implicit(self.solver)

    @property
    def n(self) -> int:
        """The states u (n,)."""
        return self.f.u.size

    def state(self, u0):
        """y0 = (u0, q0 = 0) (n + k,): the state the solver integrates."""
        k = self.f.integrand_size
        return jnp.concatenate([u0, jnp.zeros((k,), u0.dtype)]) if k else u0

    def rate(self, y, p, t):
        """y' = F(u, p, t) (n + k,) at the state y (n + k,)."""
        return self.f(y[: self.n] if self.f.integrand_size else y, p, t)

    def derivative(self, y, p, t):
        """y' (n + k,) at the state y (n + k,) at t: F(u, p, t), or for M u' = f (a Rosenbrock solver's
        mass matrix), the consistent u' (`sciad._dae.consistent_derivative`: a DAE's algebraic states
        move with its algebraic equations) and q' = g. What a save time's or an event time's derivative is;
        a kind whose solutions have none (an SDE's paths) says so here."""
        no_derivative = getattr(self.f, "no_time_derivative", None)
        if no_derivative:
            raise ValueError(no_derivative)
        rate = self.rate(y, p, t)
        mass = solver_mass(self.solver, self.n)
        if mass is None:
            return rate
        n = self.n
        return rate.at[:n].set(consistent_derivative(mass, lambda u, t: self.f(u, p, t)[:n], y[:n], t))

    def backward(self) -> "Setup":
        """The setup a continuous adjoint's backward sweep solves on: this one, or its kind's own (an SDE's
        Stratonovich form, by Heun)."""
        kind = getattr(self.f, "backward", None)
        return self if kind is None else kind(self)

    def bare(self) -> "Setup":
        """This setup without its traced parts (f's closure values, save times, t0, t1): what a custom
        rule holds fixed, the rest arriving as the rule's own inputs (`bound`). A Rosenbrock solver's
        mass matrix (NumPy, read at trace time) is held as a static field until then, so a rule that
        takes the bare setup as an input (traced) still reads it (`sciad._dae.held_mass`)."""
        bare = eqx.tree_at(
            lambda s: (s.f, s.ts, s.t0, s.t1, s.dt0),
            self,
            (self.f.with_closure(None, False).driven(None, self.f), None, None, None, None),
            is_leaf=lambda x: x is None,
        )
        solver, mass = held_mass(self.solver)
        return dataclasses.replace(bare, solver=solver, mass=mass)

    def bound(self, c, ts, t0, t1, merged: bool = False, dt0=None, driving=None, like=None) -> "Setup":
        """This setup with f holding the closure values `c` (appended to p where `merged`), saving at
        `ts`, from t0 to t1, first trying the step dt0, driven by `driving` (the arrays of the field `like`'s
        `driving`, an SDE's Brownian path; None: as it is) (a bare setup's solver with its mass matrix again)."""
        f = self.f.with_closure(c, merged)
        if driving is not None:
            f = f.driven(driving, like)
        setup = eqx.tree_at(
            lambda s: (s.f, s.ts, s.t0, s.t1, s.dt0),
            self,
            (f, ts, t0, t1, dt0),
            is_leaf=lambda x: x is None,
        )
        setup = dataclasses.replace(setup, parameter_slots=(1, 2) if merged else (1,))
        if self.mass is None:
            return setup
        return dataclasses.replace(setup, solver=released_mass(setup.solver, self.mass), mass=None)

    def batched(self, size: int) -> "Setup":
        """This setup for a batch of `size` members sharing p, the times and f's closure, solved as one
        state (`Members`): every step size is controlled by the largest of the members' norms, so each
        member's error is held as on its own. For explicit solvers without a mass matrix."""
        like = typing.cast(dfx.PIDController, self.controller())  # the ODE solves batched so are adaptive
        members = Members(size, self.n, self.f.integrand_size, like.norm)
        return dataclasses.replace(
            self,
            f=MemberField(self.f, members),
            stepsize_controller=eqx.tree_at(lambda c: c.norm, like, members.largest_flat()),
            members=members,
        )

    def term(self, vector_field: Callable | None = None, noise: Callable | None = None):
        """`vector_field(t, y, args)` (default: the state's rate) as the term the solver takes; IMEX
        solvers (KenCarp) get it as their implicit part, with a zero explicit part. A kind that adds terms
        of its own (an SDE's noise: `noise(s, y, args, dW)`, a backward sweep's) makes them."""
        kind_terms = getattr(self.f, "terms", None)
        if kind_terms is not None:
            return kind_terms(self.solver, vector_field, noise)
        vector_field = vector_field or (lambda t, y, p: self.rate(y, p, t))
        term = dfx.ODETerm(vector_field)
        if typing.get_origin(self.solver.term_structure) is dfx.MultiTerm:
            zero = dfx.ODETerm(lambda t, y, args: jax.tree.map(jnp.zeros_like, y))
            return dfx.MultiTerm(zero, term)
        return term

    def breakpoints(self, extra=()) -> jax.Array:
        """Sorted times t0, ts, `extra`, t1 (T + 2 + len(extra), repeats kept: zero-length intervals):
        where the adjoint state jumps or restarts."""
        ts = jnp.asarray(self.ts)
        times = [jnp.full((1,), self.t0, ts.dtype), ts, jnp.asarray(extra, ts.dtype), jnp.full((1,), self.t1, ts.dtype)]
        return jnp.sort(jnp.concatenate(times))

    def saved(self, bps: jax.Array) -> jax.Array:
        """Indices (T,) of the saveat times among the breakpoints `bps`."""
        return jnp.searchsorted(bps, jnp.asarray(self.ts, bps.dtype))

    def diffeqsolve(
        self,
        term,
        y0,
        args,
        t0,
        t1,
        *,
        ts=None,
        dense=False,
        steps: int = 0,
        max_steps=None,
        norm=None,
        dt0=None,
        throw=True,
    ):
        """One solve from t0 to t1 > t0 with this setup's solver and tolerances on sciad's loop (`integrate`:
        forward-mode differentiable, so an outer `jax.jvp` enters it), saving at `ts` and, with `steps` = k,
        after every k-th accepted step, in one array. `dt0` is the first step (None: the controller selects
        it, at two extra f evaluations)."""
        controller, past = self.controller(norm=norm), {}
        stepping = getattr(self.f, "stepping", None)  # a kind whose steps read the solve's past (a delay equation)
        if stepping is not None:
            stepping = stepping(self.solver, y0, args, t0)
            controller = stepping.controller(controller)
            past = {"carried": stepping.past, "on_step": stepping.record, "carried_args": True, "limit": stepping.limit}
            past |= {"jump_ts": stepping.jump_ts, "jumps": stepping.jumps}
        sol = integrate(
            Stepper.of(term, self.solver, controller, refine=stepping and stepping.refine),
            y0,
            args,
            t0,
            t1,
            max_steps=max_steps or self.max_steps,
            dt0=dt0,
            ts=ts,
            every=int(steps),
            dense=dense,
            **past,
        )
        if stepping is not None:
            sol = stepping.checked(sol)
        if not throw:
            return sol
        return eqx.tree_at(lambda s: s.ys, sol, solver_failure(sol.ys, sol.result, max_steps or self.max_steps))

    def initialised(self, u0, p):
        """u0 (n,), its algebraic states solved from its differential ones where `consistent`
        (`sciad._dae.initialise`, differentiable), else as it is."""
        if not self.consistent:
            return u0
        return initialise("consistent", self.f, solver_mass(self.solver, self.n), u0, p, self.t0, self.rtol, self.atol)

    def forward(self, u0, p, *, ts=None, **options):
        """The forward solve of y from (u0, 0) (`initialised`) at t0 to t1, saving y (n + k,) at `ts`
        (default: the saveat times); `options` as `diffeqsolve`'s."""
        ts = self.ts if ts is None else ts
        options.setdefault("dt0", self.dt0)
        return self.diffeqsolve(
            self.term(),
            self.state(self.initialised(u0, p)),
            p,
            self.t0,
            self.t1,
            ts=jnp.asarray(ts, u0.dtype),
            **options,
        )


class Members(eqx.Module):
    """A batch of `size` members, each with a state y = (u, q) (n + k,), as one state (size·(n + k),):
    the members' u one after another, then their q. `norm`: the norm of one member's state."""

    size: int = eqx.field(static=True)
    n: int = eqx.field(static=True)
    k: int = eqx.field(static=True)
    norm: Callable = eqx.field(static=True)

    def flat(self, y):
        """(..., size, n + k) -> (..., size·(n + k)): the members' states as one."""
        lead = y.shape[:-2]
        return jnp.concatenate([y[..., : self.n].reshape(*lead, -1), y[..., self.n :].reshape(*lead, -1)], axis=-1)

    def stacked(self, y):
        """(..., size·(n + k)) -> (..., size, n + k): one state as the members'."""
        lead, split = y.shape[:-1], self.size * self.n
        u = y[..., :split].reshape(*lead, self.size, self.n)
        return jnp.concatenate([u, y[..., split:].reshape(*lead, self.size, self.k)], axis=-1)

    def largest_flat(self) -> Callable:
        """The norm of one state (size·(n + k),): the largest of the members' `norm`s."""
        return lambda y: jnp.max(jax.vmap(self.norm)(self.stacked(y)))

    def largest(self, norm: Callable, own) -> Callable:
        """The norm of a PyTree whose leaves are the members' own, one after another, where `own` (a
        PyTree of bools like it) says, the rest shared: the largest over the members of `norm` of a
        member's (its own leaves, the shared ones)."""

        def largest(y):
            leaves, tree = jax.tree.flatten(y)
            flags = jax.tree.leaves(own)
            split = [x.reshape(self.size, -1) if o else x for x, o in zip(leaves, flags)]
            norms = jax.vmap(lambda *x: norm(jax.tree.unflatten(tree, x)), in_axes=[0 if o else None for o in flags])
            return jnp.max(norms(*split))

        return largest


class MemberField(eqx.Module):
    """f of a batch (`Members`) as one state's: F = (the members' f, their g) (size·(n + k),), from
    u (size·n,); `open`, `held` and the sizes as `sciad._vector_field.VectorField`'s."""

    field: typing.Any
    members: Members = eqx.field(static=True)

    @property
    def u(self) -> Layout:
        dtype = self.field.dtype
        return Layout.of(jax.ShapeDtypeStruct((self.members.size * self.members.n,), dtype), dtype)

    @property
    def integrand_size(self) -> int:
        return self.members.size * self.members.k

    @property
    def held(self):
        return self.field.held

    def open(self) -> Callable:
        g, members = self.field.open(), self.members

        def batch(u, p, c, t):
            return members.flat(jax.vmap(lambda u: g(u, p, c, t))(u.reshape(members.size, members.n)))

        return batch

    def __call__(self, u, p, t):
        return self.open()(u, p, self.held, t)


# Steps the storing sensealgs keep without recomputation: diffrax's default max_steps, and no more
# than STORED_BYTES of them (at least MIN_STORED steps). A buffer's cost is its size, not the steps
# written into it: every call allocates and fills it (diffrax's dense output copies it about twice
# more), and on the CPU a buffer past glibc's 32 MiB mmap threshold is fresh memory, page-faulted in
# on every call (n = 20,000 Tsit5 steps: 16 steps 0.8 ms over the plain solve, 32 steps 13 ms). So
# the budget is small (2 MiB: 16 Tsit5 steps of 2,000 states, a whole solve of a few hundred states)
# and a solve that takes more steps is recomputed from checkpoints: the cost follows the steps taken,
# not a user's max_steps (a safety cap) nor the largest state.
STORED_STEPS = 4096
STORED_BYTES = 2**21
MIN_STORED = 16


def stored_steps(max_steps: int, step_bytes: int = 0) -> int:
    """The steps a storing sensealg keeps for a solve of at most `max_steps` steps of `step_bytes` each."""
    return min(max_steps, STORED_STEPS, max(MIN_STORED, STORED_BYTES // max(step_bytes, 1)))


def interpolation_step_bytes(solver, states: int, itemsize: int) -> int:
    """Bytes of one step of a dense interpolation: stages + 1 vectors of `states` (7 stages if unknown)."""
    return (getattr(getattr(solver, "tableau", None), "num_stages", 7) + 1) * states * itemsize


def normalised(w) -> tuple:
    """(s, w / s): a cotangent w divided by its largest |entry| s (1 where w is 0), s a constant (no
    derivative: what is solved with w / s is linear in it). A linear adjoint system solved for w / s
    and scaled back by s has its error controlled relative to its own size, whatever the loss's scale."""
    size = jax.lax.stop_gradient(jnp.max(jnp.abs(w), initial=0.0))
    scale = jnp.where((size > 0) & jnp.isfinite(size), size, jnp.ones_like(size))
    return scale, w / scale


def leading_seminorm(parts: int = 1) -> Callable:
    """Error control on the first `parts` parts of a tuple state alone (a seminorm, Kidger et al. 2021):
    y -> RMS norm of y[:parts]."""
    return lambda y: optx.rms_norm(y[:parts])


def step_controller(
    solver: dfx.AbstractSolver,
    rtol: float,
    atol: float,
    norm=None,
    like: dfx.AbstractStepSizeController | None = None,
) -> dfx.AbstractStepSizeController:
    """Adaptive steps at rtol, atol: integral control, or for implicit solvers PI control
    (pcoeff 0.4, icoeff 0.3, as diffrax suggests for stiff problems: Kvaerno5 rejects about
    half its steps on the Oregonator under integral control, a fifth under PI); or the controller
    `like` (its gains and limits) at rtol, atol and `norm` (None: its own); `like` another controller:
    itself (an SDE's: fixed steps of the solve's `dt0`, or steps clipped to its save times). A solver
    that chooses its own steps declares the controller that applies them (`step_controller`: BDF's)."""
    if like is not None and not isinstance(like, dfx.PIDController):  # a kind's own (an SDE's grid, its save times)
        return like
    own = getattr(solver, "step_controller", None)
    if own is not None:  # a solver that chooses its own steps (and order: BDF) declares the controller applying them
        norm = norm or (None if like is None else like.norm)
        return own(rtol=rtol, atol=atol, **({} if norm is None else {"norm": norm}))
    if like is not None:
        return eqx.tree_at(lambda c: (c.rtol, c.atol, c.norm), like, (rtol, atol, norm or like.norm))
    gains = {"pcoeff": 0.4, "icoeff": 0.3} if is_implicit(solver) else {}
    return dfx.PIDController(rtol=rtol, atol=atol, **gains, **({} if norm is None else {"norm": norm}))


def solver_failure(x, result: dfx.RESULTS, max_steps: int):
    """`x`, raising a `SolveError` when the diffrax solve that gave `result` failed (e.g. ran out of
    steps), with diffrax's message for `result` (sciad's own for max_steps)."""
    messages = tuple(_failure(i, m, max_steps) for i, m in enumerate(enumeration_messages(dfx.RESULTS)))
    return branched_check(x, result != dfx.RESULTS.successful, item_index(result), messages)


def _failure(index: int, diffrax_message: str, max_steps: int) -> str:
    if index == item_index(dfx.RESULTS.max_steps_reached):
        return (
            f"the maximum number of solver steps was reached: the ODE solve needed more than "
            f"max_steps={max_steps} steps; pass a larger max_steps to sciad.solve (or looser rtol/atol; a "
            "stiff problem needs an implicit solver: solver='auto' picks one)"
        )
    return f"the ODE solver failed: {diffrax_message}"


def checked(setup: Setup, result, x):
    """`x`, with a run-time error if the diffrax solve that gave `result` failed
    (e.g. hit max_steps). The check on a solve's outputs is dropped when only
    their derivatives are used (jax.jit removes it), so the rules that re-solve
    internally attach it to what they return."""
    return solver_failure(x, result, setup.max_steps)


def stats_vector(sol: "dfx.Solution | Trajectory") -> jax.Array:
    """(steps, accepted, rejected) (3,) int32."""
    s = sol.stats
    return jnp.stack([s["num_steps"], s["num_accepted_steps"], s["num_rejected_steps"]]).astype(jnp.int32)


class Products(eqx.Module):
    """f's derivative products from JAX code, computed by one `sciad.ad` backend:
    `vjp(u, p, t, λ) -> (f, λᵀ∂f/∂u, λᵀ∂f/∂p)`, `jvp(u, p, t, du, dp) -> (f, ∂f/∂u du + ∂f/∂p dp)`.
    JAX engines are traced in; torch, autograd and finite differences run
    through `sciad.ad.differentiate_with` (a host callback per product).
    Built from a `VectorField` f: `f` is then f(u, p, c, t) (`open()`), `g` the same through the
    engine's rules, and `c` f's closure values, which enter the engine as a constant argument."""

    backend: ad.AbstractBackend
    f: Callable
    g: Callable
    c: jax.Array

    def __init__(self, f, backend):
        self.backend = ad.get(backend)
        self.f = f.open()
        self.g = ad.differentiate_with(self.f, self.backend)
        self.c = f.held

    def vjp(self, u, p, t, lam):
        if self.backend.traced and self.backend.higher_order:
            # Traced by JAX and differentiable again: the engine's own pullback, f evaluated once
            # (through `g`'s rules the primal and the pullback would each evaluate it).
            y, pb = self.backend.value_and_pullback(lambda u, p: self.f(u, p, self.c, t), (u, p))
        else:
            y, pb = jax.vjp(lambda u, p: self.g(u, p, self.c, t), u, p)
        return (y, *pb(lam))

    def jvp(self, u, p, t, du, dp):
        return jax.jvp(lambda u, p: self.g(u, p, self.c, t), (u, p), (du, dp))


class Active(eqx.Module):
    """Which inputs of a sensealg's forward pass are differentiated: u0 and p."""

    u0: bool = eqx.field(static=True)
    p: bool = eqx.field(static=True)


class AbstractSensitivity(eqx.Module):
    """How a solve is differentiated. Subclasses give the forward pass, the pullback and the
    pushforward (`solver_pushforward`, forward-mode AD through the solver, where they have no
    rule of their own)."""

    # the forward pass keeps a dense interpolation (memory ~ steps): a class attribute, or a property of the options
    if typing.TYPE_CHECKING:  # a static checker reads equinox's AbstractVar as a field every constructor takes
        stores_interpolation: typing.ClassVar[bool]
    else:
        stores_interpolation: eqx.AbstractVar[bool]
    # Its tangents pass through a DAE's consistent initialisation inside its forward pass (`Setup.consistent`):
    # m of them for p, where a u0 solved from p outside would be n more inputs (forward mode).
    initialises: typing.ClassVar[bool] = False
    # Its derivative follows the forward solve's own steps, whose error control sees u alone: on the
    # steps an explicit solver takes at its stability limit (a stiff problem) its error is not
    # controlled, and the forward pass refuses it (`stability_limited`).
    follows_steps: typing.ClassVar[bool] = False
    # It differentiates the loop's own steps by forward mode (every kind's: a delay equation's past included).
    through_the_steps: typing.ClassVar[bool] = False
    # It differentiates the loop's own steps by reverse mode (a kind whose field declares `steps_reversed`).
    reverses_the_steps: typing.ClassVar[bool] = False

    @abc.abstractmethod
    def forward(self, setup: Setup, u0, p, active) -> tuple[jax.Array, jax.Array, typing.Any]:
        """-> (us (T, n), stats (3,) int32, residuals for the rules). `active`: which of u0 and p
        are differentiated (`Active`), or None when nothing is."""

    @abc.abstractmethod
    def pullback(self, setup: Setup, residuals, w) -> tuple[jax.Array | None, jax.Array | None]:
        """w (T, n) cotangent of us -> (∂L/∂u0 (n,), ∂L/∂p (m,)); None where inactive."""

    @abc.abstractmethod
    def pushforward(self, setup: Setup, residuals, du0, dp) -> jax.Array:
        """Tangent of us (T, n) in direction (du0 (n,), dp (m,)) (`solver_pushforward` where the
        sensealg has no rule of its own)."""

    def pullback_batch(self, setup: Setup, residuals, axes, w, size: int):
        """The pullback of a `jax.vmap` batch of `size` members sharing p, the times and f's closure,
        whose p cotangents the batch sums: residuals with the batch first on the leaves `axes` (a
        PyTree of bools like them) says, w (size, T, n) -> (∂L/∂u0 (size, n), the batch's ∂L/∂p (m,)),
        computed for the whole batch at once; or None, and the members' pullbacks are vmapped."""
        return None

    def engines(self) -> tuple:
        """The `sciad.ad` backends this sensealg runs f's products on: its fields that hold one."""
        return tuple(
            x for x in (getattr(self, f.name) for f in dataclasses.fields(self)) if isinstance(x, ad.AbstractBackend)
        )

    def refusal(self, setup: Setup) -> str | None:
        """Why this sensealg cannot differentiate the solve of `setup`, naming what can; None where it can (the
        one place a sensealg says so, for every problem kind). Here: a host engine for a kind whose products
        must be JAX's (its field's `host_engines_refused`)."""
        steps_only = getattr(setup.f, "through_steps_only", None)  # a kind differentiated through its steps alone
        reversed_steps = self.reverses_the_steps and getattr(setup.f, "steps_reversed", False)
        if steps_only and not (self.through_the_steps or reversed_steps):
            return f"sensealg={type(self).__name__}: {steps_only}"
        why = getattr(setup.f, "host_engines_refused", None)
        host = [e.name for e in self.engines() if not e.traced]
        if why and host:
            return (
                f"sensealg={type(self).__name__}: {why}, got {host[0]!r}: pass 'jax-reverse', 'jax-forward' or "
                "'jax-transpose'"
            )
        return None

    def slow_for(self, states: int, implicit: bool) -> str | None:
        """Why this sensealg is known to be far off the fastest for `states` states and an implicit
        (or explicit) solver, or None."""
        return None

    def solve(self, setup: Setup, u0, p):
        """-> (ys (T, n + k), stats (3,) int32): the state y = (u, q) at the save times, differentiable by
        this algorithm's rules in u0 (n,), p (m,), the values f closes over, c = setup.f.held (k,)
        (held as constants, or appended to p where they are differentiated), and the times: the save
        times setup.ts (T,) (∂y(tᵢ)/∂tᵢ = y'(tᵢ): F, or a DAE's consistent derivative, `Setup.derivative`),
        t0 (∂y(tᵢ)/∂t0 = -Φ(tᵢ, t0) y'(t0)) and t1 (the save times do not move with it)."""
        m = p.shape[0]
        c, times = setup.f.held, (setup.ts, setup.t0, setup.t1)
        first = () if setup.dt0 is None else (setup.dt0,)  # the first step: an input, never differentiated
        driving = setup.f.driving()  # what drives the solve besides (an SDE's Brownian path): never differentiated
        first = (*first, *driving)
        # The rules see c, the times, the first step and the path as their own inputs only, never the caller's
        # (traced) values.
        rules_setup = setup.bare()

        def bind(c, times, merged: bool, first=()) -> Setup:
            dt0, arrays = (first[0] if setup.dt0 is not None else None), first[len(first) - len(driving) :]
            return rules_setup.bound(c, *times, merged, dt0, arrays if driving else None, setup.f)  # pyright: ignore[reportCallIssue]  # times: 3

        # The rules' outputs are all differentiable (one linear map gives their tangents): the stats
        # cross them as floats (exact up to 2^24 steps in float32) and leave as int32.
        def forward(u0, p, c, ts, t0, t1, *first, active):
            if active is None:
                ys, stats, residuals = self.forward(bind(c, (ts, t0, t1), False, first), u0, p, None)
                return (ys, _as_saves(stats, ys)), residuals
            d_u0, d_p, merged, d_ts, d_t0 = active[:5]  # one flag per input of the rules
            p_in = jnp.concatenate([p, c]) if merged else p
            bound = bind(c, (ts, t0, t1), merged, first)
            # t0's derivative is ∂L/∂u0's product with -F(y0): it needs ∂L/∂u0.
            ys, stats, residuals = self.forward(bound, u0, p_in, Active(d_u0 or d_t0, d_p or merged))
            if self.follows_steps:
                ys, stats, residuals = stability_limited(self, bound, u0, p_in, (ys, stats, residuals))
            stats = _as_saves(stats, ys)
            rates = _Rates(
                jax.vmap(lambda y, t: bound.derivative(y, p_in, t))(ys, ts) if d_ts else None,
                bound.derivative(bound.state(bound.initialised(u0, p_in)), p_in, t0) if d_t0 else None,
            )
            if any(active[6 + len(first) - len(driving) :]):
                raise ValueError(
                    "what drives this solve besides u0 and p (an SDE's Brownian path, a delay equation's dose "
                    "times) takes no derivative: hold it with jax.lax.stop_gradient"
                )
            size_u0 = jnp.max(jnp.abs(u0))
            sizes = jax.lax.stop_gradient(jnp.stack([size_u0, jnp.maximum(size_u0, jnp.max(jnp.abs(ys)))]))
            return forward_mode_only(
                ((ys, stats), _Residuals(residuals, c, (ts, t0, t1), merged, p_in, sizes, rates, first)),
                REVERSE_OVER_REVERSE,
            )

        def pushforward(res, vs):
            du0, dp, dc, dts, dt0 = vs[:5]
            n = du0.shape[0]
            if res.rates.t0 is not None:
                du0 = du0 - res.rates.t0[:n] * dt0
            dys = self.pushforward(
                bind(res.c, res.times, res.merged, res.first),
                res.inner,
                du0,
                jnp.concatenate([dp, dc]) if res.merged else dp,
            )
            if res.rates.t0 is not None:  # q(t0) = 0 moves with t0: every q(tᵢ) by -g(u0) dt0
                dys = dys.at[:, n:].add(-res.rates.t0[n:] * dt0)
            if res.rates.ts is not None:
                dys = dys + res.rates.ts * dts[:, None]
            return dys, jnp.zeros((3,), dys.dtype)

        def member(args):
            res, w = args
            return warn_if_chaotic(
                setup.rtol, res, w, *self.pullback(bind(res.c, res.times, res.merged, res.first), res.inner, w)
            )

        def batch(args, axes, size):
            (res, w), (res_axes, w_axes) = args, axes
            if any(jax.tree.leaves((res_axes.c, res_axes.times, res_axes.first, res_axes.p_in))):
                return None  # members of their own parameters, times or closure
            w = w if w_axes else jnp.broadcast_to(w, (size, *w.shape))
            bound = bind(res.c, res.times, res.merged, res.first)
            cotangents = self.pullback_batch(bound, res.inner, res_axes.inner, w, size)
            if cotangents is None:
                return None
            sizes = res.sizes if res_axes.sizes else jnp.broadcast_to(res.sizes, (size, *res.sizes.shape))
            return warn_if_chaotic(setup.rtol, eqx.tree_at(lambda r: r.sizes, res, sizes), w, *cotangents, True)  # pyright: ignore[reportCallIssue]  # the two cotangents

        def pullback(res, w):
            w = w[0]
            n = u0.shape[0]
            slots = (1, 2) if res.merged else (1,)
            g_u0, g_p = summed_in_batches(member, batch, (res, w), slots, (False, True))
            g_ts = None if res.rates.ts is None else jnp.sum(w * res.rates.ts, axis=1)
            g_t0 = None if res.rates.t0 is None else _t0_cotangent(g_u0, w, res.rates.t0, n)
            g_t1, g_first = jnp.zeros_like(res.times[2]), tuple(jnp.zeros_like(x) for x in res.first)
            if not res.merged:
                return g_u0, g_p, None, g_ts, g_t0, g_t1, *g_first
            return g_u0, g_p[:m], g_p[m:], g_ts, g_t0, g_t1, *g_first  # pyright: ignore[reportOptionalSubscript]  # merged: p differentiated

        ys, stats = ad.custom_linear_rules(forward, pushforward, pullback)(u0, p, c, *times, *first)
        return ys, stats.astype(jnp.int32)


def _as_saves(stats, ys):
    """The stats (3,) in the saves' dtype and batched with them under `jax.vmap`: a plain solve's and a
    differentiated one's outputs must batch alike, and a fixed grid's step counts depend on no batched input
    of the plain solve (an SDE's paths) where the differentiated one carries them with the saves."""
    return stats.astype(ys.dtype) + jnp.isfinite(ys[0, 0]).astype(ys.dtype) * 0


def _t0_cotangent(g_u0, w, rate0, n: int):
    """∂L/∂t0 = -(∂L/∂u0 · f(u0) + w_Q · g(u0)), w_Q (k,) the integral's cotangents summed over the saves."""
    return -(g_u0 @ rate0[:n] + jnp.sum(w[:, n:], axis=0) @ rate0[n:])


class _Rates(eqx.Module):
    """F = y' at the save times (T, n + k) and at t0 (n + k,), where their times are differentiated."""

    ts: jax.Array | None
    t0: jax.Array | None


def solver_pushforward(setup: Setup, u0, p, du0, dp):
    """Tangent of us (T, n) in direction (du0, dp) by forward-mode AD through the solver."""

    def solve(u0, p):
        sol = setup.forward(u0, p)
        return sol.ys, sol.result

    _, dus, result = jax.jvp(solve, (u0, p), (du0, dp), has_aux=True)
    return checked(setup, result, dus)


class _Residuals(eqx.Module):
    """A sensealg's residuals with the closure `c`, the `times` (ts, t0, t1), whether c was appended
    to p, the parameters the sensealg saw (`p_in`), the largest |u0| and |y| over u0 and the saved
    states (`sizes`, (2,)), the `rates` for the times' derivatives and the `first` step (() or (dt0,))."""

    inner: typing.Any
    c: jax.Array
    times: tuple
    merged: bool = eqx.field(static=True)
    p_in: jax.Array
    sizes: jax.Array
    rates: _Rates
    first: tuple = ()


CHAOTIC = (
    "the gradient is {:.1e} times as sensitive as the solution itself (relative to their sizes; "
    "more than 1/rtol): the solve is exponentially sensitive to u0 and p over this horizon (chaos, e.g. "
    "Lorenz), and the solver's own error moves the loss as much as the gradient predicts, so its size and "
    "sign depend on the tolerance. A gradient of a long-time average of a chaotic system is meaningless: "
    "shorten the horizon (fit on windows, multiple shooting) or use a shadowing method (least-squares "
    "shadowing; not yet in sciad)"
)


def warn_if_chaotic(rtol: float, res: _Residuals, w, g_u0, g_p, members: bool = False):
    """(g_u0, g_p), warning when the relative gradient, (|∂L/∂u0| |u0| or |∂L/∂p ⊙ p|, largest
    entries) over (Σ|∂L/∂u(tᵢ)|) |u| (largest entry), exceeds 1/rtol: a perturbation the size of the
    solver's error then moves the loss as much as the solution's whole size would. A stable system
    stays near 1 and an unstable linear one, whose solution grows with its sensitivity, too.
    For a batch's `members` (w (B, T, n), g_u0 (B, n), sizes (B, 2), g_p the batch's total): each
    member's ∂L/∂u0 against its own cotangent, the total ∂L/∂p against the members' together."""
    size_u0, size_u = jnp.moveaxis(res.sizes, -1, 0)
    tiny = jnp.finfo(w.dtype).tiny
    if members:
        scale = jnp.maximum(jnp.sum(jnp.abs(w), axis=(-2, -1)) * size_u, tiny)  # (B,)
        relative = [] if g_p is None else [jnp.max(jnp.abs(g_p * res.p_in), initial=0.0) / jnp.sum(scale)]
        if g_u0 is not None:
            relative.append(jnp.max(jnp.max(jnp.abs(g_u0), axis=-1, initial=0.0) * size_u0 / scale))
    else:
        scale = jnp.maximum(jnp.sum(jnp.abs(w)) * size_u, tiny)
        relative = [] if g_p is None else [jnp.max(jnp.abs(g_p * res.p_in), initial=0.0) / scale]
        if g_u0 is not None:
            relative.append(jnp.max(jnp.abs(g_u0), initial=0.0) * size_u0 / scale)
    if not relative:
        return g_u0, g_p
    amplification = jax.lax.stop_gradient(jnp.max(jnp.stack(relative)))
    return warn_if((g_u0, g_p), amplification * rtol > 1, CHAOTIC, amplification)


STABILITY_LIMITED_MESSAGE = (
    "{sensealg} carries its derivative on the steps of {solver}, an explicit solver, and those steps sat at the "
    "solver's stability limit (h ρ(∂f/∂u) ≈ {beta:.2g}): the problem is stiff for it. The step-size control keeps "
    "the solution bounded by rejecting steps, but the steps' linearisation, which carries the tangents and "
    "cotangents, multiplies the stiff modes by about 1 per step where they should decay, with no such feedback: "
    "the gradient's error is not controlled, and can be off by many orders of magnitude. {advice}"
)
STIFF_ADVICE = (
    'Pass solver="auto" or an implicit solver (solver="rodas5p" or "kvaerno5"), or keep the solver with a '
    "continuous adjoint, whose error is controlled (sensealg=sciad.GaussAdjoint())"
)


def stability_limited(sensealg: "AbstractSensitivity", setup: Setup, u0, p, outputs):
    """`outputs` (a PyTree: the forward pass's saves, stats and residuals), raising a `SolveError` when
    the program runs where the solve's accepted steps (stats (3,)) sat at its explicit solver's
    stability limit: at most `STABILITY_LIMITED` × the steps stability alone needs over the
    solve. A solver without an explicit tableau, or a solve of fewer than `STABILITY_CHECKED_STEPS`
    accepted steps (in every member of a vmap batch), passes unchecked."""
    beta = stability_boundary(setup.solver)
    if beta is None or isinstance(setup.stepsize_controller, GridSteps):  # fixed steps: none controlled
        return outputs
    ys, stats = outputs[0], outputs[1]
    n = setup.n

    def steps():
        return stability_steps(
            lambda u, t: setup.f(u, p, t)[:n], setup.t0, setup.t1, u0, setup.ts, ys[:, :n], beta, setup.rtol
        ).astype(ys.dtype)

    S = jax.lax.cond(batch_any(stats[1] >= STABILITY_CHECKED_STEPS), steps, lambda: jnp.zeros((), ys.dtype))
    pred = (S >= STABILITY_STEPS_MIN) & (stats[1] <= STABILITY_LIMITED * S)
    message = STABILITY_LIMITED_MESSAGE.format(
        sensealg=type(sensealg).__name__,
        solver=type(setup.solver).__name__,
        beta=beta,
        advice=getattr(setup.f, "stiff_advice", STIFF_ADVICE),  # a kind's own remedies
    )
    arrays, rest = eqx.partition(outputs, eqx.is_array)
    return eqx.combine(error_if(arrays, pred, message), rest)


def plain_forward(setup: Setup, u0, p) -> tuple[jax.Array, jax.Array, None]:
    """(ys, stats, no residuals) of an undifferentiated solve."""
    sol = setup.forward(u0, p)
    return typing.cast(jax.Array, sol.ys), stats_vector(sol), None
