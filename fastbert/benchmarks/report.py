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
    return f"{ratio:.2f}x"


def render_table(results, title):
    """A rich Table: one line per Result, grouped by section."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", pad_edge=False)
    table.add_column("Part", style="bold")
    table.add_column("Implementation")
    table.add_column("Workload")
    table.add_column("Throughput", justify="right")
    table.add_column("fastbert x", justify="right")
    table.add_column("Output", justify="center")
    last_section = None
    for r in results:
        if last_section is not None and r.section != last_section:
            table.add_section()
        section = r.section if r.section != last_section else ""
        last_section = r.section
        name = f"[bold cyan]{r.name}[/]" if r.fastbert else r.name
        if r.value is not None:
            value = _fmt_value(r.value, r.unit)
        else:
            value = f"[dim]{r.note}[/]"
        if r.speedup is None:
            speedup = ""
        elif r.speedup_fails:
            speedup = f"[red]{_fmt_ratio(r.speedup)} FAIL[/]"
        else:
            color = "green" if r.speedup >= 1.0 else "yellow"
            speedup = f"[{color}]{_fmt_ratio(r.speedup)}[/]"
        check = {OK: "[green]ok[/]", FAIL: "[bold red]FAIL[/]",
                 ERROR: "[bold red]ERROR[/]"}.get(r.check, "[dim]n/a[/]")
        table.add_row(section, name, r.case, value, speedup, check)
    return table


def notes_for(results, json_path, png_path):
    """The lines printed under the table: what the ratios mean, problems, where the files went."""
    lines = [
        "fastbert x = fastbert's throughput / that row's throughput, same workload, same run",
        "  (2.00x = fastbert does twice the work per second; green >= 1x, yellow < 1x).",
        "Output = checked against Hugging Face in this run: tokenizers must give identical ids,",
        "  models and embeddings must agree within tolerance; a speed-up with a FAIL does not count.",
    ]
    for r in results:
        if r.note and r.failed:
            lines.append(f"  {r.check}: {r.section} / {r.name} / {r.case}: {r.note}")
    lines.append(f"JSON (all rows, machine, versions): {json_path}")
    lines.append(f"Plot: {png_path}")
    return lines


def write_json(path: Path, meta: dict, results, raw_rows: dict):
    payload = {"meta": meta, "results": [asdict(r) for r in results], "raw": raw_rows}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def write_plot(path: Path, results, title: str, subtitle: str):
    """Horizontal bars of fastbert's speed-up over each peer (log scale, 1.0x marked)."""
    import matplotlib
    matplotlib.use("Agg")  # no display: the plot is only written to a file
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.speedup is not None and math.isfinite(r.speedup) and r.speedup > 0]
    height = max(2.5, 0.42 * len(rows) + 1.8)
    fig, ax = plt.subplots(figsize=(10, height))
    if rows:
        labels = [f"{r.section}: vs {r.name}\n{r.case}" for r in rows]
        ratios = [r.speedup for r in rows]
        colors = ["#c0392b" if r.speedup_fails else ("#2e86c1" if r.speedup >= 1 else "#a0a0a0")
                  for r in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, ratios, color=colors)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=1)
        lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
        ax.set_xlim(lo / 1.5, hi * 2.0)
        for yi, r in zip(y, rows):
            label = f"{r.speedup:.2f}x" + ("  FAIL" if r.speedup_fails else "")
            ax.text(r.speedup * 1.04, yi, label, va="center", fontsize=7)
        ax.set_xlabel("fastbert throughput / peer throughput (log scale; right of the line = fastbert faster)")
    else:
        ax.text(0.5, 0.5, "no ratios measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title(f"{title}\n{subtitle}", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
