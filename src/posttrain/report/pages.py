"""One HTML page per pipeline stage, built from what the stage stored: the artifact's manifest (metrics and,
for training runs, the per-step `history` in `extra`) and its files. The Flyte tasks show them as Decks;
`render_page` (posttrain.report) gives the same text without Flyte."""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.manifest import Manifest
from posttrain.data.examples import completion_text, prompt_messages, read_examples
from posttrain.eval.compare import paired_greedy, start_eval
from posttrain.eval.intervals import PairedChange, wilson
from posttrain.eval.report import EvalReport
from posttrain.report import charts
from posttrain.report.html import key_values, note, page, section, table


def _about(m: Manifest) -> str:
    """The artifact's identity and origin, as the first section of every page."""
    return section("artifact", "Artifact", key_values({
        "id": m.id, "kind": m.kind, "name": m.name, "run": m.run_id, "created": m.created,
        "parents": ", ".join(p[:12] for p in m.parents) or None}))


def _curves(history: list[dict], keys: tuple[str, ...]) -> dict[str, list[float]]:
    """{key: its value at every step} for the keys the history holds."""
    return {k: [h.get(k) for h in history] for k in keys if any(k in h for h in history)}


def _no_history(stage: str) -> str:
    return section("history", "Per-step history", note(
        f"This {stage} model's manifest holds no per-step history (it was stored before histories were kept)."))


def _rows_section(m: Manifest) -> str:
    """Rows per source file and where they went (data prep's row report in the manifest's extra)."""
    per_file = m.extra.get("rows_per_file", [])
    explain = note("A dataset is stored only when every row is valid (data prep refuses the whole input otherwise), "
                   "so the rows left out of a stored dataset are exact duplicates and rows whose prompt is a "
                   "held-out eval problem.")
    if not per_file:
        return section("rows", "Rows", explain, key_values(m.metrics),
                       note("No per-file counts in this manifest (stored before they were kept)."))
    outcome = {k: [r[k] for r in per_file] for k in ("train", "eval", "duplicates", "eval_prompt")}
    return section("rows", "Rows per source file", explain, charts.bar_chart(
        "rows", "Rows per file", [Path(r["file"]).name for r in per_file], outcome, ylabel="rows", stacked=True),
        table(("file", "rows", "train", "eval", "duplicates", "same prompt as eval"),
              [[r["file"], r["rows"], r["train"], r["eval"], r["duplicates"], r["eval_prompt"]] for r in per_file]))


def _dropped_section(m: Manifest) -> str:
    """The sample of left-out rows data prep kept, with the reason for each."""
    dropped = m.extra.get("dropped_sample", [])
    return section("dropped", "Left-out rows (sample)",
                   table(("where", "reason", "prompt"), [[d["where"], d["reason"], d["prompt"]] for d in dropped],
                         text_columns=(2,)) if dropped else note("No row was left out (or none were recorded)."))


def _lengths_section(folder: Path) -> str:
    """Prompt and completion length histograms of both splits, in characters."""
    prompts, completions = {}, {}
    for split in ("train", "eval"):
        examples = read_examples(folder, split)
        prompts[split] = [sum(len(t["content"]) for t in prompt_messages(ex)) for ex in examples]
        completions[split] = [len(c) for ex in examples if (c := completion_text(ex)) is not None]
    return section("lengths", "Lengths (characters)", note(
        "Characters, not tokens: a dataset is made before any model's tokenizer is chosen. Prompt: every turn "
        "before the final assistant turn; completion: that turn (rows without one are left out)."),
        charts.histogram("prompt-length", "Prompt length", prompts, xlabel="characters"),
        charts.histogram("completion-length", "Completion length", {k: v for k, v in completions.items() if v},
                         xlabel="characters") if any(completions.values()) else note("No row has a completion."))


def dataset_page(store: ArtifactStore, id_: str) -> str:
    """Rows kept and left out per source file, a sample of left-out rows with the reason, and prompt and
    completion length histograms (in characters: data prep runs before any tokenizer exists)."""
    m = store.manifest(id_)
    return page(f"Dataset {m.name}", [_about(m), _rows_section(m), _dropped_section(m),
                                      _lengths_section(store.get(id_))])


