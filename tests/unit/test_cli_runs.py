"""`posttrain runs`, `show` and `channels` on a real store with two small runs: text and --json output, run
status, one-line errors. (`promote`, which evaluates real models: tests/integration/test_promote_cli.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.artifacts import ArtifactStore
from posttrain.cli.main import main

POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


def _put(store: ArtifactStore, tmp: Path, kind: str, name: str, run_id: str, parents: list[str], *,
         metrics: dict | None = None, extra: dict | None = None) -> str:
    """Store one tiny artifact whose single file names it (so every artifact has its own content)."""
    src = tmp / f"src-{run_id}-{name}"
    src.mkdir()
    (src / "data.json").write_text(json.dumps({"kind": kind, "name": name, "run": run_id}))
    return store.put(kind, name, src, run_id=run_id, parents=parents, config={"sft": {"steps": 3}},
                     metrics=metrics, extra=extra).id


@pytest.fixture
def home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Run A: data -> tokenizer -> SFT -> eval, -> two RL checkpoints -> eval (complete). Run B, made later: data
    -> SFT -> eval, -> RL with no eval (partial). Returns the store root and the artifacts' ids by name."""
    home, store, ids = tmp_path / "home", ArtifactStore(tmp_path / "home"), {}
    ids["ds_a"] = _put(store, tmp_path, "dataset", "arith", "run-a", [], metrics={"num_train": 8})
    ids["tok_a"] = _put(store, tmp_path, "tokenizer", "arith-bpe64", "run-a", [ids["ds_a"]])
    ids["sft_a"] = _put(store, tmp_path, "model", "sft-arith", "run-a", [ids["ds_a"], ids["tok_a"]],
                        metrics={"loss": 0.25}, extra={"stage": "sft"})
    ids["sft_eval_a"] = _put(store, tmp_path, "eval", "eval-sft-arith", "run-a", [ids["sft_a"], ids["ds_a"]],
                             metrics={"greedy_accuracy": 0.4, "num_problems": 10})
    for step in (1, 2):
        ids[f"rl{step}_a"] = _put(store, tmp_path, "model", f"rl-step{step}", "run-a", [ids["sft_a"], ids["ds_a"]],
                                  extra={"policy_version": step, "step": step})
    ids["rl_eval_a"] = _put(store, tmp_path, "eval", "eval-rl-step2", "run-a", [ids["rl2_a"], ids["ds_a"]],
                            metrics={"greedy_accuracy": 0.6, "sampled_accuracy": 0.55, "pass_at_k": 0.8,
                                     "num_problems": 10})
    ids["ds_b"] = _put(store, tmp_path, "dataset", "arith-b", "run-b", [])
    ids["sft_b"] = _put(store, tmp_path, "model", "sft-arith-b", "run-b", [ids["ds_b"]], extra={"stage": "sft"})
    ids["sft_eval_b"] = _put(store, tmp_path, "eval", "eval-sft-arith-b", "run-b", [ids["sft_b"], ids["ds_b"]],
                             metrics={"greedy_accuracy": 0.3, "num_problems": 10})
    ids["rl_b"] = _put(store, tmp_path, "model", "rl-step1", "run-b", [ids["sft_b"], ids["ds_b"]],
                       extra={"policy_version": 1, "step": 1})
    return home, ids


def _cli(capsys, home: Path, *argv: str) -> tuple[int, str, str]:
    status = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_runs_lists_each_run_newest_first_with_stages_status_and_accuracy(home, capsys):
    root, ids = home
    status, out, _ = _cli(capsys, root, "runs")
    assert status == 0
    b, a = out.split("\n\n")
    assert b.startswith("run run-b  partial (last stage: rl)") and "(4 artifacts)" in b
    assert a.startswith("run run-a  complete") and "(7 artifacts)" in a
    assert f"eval(rl)   {ids['rl_eval_a'][:12]}" in a and "greedy 0.6  sampled 0.55  pass@k 0.8  on 10 problems" in a
    assert f"rl         {ids['rl2_a'][:12]}  rl-step2" in a and "(2 checkpoints)" in a
    assert ids["rl1_a"][:12] not in a  # earlier RL checkpoints fold into the last one
    assert [line.split()[0] for line in a.splitlines()[1:]] == ["dataset", "tokenizer", "sft", "eval(sft)", "rl",
                                                               "eval(rl)"]

    status, out, _ = _cli(capsys, root, "runs", "--json", "--limit", "1")
    rows = json.loads(out)
    assert status == 0 and [r["run_id"] for r in rows] == ["run-b"]
    assert rows[0]["status"] == "partial (last stage: rl)" and rows[0]["wall_s"] >= 0
    assert [x["stage"] for x in rows[0]["artifacts"]] == ["dataset", "sft", "eval", "rl"]
    assert rows[0]["artifacts"][2]["model_stage"] == "sft" and rows[0]["artifacts"][2]["metrics"] == {
        "greedy_accuracy": 0.3, "num_problems": 10}


