"""The post-training pipeline as Flyte workflows: wiring only.

    plan ─► data_prep ─► dataset, tokenizer ─► sft (Elastic, N ranks) ─► model ─┬─► evaluate ─► eval
                                                                               └─► rl (Ray) ─► model ─► evaluate ─► eval

Run locally from the repository root (no extra environment variables needed):
    pyflyte run workflows/pipeline.py pipeline                          # the embedded tiny_cpu default
    pyflyte run workflows/pipeline.py pipeline --recipe tiny_cpu_long --overrides '{"rl": {"steps": 60}}'
    pyflyte run workflows/pipeline.py sft_pipeline                      # data -> SFT -> eval only
"""

from __future__ import annotations

from flytekit import workflow

from posttrain.artifacts.handles import ArtifactRef
from tasks.data import data_prep
from tasks.evaluate import evaluate
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
    m = sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
            run_id=p.run_id)
    e = evaluate(cfg=p.eval, reward=p.reward, model=m, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e.report, rl_model=None,
                     rl_eval=None)


@workflow
def pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> SFT -> evaluation -> RL (GRPO) -> evaluation: the main job of `make run`."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id)
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
            run_id=p.run_id)
    e1 = evaluate(cfg=p.eval, reward=p.reward, model=m, dataset=d.dataset, run_id=p.run_id)
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, max_seq_len=p.model.max_seq_len, tracking=p.tracking, start_model=m,
           dataset=d.dataset, run_id=p.run_id)
    e2 = evaluate(cfg=p.eval, reward=p.reward, model=r, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report)