def pass_rate_page(store: ArtifactStore, id_: str) -> str:
    """RL's prompts selected by pass rate (data.pass_rate): how many prompts had each rate under the start model,
    which were kept, and the counts."""
    m = store.manifest(id_)
    pr = json.loads((store.get(id_) / "info.json").read_text())["pass_rate"]
    k, lo, hi = pr["samples_per_prompt"], pr["min_rate"], pr["max_rate"]
    counts = [0] * (k + 1)
    for _, rate in pr["rates"]:
        counts[round(rate * k)] += 1
    kept = [c if lo < j / k < hi else 0 for j, c in enumerate(counts)]
    chart = charts.bar_chart("pass-rates", "Prompts by pass rate", [f"{j}/{k}" for j in range(k + 1)],
                             {"kept": kept, "left out": [c - x for c, x in zip(counts, kept)]}, ylabel="prompts",
                             stacked=True)
    return page(f"Prompts by pass rate {m.name}", [_about(m), section("rates", "Pass rates", note(
        f"The start model sampled {k} answers to each train prompt; a prompt is kept when its pass rate lies "
        f"strictly between {lo} and {hi}. The eval split is kept whole."), chart, key_values({
            "prompts measured": pr["sampled"], "kept": pr["kept"], "never solved": pr["never_solved"],
            "always solved": pr["always_solved"], "mean rate": round(pr["mean_rate"], 3),
            "failed reward calls": pr["reward_failures"], "start model": m.extra.get("source_model", "")[:12],
            "dataset": m.extra.get("source_dataset", "")[:12]}))])


def sft_page(store: ArtifactStore, id_: str) -> str:
    """Loss, learning rate, gradient norm and tokens/s per step, with the run's wall time and final numbers."""
    m = store.manifest(id_)
    history = m.extra.get("history", [])
    summary = section("summary", "Summary", key_values({
        "wall time (s)": m.metrics.get("wall_s"), "steps": m.metrics.get("steps"),
        "ranks": m.metrics.get("world_size"), "train examples": m.metrics.get("train_examples"),
        "dropped (too long)": m.metrics.get("dropped_too_long"), "final loss": m.metrics.get("loss"),
        "start model": (m.extra.get("start_model") or "from scratch")[:12]}))
    if not history:
        return page(f"SFT {m.name}", [_about(m), summary, _no_history("SFT")])
    steps = [h["step"] for h in history]
    curves = section("curves", "Per-step curves", *[
        charts.line_chart(key.replace("_", "-"), title, steps, _curves(history, (key,)), logy=key == "loss")
        for key, title in (("loss", "Loss (mean over assistant tokens)"), ("lr", "Learning rate"),
                           ("grad_norm", "Gradient norm (before clipping)"), ("tokens_per_s", "Tokens/s"))])
    return page(f"SFT {m.name}", [_about(m), summary, curves])


_RL_CURVES = (
    ("reward", "Reward and accuracy", ("reward_mean", "reward_std", "accuracy")),
    ("kl", "KL to the reference", ("kl",)),
    ("entropy", "Entropy", ("entropy",)),
    ("response-length", "Response length (tokens)", ("response_len_mean",)),
    ("clip-fraction", "Clip fraction", ("clip_fraction",)),
    ("drift", "Drift |rollout - policy logprob|", ("drift",)),
    ("policy-version", "Policy version", ("policy_version",)),
    ("reward-failures", "Failed reward calls", ("reward_failures",)),
)
"""(chart name, title, StepMetrics.flat() keys) of the RL page's line charts."""


