"""Presentation of a `fastbert bench` run: the rich table, the JSON file and the PNG plot.

The measurement modules return raw rows; `suite.py` turns each into a `Result` (one line of the
table). This module only renders Results and never measures anything.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
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


def notes_for(results, json_path, png_path):
    """The lines printed under the table: what the ratios mean, problems, where the files went."""
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
    lines.append(f"JSON (all rows, machine, versions): {json_path}")
    lines.append(f"Plot: {png_path}")
    lines.append(f"Markdown tables: {Path(json_path).with_suffix('.md')}")
    return lines


def write_json(path: Path, meta: dict, results, raw_rows: dict):
    payload = {"meta": meta, "results": [asdict(r) for r in results], "raw": raw_rows}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def write_plot(path: Path, results, title: str, subtitle: str):
    """fastbert's speed-up over each peer: one panel per part, one group of bars per workload,
    one colour per peer; log scale with 1x marked. Bars of a failed output check are red."""
    import matplotlib
    matplotlib.use("Agg")  # no display: the plot is only written to a file
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in results if r.speedup is not None and math.isfinite(r.speedup) and r.speedup > 0]
    sections = list(dict.fromkeys(r.section for r in rows))
    if not rows:
        fig, ax = plt.subplots(figsize=(10, 2.5))
        ax.text(0.5, 0.5, "no ratios measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        axes = [ax]
    else:
        sizes = [len({r.case for r in rows if r.section == s}) for s in sections]
        fig, axes = plt.subplots(len(sections), 1, sharex=True, squeeze=False,
                                 figsize=(12.5, 1.6 + sum(0.55 * n + 0.7 for n in sizes)),
                                 gridspec_kw={"height_ratios": [n + 1.2 for n in sizes]})
        axes = list(axes[:, 0])
        palette = ["#2e86c1", "#28b463", "#af7ac5", "#f39c12", "#7f8c8d"]
        ratios = [r.speedup for r in rows]
        for ax, section in zip(axes, sections):
            mine = [r for r in rows if r.section == section]
            cases = list(dict.fromkeys(r.case for r in mine))
            peers = list(dict.fromkeys(r.name for r in mine))
            height = 0.8 / len(peers)
            for j, peer in enumerate(peers):
                for r in (r for r in mine if r.name == peer):
                    y = cases.index(r.case) - 0.4 + height * (j + 0.5)
                    color = "#c0392b" if r.speedup_fails else palette[j % len(palette)]
                    ax.barh(y, r.speedup, height=height * 0.9, color=color,
                            label=f"vs {peer}" if r is next(x for x in mine if x.name == peer) else None)
                    ax.text(r.speedup * 1.03, y, _fmt_ratio(r.speedup) + (" FAIL" if r.speedup_fails else ""),
                            va="center", fontsize=6.5)
            ax.set_yticks(range(len(cases)))
            ax.set_yticklabels(cases, fontsize=7)
            ax.set_ylim(len(cases) - 0.5, -0.5)
            ax.axvline(1.0, color="black", linewidth=1)
            ax.set_title(section, loc="left", fontsize=9, fontweight="bold")
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
        ax = axes[-1]
        ax.set_xscale("log")
        ax.set_xlim(min(ratios + [1.0]) / 1.5, max(ratios + [1.0]) * 2.5)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("fastbert throughput / peer throughput, same workload, same run "
                      "(log scale; right of the black line = fastbert faster)", fontsize=8)
    fig.suptitle(f"{title}\n{subtitle}", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
