"""examples/tool_env, a user's own environment with tools, through agent_pipeline (`pyflyte run`, Flyte local
execution, real Ray) at tiny size. A file of its own so that make test's e2e stage can run it on either worker
(`--dist loadfile` keeps a file on one): beside the agent_pipeline file it made that worker the stage's longest."""

from __future__ import annotations

import csv
import hashlib
import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.integration.test_agent_pipeline_e2e import _run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
WALL_S = 139
"""Measured wall time, idle (conftest runs the longest modules first)."""
TOOL_ENV = Path(__file__).resolve().parents[2] / "examples" / "tool_env"
TOOL_ENV_SFT = {"steps": 150, "save_every": 50}
"""examples/tool_env's own data, so its own SFT (the calculator's cached model has another tokenizer and task): half
the example's 300 steps, by which its loss is ~1e-3 (measured: greedy 0.95 on the 40 held-out problems after SFT and
after RL; 300 steps: 1.000)."""


def _example_overrides() -> dict:
    spec = importlib.util.spec_from_file_location("tool_env_overrides", TOOL_ENV / "overrides.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.overrides()


def test_tool_env_example_trains_in_the_users_environment(tmp_path, monkeypatch):
    """examples/tool_env at tiny size, as a user runs it (agent_pipeline, the example's overrides.py): the user's
    demonstrations -> SFT (shortened) -> evaluation in the user's Warehouse environment -> 2 RL steps in it ->
    evaluation. Its committed rows are what make_data.py writes from the table; the episodes call its tools and
    read the table's values; the environment's source hash is in the RL model's lineage."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.eval import EvalReport

    monkeypatch.syspath_prepend(str(TOOL_ENV))
    make_data = importlib.import_module("make_data")
    make_data.write(tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):  # the committed rows are the table's (rerun make_data.py)
        assert (tmp_path / name).read_text() == (TOOL_ENV / name).read_text(), name

    ov = _example_overrides()
    ov["sft"] = TOOL_ENV_SFT
    ov["rl"].update(steps=2, prompts_per_step=16)
    ov["eval"]["k"] = 1
    home = tmp_path / "home"
    out = _run(home, ov, run_id="tool_env")
    acc = {k: float(v) for k, v in re.findall(r"(\w+_accuracy)=([-0-9.]+)", out.stdout)}
    print(acc)
    assert acc["sft_greedy_accuracy"] >= 0.8 and acc["rl_greedy_accuracy"] >= 0.8, acc  # answers the verifier accepts
    ids = dict(re.findall(r"(\w+_id)='([0-9a-f]{64})'", out.stdout))
    store = ArtifactStore(str(home))
    sources = json.loads((store.get(ids["dataset_id"]) / "info.json").read_text())["sources"]
    assert {s["path"] for s in sources} == {str(TOOL_ENV / "train.jsonl"), str(TOOL_ENV / "eval.jsonl")}

    with (TOOL_ENV / "parts.csv").open(newline="") as f:
        values = {v for row in csv.DictReader(f) for v in (row["stock"], row["shelf"])}
    sft_eval, rl_eval = (EvalReport.from_json((store.get(ids[k]) / "report.json").read_text())
                         for k in ("sft_eval_id", "rl_eval_id"))
    for report in (sft_eval, rl_eval):
        assert report.episodes["environment"] == "warehouse:Warehouse", report.episodes
        assert report.episodes["tools"] == ["shelf", "stock"], report.episodes
        assert report.episodes["tool_calls_mean"] > 0.5, report.episodes
        assert len(report.problems) == 40
        looked_up = [p["episode"][1][1] for p in report.problems if len(p["episode"]) >= 2]
        assert sum(text.strip() in values for text in looked_up) >= 20, looked_up[:10]  # the table's answers

    rl_model = store.manifest(ids["rl_model_id"])
    source = hashlib.sha256((TOOL_ENV / "warehouse.py").read_bytes()).hexdigest()
    assert rl_model.extra["environment"] == {"warehouse:Warehouse": source}
    assert [h["step"] for h in rl_model.extra["history"]] == [1, 2]
    assert all(h["env/tool_calls_mean"] > 0.5 for h in rl_model.extra["history"]), rl_model.extra["history"]
