"""The post-training pipeline as Flyte workflows: wiring only.

    plan ─► data_prep ─► dataset, tokenizer ──┐
        └─► start_model (model.base_path / model.artifact -> model artifact, or none: from scratch)
                                              ▼
            sft (Elastic, N ranks; skipped when sft.enabled=false) ─► model ─┬─► evaluate ─► eval
                                                                            └─► rl (Ray) ─► model ─► evaluate ─► eval
    with data.pass_rate.enabled, RL's prompts are those the model solves sometimes:
            model, dataset ─► select_prompts (k samples per train prompt) ─► dataset ─► rl

Run locally from the repository root (no extra environment variables needed):
    pyflyte run workflows/pipeline.py pipeline                          # the embedded tiny_cpu default
    pyflyte run workflows/pipeline.py pipeline --recipe tiny_cpu_long --overrides '{"rl": {"steps": 60}}'
    pyflyte run workflows/pipeline.py sft_pipeline                      # data -> SFT -> eval only
    pyflyte run workflows/pipeline.py pipeline --overrides '{"model": {"base_path": "/models/m"}, "sft": {"enabled": false}, ...}'
    pyflyte run workflows/pipeline.py eval_pipeline --overrides '{"model": {"base_path": "/models/m"}, ...}'

The dense objectives beside SFT (the same SPMD trainer; each stage cached on its inputs, so changing dpo.beta
re-runs only DPO and its evaluation):

    plan ─► data_prep ─► sft ─► evaluate ─► pairs (the SFT model's own samples, scored) ─► dpo ─► evaluate
                                        └─► pairs ─► reward_model ─► evaluate_reward_model (pairwise accuracy)
    plan ─► data_prep ─► distill (teacher: distill.teacher; student: the start model, or fresh) ─► evaluate
    plan ─► data_prep ─► sft ─► evaluate
                            └─► pairs ─► reward_model ─┬─► evaluate_reward_model
                            └──────────────────────────┴─► rl (PPO; the reward model scores) ─► evaluate (verifier)

    pyflyte run workflows/pipeline.py dpo_pipeline --overrides '{"dpo": {"beta": 0.1}}'
    pyflyte run workflows/pipeline.py reward_model_pipeline
    pyflyte run workflows/pipeline.py rlhf_pipeline                     # tiny_cpu_rlhf: the reward model is the reward
    pyflyte run workflows/pipeline.py distill_pipeline --overrides '{"distill": {"teacher": "channel:production"}}'

Agentic RL (multi-turn episodes with tools, in an environment; posttrain.envs):

    plan ─► data_prep ─► sft (demonstrated episodes) ─► evaluate (in the environment) ─► rl (episodes) ─► evaluate

    pyflyte run workflows/pipeline.py agent_pipeline                    # tiny_calculator: when to call a calculator

With preference data (data.schema "preference") the data are the pairs: no sampling, and SFT (when enabled)
trains on the chosen completions.
"""

from __future__ import annotations

from flytekit import conditional, workflow

from posttrain.artifacts.handles import ArtifactRef
from tasks.data import data_prep
from tasks.evaluate import evaluate, evaluate_reward_model
from tasks.model import given_model, start_model
from tasks.pairs import given_pairs, make_pairs
from tasks.pass_rate import all_prompts, select_prompts
from tasks.plan import plan
from tasks.rl import rl
from tasks.sft import distill, dpo, reward_model, sft
from tasks.summary import Summary, summarize


@workflow
def data_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> ArtifactRef:
    """Data prep only: writes (or finds in the cache) the dataset and tokenizer artifacts."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="data_pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    return d.dataset


@workflow
def sft_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> SFT -> evaluation."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="sft_pipeline")
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
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    s = start_model(model=p.model, run_id=p.run_id)
    # A branch, not a pass-through inside the SFT task: no SPMD pod (or PyTorchJob) starts just to hand on s.
    m = (conditional("sft_or_start_model").if_(p.sft_enabled.is_true())
         .then(sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
                   start_model=s, run_id=p.run_id))
         .else_().then(given_model(start=s)))
    e1 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset,
                  run_id=p.run_id)
    prompts = (conditional("prompts_by_pass_rate").if_(p.pass_rate_enabled.is_true())
               .then(select_prompts(data=p.data, rl=p.rl, reward=p.reward, model=m, dataset=d.dataset,
                                    run_id=p.run_id))
               .else_().then(all_prompts(dataset=d.dataset)))
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model, tracking=p.tracking, start_model=m,
           dataset=prompts, run_id=p.run_id)
    e2 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=r, dataset=d.dataset,
                  run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report)


@workflow
def eval_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> ArtifactRef:
    """Evaluate one existing model (model.base_path or model.artifact) on the dataset's eval split, with the
    recipe's eval settings; returns the `eval` artifact. `posttrain eval` does the same without Flyte."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="eval_pipeline")
    d = data_prep(cfg=p.data, require_completions=False, run_id=p.run_id)  # evaluation needs no completions
    m = given_model(start=start_model(model=p.model, run_id=p.run_id))
    e = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset,
                 run_id=p.run_id)
    return e.report


