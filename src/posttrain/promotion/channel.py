"""Channels and the promotion gate, judged like with like.

A channel ("production") holds one model and pins the problems every candidate is judged on:

    channels/<channel>.json        the holder: model_id, eval_id, greedy_accuracy, decision_id
    channels/<channel>/pin.json    the pinned eval set: eval_dataset_id (+ guard_dataset_ids); written once, by
                                   the channel's first decision (or `posttrain promote --pin`)

The gate compares the candidate and the current holder evaluated on exactly the pinned datasets' eval splits
with the same settings (same engine, seeds, k, reward - the eval artifacts' configs must match): the candidate
is promoted only if its greedy accuracy on the pinned set reaches `min_accuracy` and, on the pinned set and
every guard set, is not below the holder's by more than `tolerance`; with `require_gain`, also only if its
problem-by-problem change over the holder on the pinned set has a 95% interval above 0 (a gain that is not
noise: posttrain.eval.compare.paired_greedy). Every decision against a holder records that paired change on
each set. Evaluating is the caller's job
(posttrain.stages.gate runs both evaluations); `gate` checks the evaluations really are those, decides, and stores
the decision as a `decision` artifact - decision.json with the time, inputs, thresholds, both sides'
accuracies and the reason; parents: the candidate model and every evaluation of both models - so the
decision, both evaluations and the thresholds are reachable by lineage (`posttrain lineage DECISION`), and
the holder's pointer names the decision that put it there. Refusals are stored the same way.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import fsspec

from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.handles import ArtifactRef
from posttrain.artifacts.state import get_text, put_text


@dataclass(frozen=True, kw_only=True)
class Decision:
    promoted: bool
    reason: str
    decision_id: str
    """The `decision` artifact that records it."""


class PromotionError(ValueError):
    """The gate was given something it cannot judge: not a model, evaluations of another model, on other
    problems or with other settings than the pinned ones, or a channel without a pinned eval set."""


def _channels_dir(store: ArtifactStore) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, root = fsspec.core.url_to_fs(str(store.root))
    return fs, f"{root.rstrip('/')}/channels"


def _channel_file(store: ArtifactStore, rel: str) -> str:
    """Path or URL of `channels/<rel>` under the store's root."""
    return f"{str(store.root).rstrip('/')}/channels/{rel}"


def _read_json(store: ArtifactStore, rel: str) -> dict | None:
    text = get_text(_channel_file(store, rel))
    return json.loads(text) if text is not None else None


def _write_json(store: ArtifactStore, rel: str, data: dict) -> None:
    """Readers see the old file or the new one (artifacts.state.put_text)."""
    put_text(_channel_file(store, rel), json.dumps(data))


def current(channel: str, store: ArtifactStore | None = None) -> dict | None:
    """The channel's holder {"model_id", "eval_id", "greedy_accuracy", "decision_id"}; None before the first
    promotion."""
    return _read_json(store or ArtifactStore(), f"{channel}.json")


def pin(channel: str, store: ArtifactStore | None = None) -> dict | None:
    """The channel's pinned eval set {"eval_dataset_id", "guard_dataset_ids"}; None until its first decision."""
    return _read_json(store or ArtifactStore(), f"{channel}/pin.json")


def set_pin(channel: str, eval_dataset: ArtifactRef, guards: list[ArtifactRef], store: ArtifactStore) -> dict:
    """Pin the channel's eval set - once: judging later candidates on other problems would compare unlike
    with unlike, so an existing pin is refused (start a new channel instead)."""
    if pin(channel, store) is not None:
        raise PromotionError(f"channel {channel!r} already pins its eval set {pin(channel, store)}; a channel's "
                             "eval set never changes (use a new channel to judge on other problems)")
    for d in [eval_dataset, *guards]:
        if d.kind != "dataset":
            raise PromotionError(f"{d.short} is a {d.kind} artifact ({d.name}), not a dataset to pin")
    data = {"eval_dataset_id": eval_dataset.id, "guard_dataset_ids": [g.id for g in guards]}
    _write_json(store, f"{channel}/pin.json", data)
    return data


