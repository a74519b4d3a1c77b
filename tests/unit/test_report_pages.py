"""The report pages (posttrain.report): each builder's sections and charts, from real manifests (the dense
stages' - DPO, reward model, distillation, pairs, pairwise eval - made by the stages on a world of one); the data
prep row report; and a Deck made by a task in a local flytekit execution."""

from __future__ import annotations

import json
import re

import pytest

from posttrain.eval.intervals import wilson
from posttrain.report import pages, render_page
from tests.report_inputs import EXPECTED, build_store, decision


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("report"))


def _series(html: str, chart: str) -> set[str]:
    """The series ids drawn in one chart of a page."""
    return set(re.findall(rf'id="{chart}--series-([a-z0-9-]+)"', html))


def _charts(html: str) -> dict[str, set[str]]:
    """Every chart of a page -> its series ids."""
    return {c: _series(html, c) for c in re.findall(r'<figure class="chart" id="chart-([a-z0-9-]+)"', html)}


def pages_of(store, id_: str) -> str:
    """The artifact's page as a Deck fragment, picked by render_page as the tasks and `posttrain show --html` do."""
    return render_page(store, id_, standalone=False)


def test_wilson_interval_stays_in_bounds_and_matches_known_values():
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_paired_change_interval_agrees_with_a_paired_bootstrap_and_mcnemar_is_exact():
    """Newcombe's paired interval (posttrain.eval.intervals.paired_change) against a seeded paired bootstrap on 500
    problems (60 gained, 20 lost); swapping before and after negates it; McNemar's exact p on known counts."""
    import random

    from posttrain.eval.intervals import mcnemar_exact, paired_change

    before = [True] * 20 + [False] * 60 + [True] * 20 + [False] * 400
    after = [True] * 20 + [True] * 60 + [False] * 20 + [False] * 400
    c = paired_change(after, before)
    assert (c.n, c.gained, c.lost, c.change) == (500, 60, 20, pytest.approx(0.08))
    rng, diffs = random.Random(0), []
    for _ in range(4000):
        idx = [rng.randrange(500) for _ in range(500)]
        diffs.append(sum(after[i] - before[i] for i in idx) / 500)
    diffs.sort()
    assert c.low == pytest.approx(diffs[100], abs=0.004) and c.high == pytest.approx(diffs[3899], abs=0.004)
    back = paired_change(before, after)
    assert (back.low, back.high) == pytest.approx((-c.high, -c.low), abs=1e-12)
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024) and mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(60, 20) < 1e-4 < mcnemar_exact(10, 4)
    same = paired_change([True] * 5 + [False] * 5, [True] * 5 + [False] * 5)
    assert same.change == 0 and same.low < 0 < same.high and same.p_value == 1.0
    with pytest.raises(ValueError, match="same problems"):
        paired_change([True], [True, False])


def test_dataset_page_counts_rows_per_file_and_samples_left_out_rows(made):
    store, ids = made
    m = store.manifest(ids["dataset"])
    (per_file,) = m.extra["rows_per_file"]
    assert per_file["file"] == "task:addition" and per_file["rows"] == 200
    assert per_file["train"] + per_file["eval"] + per_file["duplicates"] + per_file["eval_prompt"] == 200
    assert per_file["train"] == m.metrics["num_train"] and per_file["duplicates"] == m.metrics["num_duplicates"]
    assert 0 < len(m.extra["dropped_sample"]) <= 5
    folder = store.get(ids["dataset"])  # the row report stays out of the dataset's files (and so its id)
    assert "rows_per_file" not in json.loads((folder / "info.json").read_text())
    assert "_source" not in (folder / "train.jsonl").read_text()
    html = pages.dataset_page(store, ids["dataset"])
    for sec in ("artifact", "rows", "dropped", "lengths"):
        assert f'id="section-{sec}"' in html
    # every series the browser test sees drawn, plus "eval-prompt": 0 rows here, a bar of height 0
    assert _charts(html) == {**EXPECTED["dataset"], "rows": EXPECTED["dataset"]["rows"] | {"eval-prompt"}}
    assert "characters" in html.lower()


def test_sft_page_draws_each_curve_and_the_wall_time(made):
    store, ids = made
    html = pages.sft_page(store, ids["sft"])
    assert _charts(html) == EXPECTED["sft"]
    assert "wall time" in html and "12.5" in html


def test_rl_page_draws_curves_and_stacked_phase_times(made):
    store, ids = made
    html = pages.rl_page(store, ids["rl"])
    assert _charts(html) == EXPECTED["rl"]
    assert 'id="section-timing"' in html


