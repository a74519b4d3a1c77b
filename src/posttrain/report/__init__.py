"""Readable reports of pipeline artifacts: HTML pages with inline SVG charts (no JavaScript, nothing fetched),
shown as Flyte Decks by the tasks and available without Flyte through `render_page`."""

from __future__ import annotations

import json

from posttrain.artifacts import ArtifactStore


def render_page(store: ArtifactStore, artifact_id: str, *, standalone: bool = True) -> str:
    """The HTML page of one artifact (an id or a unique prefix), chosen by its kind and, for a model, the stage
    that made it: dataset (a preference dataset: its pairs), SFT model, RL model (its manifest has a policy
    version), DPO, distilled or reward model, pairs from a model's samples, prompts selected by pass rate, eval, a reward model's pairwise eval
    or promotion decision; other artifacts (a tokenizer, a base model) get their manifest's summary.
    `standalone`: a complete document (to save as a file); else the fragment a Flyte Deck takes."""
    from posttrain.report import dense_pages, pages
    from posttrain.report.html import document

    m = store.manifest(artifact_id)
    by_stage = {"dataset": pages.dataset_page, "pass_rate": pages.pass_rate_page, "sft": pages.sft_page, "rl": pages.rl_page, "eval": pages.eval_page,
                "dpo": dense_pages.dpo_page, "distill": dense_pages.distill_page,
                "reward_model": dense_pages.reward_model_page, "pairs": dense_pages.pairs_page,
                "eval_pairs": dense_pages.eval_pairs_page}
    if m.kind == "decision":
        fragment = pages.promotion_page(json.loads((store.get(m.id) / "decision.json").read_text()))
    elif m.stage == "dataset" and dense_pages.is_preference_dataset(store, m):
        fragment = dense_pages.preference_dataset_page(store, m.id)
    elif m.stage in by_stage:
        fragment = by_stage[m.stage](store, m.id)
    else:
        fragment = pages.artifact_page(m)
    return document(fragment, f"{m.kind} {m.name}") if standalone else fragment
