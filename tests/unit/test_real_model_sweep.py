"""bench/real_model_sweep.py: it scores on the validation split only and refuses whatever would score it beyond;
its plain-Python rewards are the families' rules; configs share a pass-rate selection only when they sample alike;
its --table pairs each config with the baseline at the same step, problem by problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_real_model_splits import bench  # noqa: F401 (a fixture: bench/ importable while these run)


def sweep_args(out: Path, *extra: str) -> list[str]:
    return ["--out", str(out), "--model", str(out / "no-model"), *extra]


def test_the_sweep_refuses_whatever_would_score_it_beyond_the_validation_split(bench, tmp_path):  # noqa: F811 (the fixture imported above)
    sweep = bench[2]
    with pytest.raises(SystemExit, match=r"--eval-n 300: configs are scored on the validation split only, 1..--valid"):
        sweep.main(sweep_args(tmp_path, "--eval-n", "300", "--validation-n", "256"))
    with pytest.raises(SystemExit, match="--configs: config 'x' sets data"):
        sweep.main(sweep_args(tmp_path, "--configs", '[{"name": "x", "data": {"eval_files": ["test.jsonl"]}}]'))
    (tmp_path / "ds").mkdir()  # a dataset made before the three splits (its eval set: the old held-out = test)
    with pytest.raises(SystemExit, match=r"--out .*was not prepared on the validation split by this sweep"):
        sweep.main(sweep_args(tmp_path, "--prepare-only"))
    args = sweep.parser().parse_args(sweep_args(tmp_path))
    (tmp_path / "prepared.json").write_text(json.dumps(sweep.checked(args)))
    with pytest.raises(SystemExit, match=r"prepared with other --split, --validation-n"):
        sweep.main(sweep_args(tmp_path, "--prepare-only", "--split", "train_first", "--validation-n", "128"))


def test_the_sweeps_plain_rewards_are_the_families_rules(bench):  # noqa: F811 (the fixture imported above)
    sweep = bench[2]
    assert sweep.number_score("so 3 + 4 = 7.", "7", {}) == 1.0 and sweep.number_score("7 or 8", "7", {}) == 0.0
    assert sweep.word_score("It is 'Elppa'.", "elppa", {}) == 1.0
    assert sweep.word_score("elppa?? no: elpp", "elppa", {}) == 0.0
    assert sweep.list_score("sorted: ['3.0', '7.0']", "['3.0', '7.0']", {}) == 1.0
    assert sweep.list_score("['7.0', '3.0']", "['3.0', '7.0']", {}) == 0.0
    assert sweep.SCORES.keys() == bench[0].FAMILIES.keys()


def test_the_sweeps_selection_is_shared_only_by_configs_that_sample_alike(bench, tmp_path):  # noqa: F811 (the fixture imported above)
    """Configs differing in rl.lr or rl.kl_coef share one pass-rate selection; temperature, the model or the
    selection's own settings give another."""
    from dataclasses import replace

    from posttrain.recipes import resolve

    key = bench[2].selection_key
    cfg = resolve("small_instruct_sft_rl_cpu")
    base = key(cfg, tmp_path)
    assert key(replace(cfg, rl=replace(cfg.rl, lr=1e-4, kl_coef=0.0)), tmp_path) == base
    assert key(replace(cfg, rl=replace(cfg.rl, temperature=1.0)), tmp_path) != base
    assert key(replace(cfg, data=replace(cfg.data, pass_rate=replace(cfg.data.pass_rate, max_prompts=8))),
               tmp_path) != base
    assert key(cfg, tmp_path / "other") != base


def test_the_sweeps_table_pairs_each_config_with_the_baseline_at_the_same_step(bench, tmp_path):  # noqa: F811 (the fixture imported above)
    """--table: the change from the config's own step 0 and from the baseline at the same step, problem by
    problem; a config run again replaces its earlier line; a missing baseline is refused, naming the configs."""
    sweep = bench[2]

    def line(name, step, right, train_acc=0.5):
        return json.dumps({"name": name, "step": step, "validation_greedy": right.count("1") / len(right),
                           "train_acc": train_acc, "s": 10.0, "right": right})

    lines = [line("recipe", 0, "0" * 10 + "1" * 10), line("recipe", 10, "1" * 12 + "0" * 8),
             line("lr", 0, "0" * 10 + "1" * 10), line("lr", 10, "0" * 20), line("lr", 10, "1" * 20),
             json.dumps({"name": "recipe", "pass_rate": {"kept": 7}})]
    (tmp_path / "evaluations.jsonl").write_text("\n".join(lines) + "\n")
    out = sweep.table(tmp_path, "recipe")
    rows = {tuple(c.strip() for c in r.split("|")[1:3]): r for r in out.splitlines() if r.startswith("| ")}
    assert "| 0.600 | +0.100 (" in rows[("recipe", "10")]  # 12 right of 20 against 10: 4 gained, 2 lost
    lr10 = rows[("lr", "10")].split("|")
    assert lr10[3].strip() == "1.000"  # the later line of (lr, 10) counts
    assert lr10[4].strip().startswith("+0.500 (") and lr10[5].strip().startswith("+0.400 (")
    assert '"kept": 7' in out
    with pytest.raises(SystemExit, match="'lr', 'recipe'"):
        sweep.table(tmp_path, "nope")