def test_eval_page_shows_intervals_samples_escaped_and_the_start_models_eval(made):
    store, ids = made
    html = pages.eval_page(store, ids["rl_eval"])
    assert _charts(html) == EXPECTED["eval"]
    assert 'id="section-comparison"' in html and "Wilson" in html
    assert "Greedy change, problem by problem: +" in html and "McNemar exact p" in html  # paired on the same problems
    assert "&lt;b&gt;1+1=&lt;/b&gt;" in html and "<b>1+1=" not in html
    alone = pages.eval_page(store, ids["sft_eval"])  # the SFT model was trained from scratch: nothing to compare
    assert 'id="section-comparison"' not in alone and 'id="section-samples"' in alone


@pytest.mark.parametrize("promoted", [True, False])
def test_promotion_page_shows_the_verdict_against_the_bar_and_the_holder(promoted):
    html = pages.promotion_page(decision(promoted))
    assert ('<p class="ok">promoted</p>' if promoted else '<p class="bad">not promoted</p>') in html
    assert ("not promoted" in html) != promoted
    assert _charts(html) == EXPECTED["promotion"]
    assert "guard set 1" in html


def test_render_page_shows_a_stored_decision(tmp_path):
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder

    store = ArtifactStore(str(tmp_path / "store"))
    ref = store.put("decision", "production-promoted", write_folder(tmp_path, "d", {
        "decision.json": json.dumps(decision())}), run_id="r", parents=[], config={})
    html = render_page(store, ref.id)
    assert html.startswith("<!DOCTYPE html>") and _series(html, "promotion") >= {"candidate", "min-accuracy"}


def test_render_page_picks_the_page_by_kind_and_stage(made):
    store, ids = made
    titles = {k: re.search(r"<h1>([\w ]+?) [\w-]+</h1>", render_page(store, i)).group(1) for k, i in ids.items()}
    assert titles == {"dataset": "Dataset", "sft": "SFT", "rl": "RL", "sft_eval": "Eval", "rl_eval": "Eval",
                      "dense_sft": "SFT", "pairs": "Pairs", "dpo": "DPO", "reward_model": "Reward model",
                      "distill": "Distilled model", "eval_pairs": "Reward model eval",
                      "preference_dataset": "Preference dataset"}


# ------------------------------------------------------------------ dense stages (made by the stages themselves)


def _summary(html: str) -> dict[str, str]:
    """The Summary section's rows: {name: value as shown}."""
    body = html[html.index('id="section-summary"'):]
    body = body[:body.index("</section>")]
    return dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", body))


def test_dpo_page_draws_loss_implicit_rewards_and_accuracy_and_names_the_reference(made):
    store, ids = made
    m = store.manifest(ids["dpo"])
    assert m.extra["frozen_model"] == ids["dense_sft"] and len(m.extra["history"]) == 4
    html = pages_of(store, ids["dpo"])
    assert _charts(html) == EXPECTED["dpo"]
    facts = _summary(html)
    assert facts["reference model"] == f"{ids['dense_sft'][:12]} (sft-addition, sft)"
    assert facts["final preference accuracy"] == f"{m.metrics['accuracy']:.4g}"
    assert facts["final reward margin"] == f"{m.metrics['rewards/margin']:.4g}" and facts["beta"] == "0.1"
    assert "Implicit rewards" in html


def test_reward_model_page_draws_scores_and_accuracy_and_its_held_out_accuracy(made):
    store, ids = made
    html = pages_of(store, ids["reward_model"])
    assert _charts(html) == EXPECTED["reward_model"]
    ev = store.manifest(ids["eval_pairs"])
    assert _summary(html)[f"held-out pairwise accuracy (eval {ev.id[:12]})"] == f"{ev.metrics['pairwise_accuracy']:.4g}"


def test_distill_page_draws_loss_and_cross_entropy_and_names_the_teacher(made):
    store, ids = made
    m = store.manifest(ids["distill"])
    html = pages_of(store, ids["distill"])
    assert _charts(html) == EXPECTED["distill"]
    facts = _summary(html)
    assert facts["teacher"] == f"{ids['dense_sft'][:12]} (sft-addition, sft)" and facts["start model"] == "from scratch"
    assert facts["final cross-entropy"] == f"{m.metrics['ce']:.4g}"


