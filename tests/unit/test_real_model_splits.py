"""The real-model benches' three splits and task families (bench/rg_task.py, bench/real_model.py,
bench/real_model_sweep.py): no question in two of train / validation / test, the reported table naming the test
split, and the spelling family's reward read by reasoning-gym's own scorer.

The tests that need reasoning-gym use the benches' own install folder (`<cache>/reasoning-gym/<version>`, made by
`install_reasoning_gym()`, e.g. by `bench/real_model.py`), else test_rewards.py's install in pytest's cache."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.unit.test_rewards import reasoning_gym_dir  # noqa: F401 (a fixture)

BENCH = str(Path(__file__).resolve().parents[2] / "bench")


@pytest.fixture(scope="module")
def bench():
    """(rg_task, real_model, real_model_sweep), imported with bench/ on sys.path only while this module's tests run
    (bench's module names must not shadow anything for later tests)."""
    saved = list(sys.path)
    sys.path.insert(0, BENCH)
    names = ("rg_task", "real_model", "real_model_sweep", "default_seeds", "run_store", "selection_vs_none",
             "sweep_data", "sweep_table")
    try:
        yield tuple(importlib.import_module(n) for n in names[:3])
    finally:
        sys.path[:] = saved
        for name in names:
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def rg_dir(bench, reasoning_gym_dir):  # noqa: F811 (the fixture imported above)
    """reasoning-gym for the bench code: the benches' own install folder where bench/real_model.py made one, else
    the one tests/unit/test_rewards.py installs once into pytest's cache (skipped only when PyPI is unreachable)."""
    rg_task = bench[0]
    root = rg_task.CACHE / "reasoning-gym" / rg_task.RG_VERSION
    return root if (root / "reasoning_gym").is_dir() else reasoning_gym_dir


def rows(questions: list[int]) -> list[dict]:
    """reasoning-gym-like rows, question q for each q (a repeated q is a repeated question)."""
    return [{"question": f"q{q}", "answer": str(q), "metadata": {"source_dataset": "x"}} for q in questions]


def questions(part: list[dict]) -> list[str]:
    return [r["question"] for r in part]


def assert_disjoint(parts: dict, sizes) -> None:
    """Each split's questions in no other split; validation and test exactly their size, each question once."""
    train, val, test = (set(questions(parts[k])) for k in ("train", "validation", "test"))
    assert not train & val and not train & test and not val & test
    assert len(parts["validation"]) == len(val) == sizes.validation
    assert len(parts["test"]) == len(test) == sizes.test


@pytest.mark.parametrize("order", ["train_first", "held_out_first"])
def test_no_question_is_in_two_splits(bench, order):
    rg_task = bench[0]
    sizes = rg_task.Sizes(train=30, validation=8, test=6)
    # 60 distinct questions drawn with repeats: a train question recurs later, a held-out one recurs in train
    generated = rows([(i * 7) % 60 for i in range(sizes.train + 4 * (sizes.validation + sizes.test))])
    parts = rg_task.split_questions(generated, sizes, order)
    assert_disjoint(parts, sizes)
    assert parts["train"]
    if order == "train_first":
        assert parts["train"] == generated[:30]  # the first rows, repeats kept: train is a sample


@pytest.mark.parametrize("order", ["train_first", "held_out_first"])
def test_validation_and_test_are_the_same_mix_and_neither_depends_on_the_others_size(bench, order):
    """A small problem space (chain_sum's 2-term questions) is distinct-rich early in the rows and repeats later:
    dealing validation first gave it most of them. Each held-out question's split is a hash of its text, so a
    scarce kind splits about evenly, and changing --eval never moves a question the sweep scored on into test."""
    rg_task = bench[0]
    # kind "s" has 40 distinct questions, drawn as often as kind "b" (4,000 distinct): its distinct ones come early
    generated = [{"question": f"s{i // 2 % 40}" if i % 2 else f"b{i}", "answer": "0", "metadata": {}} for i in range(2400)]
    small = rg_task.split_questions(generated, rg_task.Sizes(400, 100, 50), order)
    large = rg_task.split_questions(generated, rg_task.Sizes(400, 100, 100), order)
    assert small["validation"] == large["validation"]
    assert questions(small["test"]) == questions(large["test"])[:50]
    scarce = {k: sum(q.startswith("s") for q in questions(large[k])) for k in ("validation", "test")}
    if order == "held_out_first":  # all 40 are held out; dealing validation first gave it all 40
        assert sum(scarce.values()) == 40 and 12 <= scarce["validation"] <= 28, scarce
    for k in ("validation", "test"):
        assert all(rg_task.side(q) == k for q in questions(large[k]))


def test_train_rows_of_another_config_lose_every_held_out_question(bench):
    rg_task = bench[0]
    sizes = rg_task.Sizes(train=10, validation=3, test=3)
    generated = rows(list(range(100)))
    held = rg_task.split_questions(generated, sizes, "held_out_first")  # from the first 4 x 6 rows
    held = [int(q[1:]) for k in ("validation", "test") for q in questions(held[k])]
    train_rows = rows(held + [50, 51, 51])
    parts = rg_task.split_questions(generated, sizes, "held_out_first", train_rows)
    assert questions(parts["train"]) == ["q50", "q51", "q51"]
    assert_disjoint(parts, sizes)
    with pytest.raises(SystemExit, match="--train-task needs --split held_out_first"):
        rg_task.split_questions(generated, sizes, "train_first", train_rows)


def test_too_few_distinct_questions_and_empty_splits_are_refused_naming_the_flag(bench):
    rg_task = bench[0]
    with pytest.raises(SystemExit, match=r"only \d \+ \d distinct questions .* need 4 \+ 4 \(--validation-n, --eval\)"):
        rg_task.split_questions(rows([i % 5 for i in range(60)]), rg_task.Sizes(10, 4, 4), "held_out_first")
    with pytest.raises(SystemExit, match="no train question is left"):
        rg_task.split_questions(rows([i % 8 for i in range(60)]), rg_task.Sizes(10, 4, 4), "held_out_first")
    with pytest.raises(SystemExit, match="--validation-n: the validation split needs at least one question"):
        rg_task.Sizes(10, 0, 4)


def test_a_built_task_has_three_disjoint_splits_and_evaluates_on_the_one_asked(bench, rg_dir, tmp_path):
    rg_task = bench[0]
    sizes = rg_task.Sizes(train=60, validation=12, test=12)
    for family in ("arithmetic", "spelling"):
        folder = tmp_path / family
        fam = rg_task.FAMILIES[family]
        over = rg_task.build_task(folder, rg_dir, sizes, fam.rewards[0], "train_first", fam.task,
                                  evaluate="validation" if family == "spelling" else "test")
        parts = {k: [json.loads(line) for line in (folder / f"{k}.jsonl").read_text().splitlines()]
                 for k in rg_task.SPLITS}
        assert_disjoint(parts, sizes)
        assert all(r["metadata"]["source_dataset"] == fam.task["name"] for p in parts.values() for r in p)
        evaluated = "validation" if family == "spelling" else "test"
        assert over["data"]["eval_files"] == [str(folder / f"{evaluated}.jsonl")]
        assert over["eval"]["num_problems"] == 12
        assert json.loads((folder / "splits.json").read_text())["evaluated"] == evaluated


def rg_scores(rg_task, rg_dir, folder: Path, reward: str, row: dict, completions: list[str]) -> list[float]:
    """Reward `reward`'s scores of `completions` to reasoning-gym `row`, loaded as RL and eval load it (posttrain's
    RewardScorer, the written rg_reward.py with the install folder on its path); no completion may fail."""
    from posttrain.config import RewardConfig
    from posttrain.rewards.scorer import RewardSample, RewardScorer

    (folder / "rewards").mkdir(exist_ok=True)
    (folder / "rewards" / "rg_reward.py").write_text(rg_task.REWARDS[reward])
    cfg = RewardConfig(fn="rg_reward:score", python_path=[str(folder / "rewards"), str(rg_dir)], timeout_s=60)
    example = {"messages": [{"role": "user", "content": row["question"]}], "answer": row["answer"],
               "columns": {"metadata": row["metadata"]}}
    with RewardScorer(cfg) as s:
        results = s.score([RewardSample.from_example(example, c) for c in completions])
    assert all(r.failure is None for r in results), results
    return [r.score for r in results]


def test_the_word_reward_reads_the_last_word_and_reasoning_gyms_scorer_scores_it(bench, rg_dir, tmp_path):
    """The spelling family's reward, loaded as RL and eval load it (posttrain's RewardScorer, the written
    rg_reward.py with the install folder on its path), on hand-written completions of a real spell_backward row."""
    rg_task = bench[0]
    row = rg_task.generate(rg_dir, {"name": "spell_backward", "min_word_len": 5, "max_word_len": 5}, 1, seed=1)[0]
    word, answer = row["metadata"]["word"], row["answer"]
    assert answer == word[::-1] and row["question"].endswith(f": {word}")
    completions = [answer,                                              # the bare answer
                   f"The word '{word}' spelled backward is '{answer.upper()}'.",  # in a sentence, upper case
                   f"{word} -> {answer}",                               # as the prompt's example writes it
                   f"{answer} is {word} backward",                      # the answer, then more: read "backward"
                   answer[:3] + "".join("x" if c != "x" else "q" for c in answer[3:]),  # 3 of 5 letters right
                   "?!"]                                                # no word at all
    got = {reward: rg_scores(rg_task, rg_dir, tmp_path, reward, row, completions) for reward in ("word", "number")}
    assert got["word"][:3] == [1.0, 1.0, 1.0]
    assert got["word"][3] < 1.0 and got["word"][4] == pytest.approx(0.6) and got["word"][5] == 0.0
    assert got["number"] == [0.0] * len(completions)  # reward `number` cannot read a word: why the family has its own
    fam = rg_task.FAMILIES["spelling"]  # the table's "word right" column reads a completion as the reward does
    assert [fam.same(fam.extract(c), answer) for c in completions] == [r >= 1.0 for r in got["word"]]


def test_the_list_reward_reads_the_last_list_and_reasoning_gyms_scorer_scores_it(bench, rg_dir, tmp_path):
    """The sorting family's reward (number_sorting), loaded as RL and eval load it, on hand-written completions of a
    real row: the last bracketed list is read, the asked order and every number count."""
    rg_task = bench[0]
    row = rg_task.generate(rg_dir, {**rg_task.SORT_TASK, "min_numbers": 4}, 1, seed=1)[0]
    answer = row["answer"]
    want = json.loads(answer.replace("'", '"'))
    assert want == row["metadata"]["sorted_numbers"] and len(want) == 4
    completions = [answer,                                                       # the bare answer
                   f"Sorted: {json.dumps(want)}.",                               # double quotes, in a sentence
                   f"{json.dumps(want[::-1])} reversed is {answer}",             # the last list is read
                   f"{answer} or maybe {json.dumps(want[::-1])}",                # the last list is the wrong order
                   str(want[:3]),                                                # a number left out
                   "?!"]                                                         # no list at all
    scores = rg_scores(rg_task, rg_dir, tmp_path, "list", row, completions)
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    fam = rg_task.FAMILIES["sorting"]  # the table's "list right" column reads a completion as the reward does
    assert [fam.same(fam.extract(c), answer) for c in completions] == [r >= 1.0 for r in scores]


def test_a_family_takes_only_the_rewards_that_read_its_answers(bench):
    real_model = bench[1]
    assert real_model.family_reward("spelling", None) == "word"
    assert real_model.family_reward("arithmetic", None) == "number"
    with pytest.raises(SystemExit, match="--reward number does not read family spelling's answers; it takes word or"):
        real_model.family_reward("spelling", "number")
    with pytest.raises(SystemExit, match="--reward word does not read family arithmetic's"):
        real_model.main(["--family", "arithmetic", "--reward", "word"])


def test_each_family_writes_its_own_docs_block(bench):
    """`--write-readme` for one family must not overwrite another's table."""
    real_model = bench[1]
    blocks = {family: real_model.markers(family) for family in ("arithmetic", "sorting", "spelling")}
    assert blocks["arithmetic"] == ("<!-- real_model:begin -->", "<!-- real_model:end -->")
    assert blocks["sorting"] == ("<!-- real_model_sorting:begin -->", "<!-- real_model_sorting:end -->")
    assert len(set(blocks.values())) == 3


def test_the_table_says_its_figures_are_on_the_test_split_and_counts_words_right(bench, tmp_path):
    rg_task, real_model, _ = bench
    home = tmp_path / "store"
    for name, greedy in (("eval-base", ["elppa", "'Elppa'.", "apple"]), ("eval-rl", ["elppa", "elppa", "elppa"])):
        folder = home / "objects" / name
        (folder / "files").mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"kind": "eval", "name": name}))
        (folder / "files" / "report.json").write_text(json.dumps(
            {"problems": [{"greedy": g, "answer": "elppa"} for g in greedy]}))
    right = real_model.answers_right(home, rg_task.FAMILIES["spelling"])
    assert right == {"folder": pytest.approx(2 / 3), "rl": 1.0}
    row = {"seed": 0, "wall_s": 60.0, "sft_greedy_accuracy": 0.25, "rl_greedy_accuracy": 0.5, "d_greedy": 0.25,
           "folder_right": right["folder"], "rl_right": right["rl"]}
    block = real_model.table([row], ["--family", "spelling"], (1.0, 1.0, 1.0), rg_task.Sizes(2000, 256, 200),
                             dict(rg_task.SPELL_TASK), family="spelling")
    assert block.splitlines()[0].endswith("| folder word right | RL word right | wall |")
    assert block.splitlines()[2] == "| 0 | 0.250 | 0.500 | +0.250 | 0.667 | 1.000 | 1.0 min |"
    assert "2000 generated train / 256 validation / 200 test questions (no question in two splits" in block
    assert real_model.ON_TEST in block and "`spell_backward`" in block


