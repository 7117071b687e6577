"""The README's Python examples run as written: each ```python block in its own fresh namespace.

The blocks share one interpreter (importing torch and transformers once keeps this test fast), but
each starts from an empty namespace, from an empty working directory, so every block must carry its
own imports and data, as a reader pasting it would need.
"""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks():
    blocks = BLOCK.findall(README.read_text(encoding="utf-8"))
    return [pytest.param(code, id=f"block{i}-" + _first_words(code)) for i, code in enumerate(blocks, 1)]


def _first_words(code):
    first = next((ln for ln in code.splitlines() if ln.strip() and not ln.startswith("import")), "")
    return re.sub(r"\W+", "_", first)[:30].strip("_") or "code"


def test_readme_has_examples():
    assert len(python_blocks()) >= 5, "the README should show every swap-in path as a runnable example"


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first_shell = re.search(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S).group(1)
    commands = [ln.split("#")[0].strip() for ln in first_shell.splitlines() if ln.split("#")[0].strip()]
    assert commands == ["make bench", "make test"], commands


@pytest.mark.parametrize("code", python_blocks())
def test_readme_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{README.name} example", "exec"), {"__name__": "__main__"})
