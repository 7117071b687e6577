"""Real text for the benchmarks (`fastbert bench`, bench/); tests/corpora.py reads its text from here too.

English: the help topics that ship with CPython (``pydoc_data.topics``), split into paragraphs
(or, for the embedding benchmark, into lines).
Multilingual: the translated message catalogs (``.po`` files) shipped inside Django's wheel,
about 100 languages in many scripts (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Bengali,
Tamil, Thai, Khmer, Georgian, Armenian, CJK, ...). Only the translations (``msgstr``) are used,
grouped into paragraph-sized documents; Django and its translations are BSD-3-Clause licensed.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

# Documents are grouped to at least this many characters: paragraph-sized, like the English ones.
_MIN_DOC_CHARS = 200


def total_bytes(texts: list[str]) -> int:
    """UTF-8 size of ``texts``: the MB in MB/s."""
    return sum(len(t.encode("utf-8")) for t in texts)


def take(texts: list[str], max_bytes: int | None) -> list[str]:
    """The shortest prefix of ``texts`` holding at least ``max_bytes`` UTF-8 bytes (all if None)."""
    if max_bytes is None:
        return list(texts)
    out, size = [], 0
    for text in texts:
        if size >= max_bytes:
            break
        out.append(text)
        size += len(text.encode("utf-8"))
    return out


@functools.lru_cache(maxsize=1)
def english_paragraphs() -> tuple[str, ...]:
    """The paragraphs of CPython's pydoc topics as written (newlines and indents kept), topics in sorted order."""
    from pydoc_data.topics import topics

    return tuple(p for key in sorted(topics) for p in topics[key].split("\n\n") if p.strip())


def english_lines(max_bytes: int | None = None) -> list[str]:
    """Paragraphs of CPython's pydoc topics (about 0.46 MB in all), each on one line (whitespace runs
    become one space): the English text of the tokenizer benchmarks, and sentences for the model ones."""
    return take([" ".join(p.split()) for p in english_paragraphs()], max_bytes)


def pydoc_lines(count: int | None = None) -> list[str]:
    """The first ``count`` (all if None) non-empty lines of CPython's pydoc topics, as written (topics
    in sorted order): short inputs, the text of the embedding benchmark."""
    from pydoc_data.topics import topics

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    return lines[:count]


def _po_string(line: str, path: Path, lineno: int) -> str:
    # A .po string literal uses C escapes; as a Python literal it reads the same way.
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError) as err:
        raise ValueError(f"{path}:{lineno}: cannot read string literal {line!r}") from err


def read_po_translations(path: str | os.PathLike) -> list[str]:
    """Non-empty ``msgstr`` / ``msgstr[n]`` texts of one .po file (the header entry excluded)."""
    path = Path(path)
    out: list[str] = []
    msgid: list[str] | None = None
    current: list[str] | None = None  # the string being continued on "..." lines

    def flush():
        nonlocal current
        if current is not None and msgid is not None and "".join(msgid):
            text = "".join(current)
            if text.strip():
                out.append(text)
        current = None

    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if line.startswith("msgid "):
            flush()
            msgid = [_po_string(line[6:], path, lineno)]
            current = None
        elif line.startswith("msgid_plural ") or line.startswith("msgctxt "):
            current = None
        elif line.startswith("msgstr"):
            flush()
            current = [_po_string(line.split(" ", 1)[1], path, lineno)]
        elif line.startswith('"'):
            literal = _po_string(line, path, lineno)
            if current is not None:
                current.append(literal)
            elif msgid is not None:
                msgid.append(literal)
        elif not line or line.startswith("#"):
            flush()
    flush()
    return out


def django_locale_root() -> Path:
    try:
        import django
    except ImportError as err:
        raise ImportError("the multilingual corpus reads Django's translation catalogs: "
                          "pip install django (it is in fastbert's 'test' and 'bench' extras)") from err
    return Path(django.__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def _multilingual_documents() -> tuple[str, ...]:
    root = django_locale_root()
    by_locale: dict[str, list[str]] = {}
    for po in sorted(root.glob("**/locale/*/LC_MESSAGES/*.po")):
        locale = po.parent.parent.name
        docs = by_locale.setdefault(locale, [])
        chunk: list[str] = []
        for text in read_po_translations(po):
            chunk.append(text)
            if sum(map(len, chunk)) >= _MIN_DOC_CHARS:
                docs.append("\n".join(chunk))
                chunk = []
        if chunk:
            docs.append("\n".join(chunk))
    # Interleave the locales so that every prefix (a --quick run, a 1 MB sample) has all languages.
    queues = [by_locale[k] for k in sorted(by_locale)]
    out = []
    for i in range(max(map(len, queues))):
        out.extend(q[i] for q in queues if i < len(q))
    return tuple(out)


def multilingual_texts(max_bytes: int | None = None) -> list[str]:
    """Paragraph-sized documents of Django's translations (~100 languages), interleaved by language."""
    return take(list(_multilingual_documents()), max_bytes)