def test_with_sft_the_table_gives_the_folder_the_sft_model_and_paired_intervals(bench, tmp_path):
    """A recipe with SFT: three evaluations in the store; the change is the RL model's against the folder, RL's own
    part against the SFT model, each with its paired interval over the same test problems."""
    rg_task, real_model, _ = bench
    home = tmp_path / "store"
    answers = [str(i) for i in range(40)]
    right = {"eval-base-folder": 10, "eval-sft-train": 24, "eval-grpo-train": 30}  # the first n problems right
    for name, n in right.items():
        folder = home / "objects" / name
        (folder / "files").mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"kind": "eval", "name": name}))
        (folder / "files" / "report.json").write_text(json.dumps({"problems": [
            {"prompt": f"q{i}", "answer": a, "greedy": a if i < n else "x", "correct": i < n}
            for i, a in enumerate(answers)]}))
    assert real_model.answers_right(home, rg_task.FAMILIES["arithmetic"]) == {"folder": 0.25, "sft": 0.6, "rl": 0.75}
    over_folder, over_sft = real_model.paired(home, "rl"), real_model.paired(home, "rl", "sft")
    assert over_folder["low"] > 0.3 and over_folder["p"] < 1e-5  # 20 gained, none lost
    assert over_sft["low"] < 0.15 < over_sft["high"] and over_sft["p"] == pytest.approx(2 * 0.5 ** 6)  # 6 gained
    row = {"seed": 0, "wall_s": 60.0, "folder_greedy": 0.25, "sft_greedy_accuracy": 0.6, "rl_greedy_accuracy": 0.75,
           "d_greedy": 0.5, "greedy_low": over_folder["low"], "greedy_high": over_folder["high"],
           "over_sft_low": over_sft["low"], "over_sft_high": over_sft["high"], "folder_right": 0.25, "rl_right": 0.75}
    block = real_model.table([row], [], (1.0, 1.0, 1.0), rg_task.Sizes(2000, 256, 40), dict(rg_task.TASK))
    head, _, cells = block.splitlines()[:3]
    assert head == ("| seed | folder greedy | SFT greedy | RL greedy | change greedy (95% paired interval) | RL over SFT "
                    "(95% paired interval) | folder arithmetic right | RL arithmetic right | wall |")
    assert cells.startswith(f"| 0 | 0.250 | 0.600 | 0.750 | +0.500 ({over_folder['low']:+.3f}, "
                            f"{over_folder['high']:+.3f}) | +0.150 ({over_sft['low']:+.3f}, {over_sft['high']:+.3f}) |")
    with pytest.raises(SystemExit, match="did not score the same problems"):
        (home / "objects" / "eval-sft-train" / "files" / "report.json").write_text(json.dumps({"problems": [
            {"prompt": "other", "answer": "0", "greedy": "0", "correct": True}] * 40}))
        real_model.paired(home, "rl", "sft")


