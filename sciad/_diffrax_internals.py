"""diffrax's private names sciad uses, in one place, with the diffrax versions they were tested on.

- `use_stepsize_tol` (diffrax._root_finder, no public name): the marker an implicit solver's root
  finder holds in place of rtol, atol and norm when the step-size controller provides them.
  sciad's `Stepper` (sciad.adjoints._loop: every solve sciad steps itself) steps a
  diffrax solver itself and fills them in, as `diffrax.diffeqsolve` does.
- `WrapTerm` (diffrax._term): the term `diffrax.diffeqsolve` hands its controller and solver; sciad's
  loop starts a solve on it, as diffeqsolve does (the controller's first step size differs on the bare
  term), so that its steps are diffrax's (sciad.adjoints._loop).

The stepper also drives diffrax's solver and controller interfaces directly (`init`, `step`,
`adapt_step_size`, `interpolation_cls`, `scan_kind`): public, but changed between minor
versions, so the whole range below holds for them too. pyproject.toml pins the same range.
"""

from sciad._surfaces import private_surface

PACKAGE = "diffrax"
TESTED = ("0.7.2", "0.8")  # [lowest, first untested)

with private_surface(PACKAGE, TESTED):
    from diffrax._root_finder import use_stepsize_tol
    from diffrax._term import WrapTerm
