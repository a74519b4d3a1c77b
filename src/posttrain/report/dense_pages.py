"""Pages of the dense stages beside SFT (stages.train with a DPO, reward-model or distillation section;
stages.pairs; stages.evaluate_reward_model), built like posttrain.report.pages from what each stage stored: the
per-step `history` in a model manifest's extra, a pairs dataset's files and counts, a reward-model eval's
`pairwise.json`. `render_page` (posttrain.report) picks them by the manifest's stage.

Leaves out: comparing two DPO runs or two reward models on one page, and re-scoring anything (a page only
reads what was stored).
"""

from __future__ import annotations

import json

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.errors import ArtifactNotFoundError
from posttrain.artifacts.manifest import Manifest
from posttrain.data.examples import is_preference, prompt_messages, read_examples
from posttrain.eval.intervals import wilson
from posttrain.report import charts
from posttrain.report.html import key_values, note, page, section, table
from posttrain.report.pages import _about, _curves, _dropped_section, _no_history, _rows_section

_COMMON_CURVES = (("lr", "Learning rate", ("lr",)), ("grad-norm", "Gradient norm (before clipping)", ("grad_norm",)),
                  ("tokens-per-s", "Tokens/s", ("tokens_per_s",)))
"""(chart name, title, history keys) every trainer history has, after the objective's own charts."""

_OBJECTIVE_CURVES = {
    "dpo": (("loss", "DPO loss", ("loss",)),
            ("rewards", "Implicit rewards: beta * log(policy / reference) of chosen and rejected",
             ("rewards/chosen", "rewards/rejected", "rewards/margin")),
            ("accuracy", "Preference accuracy (chosen reward > rejected reward)", ("accuracy",))),
    "reward_model": (("loss", "Bradley-Terry loss", ("loss",)),
                     ("scores", "Scores of chosen and rejected", ("scores/chosen", "scores/rejected", "scores/margin")),
                     ("accuracy", "Accuracy (chosen scored above rejected)", ("accuracy",))),
    "distill": (("loss", "Distillation loss (divergence to the teacher)", ("loss",)),
                ("ce", "Cross-entropy on the demonstrations' tokens (not trained on)", ("ce",))),
}
"""The objective's own charts, per stage; every history key is its own series (`rewards/chosen` draws as
series `rewards-chosen`)."""

_TITLES = {"dpo": "DPO", "reward_model": "Reward model", "distill": "Distilled model"}


def _named(store: ArtifactStore, id_: str | None) -> str | None:
    """A model as "<id prefix> (<name>, <stage>)", or marked missing when the store no longer holds it."""
    if not id_:
        return None
    try:
        m = store.manifest(id_)
    except ArtifactNotFoundError:
        return f"{id_[:12]} (not in this store)"
    return f"{id_[:12]} ({m.name}, {m.stage})"


def _trained_page(store: ArtifactStore, id_: str, facts: dict) -> str:
    """A dense trainer's page: the run's summary with `facts` (the stage's own lines), then the objective's
    curves and the learning rate, gradient norm and tokens/s per step."""
    m = store.manifest(id_)
    stage, history = m.stage, m.extra.get("history", [])
    summary = section("summary", "Summary", key_values({
        "wall time (s)": m.metrics.get("wall_s"), "steps": m.metrics.get("steps"),
        "ranks": m.metrics.get("world_size"), "train examples": m.metrics.get("train_examples"),
        "dropped (too long)": m.metrics.get("dropped_too_long"), "final loss": m.metrics.get("loss"), **facts,
        "start model": _named(store, m.extra.get("start_model")) or "from scratch"}))
    title = f"{_TITLES[stage]} {m.name}"
    if not history:
        return page(title, [_about(m), summary, _no_history(_TITLES[stage])])
    steps = [h["step"] for h in history]
    curves = section("curves", "Per-step curves", *[
        charts.line_chart(name, chart_title, steps, _curves(history, keys))
        for name, chart_title, keys in _OBJECTIVE_CURVES[stage] + _COMMON_CURVES])
    return page(title, [_about(m), summary, curves])


