"""The Python examples of README.md and docs/*.md run as written: each ```python block in its own
fresh namespace.

The blocks share one interpreter (importing torch and transformers once keeps this test fast), but
each starts from an empty namespace, from an empty working directory, so every block must carry its
own imports and data, as a reader pasting it would need.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page):
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def all_blocks():
    return [pytest.param(page, code, id=f"{page.stem}-{i}-" + _first_words(code))
            for page in PAGES for i, code in enumerate(python_blocks(page), 1)]


def _first_words(code):
    first = next((ln for ln in code.splitlines() if ln.strip() and not ln.startswith(("import", "from"))), "")
    return re.sub(r"\W+", "_", first)[:30].strip("_") or "code"


def test_readme_has_the_three_quickstarts():
    code = "\n".join(python_blocks(README))
    for call in ("fastbert.optimize(", ".encode(", "fastbert.BertTokenizer"):
        assert call in code, call


def test_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "the README is the way in: the long form goes to docs/"
    first_shell = re.search(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S).group(1)
    commands = [ln.split("#")[0].strip() for ln in first_shell.splitlines() if ln.split("#")[0].strip()]
    assert commands == ["make bench", "make test"], commands


def test_relative_links_of_readme_and_docs_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to {target} leads nowhere"


@pytest.mark.parametrize("page, code", all_blocks())
def test_example_runs(page, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page.name} example", "exec"), {"__name__": "__main__"})
