"""Regenerate bench/results/RESULTS.md from the JSONL files beside it (the benches do this after each run).

    python bench/results_md.py [DIR]      # DIR: default bench/results/
"""
from __future__ import annotations

import argparse
from pathlib import Path

from fastbert.benchmarks import results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"{args.dir}: not a directory")
    print(results.write_markdown(args.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
