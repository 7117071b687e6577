"""A Hugging Face hub cache folder made by hand, as huggingface_hub lays one out: what the offline
and revision tests load from without a network."""
import shutil
from pathlib import Path


def cached_snapshot(cache: Path, repo_id: str, source: Path, names, commit: str) -> Path:
    """Copies `names` (those present) from `source` into cache's snapshot `commit` of `repo_id`, with
    refs/main pointing at it; -> the snapshot folder."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in names:
        if (Path(source) / name).exists():
            shutil.copy(Path(source) / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot
