"""Presentation of a `fastbert bench` run: the rich table and its Markdown twin (RESULTS.md).

The measurement modules return raw rows; `suite.py` turns each into a `Result` (one line of the
table). This module only renders Results and never measures anything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# Output-check verdicts. FAIL (outputs differ from HF's) and ERROR (a fastbert measurement crashed)
# make `fastbert bench` exit non-zero; speed never does.
OK, FAIL, ERROR, SKIPPED = "ok", "FAIL", "ERROR", "n/a"


@dataclass
class Result:
    section: str                 # "Tokenizer", "Model forward", "Embeddings", ...
    name: str                    # what ran, e.g. "fastbert.BertTokenizer" or a peer
    case: str                    # the workload, e.g. "English, padded 128, 1 thread"
    value: float | None = None   # throughput, higher is better
    unit: str = ""               # "MB/s", "tokens/s", "lines/s"
    fastbert: bool = False       # True for fastbert's own rows
    speedup: float | None = None  # on a peer row: fastbert's value / this row's value (same case)
    check: str = SKIPPED         # OK | FAIL | ERROR | SKIPPED: this row's outputs vs HF's
    note: str = ""               # why a row has no figure, or what the check measured
    speedup_fails: bool = False  # fastbert's own row for this case failed its output check
    detail: str = ""             # the measured agreement, e.g. "min cosine 0.999999"

    @property
    def failed(self) -> bool:
        return self.check in (FAIL, ERROR)


def _fmt_value(value, unit):
    if value is None or not math.isfinite(value):
        return "—"
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _fmt_ratio(ratio):
    if ratio is None or not math.isfinite(ratio):
        return "—"
    return f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def _cell(value, unit, show_unit):
    return _fmt_value(value, unit if show_unit else "")


def render_tables(results):
    """One rich Table per section: a line per workload, fastbert first, then each peer's
    throughput with fastbert's speed-up over it in brackets."""
    from rich.markup import escape
    from rich.table import Table

    tables = []
    sections = list(dict.fromkeys(r.section for r in results))
    for section in sections:
        rows = [r for r in results if r.section == section]
        units = {r.unit for r in rows if r.value is not None}
        show_unit = len(units) != 1
        unit_title = "" if show_unit else f" ({units.pop()}, higher is better)"
        peers = list(dict.fromkeys(r.name for r in rows if not r.fastbert))
        fast_names = list(dict.fromkeys(r.name for r in rows if r.fastbert))
        table = Table(title=f"{section}{unit_title}", title_justify="left", title_style="bold",
                      pad_edge=False)
        table.add_column("Workload")
        fast_title = fast_names[0] if len(fast_names) == 1 else "fastbert"
        table.add_column(fast_title, justify="right", style="bold cyan")
        for peer in peers:
            table.add_column(peer, justify="right")
        table.add_column("Output vs HF")
        for case in dict.fromkeys(r.case for r in rows):
            in_case = [r for r in rows if r.case == case]
            fast = next((r for r in in_case if r.fastbert), None)
            if fast is not None and fast.value is not None:
                cells = [_cell(fast.value, fast.unit, show_unit)]
            else:
                short = (fast.note.split(":")[0] if fast is not None and fast.note else "not measured")
                cells = [f"[dim]{short}[/]"]
            for peer in peers:
                r = next((r for r in in_case if r.name == peer), None)
                if r is None or r.value is None:
                    cells.append("[dim]—[/]")
                    continue
                text = _cell(r.value, r.unit, show_unit)
                if r.speedup is not None:
                    color = "red" if r.speedup_fails else "green" if r.speedup >= 1 else "yellow"
                    text += f" [{color}]({_fmt_ratio(r.speedup)})[/]"
                if r.check in (FAIL, ERROR):
                    text += " [red]wrong[/]"
                cells.append(text)
            check = fast.check if fast is not None else SKIPPED
            verdict = {OK: "[green]ok[/]", FAIL: "[bold red]FAIL[/]",
                       ERROR: "[bold red]ERROR[/]"}.get(check, "[dim]n/a[/]")
            if fast is not None and fast.detail:
                verdict += f" [dim]{fast.detail}[/]"
            table.add_row(case, *cells, verdict)
        notes = list(dict.fromkeys(f"{r.name}: {r.note}" for r in rows
                                   if r.note and (r.value is None or not r.fastbert)))
        if notes:
            table.caption = escape("\n".join(notes))
            table.caption_justify = "left"
        tables.append(table)
    return tables


def to_markdown(results) -> str:
    """The same tables as render_tables, in Markdown (for a README or an issue)."""
    out = []
    for section in dict.fromkeys(r.section for r in results):
        rows = [r for r in results if r.section == section]
        units = {r.unit for r in rows if r.value is not None}
        show_unit = len(units) != 1
        peers = list(dict.fromkeys(r.name for r in rows if not r.fastbert))
        fast_names = list(dict.fromkeys(r.name for r in rows if r.fastbert))
        unit = "" if show_unit else f" ({next(iter(units))})"
        out.append(f"**{section}**{unit}, higher is better; (x) = fastbert's speed-up over that peer\n")
        head = ["Workload", (fast_names[0] if len(fast_names) == 1 else "fastbert")] + peers + ["Output vs HF"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + "|")
        for case in dict.fromkeys(r.case for r in rows):
            in_case = [r for r in rows if r.case == case]
            fast = next((r for r in in_case if r.fastbert), None)
            cells = [case, f"**{_cell(fast.value, fast.unit, show_unit)}**"
                     if fast is not None and fast.value is not None else (fast.note if fast else "—")]
            for peer in peers:
                r = next((r for r in in_case if r.name == peer), None)
                if r is None or r.value is None:
                    cells.append("—")
                    continue
                text = _cell(r.value, r.unit, show_unit)
                if r.speedup is not None:
                    text += f" ({_fmt_ratio(r.speedup)}{' FAIL' if r.speedup_fails else ''})"
                cells.append(text)
            check = fast.check if fast is not None else SKIPPED
            cells.append(f"{check} {fast.detail}".strip() if fast is not None else check)
            out.append("| " + " | ".join(cells) + " |")
        notes = list(dict.fromkeys(f"{r.name}: {r.note}" for r in rows
                                   if r.note and (r.value is None or not r.fastbert)))
        out.extend(["", *[f"{n}  " for n in notes]] if notes else [])
        out.append("")
    return "\n".join(out)


def notes_for(results, path):
    """The lines printed under the table: what the ratios mean, problems, where the run went."""
    lines = [
        "(2.00x) after a peer's figure = fastbert's throughput / that peer's, same workload, same run:",
        "  fastbert does twice the work per second (green >= 1x, yellow < 1x).",
        "Output = fastbert's result checked against Hugging Face's in this run: tokenizers must give",
        "  identical ids, models and embeddings must agree within tolerance. A FAIL voids the speed-up;",
        "  a peer marked 'wrong' gave different output from Hugging Face.",
    ]
    problems = {}
    for r in results:
        if r.note and r.failed:
            problems.setdefault((r.check, r.section, r.name, r.note), []).append(r.case)
    for (check, section, name, note), cases in problems.items():
        where = cases[0] if len(cases) == 1 else f"{len(cases)} workloads"
        lines.append(f"  {check}: {section} / {name} ({where}): {note}")
    lines.append(f"Appended to {path} (every row, machine, versions); tables in {Path(path).parent / 'RESULTS.md'}")
    return lines