def test_show_prints_the_manifest_parents_files_and_metrics(home, capsys):
    root, ids = home
    status, out, _ = _cli(capsys, root, "show", ids["rl_eval_a"][:10])
    assert status == 0
    assert out.startswith(f"eval {ids['rl_eval_a'][:12]}  eval-rl-step2\n")
    assert f"  parents  {ids['rl2_a'][:12]}  rl        rl-step2  (run run-a)" in out
    assert f"           {ids['ds_a'][:12]}  dataset   arith  (run run-a)" in out
    assert "  config   sft.steps=3" in out and "  files    1 file, " in out
    assert "  result   greedy 0.6  sampled 0.55  pass@k 0.8  on 10 problems" in out
    assert "greedy_accuracy = 0.6" in out and "pass_at_k = 0.8" in out

    status, out, _ = _cli(capsys, root, "show", ids["sft_a"], "--json")
    doc = json.loads(out)
    assert status == 0 and doc["manifest"]["id"] == ids["sft_a"] and doc["manifest"]["metrics"] == {"loss": 0.25}
    assert [(p["kind"], p["name"]) for p in doc["parents"]] == [("dataset", "arith"), ("tokenizer", "arith-bpe64")]


def test_a_bad_id_is_a_one_line_error(home, capsys):
    root, _ = home
    status, out, err = _cli(capsys, root, "show", "zzzz")
    assert status == 1 and out == "" and err.startswith("posttrain: error: no artifact with id 'zzzz'")
    status, _, err = _cli(capsys, root, "promote", "zzzz", "production")
    assert status == 1 and err.startswith("posttrain: error: no artifact with id 'zzzz'") and "Traceback" not in err


