"""`sciad.ensemble` across processes: two JAX processes on loopback (`jax.distributed`, gloo
collectives, 2 simulated CPU devices each; `tests/programs/multihost_worker.py`) compute sharded gradients
over the 4-device mesh of both; they must equal the one-process, unsharded ensemble's."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from programs.multihost_worker import gradients

import sciad

WORKER = Path(__file__).parent / "programs" / "multihost_worker.py"
CASES = ["padded-auto", "InterpolatingAdjoint", "DiscreteAdjoint", "BacksolveAdjoint"]  # see the worker
TIMEOUT = 300  # seconds for both workers: a hung collective fails the test


def free_port() -> int:
    """A loopback port nobody listens on now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def workers(tmp_path: Path, cases: list[str]):
    """The two processes of the cluster, output to `tmp_path`/log-0 and log-1; killed on leaving if alive."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
    port = free_port()
    procs = []
    try:
        for i in range(2):
            with open(tmp_path / f"log-{i}", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), str(port), str(i), str(tmp_path), *cases],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def wait(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """The exit statuses, None for a process still running when one failed or time ran out."""
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        if any(proc.returncode for proc in procs):
            break
        time.sleep(0.2)
    return [proc.poll() for proc in procs]


@pytest.mark.slow
def test_two_process_sharded_gradients_equal_one_process(tmp_path):
    ps = sciad.problems.lotka_volterra().problem.p * np.linspace(0.9, 1.1, 8)[:, None]  # 8 members, 2 a device
    np.save(tmp_path / "ps.npy", ps)
    with workers(tmp_path, CASES) as procs:
        reference = {
            case: np.asarray(gradients(ps[:-2] if case.startswith("padded-") else ps, case.removeprefix("padded-")))
            for case in CASES
        }  # one process, while the workers run
        statuses = wait(procs, TIMEOUT)
    logs = "\n".join(
        f"--- worker {i} (exit status {s}):\n{(tmp_path / f'log-{i}').read_text()[-4000:]}"
        for i, s in enumerate(statuses)
    )
    if 3 in statuses:
        reason = [line for line in logs.splitlines() if line.startswith("collectives unavailable")]
        pytest.skip(f"two-process JAX on loopback: {reason[0] if reason else logs[-500:]}")
    assert statuses == [0, 0], f"workers failed or hung (None: killed after {TIMEOUT} s or the other failed):\n{logs}"
    for case, want in reference.items():
        for i in range(2):
            got = np.load(tmp_path / f"{case}-{i}.npy")
            assert got.shape == want.shape, case
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"{case}, process {i}")
        assert np.all(np.isfinite(want)) and np.all(want != 0), case