def _sft_or_start(p, d):
    """The SFT model, or with sft.enabled=false the start model: a branch, so no SPMD pod starts to hand it on."""
    s = start_model(model=p.model, run_id=p.run_id)
    return (conditional("sft_or_start_model").if_(p.sft_enabled.is_true())
            .then(sft(model=p.model, sft=p.sft, tracking=p.tracking, dataset=d.dataset, tokenizer=d.tokenizer,
                      start_model=s, run_id=p.run_id))
            .else_().then(given_model(start=s)))


def _pairs(p, d, m):
    """Pairs sampled from model `m` on prompt data, or the user's preference data as they are."""
    return (conditional("pairs_from_samples_or_data").if_(p.pairs_from_samples.is_true())
            .then(make_pairs(cfg=p.pairs, reward=p.reward, model=m, dataset=d.dataset, run_id=p.run_id))
            .else_().then(given_pairs(dataset=d.dataset)))


@workflow
def dpo_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> SFT -> evaluation -> preference pairs from the SFT model's own samples -> DPO -> evaluation."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="dpo_pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = _sft_or_start(p, d)
    e1 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset, run_id=p.run_id)
    pairs = _pairs(p, d, m)
    r = dpo(model=p.model, dpo=p.dpo, tracking=p.tracking, pairs=pairs, start_model=m, run_id=p.run_id)
    e2 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=r, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report, second_stage="dpo")


@workflow
def reward_model_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> ArtifactRef:
    """data prep -> SFT -> preference pairs from the SFT model's own samples -> reward model (the SFT model's body
    with a scalar head) -> pairwise accuracy on the held-out pairs; returns that `eval` artifact."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="reward_model_pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = _sft_or_start(p, d)
    pairs = _pairs(p, d, m)
    rm = reward_model(model=p.model, reward_model=p.reward_model, tracking=p.tracking, pairs=pairs, start_model=m,
                      run_id=p.run_id)
    return evaluate_reward_model(reward_model=rm, pairs=pairs, run_id=p.run_id)


@workflow
def rlhf_pipeline(recipe: str = "tiny_cpu_rlhf", overrides: str = "", run_id: str = "") -> Summary:
    """Classic RLHF: data -> SFT (+ eval) -> preference pairs -> reward model (+ its held-out pairwise accuracy) ->
    RL (`rl.algorithm`; PPO in the default recipe) with that reward model as a scorer - the only reward with
    `reward.fn_weight` 0, as in tiny_cpu_rlhf - -> evaluation with the task's verifier."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="rlhf_pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = _sft_or_start(p, d)
    e1 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset, run_id=p.run_id)
    pairs = _pairs(p, d, m)
    rm = reward_model(model=p.model, reward_model=p.reward_model, tracking=p.tracking, pairs=pairs, start_model=m,
                      run_id=p.run_id)
    evaluate_reward_model(reward_model=rm, pairs=pairs, run_id=p.run_id)
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model, tracking=p.tracking, start_model=m,
           dataset=d.dataset, run_id=p.run_id, reward_model=rm)
    e2 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=r, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report)


@workflow
def agent_pipeline(recipe: str = "tiny_calculator", overrides: str = "", run_id: str = "") -> Summary:
    """Agentic RL: data -> SFT on the demonstrations (whole episodes: tool calls, results, answers) -> evaluation
    in the environment -> RL in the environment (rl.environment / rl.tools: multi-turn, token-exact episodes) ->
    evaluation in the environment. The default, tiny_calculator, teaches the embedded tiny model when to call
    a calculator; the plan refuses a recipe without an environment for RL or for the evaluation."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="agent_pipeline")
    d = data_prep(cfg=p.data, require_completions=p.sft.enabled, run_id=p.run_id)
    m = _sft_or_start(p, d)
    e1 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=m, dataset=d.dataset, run_id=p.run_id)
    r = rl(rl=p.rl, reward=p.reward, placement=p.placement, model=p.model, tracking=p.tracking, start_model=m,
           dataset=d.dataset, run_id=p.run_id)
    e2 = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=r, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=m, sft_eval=e1.report, rl_model=r,
                     rl_eval=e2.report)


@workflow
def distill_pipeline(recipe: str = "tiny_cpu", overrides: str = "", run_id: str = "") -> Summary:
    """data prep -> distillation of distill.teacher into the student (model.base_path / model.artifact, or a fresh
    model of the `model` section with the teacher's tokenizer) on the demonstrations -> evaluation."""
    p = plan(recipe=recipe, overrides=overrides, run_id=run_id, workflow="distill_pipeline")
    d = data_prep(cfg=p.data, require_completions=True, run_id=p.run_id)
    s = start_model(model=p.model, run_id=p.run_id)
    k = distill(model=p.model, distill=p.distill, tracking=p.tracking, dataset=d.dataset, start_model=s,
                run_id=p.run_id)
    e = evaluate(cfg=p.eval, reward=p.reward, tracking=p.tracking, model=k, dataset=d.dataset, run_id=p.run_id)
    return summarize(run_id=p.run_id, dataset=d.dataset, sft_model=k, sft_eval=e.report, rl_model=None, rl_eval=None)
