"""BacksolveAdjoint's self-check on two corpora: the calibration corpus its limits are set on
(tests/helpers/backsolve_corpus.py) and a held-out corpus of different problems it was not set on
(tests/helpers/backsolve_heldout.py). On both, every right gradient passes quietly and every wrong one is
refused, right and wrong measured against a tight reference (`backsolve_corpus.right`); a stiff
problem is refused within a few backward steps per forward step (not after max_steps). Each case
prints the signal's margin to the limit:

    limit / drift for the right ones (> 1 passes), drift / limit for the wrong ones (> 1 refused).

experiments/backsolve_calibration.py prints both corpora's margins at once.
"""

import jax
import pytest

import sciad
import sciad.adjoints._continuous as continuous
from helpers import backsolve_corpus, backsolve_heldout, slow_except

CALIBRATION = {case.name: case for case in backsolve_corpus.cases()}
HELDOUT = {case.name: case for case in backsolve_heldout.cases()}
# in the default run: a stiff refusal; held out, the kind of case (a damped long horizon whose right
# gradient was refused) and a wrong gradient refused by its drift; the rest with the slow tests (CI runs them)
FAST = ["linear, rates 1 and 20, t ≤ 5"]
FAST_HELDOUT = ["van der Pol, μ 1, t ≤ 20, rtol 1e-6"]  # the rest in the slow run (the default run's budget)


def assert_judged_right(case):
    judged = backsolve_corpus.judged(case)
    drift, limit = judged["drift"], continuous.DRIFT_TOLERANCE
    print(
        f"{case.name}: relative error {judged['error']:.2g}, drift {drift:.3g} per forward step, "
        f"margin {(drift / limit if case.wrong else limit / drift):.3g}"
    )
    assert judged["right"] != case.wrong, f"the corpus says {case.name!r} is {'wrong' if case.wrong else 'right'}"
    if case.wrong:
        assert drift > limit
        with pytest.raises(Exception, match="unstable backwards in time"):
            jax.block_until_ready(backsolve_corpus.gradient(case, sciad.BacksolveAdjoint()))
    else:
        assert drift <= limit


@pytest.mark.parametrize("name", slow_except(list(CALIBRATION), fast=FAST))
def test_backsolve_refuses_exactly_the_wrong_gradients(name):
    assert_judged_right(CALIBRATION[name])


@pytest.mark.parametrize("name", slow_except(list(HELDOUT), fast=FAST_HELDOUT))
def test_backsolve_refuses_exactly_the_wrong_gradients_held_out(name):
    assert_judged_right(HELDOUT[name])


def test_a_stiff_refusal_stops_after_a_few_backward_steps_per_forward_step():
    """Fisher–KPP (50 states, Kvaerno5): the backward solve is cut off at BACKWARD_STEPS per forward step
    (at 100 states, with max_steps as its only bound, it ran 216 s here)."""
    case = backsolve_corpus.fisher_kpp(50)
    with pytest.raises(Exception, match=f"more than {continuous.BACKWARD_STEPS} steps per forward step"):
        jax.block_until_ready(backsolve_corpus.gradient(case, sciad.BacksolveAdjoint()))