def _phase_times(history: list[dict], algorithm: str | None) -> dict[str, list[float]]:
    """Seconds per phase at every step (the `time/<phase>_s` keys) in the order the algorithm runs them
    (`loops.ALGORITHMS`; the manifest's JSON keeps keys sorted), plus `other`: the rest of the step's wall time."""
    from posttrain.rl.loops import ALGORITHMS

    known = next((spec.phases for a, spec in ALGORITHMS.items() if a.value == algorithm), ())
    found = {k[len("time/"):-len("_s")] for h in history for k in h if k.startswith("time/")}
    order = [p for p in known if p in found] + sorted(found - set(known))
    phases = [f"time/{p}_s" for p in order]
    out = {p: [h.get(k, 0.0) for h in history] for p, k in zip(order, phases)}
    out["other"] = [max(h["step_s"] - sum(h.get(k, 0.0) for k in phases), 0.0) for h in history]
    return out


CURRICULUM_CURVES = ("pass_rate/kept_fraction", "pass_rate/in_band_fraction", "pass_rate/never_fraction",
                     "pass_rate/always_fraction", "pass_rate/mean_rate")
"""posttrain.rl.curriculum's metrics: the kept fraction every step, the rest at each refresh."""


def _extra_curves(history: list[dict]) -> dict[str, tuple[str, ...]]:
    """The algorithm's own metrics (StepMetrics.extra: "critic/value_loss", "adv/mean", ...), one chart per
    name prefix, so a new algorithm's curves appear without a change here."""
    keys = sorted({k for h in history for k in h
                   if "/" in k and not k.startswith(("time/", "compute/", "idle/", "pass_rate/"))})
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(k.split("/", 1)[0], []).append(k)
    return {p: tuple(ks) for p, ks in out.items()}


def rl_page(store: ArtifactStore, id_: str) -> str:
    """Reward, accuracy, KL, entropy, response length, clip fraction, drift and policy version per step, the
    step's seconds per phase stacked, and failed reward calls."""
    m = store.manifest(id_)
    history = m.extra.get("history", [])
    summary = section("summary", "Summary", key_values({
        "steps": m.extra.get("step"), "policy version": m.extra.get("policy_version"),
        "algorithm": m.extra.get("algorithm"), "start model": (m.extra.get("start_model") or "")[:12] or None,
        "total step time (s)": sum(h["step_s"] for h in history) if history else None,
        "failed reward calls": sum(h.get("reward_failures", 0) for h in history) if history else None}),
        note("Restarts after a lost worker are not recorded in the manifest; a restarted run resumes from its "
             "last checkpoint, so every step appears once."))
    if not history:
        return page(f"RL {m.name}", [_about(m), summary, _no_history("RL")])
    steps = [h["step"] for h in history]
    curves = section("curves", "Per-step curves", *[
        charts.line_chart(name, title, steps, _curves(history, keys)) for name, title, keys in _RL_CURVES],
        *[charts.line_chart(f"algo-{prefix}", f"{prefix} ({m.extra.get('algorithm')})", steps, _curves(history, keys))
          for prefix, keys in _extra_curves(history).items()],
        *([charts.line_chart("curriculum", "Pass-rate curriculum (data.pass_rate.refresh_every): the share of the "
                                           "pool drawn from, and each refresh's measure of the pool", steps,
                             _curves(history, CURRICULUM_CURVES))]
          if any("pass_rate/kept_fraction" in h for h in history) else []))
    timing = section("timing", "Time per step", charts.stacked_area(
        "phases", "Seconds per phase (controller's view)", steps, _phase_times(history, m.extra.get("algorithm"))),
        charts.line_chart("overhead", "Orchestration overhead (share of the step no worker computed)", steps,
                          _curves(history, ("orchestration_overhead",))),
        *([charts.line_chart("idle", "Idle share of the step per role (the bubble: 1 - its workers' compute / the "
                                     "step's wall; rollout ahead of the update, rl.max_staleness, fills it)", steps,
                             _curves(history, ("idle/rollout", "idle/update")))]
          if any("idle/rollout" in h for h in history) else []))
    episodes = [_rl_episodes_section(m.extra["episodes"], m.extra.get("step"))] if m.extra.get("episodes") else []
    return page(f"RL {m.name}", [_about(m), summary, curves, timing, *episodes])


