"""Data prep through Flyte local execution: handles, run ids, the content cache, and early rejection."""

from __future__ import annotations

import pytest

from posttrain.config import ConfigError


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _small(**data):
    import json

    return json.dumps({"data": {"num_examples": 600, "eval_size": 100, **data}})


def test_data_pipeline_runs_in_flyte_and_second_run_hits_the_cache(home):
    from posttrain.artifacts import ArtifactStore
    from workflows.pipeline import data_pipeline

    ref1 = data_pipeline(recipe="tiny_cpu", overrides=_small(), run_id="run-a")
    store = ArtifactStore(str(home))
    made = {m.id: m for m in store.list()}
    assert ref1.id in made and made[ref1.id].kind == "dataset" and made[ref1.id].run_id == "run-a"
    tok = [m for m in made.values() if m.kind == "tokenizer"]
    assert len(tok) == 1 and tok[0].parents == [ref1.id]

    ref2 = data_pipeline(recipe="tiny_cpu", overrides=_small(), run_id="run-b")
    assert ref2.id == ref1.id
    assert {m.id for m in store.list()} == set(made)  # nothing new was written
    assert [m.id for m in store.list(run_id="run-a")] and not store.list(run_id="run-b")

    ref3 = data_pipeline(recipe="tiny_cpu", overrides=_small(seed=1), run_id="run-c")
    assert ref3.id != ref1.id


def test_invalid_config_is_rejected_before_any_work(home):
    from workflows.pipeline import data_pipeline

    with pytest.raises(Exception) as e:
        data_pipeline(recipe="tiny_cpu", overrides='{"sft": {"global_batch_size": 65}}')
    assert "sft.global_batch_size" in str(e.value)
    assert not (home / "objects").exists() or not any((home / "objects").iterdir())


@pytest.mark.parametrize("workflow", ["data_pipeline", "sft_pipeline"])
def test_each_workflow_plans_as_itself(home, workflow):
    """A workflow's plan checks the settings it would ignore: only `pipeline` selects prompts by pass rate, so
    data.pass_rate.enabled is refused in the others (each passes its own name to plan)."""
    import workflows.pipeline as wf

    with pytest.raises(Exception) as e:
        getattr(wf, workflow)(recipe="tiny_cpu", overrides='{"data": {"pass_rate": {"enabled": true}}}')
    assert "data.pass_rate.enabled" in str(e.value) and "this workflow selects no prompts" in str(e.value)
    assert not (home / "objects").exists() or not any((home / "objects").iterdir())


def test_task_definition_settings_are_checked_against_the_config(home):
    from workflows.pipeline import data_pipeline

    with pytest.raises(Exception) as e:
        data_pipeline(recipe="tiny_cpu", overrides='{"sft": {"nproc": 4, "global_batch_size": 512}}')
    assert "sft.nproc" in str(e.value) and "POSTTRAIN_SFT_NPROC" in str(e.value)


def test_config_error_type():
    from posttrain.recipes import resolve

    with pytest.raises(ConfigError):
        resolve("tiny_cpu", '{"eval": {"k": -1}}')
