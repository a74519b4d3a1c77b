"""The promotion gate judges like with like: the candidate's and the holder's evaluations must be on the
channel's pinned datasets with the same settings; decisions are `decision` artifacts whose lineage reaches
both evaluations; the pointer moves only on a promotion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain import promotion
from posttrain.artifacts import ArtifactStore
from posttrain.promotion import PromotionError, gate, set_pin

SETTINGS = {"k": 0, "seed": 0, "temperature": 1.0, "backend": "transformers", "reward": {"fn": ""}}


def _put(store: ArtifactStore, tmp: Path, kind: str, name: str, parents: list[str], **kw):
    src = tmp / f"src-{name}"
    src.mkdir(exist_ok=True)  # the same evaluation asked for twice: the same artifact
    (src / "x.json").write_text(json.dumps({"name": name}))
    return store.put(kind, name, src, run_id="t", parents=parents, config=kw.pop("config", {}), **kw)


@pytest.fixture
def world(tmp_path):
    """Two datasets (A pinned, B not), two models, and evaluations of each model on each dataset."""
    store = ArtifactStore(tmp_path / "home")
    ds = {n: _put(store, tmp_path, "dataset", n, []) for n in ("A", "B")}
    models = {n: _put(store, tmp_path, "model", n, [ds["A"].id]) for n in ("good", "bad")}
    acc = {("good", "A"): 0.6, ("bad", "A"): 0.3, ("good", "B"): 0.5, ("bad", "B"): 0.7}

    def ev(model: str, d: str, settings: dict = SETTINGS):
        return _put(store, tmp_path, "eval", f"eval-{model}-{d}-{len(settings)}-{settings.get('k')}",
                    [models[model].id, ds[d].id],
                    config={**settings, "model_id": models[model].id, "dataset_id": ds[d].id},
                    metrics={"greedy_accuracy": acc[(model, d)]})

    return store, ds, models, ev


def test_promote_then_refuse_on_the_pinned_set_with_the_decisions_in_lineage(world):
    store, ds, models, ev = world
    set_pin("production", ds["A"], [], store)
    first = gate(channel="production", model=models["good"], evals=[ev("good", "A")], holder_evals=[],
                 min_accuracy=0.5, tolerance=0.0, run_id="r1", store=store)
    assert first.promoted and "the channel held no model" in first.reason
    held = promotion.current("production", store)
    assert held["model_id"] == models["good"].id and held["decision_id"] == first.decision_id

    second = gate(channel="production", model=models["bad"], evals=[ev("bad", "A")], holder_evals=[ev("good", "A")],
                  min_accuracy=0.0, tolerance=0.05, run_id="r2", store=store)
    assert not second.promoted
    assert second.reason == (f"greedy accuracy 0.300 on the pinned set < current production model "
                             f"{models['good'].id[:12]}'s 0.600 - tolerance 0.050")
    assert promotion.current("production", store) == held  # a refusal moves nothing

    refused, promoted = promotion.decisions("production", store)
    assert (refused["decision_id"], promoted["decision_id"]) == (second.decision_id, first.decision_id)
    assert refused["holder"]["greedy_accuracies"] == [0.6] and refused["eval_dataset_ids"] == [ds["A"].id]
    tree = store.lineage(second.decision_id)  # both evaluations, both models and the pinned data, by lineage
    evals = [n for n in tree.parents if n.manifest.kind == "eval"]
    assert {n.manifest.config["model_id"] for n in evals} == {models["good"].id, models["bad"].id}
    assert all(ds["A"].id in n.manifest.parents for n in evals)
    assert store.manifest(second.decision_id).config == {"channel": "production", "min_accuracy": 0.0,
                                                         "tolerance": 0.05, "require_gain": False,
                                                         "eval_dataset_ids": [ds["A"].id]}
    assert refused["paired_changes"] == [None]  # no per-problem change given


def test_tolerance_and_guard_sets(world):
    store, ds, models, ev = world
    set_pin("prod", ds["A"], [ds["B"]], store)
    gate(channel="prod", model=models["bad"], evals=[ev("bad", "A"), ev("bad", "B")], holder_evals=[],
         min_accuracy=0.0, tolerance=0.0, run_id="r", store=store)
    # good beats bad on the pinned set (0.6 vs 0.3) but falls behind on the guard set (0.5 vs 0.7)
    d = gate(channel="prod", model=models["good"], evals=[ev("good", "A"), ev("good", "B")],
             holder_evals=[ev("bad", "A"), ev("bad", "B")], min_accuracy=0.0, tolerance=0.1, run_id="r", store=store)
    assert not d.promoted and "on the guard set 1 < " in d.reason
    d = gate(channel="prod", model=models["good"], evals=[ev("good", "A"), ev("good", "B")],
             holder_evals=[ev("bad", "A"), ev("bad", "B")], min_accuracy=0.0, tolerance=0.25, run_id="r", store=store)
    assert d.promoted and "0.600 vs 0.300, 0.500 vs 0.700" in d.reason


def test_unlike_evaluations_are_refused_before_any_decision(world):
    store, ds, models, ev = world
    with pytest.raises(PromotionError, match="has no pinned eval set"):
        gate(channel="p", model=models["good"], evals=[ev("good", "A")], holder_evals=[], min_accuracy=0,
             tolerance=0, run_id="r", store=store)
    set_pin("p", ds["A"], [], store)
    with pytest.raises(PromotionError, match="already pins its eval set"):
        set_pin("p", ds["B"], [], store)
    with pytest.raises(PromotionError, match=r"judges on datasets"):  # evaluated on other problems
        gate(channel="p", model=models["good"], evals=[ev("good", "B")], holder_evals=[], min_accuracy=0,
             tolerance=0, run_id="r", store=store)
    with pytest.raises(PromotionError, match="was not made from the candidate"):
        gate(channel="p", model=models["good"], evals=[ev("bad", "A")], holder_evals=[], min_accuracy=0,
             tolerance=0, run_id="r", store=store)
    gate(channel="p", model=models["good"], evals=[ev("good", "A")], holder_evals=[], min_accuracy=0, tolerance=0,
         run_id="r", store=store)
    with pytest.raises(PromotionError, match="same settings"):  # the holder evaluated with k=4, the candidate k=0
        gate(channel="p", model=models["bad"], evals=[ev("bad", "A")],
             holder_evals=[ev("good", "A", {**SETTINGS, "k": 4})], min_accuracy=0, tolerance=0, run_id="r",
             store=store)
    with pytest.raises(PromotionError, match="not a model"):
        gate(channel="p", model=ds["A"], evals=[], holder_evals=[], min_accuracy=0, tolerance=0, run_id="r",
             store=store)
    assert len(promotion.decisions("p", store)) == 1  # errors decide nothing


def _report_eval(store: ArtifactStore, tmp: Path, name: str, model, dataset, correct: list[bool]):
    """An eval artifact whose report keeps every problem's result (as posttrain.eval writes it)."""
    from posttrain.eval import EvalReport

    src = tmp / f"src-{name}"
    src.mkdir()
    problems = [{"prompt": f"{i}+1=", "answer": str(i + 1), "greedy": "", "score": float(c), "correct": c,
                 "failure": None, "sampled_correct": None} for i, c in enumerate(correct)]
    EvalReport(greedy_accuracy=sum(correct) / len(correct), sampled_accuracy=None, pass_at_k=None,
               num_problems=len(correct), k=0, temperature=1.0, max_new_tokens=8, seed=0, scorer="verifier:addition",
               mean_response_tokens=3.0, seconds=1.0, generated_tokens_per_s=1.0, problems=problems).write(src)
    return store.put("eval", name, src, run_id="t", parents=[model.id, dataset.id],
                     config={**SETTINGS, "model_id": model.id, "dataset_id": dataset.id},
                     metrics={"greedy_accuracy": sum(correct) / len(correct)})


