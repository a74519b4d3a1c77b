"""Prompt selection by pass rate (`data.pass_rate`): on the shared tiny addition model (world size 1, in a
subprocess through stage_script), the stage keeps exactly the prompts the model solves in some but not all of
its samples, stores them as a cached dataset artifact whose parents are the model and the data, and records
every sampled prompt's rate; the rates are the model's: a model that never solves a problem gets none kept.
The settings are refused where they would do nothing or keep nothing."""

from __future__ import annotations

import json

import pytest

from tests import stage_script

SELECT = r"""
import json, sys
from pathlib import Path
from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import DataConfig, ModelConfig, PassRateConfig, RewardConfig
from posttrain.data.examples import read_examples
from posttrain.recipes import tiny_cpu
home, model_dir, ds_dir, mode = sys.argv[1:5]
store = ArtifactStore(home)
rl = tiny_cpu().rl
ds = store.put("dataset", "addition", ds_dir, run_id="t", parents=[], config={})
if mode == "untrained":  # the same architecture and tokenizer, no training: it never writes a right sum
    from posttrain.models.io import load_tokenizer, save_model
    from posttrain.models.tiny import build_model
    tok = load_tokenizer(model_dir)
    save_model(build_model(tiny_cpu().model, tok), tok, Path(home).parent / "untrained")
    model_dir = str(Path(home).parent / "untrained")
model = stages.start_model(ModelConfig(base_path=model_dir), run_id="t", store=store)
data = DataConfig(pass_rate=PassRateConfig(enabled=True, samples_per_prompt=4, max_prompts=64, refresh_every=5))
try:
    ref = stages.select_prompts(data, rl, RewardConfig(), model=model, dataset=ds, run_id="t", store=store)
except ValueError as e:
    print("RESULT" + json.dumps({"error": str(e)}))
    raise SystemExit(0)
again = stages.select_prompts(data, rl, RewardConfig(), model=model, dataset=ds, run_id="t", store=store)
off = stages.select_prompts(DataConfig(), rl, RewardConfig(), model=model, dataset=ds, run_id="t", store=store)
m = store.manifest(ref.id)
info = json.loads((store.get(ref) / "info.json").read_text())
from posttrain.report import render_page
from posttrain.rl.curriculum import Curriculum
from types import SimpleNamespace
page = render_page(store, ref.id)
cur = Curriculum.read(store.get(ref))  # what RL's curriculum reads (data.pass_rate.refresh_every)
print("RESULT" + json.dumps({
    "page": "Prompts by pass rate" in page and "never solved" in page and "pass-rates" in page,
    "same": again.id == ref.id, "off": off.id == ds.id, "parents": m.parents, "model": model.id, "dataset": ds.id,
    "metrics": m.metrics, "rates": info["pass_rate"]["rates"], "kept": read_examples(store.get(ref), "train"),
    "train": read_examples(ds_dir, "train")[:64], "eval_same": read_examples(store.get(ref), "eval") ==
    read_examples(ds_dir, "eval"), "pool": cur.pool, "every": cur.every,
    "start": cur.start_rows(SimpleNamespace(rows=list(range(len(cur.pool)))))}))
"""


def test_the_prompts_kept_are_those_the_model_solves_sometimes(tmp_path, tiny_sft_model):
    r, out = stage_script.run(SELECT, tmp_path / "home", tiny_sft_model, "")
    assert r["same"] and "pass_rate: cache hit" in out and r["off"]  # cached; disabled: the dataset itself
    assert r["page"]  # its page: the rates chart and the counts
    assert sorted(r["parents"]) == sorted([r["model"], r["dataset"]])  # the RL model's lineage reaches both
    rates = {i: rate for i, rate in r["rates"]}
    assert sorted(rates) == list(range(64)) and all(rate * 4 == int(rate * 4) for rate in rates.values())
    assert 0.0 in rates.values() and 1.0 in rates.values()  # both kinds occur among 64 prompts ...
    kept = [i for i, rate in sorted(rates.items()) if 0 < rate < 1]  # ... and are left out, in their order
    assert r["kept"] == [r["train"][i] for i in kept] and r["metrics"]["num_train"] == len(kept) > 0
    assert r["metrics"]["never_solved"] == sum(v == 0 for v in rates.values()) and r["eval_same"]
    assert r["metrics"]["seconds"] > 0  # what selection cost (bench/real_model.py gives RL those seconds without it)
    # with refresh_every, RL's curriculum reads every sampled row as its pool and starts on the kept ones
    assert r["pool"] == r["train"] and r["every"] == 5 and r["start"] == kept