def _put(home, name, manifest, problems=None):
    folder = home / "objects" / name
    (folder / "files").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": name, **manifest}))
    if problems is not None:
        (folder / "files" / "report.json").write_text(json.dumps({"problems": problems}))


def test_selection_against_none_gives_rl_the_selections_time_as_steps_and_pairs_the_two_rl_models(
        bench, tmp_path, monkeypatch):
    """--against-no-selection on a store laid out as a run leaves it: the SFT model's longer history (no step_s) is
    not RL's; the selection's 90 s at the RL steps' mean of 9 s become 10 more steps; the run without selection
    (here a stand-in that writes what the pipeline would) is paired with the selected run's RL model on the same
    problems. keep_run keeps the RL steps too."""
    _, real_model, _ = bench
    home = tmp_path / "store"

    def problems(n):  # 40 problems, the first n right
        return [{"prompt": f"q{i}", "answer": str(i), "greedy": "", "correct": i < n} for i in range(40)]

    _put(home, "sft", {"kind": "model", "extra": {"stage": "sft", "history": [{"loss": 1.0}] * 268}})
    _put(home, "sel", {"kind": "dataset", "metrics": {"seconds": 90.0}, "extra": {"stage": "pass_rate"}})
    _put(home, "rl-ckpt", {"kind": "model", "extra": {"history": [{"step_s": 8.0}] * 10}})
    _put(home, "rl", {"kind": "model", "extra": {"history": [{"step_s": 8.0}] * 15 + [{"step_s": 10.0}] * 15}})
    _put(home, "eval-base-x", {"kind": "eval"}, problems(5))
    _put(home, "eval-sft-x", {"kind": "eval"}, problems(20))
    _put(home, "eval-grpo-x", {"kind": "eval"}, problems(30))
    asked = {}

    def without_selection(seed, recipe, over, home_, what=""):
        asked.update(over)
        _put(home_, "rl-plain", {"kind": "model", "extra": {"history": [{"step_s": 7.0}] * over["rl"]["steps"]}})
        _put(home_, "eval-grpo-y", {"kind": "eval"}, problems(25))
        return {"seed": seed, "wall_s": 300.0}, ""

    monkeypatch.setattr(sys.modules["selection_vs_none"], "run_pipeline", without_selection)
    over = {"model": {}, "data": {"pass_rate": {"enabled": True}}, "reward": {}}
    r = real_model.against_no_selection(1, "small_instruct_sft_rl_cpu", over, home)
    assert asked["data"]["pass_rate"]["enabled"] is False and asked["rl"]["steps"] == 30 + 10
    assert (r["steps"], r["plain_steps"], r["rl_s"], r["plain_rl_s"]) == (30, 40, 270.0, 280.0)
    assert (r["selected_greedy"], r["plain_greedy"], r["d"]) == (0.75, 0.625, 0.125)
    assert r["low"] < r["d"] < r["high"] and r["p"] == pytest.approx(2 * 0.5 ** 5)  # 5 gained, none lost
    assert "| 1 | 1.5 min | 30 steps, 4.5 min | 40 steps, 4.7 min | 0.750 | 0.625 | +0.125 (" in (
        real_model.selection_table([r]))
    real_model.keep_run(home, tmp_path / "kept")
    assert len((tmp_path / "kept" / "steps.jsonl").read_text().splitlines()) == 40  # RL's steps, not SFT's 268


