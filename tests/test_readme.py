"""The README's Python snippets run as written, in order (XLA's optimisations off: the same
programs, compiled in half the time), with the slow tests: they compile a dozen gradients, Hessians
and an autotuning run of 30 s, each feature tested on its own in the default run. The default run
checks that they compile."""

import pathlib
import re

import matplotlib
import pytest

matplotlib.use("Agg")

README = pathlib.Path(__file__).parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_snippets_compile():
    assert SNIPPETS, "no ```python blocks found in the README"
    for i, code in enumerate(SNIPPETS):
        compile(code, f"README.md snippet {i}", "exec")


@pytest.mark.slow
def test_readme_snippets_run_in_order(capsys):
    namespace: dict = {}
    for i, code in enumerate(SNIPPETS):
        try:
            exec(compile(code, f"README.md snippet {i}", "exec"), namespace)
        except Exception as e:  # name the snippet that broke
            pytest.fail(f"README snippet {i} failed: {e!r}\n{code}")
    out = capsys.readouterr().out
    assert "jax-reverse" in out and "chosen:" in out
