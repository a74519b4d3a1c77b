"""bench/real_model_sweep.py's data: the three-split task and its prepared dataset in OUT (evaluated on the
validation split only), the record of the options it was made with, and the refusal of an OUT made otherwise;
and the model folder's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

from rg_task import FAMILIES, Sizes


def fingerprint(model_dir: Path) -> str:
    """sha256 over the folder's tensors (names sorted, raw bytes): equal for equal weights whatever wrote the file."""
    import hashlib

    from safetensors.torch import load_file
    h = hashlib.sha256()
    for name, t in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        h.update(name.encode() + t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def options(args) -> dict:
    """What the sweep's data is made from: recorded in OUT/prepared.json, and compared when OUT is used again."""
    task, train_task = (json.loads(t) if t is not None else None for t in (args.task, args.train_task))
    return {"family": args.family, "task": task, "train_task": train_task, "split": args.split,
            "train": args.train, "validation_n": args.validation_n, "test_n": args.test_n, "evaluated": "validation"}


FLAGS = {"family": "--family", "task": "--task", "train_task": "--train-task", "split": "--split", "train": "--train",
         "validation_n": "--validation-n", "test_n": "--test-n", "evaluated": "--out"}


def check_prepared(out: Path, wanted: dict) -> None:
    """Refuse an OUT/ds that was not prepared by this sweep with these options: one made before the three splits, or
    by bench/real_model.py, may hold the test split as its evaluation set, and a sweep must never select on it."""
    record = out / "prepared.json"
    if not record.is_file():
        raise SystemExit(f"--out {out}: {out / 'ds'} was not prepared on the validation split by this sweep (no "
                         f"{record}; made before the train / validation / test splits?): use a new --out")
    got = json.loads(record.read_text())
    differ = [FLAGS[k] for k in wanted if got.get(k) != wanted[k]]
    if differ:
        raise SystemExit(f"--out {out}: its dataset was prepared with other {', '.join(differ)} ({json.dumps(got)}): "
                         "use a new --out or the same options")


def prepare(out: Path, recipe: str, model_dir: Path, wanted: dict) -> Path:
    """out/task (train / validation / test jsonl, via bench/rg_task.py and reasoning-gym) and out/ds (the prepared
    dataset, its evaluation set the validation split), recorded in out/prepared.json."""
    import real_model
    from rg_task import build_task, install_reasoning_gym

    from posttrain.data.prepare import prepare_dataset
    from posttrain.recipes import resolve

    family = FAMILIES[wanted["family"]]
    sizes = Sizes(wanted["train"], wanted["validation_n"], wanted["test_n"])
    task = build_task(out / "task", install_reasoning_gym(), sizes, family.rewards[0], wanted["split"],
                      wanted["task"] or dict(family.task), wanted["train_task"], evaluate="validation")
    cfg = resolve(recipe, real_model.overrides(task, {"model": {"base_path": str(model_dir)}}))
    prepare_dataset(cfg.data, out / "ds", require_completions=False)
    (out / "prepared.json").write_text(json.dumps(wanted))
    return out / "ds"