def test_the_printed_progress_keeps_the_rl_steps_ray_prefixes(bench):
    _, real_model, _ = bench
    out = ("noise\n\x1b[36m(ControllerActor pid=32447)\x1b[0m rl step 1/30: reward_mean=0.77\n"
           "(ControllerActor pid=9) rl step 2/30: reward_mean=0.8\npass_rate: dataset ab12 (96 of 256 train prompts kept)\n"
           "eval fa1d of model b5d5: greedy 0.762\n(PolicyWorker pid=3) rl: other\n")
    assert real_model.progress_lines(out) == ["rl step 1/30: reward_mean=0.77", "rl step 2/30: reward_mean=0.8",
                                              "pass_rate: dataset ab12 (96 of 256 train prompts kept)",
                                              "eval fa1d of model b5d5: greedy 0.762"]


def test_validation_figures_never_reach_the_docs_and_say_so(bench, tmp_path):
    rg_task, real_model, _ = bench
    for extra in (["--write-readme"], ["--rows-from", str(tmp_path / "x.log")]):
        with pytest.raises(SystemExit, match="--on validation: figures for choosing a recipe"):
            real_model.main(["--on", "validation", *extra])
    row = {"seed": 0, "wall_s": 60.0, "sft_greedy_accuracy": 0.25, "rl_greedy_accuracy": 0.5, "d_greedy": 0.25,
           "folder_right": 0.25, "rl_right": 0.5}
    block = real_model.table([row], [], (1.0, 1.0, 1.0), rg_task.Sizes(2000, 256, 256), dict(rg_task.TASK),
                             on="validation")
    assert real_model.ON_VALIDATION in block and real_model.ON_TEST not in block


def test_rows_from_a_run_before_the_three_splits_are_refused(bench, tmp_path):
    """Its held-out set is now the validation split: its figures must not join a table of test-split figures."""
    real_model = bench[1]
    log = tmp_path / "old.log"
    log.write_text('{"seed": 0, "d_greedy": 0.1}\n| seed |\n\nSmolLM2 ... 256 held-out questions ... Command: '
                   "`.venv/bin/python bench/real_model.py --seeds 0` (2026-11-27, commit abc; load average 2 2 2 at "
                   "the end).\n")
    with pytest.raises(SystemExit, match="does not say 'every figure is on the test split'"):
        real_model.read_earlier(log, ["--seeds", "1", "--rows-from", str(log)])