def test_pairs_page_counts_prompts_by_outcome_and_shows_sample_pairs(made):
    store, ids = made
    m = store.manifest(ids["pairs"])
    html = pages_of(store, ids["pairs"])
    assert _charts(html) == EXPECTED["pairs"]
    counts = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", html))
    assert counts["train pairs"] == str(m.metrics["num_train"]) and counts["eval pairs"] == str(m.metrics["num_eval"])
    assert counts["prompts all correct"] == str(m.metrics["all_correct"])
    assert counts["prompts all wrong"] == str(m.metrics["all_wrong"])
    assert counts["source model"] == f"{ids['dense_sft'][:12]} (sft-addition, sft)"
    samples = html[html.index('id="section-samples"'):]
    assert samples.count("<tr>") == 1 + 5  # header and the first five pairs
    # one bar per outcome, a zero-count one included
    assert len(re.findall(r'id="prompts--series-prompts"', html)) == 3


def test_preference_dataset_page_shows_rows_and_pairs_escaped(made):
    store, ids = made
    html = pages_of(store, ids["preference_dataset"])
    assert _charts(html) == {**EXPECTED["preference_dataset"],
                             "rows": EXPECTED["preference_dataset"]["rows"] | {"duplicates", "eval-prompt"}}
    samples = html[html.index('id="section-samples"'):]
    assert samples.count("<tr>") == 1 + 5 and samples.count("&lt;b&gt;") == 5 and "<b>" not in html


def test_eval_pairs_page_shows_pairwise_accuracy_with_its_interval_and_both_histograms(made):
    store, ids = made
    r = json.loads((store.get(ids["eval_pairs"]) / "pairwise.json").read_text())
    html = pages_of(store, ids["eval_pairs"])
    assert _charts(html) == EXPECTED["eval_pairs"]
    lo, hi = wilson(r["pairwise_accuracy"] * r["num_pairs"], r["num_pairs"])
    assert (f"<td>pairwise accuracy</td><td>{r['pairwise_accuracy']:.4g}</td><td>{lo:.4g}</td><td>{hi:.4g}</td>"
            in html) and "Wilson" in html
    assert "held-out pairs" in html and f"of the {r['num_pairs']} held-out pairs" in html
    for side in ("chosen", "rejected"):
        assert f"{side} (n={sum(r['histogram'][side])})" in html  # the legend counts every binned pair
        assert f"<td>{side}</td><td>{r[side]['mean']:.4g}</td>" in html
    samples = html[html.index('id="section-samples"'):]
    assert samples.count("<tr>") == 1 + len(r["samples"])


@pytest.mark.parametrize("stage,kind", [("dpo", "model"), ("distill", "model"), ("reward_model", "reward_model")])
def test_a_dense_model_without_history_gets_its_summary_and_a_note(tmp_path, stage, kind):
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder

    store = ArtifactStore(str(tmp_path / "store"))
    ref = store.put(kind, f"{stage}-old", write_folder(tmp_path, "m", {"w.txt": stage}), run_id="r", parents=[],
                    config={}, metrics={"loss": 0.5}, extra={"stage": stage, "frozen_model": "f" * 64})
    html = render_page(store, ref.id)
    assert "holds no per-step history" in html and _charts(html) == {}
    if stage != "reward_model":
        assert f"{'f' * 12} (not in this store)" in html


def test_data_prep_task_makes_a_deck_in_local_execution(tmp_path, monkeypatch):
    import flytekit.deck.deck as deck_module

    from posttrain.config import DataConfig, TokenizerConfig
    from tasks.data import data_prep

    monkeypatch.setenv("POSTTRAIN_HOME", str(tmp_path / "home"))
    written = {}
    real_output = deck_module._output_deck

    def capture(task_name, params):  # what flytekit writes to deck.html after a local task
        written[task_name] = {d.name: d.html for d in params.decks}
        real_output(task_name, params)

    monkeypatch.setattr(deck_module, "_output_deck", capture)
    data_prep(cfg=DataConfig(num_examples=60, eval_size=10, num_digits=1, tokenizer=TokenizerConfig(train=False)),
              require_completions=True, run_id="deck")
    assert 'id="chart-prompt-length"' in written["data_prep"]["dataset"]


