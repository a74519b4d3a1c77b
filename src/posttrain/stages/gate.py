"""The promotion gate with its evaluations: the candidate AND the channel's current holder, each evaluated on
the channel's pinned eval set (and guard sets) with the same eval settings in the same run, then
`promotion.gate`. Used by the retrain workflow's promote task and by `posttrain promote`.

The first decision of a channel pins its eval set: `pin_to` (the run's dataset) unless the channel already
pins one. Evaluations are stage-cached by (settings, model, dataset), so a holder already evaluated with these
settings on these problems is not evaluated again - the numbers are the same either way.
"""

from __future__ import annotations

from dataclasses import asdict

from posttrain import promotion, stages
from posttrain.artifacts import ArtifactStore
from posttrain.artifacts.handles import ArtifactRef
from posttrain.config import EvalConfig, RewardConfig
from posttrain.eval.compare import paired_greedy
from posttrain.eval.report import EvalReport


def judge(*, channel: str, model: ArtifactRef, pin_to: ArtifactRef | None, eval_cfg: EvalConfig,
          reward: RewardConfig, min_accuracy: float, tolerance: float, run_id: str,
          store: ArtifactStore, guards: tuple[ArtifactRef, ...] = (), explicit_pin: bool = False,
          require_gain: bool = False) -> promotion.Decision:
    """`pin_to` pins the channel's eval set if it has none; `explicit_pin` (the user asked for that pin, e.g.
    `posttrain promote --pin`): a channel pinned to another set is an error rather than ignored."""
    pinned = promotion.pin(channel, store)
    if pinned is not None and explicit_pin and pin_to is not None and pin_to.id != pinned["eval_dataset_id"]:
        raise promotion.PromotionError(f"channel {channel!r} already pins its eval set "
                                       f"{pinned['eval_dataset_id'][:12]}, not {pin_to.short}; a channel's eval set "
                                       "never changes (use a new channel to judge on other problems)")
    if pinned is None:
        if pin_to is None:
            raise promotion.PromotionError(f"channel {channel!r} has no pinned eval set yet: give a dataset to pin "
                                           "(posttrain promote --pin DATASET_ID)")
        pinned = promotion.set_pin(channel, pin_to, list(guards), store)
        print(f"promote: channel {channel} pins eval set {pin_to.short} (guards: {[g.short for g in guards]})")
    elif guards:
        raise promotion.PromotionError(f"channel {channel!r} already pins its eval set; guards are set with the pin")
    sets = [store.ref(i) for i in [pinned["eval_dataset_id"], *pinned["guard_dataset_ids"]]]
    held = promotion.current(channel, store)

    def evaluations(m: ArtifactRef) -> list[ArtifactRef]:
        return [stages.evaluate(eval_cfg, reward, model=m, dataset=d, run_id=run_id, store=store).report for d in sets]

    candidate = evaluations(model)
    holder = evaluations(store.ref(held["model_id"])) if held else []
    changes = [_paired(store, c, h) for c, h in zip(candidate, holder)]
    d = promotion.gate(channel=channel, model=model, evals=candidate, holder_evals=holder, min_accuracy=min_accuracy,
                       tolerance=tolerance, run_id=run_id, store=store, require_gain=require_gain, changes=changes)
    print(f"promote: {'PROMOTED' if d.promoted else 'REFUSED'} model {model.short} for channel {channel}: {d.reason} "
          f"(decision {d.decision_id[:12]}: posttrain lineage {d.decision_id[:12]})", flush=True)
    return d


def _paired(store: ArtifactStore, candidate: ArtifactRef, holder: ArtifactRef) -> dict | None:
    """The candidate's greedy change over the holder on one set, problem by problem (None: a report that keeps
    no per-problem results)."""
    read = [EvalReport.from_json((store.get(e.id) / "report.json").read_text()) for e in (candidate, holder)]
    change = paired_greedy(*read)
    return asdict(change) if change is not None else None
