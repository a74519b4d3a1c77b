"""The post-training pipeline as Flyte workflows: wiring only.

    plan ─► data_prep ─► dataset, tokenizer ──┐
        └─► start_model (model.base_path / model.artifact -> model artifact, or none: from scratch)
                                              ▼
            sft (Elastic, N ranks; skipped when sft.enabled=false) ─► model ─┬─► evaluate ─► eval
                                                                            └─► rl (Ray) ─► model ─► evaluate ─► eval

Run locally from the repository root (no extra environment variables needed):
    pyflyte run workflows/pipeline.py pipeline                          # the embedded tiny_cpu default
    pyflyte run workflows/pipeline.py pipeline --recipe tiny_cpu_long --overrides '{"rl": {"steps": 60}}'
    pyflyte run workflows/pipeline.py sft_pipeline                      # data -> SFT -> eval only
    pyflyte run workflows/pipeline.py pipeline --overrides '{"model": {"base_path": "/models/m"}, "sft": {"enabled": false}, ...}'
    pyflyte run workflows/pipeline.py eval_pipeline --overrides '{"model": {"base_path": "/models/m"}, ...}'
"""

from __future__ import annotations

from flytekit import conditional, workflow

from posttrain.artifacts.handles import ArtifactRef
from tasks.data import data_prep
from tasks.evaluate import evaluate
from tasks.model import given_model, start_model
from tasks.plan import plan
from tasks.rl import rl
from tasks.sft import sft
from tasks.summary import Summary, summarize


@workflow
def data_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> ArtifactRef:
    """Data prep only: writes (or finds in the cache) the dataset and tokenizer artifacts."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id)
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    return d.dataset


@workflow
def sft_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> SFT -> evaluation."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id)
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    s = start_model(model=p.model, run_id=p.run_id)
    m = sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
            start_model=s, run_id=p.run_id)
    e = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset,
                 run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e.report, rl_model=None,
                     rl_eval=None)


@workflow
def pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> SFT -> evaluation -> RL (GRPO) -> evaluation: the main job of `make run`.
    With sft.enabled=false, RL (and the first evaluation) start from model.base_path / model.artifact."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id)
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    s = start_model(model=p.model, run_id=p.run_id)
    # A branch, not a pass-through inside the SFT task: no SPMD pod (or PyTorchJob) starts just to hand on s.
    m = (conditional("sft_or_start_model").if_(p.sft_enabled.is_true())
         .then(sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
                   start_model=s, run_id=p.run_id))
         .else_().then(given_model(start=s)))
    e1 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset,
                  run_id=p.run_id)
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model, tracking=p.tracking, start_model=m,
           dataset=d.dataset, run_id=p.run_id)
    e2 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=r, dataset=d.dataset,
                  run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report)


@workflow
def eval_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> ArtifactRef:
    """Evaluate one existing model (model.base_path or model.artifact) on the dataset's eval split, with the
    recipe's eval settings; returns the `eval` artifact. `posttrain eval` does the same without Flyte."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id)
    d = data_prep(cfg=p.data, require_completions=False, run_id=p.run_id)  # evaluation needs no completions
    m = given_model(start=start_model(model=p.model, run_id=p.run_id))
    e = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset,
                 run_id=p.run_id)
    return e.report