def dpo_page(store: ArtifactStore, id_: str) -> str:
    """DPO: loss, the implicit rewards of chosen and rejected and their margin, preference accuracy, learning
    rate, gradient norm and tokens/s per step; the reference model (the frozen policy the rewards are measured
    against) named beside the start model."""
    m = store.manifest(id_)
    cfg = m.config.get("dpo", {})
    return _trained_page(store, id_, {
        "reference model": _named(store, m.extra.get("frozen_model")),
        "loss type": cfg.get("loss"), "beta": cfg.get("beta"),
        "final preference accuracy": m.metrics.get("accuracy"), "final reward margin": m.metrics.get("rewards/margin")})


def distill_page(store: ArtifactStore, id_: str) -> str:
    """Distillation: the loss (divergence to the teacher) and the cross-entropy on the demonstrations per step,
    with the usual trainer curves; the teacher named."""
    m = store.manifest(id_)
    cfg = m.config.get("distill", {})
    return _trained_page(store, id_, {
        "teacher": _named(store, m.extra.get("frozen_model")), "loss type": cfg.get("loss"),
        "temperature": cfg.get("temperature"), "final cross-entropy": m.metrics.get("ce")})


def reward_model_page(store: ArtifactStore, id_: str) -> str:
    """Reward model: Bradley-Terry loss, the scores of chosen and rejected and their margin, training accuracy,
    with the usual trainer curves; and the pairwise accuracy of each held-out eval of it in the store."""
    m = store.manifest(id_)
    evals = sorted(store.list(kind="eval", child_of=m.id), key=lambda e: e.created)
    return _trained_page(store, id_, {
        "final accuracy (train batch)": m.metrics.get("accuracy"),
        "final score margin": m.metrics.get("scores/margin"),
        **{f"held-out pairwise accuracy (eval {e.id[:12]})": e.metrics.get("pairwise_accuracy")
           for e in evals if e.stage == "eval_pairs"}})


# ----------------------------------------------------------------------------- preference data


def _pair_sections(store: ArtifactStore, id_: str, samples: int = 5) -> list[str]:
    """Completion lengths of chosen against rejected (both splits, in characters) and the first train pairs."""
    folder = store.get(id_)
    rows = [ex for split in ("train", "eval") for ex in read_examples(folder, split) if is_preference(ex)]
    lengths = {side: [sum(len(t["content"]) for t in ex[side]) for ex in rows] for side in ("chosen", "rejected")}
    sample = [[prompt_messages(ex)[-1]["content"] if prompt_messages(ex) else "", ex["chosen"][-1]["content"],
               ex["rejected"][-1]["content"], ex.get("answer")] for ex in rows[:samples]]
    return [section("lengths", "Completion lengths (characters)", note(
                "Characters of every chosen and rejected continuation, both splits: a preference learner can "
                "reward length alone when one side is systematically longer."),
                charts.histogram("pair-length", "Chosen vs rejected length", lengths, xlabel="characters")
                if rows else note("No preference pair in this dataset.")),
            section("samples", f"Sample pairs (first {len(sample)})", table(
                ("prompt (last turn)", "chosen", "rejected", "answer"), sample, text_columns=(0, 1, 2)))]