def channels(store: ArtifactStore | None = None) -> list[str]:
    """Every channel with a holder, a pin or a decision, sorted by name."""
    store = store or ArtifactStore()
    fs, base = _channels_dir(store)
    names = {m.config["channel"] for m in store.list(kind="decision")}
    if fs.exists(base):
        for p in fs.ls(base, detail=False):
            name = os.path.basename(p.rstrip("/"))
            names.add(name.removesuffix(".json"))
    return sorted(names)


def decisions(channel: str, store: ArtifactStore | None = None) -> list[dict]:
    """The channel's decisions (decision.json of each `decision` artifact, with its id), newest first."""
    return decisions_by_channel(store or ArtifactStore(), only=channel).get(channel, [])


def decisions_by_channel(store: ArtifactStore, only: str | None = None) -> dict[str, list[dict]]:
    """Channel -> its decisions, newest first, each decision record read once (`only`: one channel's)."""
    out: dict[str, list[dict]] = {}
    for m in store.list(kind="decision"):
        if only is None or m.config.get("channel") == only:
            record = json.loads((store.get(m.id) / "decision.json").read_text())
            out.setdefault(m.config["channel"], []).append({**record, "decision_id": m.id})
    return {c: sorted(ds, key=lambda d: d["time"], reverse=True) for c, ds in out.items()}


def _eval_of(store: ArtifactStore, eval_ref: ArtifactRef, model_id: str, who: str) -> tuple[str, dict, float]:
    """(dataset id, eval settings, greedy accuracy) of an eval that must have been made from `model_id`."""
    m = store.manifest(eval_ref.id)
    if m.kind != "eval" or "greedy_accuracy" not in m.metrics:
        raise PromotionError(f"{eval_ref.short} is a {m.kind} artifact ({m.name}), not an eval with a greedy accuracy")
    if model_id not in m.parents:
        raise PromotionError(f"eval {eval_ref.short} was not made from the {who} {model_id[:12]} (its parents: "
                             f"{[p[:12] for p in m.parents]})")
    settings = {k: v for k, v in m.config.items() if k not in ("model_id", "dataset_id")}
    return m.config.get("dataset_id", ""), settings, float(m.metrics["greedy_accuracy"])


