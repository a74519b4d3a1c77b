"""The data stage: the user's files or a built-in task -> a validated, content-hashed dataset artifact, and for a
from-scratch model the tokenizer trained on it; found in the cache when its settings and source are unchanged."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import DataConfig, to_dict
from posttrain.stages.support import source_digest


@dataclass(frozen=True, kw_only=True)
class DataOutputs:
    dataset: ArtifactRef
    tokenizer: ArtifactRef | None


def data_prep(cfg: DataConfig, *, require_completions: bool, run_id: str,
              store: ArtifactStore | None = None) -> DataOutputs:
    """Build (or find in the cache) the dataset artifact and, for from-scratch models, the tokenizer.

    `require_completions` (pass `sft.enabled`): every train row must end with an assistant turn."""
    from posttrain.data.prepare import prepare_dataset, source_fingerprint
    from posttrain.envs.tasks import TASKS as ENV_TASKS
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

    store = store or ArtifactStore()
    # data.pass_rate is the selection's after SFT (stages.pass_rate): neither in data prep's key nor its record
    settings = {k: v for k, v in to_dict(cfg).items() if k != "pass_rate"}
    key = store.cache_key("data_prep", settings, source_fingerprint(cfg), require_completions,
                          source_digest("data", "models/tokenizer.py", *(("envs",) if cfg.task in ENV_TASKS else ())))
    ds_ref = store.cache_get(key + "-dataset")
    tok_ref = store.cache_get(key + "-tokenizer") if cfg.tokenizer.train else None
    if ds_ref is not None and (tok_ref is not None or not cfg.tokenizer.train):
        print(f"data_prep: cache hit -> dataset {ds_ref.short}")
        return DataOutputs(dataset=ds_ref, tokenizer=tok_ref)

    name = cfg.task or Path(cfg.files[0]).stem
    with tempfile.TemporaryDirectory(prefix="posttrain-data-") as tmp:
        ds_dir = Path(tmp) / "dataset"
        info = prepare_dataset(cfg, ds_dir, require_completions=require_completions, tasks=ENV_TASKS)
        ds_ref = store.put("dataset", name, ds_dir, run_id=run_id, parents=[], config=settings,
                           metrics={"num_train": info.num_train, "num_eval": info.num_eval,
                                    "num_duplicates": info.num_duplicates,
                                    "num_eval_in_train": info.num_eval_in_train,
                                    "num_train_dropped_for_eval": info.num_train_dropped_for_eval},
                           extra={"require_completions": require_completions, "rows_per_file": info.rows_per_file,
                                  "dropped_sample": info.dropped_sample})
        store.cache_put(key + "-dataset", ds_ref)
        if cfg.tokenizer.train:
            tok_dir = Path(tmp) / "tokenizer"
            train_tokenizer(tokenizer_training_texts(ds_dir), cfg.tokenizer.vocab_size, tok_dir,
                            split_words=cfg.tokenizer.split_words)
            tok_ref = store.put("tokenizer", f"{name}-bpe{cfg.tokenizer.vocab_size}", tok_dir, run_id=run_id,
                                parents=[ds_ref.id], config=to_dict(cfg.tokenizer))
            store.cache_put(key + "-tokenizer", tok_ref)
    overlap = ("the task's own eval problems" if info.eval_from_files and info.task else
               f"{info.num_eval_in_train} eval rows also in train" if info.eval_from_files else
               f"held out by prompt: {info.num_train_dropped_for_eval} rows with an eval prompt left out of train")
    print(f"data_prep: dataset {ds_ref.short} ({info.num_train} train / {info.num_eval} eval, {overlap})"
          + (f", tokenizer {tok_ref.short}" if tok_ref else ""))
    return DataOutputs(dataset=ds_ref, tokenizer=tok_ref)
