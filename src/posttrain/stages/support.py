"""What every stage shares: the code version of a stage's cache key, closing a stage's wandb run on error, the
token budget check, and dropping a finished stage's state."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.artifacts.state import StateDir
from posttrain.config import RLConfig, SFTConfig, to_dict
from posttrain.tracking.wandb_run import WandbRun

if TYPE_CHECKING:
    from posttrain.data.lengths import LengthReport

_SRC = Path(__file__).resolve().parents[1]  # src/posttrain


def source_digest(*relpaths: str) -> str:
    """sha256 of the library source files (or folders) that implement a stage: its code version."""
    h = hashlib.sha256()
    for rel in relpaths:
        p = _SRC / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(_SRC)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@contextmanager
def finished_on_error(run: WandbRun | None) -> Iterator[None]:
    """Close a stage's wandb run as failed when the stage raises (a finished run is left alone)."""
    try:
        yield
    except BaseException:
        if run is not None:
            run.finish(failed=True)
        raise


def without_keep_state(cfg: SFTConfig | RLConfig) -> dict:
    """A stage's config part for its cache key: keep_state only decides what happens after success, so a
    failed run re-run with it switched on still finds (and resumes from) its state folder."""
    return {k: v for k, v in to_dict(cfg).items() if k != "keep_state"}


def check_budget(dataset_dir: Path, tokenizer_dir: Path, *, max_seq_len: int, max_new_tokens: int, sft: bool,
                  setting: str) -> LengthReport:
    """Refuse (ConfigError naming the rows and the setting) a token budget some rows cannot fit, measured with
    the tokenizer the stage trains with: the start model's own, or the trained one for a from-scratch model;
    return the measurements."""
    from posttrain.data.lengths import check_budget
    from posttrain.models.io import load_tokenizer

    kwargs = {} if sft else {"splits": ("train",), "new_tokens_setting": setting}
    return check_budget(dataset_dir, load_tokenizer(tokenizer_dir), max_seq_len=max_seq_len,
                        max_new_tokens=max_new_tokens, sft=sft, **kwargs)


def drop_state(state: StateDir) -> None:
    """Delete a finished stage's resumable state (checkpoints, optimizer, step log): once the final model is
    stored, the state only costs disk."""
    state.drop()
    print(f"state: deleted {state} (set keep_state in the stage's section, e.g. sft.keep_state, to keep it)")