def gate(*, channel: str, model: ArtifactRef, evals: list[ArtifactRef], holder_evals: list[ArtifactRef],
         min_accuracy: float, tolerance: float, run_id: str, store: ArtifactStore | None = None,
         require_gain: bool = False, changes: list[dict | None] = ()) -> Decision:
    """Decide on `model` for `channel` from its evaluations on the pinned set and each guard set, in the pin's
    order (`evals`), and the current holder's on the same sets with the same settings (`holder_evals`; empty
    while the channel holds nothing). `changes`: per set, the candidate's greedy change over the holder problem
    by problem - {n, gained, lost, change, low, high, p_value} (posttrain.eval.compare.paired_greedy, which
    stages.gate computes) or None where the reports keep no problems. Stores the decision; moves the pointer
    only on a promotion."""
    store = store or ArtifactStore()
    if model.kind != "model":
        raise PromotionError(f"{model.short} is a {model.kind} artifact ({model.name}), not a model")
    pinned = pin(channel, store)
    if pinned is None:
        raise PromotionError(f"channel {channel!r} has no pinned eval set yet (set_pin first)")
    sets = [pinned["eval_dataset_id"], *pinned["guard_dataset_ids"]]
    held = current(channel, store)
    cand = [_eval_of(store, e, model.id, "candidate") for e in evals]
    hold = [_eval_of(store, e, held["model_id"], "current holder") for e in holder_evals] if held else []
    if [c[0] for c in cand] != sets or (held and [h[0] for h in hold] != sets):
        raise PromotionError(f"channel {channel!r} judges on datasets {[s[:12] for s in sets]} (pinned set, then "
                             f"guards): one evaluation of each model on each, in that order")
    if any(c[1] != cand[0][1] for c in cand) or any(h[1] != cand[0][1] for h in hold):
        raise PromotionError("the candidate's and the holder's evaluations must use the same settings (engine, "
                             "seeds, k, temperature, reward)")
    paired = list(changes) + [None] * (len(holder_evals) - len(changes))
    if require_gain and held and paired[0] is None:
        raise PromotionError(f"require_gain needs both evaluations' per-problem results on the pinned set: eval "
                             f"{evals[0].short} or {holder_evals[0].short} was written before they were kept "
                             "(evaluate again)")
    promoted, reason = _judge(channel, [c[2] for c in cand], [h[2] for h in hold], held, min_accuracy, tolerance)
    if promoted and require_gain and held and paired[0]["low"] <= 0:
        c = paired[0]
        promoted, reason = False, (f"require_gain: the change over current {channel} model {held['model_id'][:12]} "
                                   f"on the pinned set is {c['change']:+.3f} (95% interval {c['low']:+.3f} to "
                                   f"{c['high']:+.3f}; {c['gained']} gained, {c['lost']} lost of {c['n']}), "
                                   "an interval that does not lie above 0")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    record = {"time": now, "channel": channel, "model_id": model.id, "eval_id": evals[0].id,
              "greedy_accuracy": cand[0][2], "eval_dataset_ids": sets, "eval_ids": [e.id for e in evals],
              "holder": None if held is None else {"model_id": held["model_id"], "eval_ids": [e.id for e in holder_evals],
                                                   "greedy_accuracy": hold[0][2],
                                                   "greedy_accuracies": [h[2] for h in hold]},
              "greedy_accuracies": [c[2] for c in cand], "min_accuracy": min_accuracy, "tolerance": tolerance,
              "require_gain": require_gain, "paired_changes": paired,
              "promoted": promoted, "reason": reason}
    with tempfile.TemporaryDirectory(prefix="posttrain-decision-") as tmp:
        (Path(tmp) / "decision.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        ref = store.put("decision", f"{channel}-{'promoted' if promoted else 'refused'}", tmp, run_id=run_id,
                        parents=[model.id, *(e.id for e in evals), *(e.id for e in holder_evals)],
                        config={"channel": channel, "min_accuracy": min_accuracy, "tolerance": tolerance,
                                "require_gain": require_gain, "eval_dataset_ids": sets},
                        metrics={"promoted": promoted, "greedy_accuracy": cand[0][2],
                                 "holder_greedy_accuracy": hold[0][2] if hold else None})
    if promoted:
        _write_json(store, f"{channel}.json", {"model_id": model.id, "eval_id": evals[0].id,
                                              "greedy_accuracy": cand[0][2], "decision_id": ref.id})
    return Decision(promoted=promoted, reason=reason, decision_id=ref.id)


def _judge(channel: str, cand: list[float], hold: list[float], held: dict | None, min_accuracy: float,
           tolerance: float) -> tuple[bool, str]:
    names = ["pinned set"] + [f"guard set {i}" for i in range(1, len(cand))]
    if cand[0] < min_accuracy:
        return False, f"greedy accuracy {cand[0]:.3f} on the pinned set < min_accuracy {min_accuracy:.3f}"
    for name, c, h in zip(names, cand, hold):
        if c < h - tolerance:
            return False, (f"greedy accuracy {c:.3f} on the {name} < current {channel} model "
                           f"{held['model_id'][:12]}'s {h:.3f} - tolerance {tolerance:.3f}")
    if not held:
        return True, f"greedy accuracy {cand[0]:.3f} >= min_accuracy {min_accuracy:.3f} (the channel held no model)"
    return True, (f"greedy accuracy {cand[0]:.3f} >= min_accuracy {min_accuracy:.3f}, and on every set >= current "
                  f"model {held['model_id'][:12]}'s - tolerance {tolerance:.3f} "
                  f"({', '.join(f'{c:.3f} vs {h:.3f}' for c, h in zip(cand, hold))})")