def test_show_into_a_pipe_closed_early_ends_quietly(home):
    """`posttrain show ID --json | head -c 10` with far more than a pipe holds (64 KiB) still to come."""
    root, _ = home
    src = root.parent / "big"
    src.mkdir()
    (src / "x").write_text("x")
    big = ArtifactStore(root).put("dataset", "big", src, run_id="r", parents=[], config={"blob": "x" * 300_000}).id
    proc = subprocess.Popen([POSTTRAIN, "--home", str(root), "show", big, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == "", err


def test_show_html_writes_the_artifacts_page(home, capsys, tmp_path):
    root, ids = home
    status, out, _ = _cli(capsys, root, "show", ids["sft_a"][:12], "--html", str(tmp_path / "sft.html"))
    page = (tmp_path / "sft.html").read_text()
    assert status == 0 and out.startswith("model ") and page.lower().startswith("<!doctype html>")
    assert ids["sft_a"] in page and "holds no per-step history" in page  # the SFT page, of a model stored without


@pytest.fixture
def dense_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The dense pipelines as they store their artifacts (metrics and extras as stages.train, stages.pairs and
    stages.evaluate_reward_model write them): run "dpo": data -> SFT -> eval -> pairs -> DPO -> eval (complete);
    run "rm": pairs -> reward model -> pairwise eval (complete); run "kd": data -> distilled model (partial)."""
    home, store, ids = tmp_path / "home", ArtifactStore(tmp_path / "home"), {}
    ids["ds"] = _put(store, tmp_path, "dataset", "arith", "dpo", [], metrics={"num_train": 8})
    ids["sft"] = _put(store, tmp_path, "model", "sft-arith", "dpo", [ids["ds"]], metrics={"loss": 0.25},
                      extra={"stage": "sft", "history": []})
    ids["sft_eval"] = _put(store, tmp_path, "eval", "eval-sft-arith", "dpo", [ids["sft"], ids["ds"]],
                           metrics={"greedy_accuracy": 0.4, "num_problems": 10})
    ids["pairs"] = _put(store, tmp_path, "dataset", "pairs-arith", "dpo", [ids["sft"], ids["ds"]],
                        metrics={"num_train": 13, "num_eval": 9, "all_correct": 14, "all_wrong": 2,
                                 "reward_failures": 0},
                        extra={"schema": "preference", "stage": "pairs", "source_model": ids["sft"]})
    ids["dpo"] = _put(store, tmp_path, "model", "dpo-pairs-arith", "dpo", [ids["pairs"], ids["sft"]],
                      metrics={"loss": 0.61, "accuracy": 0.875, "rewards/margin": 0.079, "steps": 4},
                      extra={"stage": "dpo", "start_model": ids["sft"], "frozen_model": ids["sft"], "history": []})
    ids["dpo_eval"] = _put(store, tmp_path, "eval", "eval-dpo-pairs-arith", "dpo", [ids["dpo"], ids["ds"]],
                           metrics={"greedy_accuracy": 0.5, "num_problems": 10})
    ids["rm"] = _put(store, tmp_path, "reward_model", "reward_model-pairs-arith", "rm", [ids["pairs"], ids["sft"]],
                     metrics={"loss": 0.68, "accuracy": 0.75, "scores/margin": 0.018},
                     extra={"stage": "reward_model", "start_model": ids["sft"], "history": []})
    ids["rm_eval"] = _put(store, tmp_path, "eval", "eval-reward_model-pairs-arith", "rm", [ids["rm"], ids["pairs"]],
                          metrics={"pairwise_accuracy": 0.6667, "num_pairs": 9, "chosen_mean": 0.12,
                                   "rejected_mean": 0.1, "margin_mean": 0.02}, extra={"stage": "eval_pairs"})
    ids["kd"] = _put(store, tmp_path, "model", "distill-arith", "kd", [ids["ds"], ids["sft"]],
                     metrics={"loss": 0.055, "ce": 5.39}, extra={"stage": "distill", "start_model": None,
                                                                 "frozen_model": ids["sft"], "history": []})
    return home, ids


def _runs_text(capsys, root: Path) -> dict[str, str]:
    status, out, _ = _cli(capsys, root, "runs")
    assert status == 0
    return {block.split()[1]: block for block in out.strip().split("\n\n")}


def test_runs_list_dense_stages_with_their_key_metrics_and_status(dense_home, capsys):
    root, ids = dense_home
    runs = _runs_text(capsys, root)
    dpo, rm, kd = runs["dpo"], runs["rm"], runs["kd"]
    assert dpo.startswith("run dpo  complete")  # the last training stage (DPO) has an eval
    assert [line.split()[0] for line in dpo.splitlines()[1:]] == ["dataset", "sft", "eval(sft)", "pairs", "dpo",
                                                                 "eval(dpo)"]
    assert f"sft        {ids['sft'][:12]}  sft-arith                final loss 0.25" in dpo
    assert f"pairs      {ids['pairs'][:12]}" in dpo
    assert "13 train / 9 eval pairs  (prompts all correct 14, all wrong 2)" in dpo
    assert f"dpo        {ids['dpo'][:12]}" in dpo and "final loss 0.61  preference accuracy 0.875" in dpo
    assert rm.startswith("run rm  complete")  # a reward model is complete with its pairwise eval
    assert "final loss 0.68  accuracy 0.75" in rm
    assert f"eval_pairs {ids['rm_eval'][:12]}" in rm and "pairwise accuracy 0.6667 on 9 pairs  margin 0.02" in rm
    assert kd.startswith("run kd  partial (last stage: distill)") and "final loss 0.055  ce 5.39" in kd


def test_a_reward_model_without_its_pairwise_eval_is_partial(dense_home, tmp_path, capsys):
    root, ids = dense_home
    _put(ArtifactStore(root), tmp_path, "reward_model", "reward_model-2", "rm2", [ids["pairs"], ids["sft"]],
         metrics={"loss": 0.7}, extra={"stage": "reward_model"})
    assert _runs_text(capsys, root)["rm2"].startswith("run rm2  partial (last stage: reward_model)")


def test_runs_json_holds_each_stages_key_metrics(dense_home, capsys):
    root, ids = dense_home
    status, out, _ = _cli(capsys, root, "runs", "--json")
    arts = {a["id"]: a for r in json.loads(out) for a in r["artifacts"]}
    assert status == 0
    assert arts[ids["dpo"]]["stage"] == "dpo" and arts[ids["dpo"]]["metrics"] == {
        "loss": 0.61, "accuracy": 0.875, "rewards/margin": 0.079}
    assert arts[ids["rm"]]["kind"] == "reward_model" and arts[ids["rm"]]["metrics"] == {"loss": 0.68, "accuracy": 0.75}
    assert arts[ids["kd"]]["metrics"] == {"loss": 0.055, "ce": 5.39}
    assert arts[ids["pairs"]]["stage"] == "pairs" and arts[ids["pairs"]]["metrics"]["num_train"] == 13
    ev = arts[ids["rm_eval"]]
    assert (ev["stage"], ev["model_id"], ev["model_stage"]) == ("eval_pairs", ids["rm"], "reward_model")
    assert ev["metrics"] == {"pairwise_accuracy": 0.6667, "num_pairs": 9, "margin_mean": 0.02}


def test_show_prints_dense_results_and_the_model_each_stage_used(dense_home, capsys):
    root, ids = dense_home
    status, out, _ = _cli(capsys, root, "show", ids["dpo"][:12])
    assert status == 0 and "  stage    dpo\n" in out
    assert "  result   final loss 0.61  preference accuracy 0.875\n" in out
    assert f"  reference {ids['sft']}\n" in out and "accuracy = 0.875" in out
    _, out, _ = _cli(capsys, root, "show", ids["kd"][:12])
    assert "  result   final loss 0.055  ce 5.39\n" in out and f"  teacher  {ids['sft']}\n" in out
    _, out, _ = _cli(capsys, root, "show", ids["pairs"][:12])
    assert "  stage    pairs\n" in out and f"  source   {ids['sft']}\n" in out
    _, out, _ = _cli(capsys, root, "show", ids["rm_eval"][:12])
    assert "  stage    eval_pairs\n" in out and "  result   pairwise accuracy 0.6667 on 9 pairs  margin 0.02\n" in out
    assert f"  parents  {ids['rm'][:12]}  reward_model reward_model-pairs-arith  (run rm)" in out

    status, out, _ = _cli(capsys, root, "show", ids["dpo"], "--json")
    key = json.loads(out)["key"]
    assert status == 0 and key == {"stage": "dpo", "reference": ids["sft"],
                                   "metrics": {"loss": 0.61, "accuracy": 0.875, "rewards/margin": 0.079}}
    _, out, _ = _cli(capsys, root, "show", ids["rm_eval"], "--json")
    assert json.loads(out)["key"]["metrics"]["pairwise_accuracy"] == 0.6667


def test_runs_give_an_evals_paired_change_over_its_start_models_eval(tmp_path, capsys):
    """Evals that kept every problem's result (tests/report_inputs.py: the SFT model right on 1 of 4 problems, the
    RL model started from it on 3): the RL eval's line carries the change problem by problem with its interval."""
    from posttrain.eval.compare import paired_greedy, report_of
    from tests.report_inputs import build_store

    store, ids = build_store(tmp_path)
    expected = paired_greedy(report_of(store, ids["rl_eval"]), report_of(store, ids["sft_eval"]))
    status, out, _ = _cli(capsys, Path(store.root), "runs")
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("  eval")}
    assert status == 0 and expected.change == 0.5 and expected.gained == 2 and expected.lost == 0
    assert lines[ids["rl_eval"][:12]].endswith(
        f"greedy change +0.500 (95% {expected.low:+.3f} to {expected.high:+.3f}) over the start model's eval "
        f"{ids['sft_eval'][:12]}")
    assert "change" not in lines[ids["sft_eval"][:12]]  # the SFT model started from nothing evaluated

    status, out, _ = _cli(capsys, Path(store.root), "runs", "--json")
    arts = {a["id"]: a for r in json.loads(out) for a in r["artifacts"]}
    assert arts[ids["rl_eval"]]["change_over_start"] == {
        "start_eval_id": ids["sft_eval"], "change": 0.5, "low": expected.low, "high": expected.high,
        "p_value": expected.p_value, "gained": 2, "lost": 0, "num_problems": 4}
    assert arts[ids["sft_eval"]]["change_over_start"] is None
