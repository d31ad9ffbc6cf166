"""The Python snippets of the README and of the documentation pages (docs/) run as written, page by page, each
page's in order in one namespace (XLA's optimisations off: the same programs, compiled in half the time), with
the slow tests: they compile a few dozen gradients, Hessians and an autotuning run of 30 s, each feature tested
on its own in the default run. The default run checks that they compile.

The docs build (`mkdocs build --strict`) runs the short snippets too (those marked ```python exec="on"```) and
fails on one that raises; the longer ones (a plain ```python fence) run only here. A ```py fence is shown and
never run (a multi-host set-up, a setting with effects beyond the example)."""

import pathlib
import re
import textwrap

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = pathlib.Path(__file__).parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# A ```python fence, with an info string (markdown-exec's exec="on" ...) or none, at any indentation (inside an
# admonition); its closing fence at the same indentation.
FENCE = re.compile(r"^([ \t]*)```python(?:[ \t][^\n]*)?\n(.*?)^\1```[ \t]*$", flags=re.S | re.M)
# What a page's snippets must print: proof that the loop over engines and the autotuner ran.
PRINTS = {
    "README.md": ["chosen:"],
    "docs/how-to/ad-engines.md": ["jax-reverse", "torch"],
    "docs/how-to/choose-sensealg.md": ["chosen:", "autotuned"],
}


def snippets(page: pathlib.Path) -> list[str]:
    return [textwrap.dedent(code) for _, code in FENCE.findall(page.read_text())]


def name(page: pathlib.Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_snippets_compile():
    assert snippets(README), "no ```python blocks found in the README"
    assert sum(len(snippets(page)) for page in PAGES[1:]) >= 30, "the docs pages lost their examples"
    for page in PAGES:
        for i, code in enumerate(snippets(page)):
            compile(code, f"{name(page)} snippet {i}", "exec")


def test_prints_name_pages():
    assert set(PRINTS) <= {name(page) for page in PAGES}


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if snippets(page)], ids=name)
def test_snippets_run_in_order(page, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the benchmarks page reads paper/tables/
    namespace: dict = {}
    for i, code in enumerate(snippets(page)):
        try:
            exec(compile(code, f"{name(page)} snippet {i}", "exec"), namespace)
        except Exception as e:  # name the snippet that broke
            pytest.fail(f"{name(page)} snippet {i} failed: {e!r}\n{code}")
    out = capsys.readouterr().out
    for expected in PRINTS.get(name(page), []):
        assert expected in out, f"{name(page)}'s snippets did not print {expected!r}"