def _change(store: ArtifactStore, candidate, holder) -> list[dict]:
    """The paired change stages.gate passes the gate (stages.gate._paired)."""
    from posttrain.stages.gate import _paired

    return [_paired(store, candidate, holder)]


def test_require_gain_promotes_only_a_change_whose_paired_interval_lies_above_zero(tmp_path):
    """Against a holder right on 100 of 200 problems: +0.03 from 10 gains and 4 losses is within noise
    (refused under require_gain, promoted without it); +0.10 from 22 gains and 2 losses is not. The decision
    records the paired change either way, and its page shows it."""
    from posttrain.report import pages

    store = ArtifactStore(tmp_path / "home")
    data = _put(store, tmp_path, "dataset", "A", [])
    holder, small, big = (_put(store, tmp_path, "model", n, [data.id]) for n in ("holder", "small", "big"))
    base = [True] * 100 + [False] * 100
    flip = lambda gains, losses: [not x if (i >= 100 and i < 100 + gains) or (i < losses) else x
                                  for i, x in enumerate(base)]
    set_pin("prod", data, [], store)
    gate(channel="prod", model=holder, evals=[_report_eval(store, tmp_path, "e-holder", holder, data, base)],
         holder_evals=[], min_accuracy=0.0, tolerance=0.0, run_id="r", store=store, require_gain=True)
    ev_holder = store.ref(promotion.current("prod", store)["eval_id"])
    ev_small = _report_eval(store, tmp_path, "e-small", small, data, flip(10, 4))
    d = gate(channel="prod", model=small, evals=[ev_small], holder_evals=[ev_holder], min_accuracy=0.0,
             tolerance=0.0, run_id="r", store=store, require_gain=True, changes=_change(store, ev_small, ev_holder))
    assert not d.promoted and d.reason.startswith("require_gain: the change over current prod model")
    assert "+0.030 (95% interval -0.008 to +0.067" in d.reason and "10 gained, 4 lost of 200" in d.reason
    record = promotion.decisions("prod", store)[0]
    assert record["paired_changes"][0]["gained"] == 10 and record["paired_changes"][0]["low"] < 0 < record["paired_changes"][0]["high"]
    assert "Change over the holder, problem by problem" in pages.promotion_page(record)
    assert gate(channel="prod", model=small, evals=[ev_small], holder_evals=[ev_holder], min_accuracy=0.0,
                tolerance=0.0, run_id="r", store=store).promoted  # without require_gain: not below the holder
    set_pin("prod2", data, [], store)
    gate(channel="prod2", model=holder, evals=[ev_holder], holder_evals=[], min_accuracy=0.0, tolerance=0.0,
         run_id="r", store=store)
    ev_big = _report_eval(store, tmp_path, "e-big", big, data, flip(22, 2))
    d = gate(channel="prod2", model=big, evals=[ev_big], holder_evals=[ev_holder], min_accuracy=0.0, tolerance=0.0,
             run_id="r", store=store, require_gain=True, changes=_change(store, ev_big, ev_holder))
    with pytest.raises(PromotionError, match="require_gain needs both evaluations' per-problem results"):
        gate(channel="prod2", model=small, evals=[ev_small], holder_evals=[store.ref(promotion.current("prod2", store)["eval_id"])],
             min_accuracy=0.0, tolerance=0.0, run_id="r", store=store, require_gain=True)
    assert d.promoted and promotion.decisions("prod2", store)[0]["paired_changes"][0]["low"] > 0