def test_rl_page_draws_an_algorithms_own_metrics_and_its_phase_order(tmp_path):
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder
    from tests.report_inputs import rl_history

    extra = {"critic/value_loss": 0.2, "critic/vf_explained_var": 0.5, "adv/mean": 0.0, "adv/std": 1.0}
    phases = {"rollout": 0.3, "reward": 0.01, "critic": 0.5, "advantages": 0.01, "update": 0.6, "sync": 0.01}
    history = [{**h, **extra, **{f"time/{k}_s": v for k, v in phases.items()}} for h in rl_history(3)]
    for h in history:
        h.pop("time/reference_s")
    store = ArtifactStore(str(tmp_path / "store"))
    ref = store.put("model", "ppo", write_folder(tmp_path, "ppo", {"w.txt": "ppo"}), run_id="r", parents=[],
                    config={}, metrics=history[-1], extra={"algorithm": "ppo", "step": 3, "policy_version": 3,
                                                           "history": history})
    html = pages.rl_page(store, ref.id)
    charts = _charts(html)
    assert charts["algo-critic"] == {"critic-value-loss", "critic-vf-explained-var"}
    assert charts["algo-adv"] == {"adv-mean", "adv-std"}
    order = pages._phase_times(history, "ppo")
    assert list(order) == ["rollout", "reward", "advantages", "critic", "update", "sync", "other"]


def test_rl_page_shows_a_multi_turn_runs_last_episodes_turn_by_turn(tmp_path):
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder
    from tests.report_inputs import rl_history

    episodes = [{"prompt": "347*862=", "reward": 1.0, "turns": [
        ["policy", '<tool_call>{"name": "calculate", "arguments": {"expression": "347*862"}}</tool_call>'],
        ["tool", "299114"], ["policy", "299114"]]}, {"prompt": "547*862=", "reward": 0.0, "turns": [["policy", "400000"]]}]
    store = ArtifactStore(str(tmp_path / "store"))
    history = rl_history(2)
    ref = store.put("model", "agent", write_folder(tmp_path, "agent", {"w.txt": "a"}), run_id="r", parents=[],
                    config={}, metrics=history[-1], extra={"algorithm": "grpo", "step": 2, "policy_version": 2,
                                                           "history": history, "episodes": episodes})
    html = pages.rl_page(store, ref.id)
    assert 'id="section-episodes"' in html and "The first episodes of step 2" in html
    assert html.index("&#x27;347*862=&#x27;: reward 1") < html.index("299114") < html.index("547*862")
    plain = store.put("model", "plain", write_folder(tmp_path, "plain", {"w.txt": "p"}), run_id="r", parents=[],
                      config={}, metrics=history[-1], extra={"algorithm": "grpo", "step": 2, "history": history})
    assert 'id="section-episodes"' not in pages.rl_page(store, plain.id)  # single-turn runs have none


def test_rl_page_draws_each_roles_idle_share_beside_the_phases(tmp_path):
    """The bubble: idle/rollout and idle/update (every run logs them; rl.max_staleness fills them) get a chart of
    their own in the timing section, not one of the algorithm's."""
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder
    from tests.report_inputs import rl_history

    history = [{**h, "idle/rollout": 0.6, "idle/update": 0.4, "async/staleness_max": 1.0} for h in rl_history(3)]
    store = ArtifactStore(str(tmp_path / "store"))
    ref = store.put("model", "async", write_folder(tmp_path, "async", {"w.txt": "a"}), run_id="r", parents=[],
                    config={}, metrics=history[-1], extra={"algorithm": "grpo", "step": 3, "policy_version": 3,
                                                           "history": history})
    charts = _charts(pages.rl_page(store, ref.id))
    assert charts["idle"] == {"idle-rollout", "idle-update"} and "algo-idle" not in charts
    assert charts["algo-async"] == {"async-staleness-max"}


def test_rl_page_draws_the_pass_rate_curriculum_in_a_chart_of_its_own(tmp_path):
    """data.pass_rate.refresh_every: the kept fraction (every step) and a refresh's measures (its steps only)."""
    from posttrain.artifacts import ArtifactStore
    from tests.files import write_folder
    from tests.report_inputs import rl_history

    history = [{**h, "pass_rate/kept_fraction": 0.5} for h in rl_history(3)]
    history[2].update({"pass_rate/in_band_fraction": 0.25, "pass_rate/never_fraction": 0.5,
                       "pass_rate/always_fraction": 0.25, "pass_rate/mean_rate": 0.4, "pass_rate/kept_fraction": 0.25})
    store = ArtifactStore(str(tmp_path / "store"))
    ref = store.put("model", "curriculum", write_folder(tmp_path, "cur", {"w.txt": "c"}), run_id="r", parents=[],
                    config={}, metrics=history[-1], extra={"algorithm": "grpo", "step": 3, "policy_version": 3,
                                                           "history": history})
    html = pages.rl_page(store, ref.id)
    assert _charts(html)["curriculum"] == {"pass-rate-kept-fraction", "pass-rate-in-band-fraction",
                                           "pass-rate-never-fraction", "pass-rate-always-fraction", "pass-rate-mean-rate"}
    assert 'id="chart-algo-pass' not in html  # not drawn again as if the algorithm's own