def _rl_episodes_section(episodes: list[dict], step: int | None) -> str:
    """A multi-turn run's last step: its first episodes turn by turn, with the reward each got."""
    tables = [part for e in episodes for part in (
        note(f"{e['prompt']!r}: reward {e['reward']:.3g}"),
        table(("turn", "who", "text"), [[i + 1, who, text] for i, (who, text) in enumerate(e["turns"])],
              text_columns=(2,)))]
    return section("episodes", "Episodes", note(
        f"The first episodes of step {step}, turn by turn: the policy's turns, the tools' results and the "
        "environment's observations. Per step, the env charts above count turns, tool calls and failed calls; "
        "the environment's answers are their own phase in the time per step."), *tables)


def _rates(r: EvalReport) -> dict[str, tuple[float, tuple[float, float]]]:
    """{metric: (value, Wilson 95% interval)} for the metrics the report measured, each over its problems."""
    n = r.num_problems
    values = {"greedy": r.greedy_accuracy, "sampled": r.sampled_accuracy, f"pass@{r.k}": r.pass_at_k}
    return {k: (v, wilson(v * n, n)) for k, v in values.items() if v is not None}


def eval_page(store: ArtifactStore, id_: str) -> str:
    """Greedy, sampled and pass@k accuracy with Wilson 95% intervals, the start model's eval beside them when
    the store has one on the same dataset, and the per-problem sample table."""
    m = store.manifest(id_)
    r = EvalReport.from_json((store.get(id_) / "report.json").read_text())
    rates = _rates(r)
    start = start_eval(store, m)
    start_report = EvalReport.from_json((store.get(start.id) / "report.json").read_text()) if start else None
    series, errors = {"this model": [v for v, _ in rates.values()]}, {"this model": [ci for _, ci in rates.values()]}
    if start_report is not None:
        sr = _rates(start_report)
        if sr.keys() == rates.keys():
            series["start model"], errors["start model"] = [v for v, _ in sr.values()], [ci for _, ci in sr.values()]
    scores = section("scores", "Accuracy", note(
        f"95% Wilson score intervals over the {r.num_problems} problems (sampled accuracy: each problem's mean "
        f"over k={r.k} samples counted as one observation, which is conservative). Scorer: {r.scorer}."),
        charts.bar_chart("accuracy", "Accuracy (95% Wilson interval)", list(rates), series, errors=errors,
                         ylabel="fraction correct"),
        table(("metric", "value", "95% low", "95% high"), [[k, v, lo, hi] for k, (v, (lo, hi)) in rates.items()]),
        key_values({"failed reward calls": f"{r.reward_failures}/{r.reward_calls}",
                    "mean response tokens": r.mean_response_tokens, "seconds": r.seconds}))
    parts = [_about(m), scores]
    if start is not None:
        rows = [[k, start.metrics.get(key), m.metrics.get(key),
                 None if start.metrics.get(key) is None or m.metrics.get(key) is None
                 else f"{m.metrics[key] - start.metrics[key]:+.3f}"]
                for k, key in (("greedy", "greedy_accuracy"), ("sampled", "sampled_accuracy"), ("pass@k", "pass_at_k"))]
        paired = paired_greedy(r, start_report)
        parts.append(section("comparison", "Against the start model", note(
            f"The start model's eval {start.id[:12]} on the same dataset."),
            table(("metric", "start model", "this model", "change"), rows),
            note("Greedy change, problem by problem: " + paired.summary() if paired is not None else
                 "Greedy change, problem by problem: not available (the two evaluations did not keep the same "
                 "problems' results)")))
    if r.episodes is not None:
        parts.append(_episodes_section(r))
    parts.append(section("samples", "Samples", table(
        ("prompt", "completion (greedy)" if r.episodes is None else "last turn (greedy)", "answer", "reward", "correct"),
        [[s.get("prompt"), s.get("greedy"), s.get("answer"), s.get("score"), s.get("correct")] for s in r.samples],
        text_columns=(0, 1))))
    return page(f"Eval {m.name}", parts)