def pairs_page(store: ArtifactStore, id_: str) -> str:
    """A pairs dataset made from a model's own samples: pairs per split, prompts that gave none (every sample
    right, or every sample wrong), failed reward calls, the source model, chosen/rejected lengths and sample pairs."""
    m = store.manifest(id_)
    info = json.loads((store.get(id_) / "info.json").read_text())
    outcome = {"gave a pair": m.metrics["num_train"] + m.metrics["num_eval"],
               "all correct": m.metrics["all_correct"], "all wrong": m.metrics["all_wrong"]}
    source_data = [p for p in m.parents if p != m.extra.get("source_model")]
    counts = section("counts", "Pairs", note(
        f"Each prompt was sampled {info.get('samples_per_prompt')} times and every sample scored; a prompt with a "
        "correct and a wrong sample gives one pair (first correct as chosen, first wrong as rejected). Prompts "
        "whose samples all agree give none: they carry no preference."),
        charts.bar_chart("prompts", "Prompts by outcome", list(outcome), {"prompts": list(outcome.values())},
                         ylabel="prompts"),
        key_values({"train pairs": m.metrics["num_train"], "eval pairs": m.metrics["num_eval"],
                    "train prompts sampled": info.get("train_prompts"),
                    "eval prompts sampled": info.get("eval_prompts"),
                    "prompts all correct": m.metrics["all_correct"], "prompts all wrong": m.metrics["all_wrong"],
                    "failed reward calls": m.metrics.get("reward_failures"),
                    "source model": _named(store, m.extra.get("source_model")),
                    "prompts from": ", ".join(p[:12] for p in source_data) or None}))
    return page(f"Pairs {m.name}", [_about(m), counts, *_pair_sections(store, id_)])


def preference_dataset_page(store: ArtifactStore, id_: str) -> str:
    """A user's preference dataset from data prep: its row report (as any dataset's), chosen/rejected lengths
    and sample pairs."""
    m = store.manifest(id_)
    return page(f"Preference dataset {m.name}", [_about(m), _rows_section(m), _dropped_section(m),
                                                 *_pair_sections(store, id_)])


def is_preference_dataset(store: ArtifactStore, m: Manifest) -> bool:
    """A dataset whose info.json says its rows are preference pairs (data prep's, or the pairs stage's)."""
    info = store.get(m.id) / "info.json"
    return m.kind == "dataset" and info.exists() and json.loads(info.read_text()).get("schema") == "preference"


# ----------------------------------------------------------------------------- reward-model eval


def eval_pairs_page(store: ArtifactStore, id_: str) -> str:
    """A reward model's held-out eval: pairwise accuracy with its Wilson 95% interval against chance, the
    chosen and rejected score histograms, the score statistics and the scored sample pairs."""
    m = store.manifest(id_)
    r = json.loads((store.get(id_) / "pairwise.json").read_text())
    acc, n = r["pairwise_accuracy"], r["num_pairs"]
    lo, hi = wilson(acc * n, n)
    accuracy = section("accuracy", "Pairwise accuracy", note(
        f"The share of the {n} held-out pairs whose chosen completion scored above the rejected one (a tie is a "
        "miss), with its 95% Wilson score interval; 0.5 is what a scorer that cannot tell them apart gets."),
        charts.bar_chart("pairwise-accuracy", "Pairwise accuracy (95% Wilson interval)", ["pairwise accuracy"],
                         {"reward model": [acc]}, errors={"reward model": [(lo, hi)]}, ylabel="fraction of pairs",
                         hline=("chance", 0.5)),
        table(("metric", "value", "95% low", "95% high"), [["pairwise accuracy", acc, lo, hi]]),
        key_values({"pairs": n, "mean margin (chosen - rejected)": r["margin_mean"], "seconds": r.get("seconds"),
                    "reward model": _named(store, m.config.get("model_id")),
                    "pairs dataset": (m.config.get("dataset_id") or "")[:12] or None}))
    hist = r["histogram"]
    scores = section("scores", "Scores", charts.binned_histogram(
        "scores", "Scores of chosen and rejected", hist["edges"],
        {"chosen": hist["chosen"], "rejected": hist["rejected"]}, xlabel="score", ylabel="pairs"),
        table(("", "mean", "std", "min", "max"),
              [[side, *(r[side][k] for k in ("mean", "std", "min", "max"))] for side in ("chosen", "rejected")]))
    samples = section("samples", "Samples", table(
        ("prompt", "chosen", "rejected", "chosen score", "rejected score", "chosen wins"),
        [[s["prompt"], s["chosen"], s["rejected"], s["chosen_score"], s["rejected_score"],
          s["chosen_score"] > s["rejected_score"]] for s in r.get("samples", [])], text_columns=(0, 1, 2)))
    return page(f"Reward model eval {m.name}", [_about(m), accuracy, scores, samples])
