"""Real text for the tests: what the benchmarks read (fastbert.benchmarks.corpus, shipped with
`fastbert bench`), plus the test-only forms of it.

    import corpora as corpus                      # corpus.english_lines(), corpus.multilingual_texts()
    from corpora import pydoc_lines as english_lines
"""
from fastbert.benchmarks.corpus import (english_lines, english_paragraphs, multilingual_texts,  # noqa: F401
                                        pydoc_lines, take, total_bytes)


def english_texts(max_bytes: int | None = None) -> list[str]:
    """The pydoc paragraphs as written, newlines and indents kept (the benchmarks read them on one line):
    text whose whitespace runs and offsets the tokenizer tests check."""
    return take(list(english_paragraphs()), max_bytes)
