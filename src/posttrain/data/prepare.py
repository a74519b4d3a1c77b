"""Data prep: synthetic task or user files -> validated, de-duplicated, split structured examples.

Writes `train.jsonl`, `eval.jsonl` and `info.json` into `out_dir` (staged in a sibling temp folder and
renamed, so a failure leaves nothing half-written). Same input -> byte-identical files. Examples stay
structured (chat messages + reference answer): each model applies its own chat template when it trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.config import DataConfig
from posttrain.data import synthetic
from posttrain.data.examples import dumps, write_jsonl
from posttrain.data.loaders import iter_rows
from posttrain.data.validation import DataValidationError, Problems, to_example


@dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    task: str | None
    schema: str
    num_train: int
    num_eval: int
    num_duplicates: int
    sources: list[dict]


def source_fingerprint(cfg: DataConfig) -> str:
    """sha256 over the bytes of every source file (a saved folder is walked), or "synthetic"."""
    if cfg.task:
        return "synthetic"
    h = hashlib.sha256()
    for name in cfg.files:
        p = Path(name)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f).encode() + b"\0")
            h.update(f.read_bytes() if f.exists() else b"<missing>")
    return h.hexdigest()


def load_examples(cfg: DataConfig) -> list[dict]:
    """All validated examples, in source order; raises DataValidationError listing every problem."""
    if cfg.task:
        return synthetic.TASKS[cfg.task](cfg)
    problems, out = Problems(), []
    for where, row in iter_rows(cfg, problems):
        ex = to_example(row, where, cfg, problems)
        if ex is not None:
            out.append(ex)
    problems.raise_if_any()
    return out


def prepare_dataset(cfg: DataConfig, out_dir: str | Path) -> DatasetInfo:
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"dataset output folder {out_dir} is not empty")
    examples = load_examples(cfg)
    n_before = len(examples)
    if cfg.dedupe:
        seen, unique = set(), []
        for ex in examples:
            k = dumps({"m": ex["messages"], "a": ex["answer"]})
            if k not in seen:
                seen.add(k)
                unique.append(ex)
        examples = unique
    where = "data.files" if cfg.files else f"data.task={cfg.task}"
    if not examples:
        raise DataValidationError([f"{where}: nothing left after filtering and de-duplication"])
    if len(examples) <= cfg.eval_size:
        raise DataValidationError([f"data.eval_size: {cfg.eval_size} eval examples requested but only "
                                   f"{len(examples)} unique examples exist ({where}); lower data.eval_size"])
    order = list(range(len(examples)))
    random.Random(f"split-{cfg.seed}").shuffle(order)
    eval_ex = [examples[i] for i in sorted(order[: cfg.eval_size])]
    train_ex = [examples[i] for i in order[cfg.eval_size:]]
    sources = [{"path": str(f), "sha256": source_fingerprint(DataConfig(task="", files=[f]))} for f in cfg.files]
    info = DatasetInfo(task=cfg.task or None, schema=cfg.schema.value, num_train=len(train_ex),
                       num_eval=len(eval_ex), num_duplicates=n_before - len(examples), sources=sources)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir.parent))
    try:
        write_jsonl(stage / "train.jsonl", train_ex)
        write_jsonl(stage / "eval.jsonl", eval_ex)
        (stage / "info.json").write_text(json.dumps(asdict(info), indent=2, sort_keys=True) + "\n")
        if out_dir.exists():
            out_dir.rmdir()
        os.rename(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return info