EPISODES_SHOWN = 3
"""Greedy episodes shown turn by turn on an eval page in an environment (those of several turns first)."""


def _episodes_section(r: EvalReport) -> str:
    """In an environment: what happened over all episodes, and the first greedy episodes turn by turn."""
    e = r.episodes
    facts = {"environment": e["environment"] or "(tools only)", "tools": ", ".join(e["tools"]) or "none",
             "episodes (greedy + sampled)": e["episodes"], "turns per episode": e["turns_mean"],
             "tool calls per episode": e["tool_calls_mean"], "finished": e["finished"],
             "failed tool calls": ", ".join(f"{k} {v}" for k, v in sorted(e["tool_failures"].items())) or "none",
             "environment's reward per episode": "none given" if e["env_reward_mean"] is None else e["env_reward_mean"]}
    with_env = [s for s in r.samples if len(s.get("episode") or ()) > 1]  # those where the environment spoke first
    shown = (with_env + [s for s in r.samples if s.get("episode") and s not in with_env])[:EPISODES_SHOWN]
    tables = [part for s in shown for part in (
        note(f"{s.get('prompt')!r} (answer {s.get('answer')!r}): {'correct' if s.get('correct') else 'wrong'}"),
        table(("turn", "who", "text"), [[i + 1, who, text] for i, (who, text) in enumerate(s["episode"])],
              text_columns=(2,)))]
    return section("episodes", "Episodes", note(
        "Each problem was an episode in the environment; its last sampled turn was scored. Response tokens count "
        "the model's own only."), key_values(facts), *tables)


def promotion_page(decision: dict) -> str:
    """A promotion gate decision (the record posttrain.promotion stores: channel, model_id, eval_id,
    greedy_accuracy, min_accuracy, holder, promoted, reason; with guard sets also greedy_accuracies per set,
    eval_dataset_ids and tolerance): the verdict, and the candidate's greedy accuracy on each set against the
    bar and the current holder's."""
    holder = decision.get("holder")
    cand = decision["greedy_accuracies"]
    sets = ["pinned set"] + [f"guard set {i}" for i in range(1, len(cand))]
    series = {"candidate": cand}
    if holder:
        series["current holder"] = holder["greedy_accuracies"]
    verdict = '<p class="ok">promoted</p>' if decision["promoted"] else '<p class="bad">not promoted</p>'
    body = section("decision", f"Channel {decision['channel']}", verdict, note(decision["reason"]),
                   charts.bar_chart("promotion", "Greedy accuracy per eval set", sets, series,
                                    ylabel="fraction correct", hline=("min accuracy", decision["min_accuracy"])),
                   key_values({"model": decision["model_id"], "eval": decision["eval_id"],
                               "min accuracy": decision["min_accuracy"], "tolerance": decision["tolerance"],
                               "require gain": decision.get("require_gain", False),
                               "holder model": holder["model_id"] if holder else None, "time": decision.get("time")}))
    changes = [(name, PairedChange(**c)) for name, c in zip(sets, decision.get("paired_changes") or []) if c]
    parts = [body]
    if changes:  # decisions against a holder, made since paired changes were recorded
        parts.append(section("paired", "Change over the holder, problem by problem", note(
            "Greedy accuracy after - before on the same problems: Newcombe's 95% interval for paired proportions "
            "and McNemar's exact p-value."), table(
            ("set", "change", "95% low", "95% high", "gained", "lost", "problems", "McNemar p"),
            [[name, c.change, c.low, c.high, c.gained, c.lost, c.n, c.p_value] for name, c in changes])))
    return page(f"Promotion to {decision['channel']}", parts)


def artifact_page(m: Manifest) -> str:
    """Any other artifact (a tokenizer, a base model): its identity, metrics and extra fields."""
    return page(f"{m.kind.capitalize()} {m.name}", [_about(m), section("metrics", "Metrics", key_values(m.metrics)),
                                                    section("extra", "Extra", key_values(m.extra))])