COLD = r"""
import json, sys
from dataclasses import replace
from posttrain.config import EvalConfig, PassRateConfig, RewardConfig
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages, read_examples
from posttrain.data.verifiers import score
from posttrain.eval.evaluate import generator
from posttrain.eval.pass_rate import pass_rates
from posttrain.models.io import load_tokenizer
from posttrain.recipes import tiny_cpu
home, model_dir, ds_dir, mode = sys.argv[1:5]
rows = read_examples(ds_dir, "train")[:48]
rl = replace(tiny_cpu().rl, temperature=1e-4)  # sampling this cold is greedy decoding but for near-ties
rates, _ = pass_rates(rows, model_dir, PassRateConfig(enabled=True, samples_per_prompt=3), rl, RewardConfig())
tok = load_tokenizer(model_dir)
gen = generator(model_dir, tok, EvalConfig(max_new_tokens=rl.max_new_tokens))
greedy = gen([encode_prompt(tok, prompt_messages(ex)) for ex in rows], temperature=0.0, n=1, on_batch=lambda d, t: 0)
right = [float(score(ex["task"], tok.decode(g.response_ids, skip_special_tokens=True), ex["answer"]) >= 1.0)
         for ex, g in zip(rows, greedy)]
print("RESULT" + json.dumps({"rates": rates, "greedy": right}))
"""


def test_the_rates_are_the_models_own_answers_to_each_prompt(tmp_path, tiny_sft_model):
    """Sampled (nearly) greedily, each prompt's rate is 0 or 1 and equals whether the model's greedy answer to THAT
    prompt is right: samples are scored against their own prompt's answer and counted for it (a misgrouping would
    disagree on about half of them). Two near-ties of the 48 are allowed."""
    r, _ = stage_script.run(COLD, tmp_path / "home", tiny_sft_model, "")
    assert set(r["rates"]) <= {0.0, 1.0} and 0.0 in r["greedy"] and 1.0 in r["greedy"]
    assert sum(a != b for a, b in zip(r["rates"], r["greedy"])) <= 2, (r["rates"], r["greedy"])


def test_a_model_that_never_solves_keeps_nothing_and_says_so(tmp_path, tiny_sft_model):
    r, _ = stage_script.run(SELECT, tmp_path / "home", tiny_sft_model, "untrained")
    assert "no train prompt has a pass rate strictly between 0.0 and 1.0 (64 of 64 never solved" in r["error"]


@pytest.mark.parametrize(("workflow", "pass_rate", "field"), [
    ("sft_pipeline", {"enabled": True}, "data.pass_rate.enabled"),  # no RL there: the setting would do nothing
    ("pipeline", {"samples_per_prompt": 4}, "data.pass_rate.samples_per_prompt"),  # set but not enabled
    ("pipeline", {"enabled": True, "min_rate": 0.5, "max_rate": 0.6}, "data.pass_rate.max_rate"),  # no k/8 there
    ("agent_pipeline", {"enabled": True}, "data.pass_rate.enabled"),
    ("pipeline", {"enabled": True}, "data.pass_rate.enabled"),  # with rl.enabled false (below)
    ("pipeline", {"refresh_every": 10}, "data.pass_rate.refresh_every"),  # set but not enabled
    ("pipeline", {"enabled": True, "refresh_every": 100}, "data.pass_rate.refresh_every"),  # rl.steps is 100
])
def test_pass_rate_settings_that_would_do_nothing_are_refused(workflow, pass_rate, field):
    from posttrain.config import ConfigError
    from posttrain.recipes import resolve

    recipe = "tiny_calculator" if workflow == "agent_pipeline" else "tiny_cpu"
    rl_off = pass_rate == {"enabled": True} and workflow == "pipeline"
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        resolve(recipe, json.dumps({"data": {"pass_rate": pass_rate}, **({"rl": {"enabled": False}} if rl_off else {})}),
                workflow=workflow)
    if workflow == "pipeline" and pass_rate.get("enabled") is None:
        resolve(recipe, json.dumps({"data": {"pass_rate": {**pass_rate, "enabled": True}}}), workflow=workflow)


def test_a_curriculum_is_refused_with_rollout_ahead():
    from posttrain.config import ConfigError
    from posttrain.recipes import resolve

    over = {"data": {"pass_rate": {"enabled": True, "refresh_every": 10}}}
    assert resolve("tiny_cpu", json.dumps(over), workflow="pipeline").data.pass_rate.refresh_every == 10
    with pytest.raises(ConfigError, match=r"data\.pass_rate\.refresh_every: not with rl\.max_staleness = 1"):
        resolve("tiny_cpu", json.dumps({**over, "rl": {"max_staleness": 1}}), workflow="pipeline")
