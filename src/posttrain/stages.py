"""Pipeline stages with artifact bookkeeping: resolve input handles, skip work on a cache hit, run the
library function, store the output with its manifest, return a handle.

The Flyte tasks in `tasks/` are one-line wrappers around these functions, so every stage can also be run
and tested without Flyte. A stage's cache key is made of its config part, the content ids (or source
bytes) of its inputs, and a digest of the library source that implements it - so an edited source file or
a changed setting is noticed, while an RL setting never invalidates data prep or SFT.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.artifacts.state import StateDir
from posttrain.config import (
    ConfigError,
    DataConfig,
    DistillConfig,
    DPOConfig,
    EvalConfig,
    ModelConfig,
    Objective,
    PlacementConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    TrackingConfig,
    objective_of,
    to_dict,
)
from posttrain.model_refs import model_ref, start_model
from posttrain.wandb_run import WandbRun

_SRC = Path(__file__).resolve().parent


def source_digest(*relpaths: str) -> str:
    """sha256 of the library source files (or folders) that implement a stage: its code version."""
    h = hashlib.sha256()
    for rel in relpaths:
        p = _SRC / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(_SRC)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class DataOutputs:
    dataset: ArtifactRef
    tokenizer: ArtifactRef | None


def data_prep(cfg: DataConfig, *, require_completions: bool, run_id: str,
              store: ArtifactStore | None = None) -> DataOutputs:
    """Build (or find in the cache) the dataset artifact and, for from-scratch models, the tokenizer.

    `require_completions` (pass `sft.enabled`): every train row must end with an assistant turn."""
    from posttrain.data.prepare import prepare_dataset, source_fingerprint
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

    store = store or ArtifactStore()
    key = store.cache_key("data_prep", to_dict(cfg), source_fingerprint(cfg), require_completions,
                          source_digest("data", "models/tokenizer.py"))
    ds_ref = store.cache_get(key + "-dataset")
    tok_ref = store.cache_get(key + "-tokenizer") if cfg.tokenizer.train else None
    if ds_ref is not None and (tok_ref is not None or not cfg.tokenizer.train):
        print(f"data_prep: cache hit -> dataset {ds_ref.short}")
        return DataOutputs(dataset=ds_ref, tokenizer=tok_ref)

    name = cfg.task or Path(cfg.files[0]).stem
    with tempfile.TemporaryDirectory(prefix="posttrain-data-") as tmp:
        ds_dir = Path(tmp) / "dataset"
        info = prepare_dataset(cfg, ds_dir, require_completions=require_completions)
        ds_ref = store.put("dataset", name, ds_dir, run_id=run_id, parents=[], config=to_dict(cfg),
                           metrics={"num_train": info.num_train, "num_eval": info.num_eval,
                                    "num_duplicates": info.num_duplicates,
                                    "num_eval_in_train": info.num_eval_in_train,
                                    "num_train_dropped_for_eval": info.num_train_dropped_for_eval},
                           extra={"require_completions": require_completions, "rows_per_file": info.rows_per_file,
                                  "dropped_sample": info.dropped_sample})
        store.cache_put(key + "-dataset", ds_ref)
        if cfg.tokenizer.train:
            tok_dir = Path(tmp) / "tokenizer"
            train_tokenizer(tokenizer_training_texts(ds_dir), cfg.tokenizer.vocab_size, tok_dir)
            tok_ref = store.put("tokenizer", f"{name}-bpe{cfg.tokenizer.vocab_size}", tok_dir, run_id=run_id,
                                parents=[ds_ref.id], config=to_dict(cfg.tokenizer))
            store.cache_put(key + "-tokenizer", tok_ref)
    overlap = (f"{info.num_eval_in_train} eval rows also in train" if info.eval_from_files else
               f"held out by prompt: {info.num_train_dropped_for_eval} rows with an eval prompt left out of train")
    print(f"data_prep: dataset {ds_ref.short} ({info.num_train} train / {info.num_eval} eval, {overlap})"
          + (f", tokenizer {tok_ref.short}" if tok_ref else ""))
    return DataOutputs(dataset=ds_ref, tokenizer=tok_ref)


def sft_cache_key(store: ArtifactStore, model: ModelConfig, sft: SFTConfig, dataset: ArtifactRef,
                  tokenizer: ArtifactRef | None, start: ArtifactRef | None, frozen: ArtifactRef | None = None) -> str:
    # The start model counts by its content id, not by where the user's folder lies; so do the frozen model and
    # the start model for the settings that name them (dpo.reference, distill.teacher).
    model_part = {**to_dict(model), "base_path": "", "artifact": ""}
    objective = objective_of(sft)
    cfg = _without_keep_state(sft)
    for named in ("reference", "teacher"):
        cfg.pop(named, None)
    parts = (model_part, cfg, dataset.id, tokenizer.id if tokenizer else None, start.id if start else None)
    if objective == Objective.SFT:  # SFT's key as it always was: its cached models stay valid
        return store.cache_key("sft", *parts, source_digest("sft", "models", "data/chat.py"))
    return store.cache_key(objective.value, *parts, frozen.id if frozen else None,
                           source_digest("sft", "models", "data/chat.py"))


def sft(model: ModelConfig, sft_cfg: SFTConfig, tracking: TrackingConfig, *, dataset: ArtifactRef,
        tokenizer: ArtifactRef | None, run_id: str, start: ArtifactRef | None = None,
        store: ArtifactStore | None = None) -> ArtifactRef | None:
    """Run on every rank of the SPMD group. Rank 0 stores the checkpoint and returns its handle.

    `start` is the model to fine-tune (from `start_model`; resolved here from `model` when not given, None
    for a from-scratch model). Its weights are loaded from the artifact's folder, so what lineage records is
    what was trained. With `sft.enabled` false, `start` is returned as it is, untrained."""
    return train(model, sft_cfg, tracking, dataset=dataset, tokenizer=tokenizer, run_id=run_id, start=start,
                 store=store)


def train(model: ModelConfig, cfg: SFTConfig, tracking: TrackingConfig, *, dataset: ArtifactRef,
          tokenizer: ArtifactRef | None, run_id: str, start: ArtifactRef | None = None,
          frozen: ArtifactRef | None = None, store: ArtifactStore | None = None) -> ArtifactRef | None:
    """Any dense objective - SFT, DPO, reward model, distillation: `cfg`'s class decides (posttrain.sft.objectives)
    - on every rank of the SPMD group; rank 0 stores the result and returns its handle (a `reward_model` artifact
    for a reward model, a `model` otherwise), whose parents are the dataset, the tokenizer, the start model and
    the frozen model (DPO's reference, the teacher).

    `frozen`: the DPO reference (default: `start`) or the distillation teacher (resolved from distill.teacher
    when not given). A distilled student without a start model is built fresh with the TEACHER's tokenizer
    (`tokenizer` is then not used); every frozen model must share the trained model's tokenizer (checked first)."""
    store = store or ArtifactStore()
    objective = objective_of(cfg)
    stage = objective.value
    rank = int(os.environ.get("RANK", "0"))
    if start is None and (model.base_path or model.artifact):
        start = start_model(model, run_id=run_id, store=store)  # same content -> same id on every rank
    if not cfg.enabled:
        if start is None:
            raise ConfigError(f"{stage}.enabled: false needs a model to start from: set model.base_path or "
                              "model.artifact")
        if rank == 0:
            print(f"{stage}: disabled ({stage}.enabled=false): passing model {start.short} through untrained")
        return start if rank == 0 else None
    frozen = frozen_model(cfg, start, frozen, run_id, store)
    if objective == Objective.DISTILL:
        tokenizer = None  # the student speaks the teacher's tokens
    key = sft_cache_key(store, model, cfg, dataset, tokenizer, start, frozen)
    hit = store.cache_get(key)
    if hit is not None:  # every rank sees the same hit, so no rank waits on a collective
        if rank == 0:
            print(f"{stage}: cache hit -> {hit.kind} {hit.short}")
        return hit if rank == 0 else None

    return _train_fresh(model, cfg, tracking, key=key, dataset=dataset, tokenizer=tokenizer, start=start,
                        frozen=frozen, run_id=run_id, store=store)


def _train_fresh(model: ModelConfig, cfg: SFTConfig, tracking: TrackingConfig, *, key: str, dataset: ArtifactRef,
                 tokenizer: ArtifactRef | None, start: ArtifactRef | None, frozen: ArtifactRef | None, run_id: str,
                 store: ArtifactStore) -> ArtifactRef | None:
    """`train` past its cache: check what can be checked before any work, train (resuming the state the key
    names), store and cache the result on rank 0, then drop the state."""
    from posttrain.models.io import check_same_tokenizer
    from posttrain.sft import run_sft

    objective = objective_of(cfg)
    stage, rank = objective.value, int(os.environ.get("RANK", "0"))
    ds_dir, base_dir = store.get(dataset), store.get(start) if start else None
    frozen_dir = store.get(frozen) if frozen else None
    tok_dir = frozen_dir if objective == Objective.DISTILL else (store.get(tokenizer) if tokenizer else None)
    if frozen is not None and base_dir is not None:  # one vocabulary, or the token-level math is meaningless
        check_same_tokenizer(base_dir, frozen_dir, names=(f"the start model {start.short}",
                                                         f"{_frozen_setting(objective)} {frozen.short}"))
    # Every rank measures (cheap), so that all of them stop on a budget that cannot fit.
    _check_budget(ds_dir, base_dir or tok_dir, max_seq_len=model.max_seq_len, max_new_tokens=0, sft=True,
                  setting="")
    state = StateDir.under_store(store.root, stage, key)  # stable across retries and nodes: a killed run resumes
    if rank == 0:
        print(f"{stage}: state in {state}", flush=True)
    inputs = {"dataset": dataset.id, "tokenizer": tokenizer.id if tokenizer else None,
              "start_model": start.id if start else None}
    if frozen is not None:
        inputs[_frozen_setting(objective).split(".")[-1]] = frozen.id
    wandb_run = WandbRun.for_stage(tracking, stage=stage, run_id=run_id, store=store,
                                   settings={"model": model, stage: cfg}, inputs=inputs) if rank == 0 else None
    with _finished_on_error(wandb_run), tempfile.TemporaryDirectory(prefix=f"posttrain-{stage}-") as tmp:
        out_dir = Path(tmp) / "model"
        metrics = run_sft(model_cfg=model, sft_cfg=cfg, tracking_cfg=tracking, dataset_dir=ds_dir,
                          tokenizer_dir=tok_dir, base_model_dir=base_dir, out_dir=out_dir,
                          state_dir=state, run_name=f"{stage}-{run_id}", wandb_run=wandb_run,
                          frozen_model_dir=frozen_dir)
        history = metrics.pop("history")  # per-step numbers: the manifest's extra, which the id does not cover
        if rank != 0:
            return None
        kind = "reward_model" if objective == Objective.REWARD_MODEL else "model"
        parents = ([dataset.id] + ([tokenizer.id] if tokenizer else []) + ([start.id] if start else [])
                   + ([frozen.id] if frozen and frozen != start else []))
        ref = store.put(kind, f"{stage}-{dataset.name}", out_dir, run_id=run_id, parents=parents,
                        config={"model": to_dict(model), stage: to_dict(cfg)}, metrics=metrics,
                        extra={"start_model": start.id if start else None, "stage": stage, "history": history,
                               **({"frozen_model": frozen.id} if frozen else {})},
                        world_size=int(os.environ.get("WORLD_SIZE", "1")))
        if wandb_run is not None:
            wandb_run.finish(outputs={kind: ref.id})
    store.cache_put(key, ref)
    if not cfg.keep_state:  # only after the model is stored: a failed run keeps its state and resumes
        _drop_state(state)
    print(f"{stage}: {kind} {ref.short} (final loss {metrics.get('loss', float('nan')):.4f})")
    return ref


def _frozen_setting(objective: Objective) -> str:
    return {Objective.DPO: "dpo.reference", Objective.DISTILL: "distill.teacher"}[objective]


def frozen_model(cfg: SFTConfig, start: ArtifactRef | None, given: ArtifactRef | None, run_id: str,
                  store: ArtifactStore) -> ArtifactRef | None:
    """The objective's frozen model: DPO's reference (dpo.reference, else the start model), the distillation
    teacher (distill.teacher, required); None for SFT and reward models."""
    if given is not None:
        return given
    if isinstance(cfg, DPOConfig):
        if cfg.reference:
            return model_ref(cfg.reference, "dpo.reference", run_id=run_id, store=store)
        if start is None:
            raise ConfigError("dpo.reference: DPO needs a reference model: give dpo.reference, or start DPO from a "
                              "model (model.base_path / model.artifact, or after SFT)")
        return start
    if isinstance(cfg, DistillConfig):
        if not cfg.teacher:
            raise ConfigError("distill.teacher: distillation needs a teacher: a model artifact id, a local HF "
                              "folder or channel:NAME")
        return model_ref(cfg.teacher, "distill.teacher", run_id=run_id, store=store)
    return None


@dataclass(frozen=True, kw_only=True)
class EvalOutputs:
    report: ArtifactRef
    greedy_accuracy: float
    sampled_accuracy: float | None
    """None when eval.k == 0 (greedy only)."""
    pass_at_k: float | None
    """None when eval.k == 0 (greedy only)."""
    reward_failures: int = 0
    """Reward calls that failed (counted as incorrect); the report holds example reasons."""


def evaluate(cfg: EvalConfig, reward: RewardConfig, *, model: ArtifactRef, dataset: ArtifactRef, run_id: str,
             store: ArtifactStore | None = None, tracking: TrackingConfig | None = None) -> EvalOutputs:
    """Score the model on the dataset's held-out split and store an `eval` artifact (parent: the model).
    The manifest's metrics hold sampled_accuracy and pass_at_k only when eval.k > 0. With `tracking` (and
    tracking.wandb), a new evaluation is also a wandb run with its numbers and a per-problem table."""
    from posttrain.eval import evaluate as run_eval

    store = store or ArtifactStore()
    reward = reward.function_only()  # evaluation scores with the function or verifier alone
    key = store.cache_key("eval", to_dict(cfg), to_dict(reward), model.id, dataset.id,
                          source_digest("eval", "models", "rewards.py", "data/verifiers.py", "data/examples.py"))
    ref = store.cache_get(key)
    if ref is None:
        report = run_eval(store.get(model), store.get(dataset), cfg, reward)
        with tempfile.TemporaryDirectory(prefix="posttrain-eval-") as tmp:
            report.write(Path(tmp))
            metrics = {"greedy_accuracy": report.greedy_accuracy, "num_problems": report.num_problems,
                       "reward_calls": report.reward_calls, "reward_failures": report.reward_failures}
            if report.sampled_accuracy is not None:
                metrics.update(sampled_accuracy=report.sampled_accuracy, pass_at_k=report.pass_at_k)
            ref = store.put("eval", f"eval-{model.name}", Path(tmp), run_id=run_id, parents=[model.id, dataset.id],
                            config={**to_dict(cfg), "reward": to_dict(reward), "dataset_id": dataset.id,
                                    "model_id": model.id}, metrics=metrics)
        store.cache_put(key, ref)
        if tracking is not None:
            _eval_to_wandb(tracking, report, metrics, ref=ref, model=model, dataset=dataset, run_id=run_id,
                           store=store, settings={"eval": cfg, "reward": reward})
    m = store.manifest(ref.id).metrics
    sampled, pass_k = m.get("sampled_accuracy"), m.get("pass_at_k")
    failures = m.get("reward_failures", 0)

    def _fmt(x: float | None) -> str:  # "n/a": not measured (eval.k == 0)
        return "n/a" if x is None else f"{x:.3f}"

    print(f"eval {ref.short} of model {model.short}: greedy {m['greedy_accuracy']:.3f}, sampled {_fmt(sampled)}, "
          f"pass@k {_fmt(pass_k)} on {m['num_problems']} problems"
          + (f"; {failures}/{m.get('reward_calls')} reward calls failed (see the report)" if failures else ""))
    return EvalOutputs(report=ref, greedy_accuracy=m["greedy_accuracy"], sampled_accuracy=sampled, pass_at_k=pass_k,
                       reward_failures=failures)


def rl(rl_cfg: RLConfig, reward: RewardConfig, placement: PlacementConfig, tracking: TrackingConfig, *,
       max_seq_len: int, start_model: ArtifactRef, dataset: ArtifactRef, run_id: str,
       model_cfg: ModelConfig | None = None, store: ArtifactStore | None = None,
       reward_model: ArtifactRef | None = None) -> ArtifactRef:
    """RL (`rl.algorithm`) from `start_model` on the dataset's train prompts; returns the final RL `model`
    artifact, whose parents are the start model, the dataset and every model a role reads (`reward.models`,
    `rl.critic_init`: rl.model_inputs).
    `reward_model`: a reward model a workflow trained (rlhf_pipeline), scoring first with weight 1.0 before
    those of `reward.models`.

    Must run where Ray is initialised (the Flyte Ray task's pre_execute does it). Training state lives in a
    folder keyed by the inputs, so a killed task resumes from its last checkpoint when it is re-run; it is
    deleted once the final model is stored, unless `rl.keep_state`. `model_cfg` gives the workers their
    dtype and gradient checkpointing (None: fp32, no checkpointing).
    """
    from posttrain.rl import model_inputs
    from posttrain.rl.run import run_rl

    store = store or ArtifactStore()
    if not rl_cfg.enabled:
        print("rl: disabled (rl.enabled=false): passing the start model through")
        return start_model
    if reward_model is not None:
        reward = replace(reward, models=[reward_model.id, *reward.models],
                         model_weights=[1.0, *(reward.model_weights or [1.0] * len(reward.models))])
    # every model a role reads (reward.models, rl.critic_init) as a stored artifact: the key and the lineage
    # name them by id - a content hash -, the actors read their folders
    models = model_inputs.resolve(rl_cfg, reward, run_id=run_id, store=store)
    key = store.cache_key("rl", _without_keep_state(models.rl_ids), to_dict(models.reward_ids), to_dict(placement),
                          max_seq_len,
                          (model_cfg.dtype.value, model_cfg.gradient_checkpointing) if model_cfg else None,
                          start_model.id, dataset.id, source_digest("rl", "models", "rewards.py", "data/verifiers.py"))
    hit = store.cache_get(key)
    if hit is not None:
        print(f"rl: cache hit -> model {hit.short}")
        return hit
    start_dir, ds_dir = store.get(start_model), store.get(dataset)
    # Before any generation: the train prompts plus rl.max_new_tokens must fit the model's context budget.
    _check_budget(ds_dir, start_dir, max_seq_len=max_seq_len, max_new_tokens=rl_cfg.max_new_tokens, sft=False,
                  setting="rl.max_new_tokens")
    state = StateDir.under_store(store.root, "rl", key)
    print(f"rl: state in {state}", flush=True)
    wandb_run = WandbRun.for_stage(tracking, stage="rl", run_id=run_id, store=store,
                                   inputs={"start_model": start_model.id, "dataset": dataset.id,
                                           **{name: r.id for name, r in models.refs.items()}},
                                   settings={"rl": rl_cfg, "reward": reward, "placement": placement,
                                             "max_seq_len": max_seq_len, "model": model_cfg})
    result = run_rl(rl_cfg=models.rl, reward_cfg=models.reward,
                    model_cfg=model_cfg, placement_cfg=placement, max_seq_len=max_seq_len,
                    tracking_cfg=tracking, start_model_dir=start_dir, dataset_dir=ds_dir, store_root=str(store.root),
                    run_id=run_id, parents=[start_model.id, dataset.id, *[r.id for r in models.refs.values()]],
                    state_dir=state.location,
                    start_model_id=start_model.id, wandb_run=wandb_run)
    store.cache_put(key, result.model)
    if not rl_cfg.keep_state:  # only after the final model is stored: a failed run keeps its state and resumes
        _drop_state(state)
    print(f"rl: model {result.model.short} after {result.steps} updates")
    return result.model


def _eval_to_wandb(tracking: TrackingConfig, report, metrics: dict, *, ref: ArtifactRef, model: ArtifactRef,
                   dataset: ArtifactRef, run_id: str, store: ArtifactStore, settings: dict) -> None:
    """One wandb run for one evaluation: its numbers as the summary, every problem as a table row."""
    run = WandbRun.for_stage(tracking, stage="eval", run_id=run_id, store=store, settings=settings,
                             inputs={"model": model.id, "dataset": dataset.id}, name=f"eval-{model.name}-{run_id}")
    if run is None:
        return
    run.start()
    with _finished_on_error(run):
        columns = ["prompt", "answer", "greedy", "score", "correct", "failure", "sampled_correct"]
        run.log_table("eval/problems", columns, [[p.get(c) for c in columns] for p in report.problems])
        run.finish(outputs={"eval": ref.id}, summary={k: v for k, v in metrics.items() if v is not None})


@contextmanager
def _finished_on_error(run: WandbRun | None) -> Iterator[None]:
    """Close a stage's wandb run as failed when the stage raises (a finished run is left alone)."""
    try:
        yield
    except BaseException:
        if run is not None:
            run.finish(failed=True)
        raise


def _without_keep_state(cfg: SFTConfig | RLConfig) -> dict:
    """A stage's config part for its cache key: keep_state only decides what happens after success, so a
    failed run re-run with it switched on still finds (and resumes from) its state folder."""
    return {k: v for k, v in to_dict(cfg).items() if k != "keep_state"}


def _check_budget(dataset_dir: Path, tokenizer_dir: Path, *, max_seq_len: int, max_new_tokens: int, sft: bool,
                  setting: str) -> None:
    """Refuse (ConfigError naming the rows and the setting) a token budget some rows cannot fit, measured with
    the tokenizer the stage trains with: the start model's own, or the trained one for a from-scratch model."""
    from posttrain.data.lengths import check_budget
    from posttrain.models.io import load_tokenizer

    kwargs = {} if sft else {"splits": ("train",), "new_tokens_setting": setting}
    check_budget(dataset_dir, load_tokenizer(tokenizer_dir), max_seq_len=max_seq_len, max_new_tokens=max_new_tokens,
                 sft=sft, **kwargs)


def _drop_state(state: StateDir) -> None:
    """Delete a finished stage's resumable state (checkpoints, optimizer, step log): once the final model is
    stored, the state only costs disk."""
    state.drop()
    print(f"state: deleted {state} (set keep_state in the stage's section, e.g. sft.keep_state, to keep it)")
