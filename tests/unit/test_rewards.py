"""The reward interface (posttrain.rewards): call conventions read from the signature, every way a user function
can fail recorded with its reason, python_path, and eval scoring through the same sandbox. Every user function
runs in a real child process (tests/reward_fns.py); no mocks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import EvalConfig, ModelConfig, RewardConfig
from posttrain.rewards import MAX_TIMEOUTS_PER_SCORE, RewardFunctionError, RewardSample, RewardScorer

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 1+2?"}]


def sample(completion: str, **kw) -> RewardSample:
    return RewardSample(completion=completion, messages=kw.pop("messages", MSGS), **kw)


def scorer(fn: str, **kw) -> RewardScorer:
    return RewardScorer(RewardConfig(fn=f"tests.reward_fns:{fn}" if ":" not in fn else fn, **kw))


def scores(results) -> list:
    return [(r.score, r.failure) for r in results]


# ------------------------------------------------------------------------------------------ call conventions


def test_named_arguments_come_from_the_sample_and_its_columns():
    with scorer("uses_meta") as s:
        got = s.score([sample("7", columns={"meta": {"target": 7}}), sample("8", columns={"meta": {"target": 7}})])
    assert scores(got) == [(1.0, None), (0.0, None)]


def test_reserved_names_win_over_columns_and_defaults_apply():
    with scorer("exact") as s:  # a column named "answer" does not replace the reference answer
        assert scores(s.score([sample("3", answer="3", columns={"answer": "4"})])) == [(1.0, None)]
    with scorer("optional_column") as s:
        assert scores(s.score([sample("x"), sample("x", columns={"bonus": 1.0})])) == [(1.5, None), (2.0, None)]


def test_kwargs_function_gets_every_argument():
    with scorer("everything") as s:
        got = s.score([sample("a", answer="b", task="t", columns={"meta": 1, "level": 2}), sample("a")])
    assert scores(got) == [(127.0, None), (31.0, None)]  # 5 reserved names (+ meta, level on the first row)


def test_batch_function_gets_lists_once_per_call():
    with scorer("batch_len") as s:
        assert s.batch
        got = s.score([sample("ab", answer="ab"), sample("xyz", answer="q"), sample("", answer=None)])
    assert scores(got) == [(12.0, None), (3.0, None), (0.0, None)]


def test_old_three_argument_functions_still_work():
    with scorer("always_one") as s:
        assert scores(s.score([sample("anything")])) == [(1.0, None)]


def test_builtin_verifier_scores_in_process():
    from posttrain.data import verifiers

    s = RewardScorer(RewardConfig())
    rows = [sample("0433", answer="0433", task="addition"), sample("0434", answer="0433", task="addition")]
    assert [r.score for r in s.score(rows)] == [verifiers.score("addition", r.completion, r.answer) for r in rows]
    assert s.name == "posttrain.data.verifiers:score" and len(s.identity["source_sha256"]) == 64


def test_required_argument_no_row_supplies_is_refused_before_scoring():
    with scorer("uses_meta") as s:
        s.check_arguments(["meta", "other"])  # fine
        with pytest.raises(RewardFunctionError, match=r"tests\.reward_fns:uses_meta .*\['meta'\].*available argument "
                           r"names: \['answer', 'completion', 'messages', 'other', 'prompt', 'task'\]"):
            s.check_arguments(["other"])
        # one row without the column: a recorded failure for that row only
        got = s.score([sample("7", columns={"meta": {"target": 7}}), sample("7")])
    assert got[0].failure is None and got[1].score == 0.0 and "row has no column 'meta'" in got[1].failure


# ------------------------------------------------------------------------------------------ failures


@pytest.mark.parametrize("value, reason", [
    ("nan", "returned nan, not a finite number"), ("inf", "returned inf, not a finite number"),
    ("-inf", "returned -inf, not a finite number"), ("none", "returned None (NoneType), not a number"),
    ("str", "returned '1.0' (str), not a number"), ("true", "returned True (bool), not a number"),
])
def test_non_scores_are_failures(value, reason):
    with scorer("returns") as s:
        got = s.score([sample(value), sample("int"), sample("float")])
    assert scores(got) == [(0.0, reason), (2.0, None), (0.25, None)]


def test_exceptions_and_sys_exit_are_failures_and_the_process_survives():
    with scorer("raises") as s:
        (r,) = s.score([sample("x")])
        assert r.score == 0.0 and r.failure.startswith("ValueError: broken reward function (reward_fns.py:")
    with scorer("exits") as s:
        pid = s._box.proc.pid
        assert scores(s.score([sample("x")]))[0][1].startswith("SystemExit: 3")
        assert s._box.proc.pid == pid  # caught in the child: no restart needed


def test_a_dead_child_is_a_failure_and_is_replaced():
    with scorer("dies") as s:
        first = s._box.proc.pid
        got = s.score([sample("x"), sample("y")])
        assert [r.failure for r in got] == ["reward process died (exit code 7); replaced"] * 2
        assert s._box.proc.pid != first and s._box.proc.poll() is None


def test_a_crash_by_signal_is_named_and_the_child_is_replaced():
    with scorer("aborts") as s:
        first = s._box.proc.pid
        (r,) = s.score([sample("x")])
        assert r.failure == "reward process died (killed by SIGABRT); replaced"
        assert s._box.proc.pid != first and s._box.proc.poll() is None


def test_runaway_memory_is_a_failure_and_the_child_is_replaced():
    """reward.memory_mb caps what a call may add to the process: 300 MB over a 100 MB limit is a MemoryError,
    recorded with the limit; the child is replaced and later calls score."""
    with scorer("allocates", memory_mb=100) as s:
        first = s._box.proc.pid
        got = s.score([sample("small"), sample("big"), sample("small")])
        assert got[0] == got[2] and got[0].score == 1.0 and got[0].failure is None
        assert got[1].score == 0.0 and got[1].failure.startswith("MemoryError")
        assert "over reward.memory_mb = 100 (reward process replaced)" in got[1].failure
        assert s._box.proc.pid != first
    with scorer("allocates", memory_mb=0) as s:  # 0: no limit
        assert scores(s.score([sample("big")])) == [(1.0, None)]


def test_cpu_time_over_the_limit_kills_the_call_and_the_child_is_replaced():
    """reward.cpu_s is CPU time per call: a 60 s spin with cpu_s 1 ends by SIGXCPU long before the 120 s wall
    timeout; calls before and after score (the limit is per call, not for the process's life)."""
    with scorer("spins", cpu_s=1, timeout_s=120) as s:
        got = s.score([sample("x"), sample("spin"), sample("y")])
    assert scores(got) == [(1.0, None), (0.0, ("reward process exceeded its CPU-time limit (reward.cpu_s = 1; "
                                              "killed by SIGXCPU); replaced")), (1.0, None)]


def test_output_on_stdout_goes_to_stderr(capfd):
    """A function that prints cannot corrupt the parent's stdout (e.g. `posttrain eval --json`)."""
    with scorer("prints") as s:
        assert scores(s.score([sample("hello")])) == [(1.0, None)]
    out, err = capfd.readouterr()
    assert "REWARD-STDOUT" not in out and "REWARD-STDOUT hello" in err


def test_a_hung_call_times_out_and_the_child_is_killed_and_replaced():
    with scorer("hangs_on_slow", timeout_s=0.5) as s:
        first = s._box.proc
        got = s.score([sample("a"), sample("slow"), sample("b")])
        assert scores(got) == [(1.0, None), (0.0, "timed out after 0.5s (reward process killed and replaced)"),
                               (1.0, None)]
        assert first.poll() is not None and s._box.proc.pid != first.pid  # killed; a new child scored "b"


def test_timeouts_within_one_batch_are_bounded():
    with scorer("hangs", timeout_s=0.3) as s:
        got = s.score([sample(str(i)) for i in range(6)])
    assert [r.failure.split(" ")[0] for r in got] == ["timed"] * MAX_TIMEOUTS_PER_SCORE + ["not"] * 3
    assert got[-1].failure == f"not called: {MAX_TIMEOUTS_PER_SCORE} calls in this batch timed out already"


def test_batch_failures_fail_the_whole_batch_with_the_reason():
    with scorer("batch_wrong_length") as s:
        assert scores(s.score([sample("a"), sample("b")])) == [(0.0, "returned 3 scores for 2 samples")] * 2
    with scorer("batch_hangs", timeout_s=0.5) as s:
        got = s.score([sample("a"), sample("b")])
        assert {r.failure for r in got} == {"timed out after 0.5s (reward process killed and replaced)"}


# ------------------------------------------------------------------------------------------ naming and python_path


def test_a_module_on_python_path_is_imported_in_the_child_only(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    src = "import os\n\ndef score(completion, length):\n    return float(len(completion) == length)\n"
    (mods / "my_reward_mod.py").write_text(src)
    with RewardScorer(RewardConfig(fn="my_reward_mod:score", python_path=[str(mods)])) as s:
        assert scores(s.score([sample("abc", columns={"length": 3}), sample("ab", columns={"length": 3})])) == \
            [(1.0, None), (0.0, None)]
        assert s.identity == {"import_path": "my_reward_mod:score",
                              "source_sha256": hashlib.sha256(src.encode()).hexdigest()}
    assert "my_reward_mod" not in sys.modules  # user code never runs in the parent


def test_the_answer_column_is_an_argument_under_its_own_name_too(tmp_path):
    """`data.answer_field: "solution"`: a function may name `solution` (the column as given) or `answer` (the
    reference answer); data prep -> dataset -> check_arguments -> score, end to end."""
    from posttrain.config import DataConfig, DataSchema
    from posttrain.data.examples import read_examples
    from posttrain.data.prepare import prepare_dataset

    rows = [{"question": f"{i}+{i}?", "solution": f"{i} and {i}\n#### {2 * i}"} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(task="", files=[str(tmp_path / "d.jsonl")], schema=DataSchema.PROMPT_ANSWER, eval_size=1,
                     prompt_field="question", answer_field="solution", answer_marker="####")
    info = prepare_dataset(cfg, tmp_path / "ds", require_completions=False)
    assert info.columns == ["solution"]
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "by_column.py").write_text("def f(completion, solution):\n    return float(solution.endswith(completion))\n\n"
                                       "def g(completion, answer):\n    return float(completion == answer)\n")
    ex = read_examples(tmp_path / "ds", "train")[0]
    right = ex["answer"]
    assert ex["columns"]["solution"].endswith(f"#### {right}")
    for fn in ("by_column:f", "by_column:g"):
        with RewardScorer(RewardConfig(fn=fn, python_path=[str(mods)])) as s:
            s.check_arguments(info.columns)
            got = s.score([RewardSample.from_example(ex, right), RewardSample.from_example(ex, "wrong")])
            assert scores(got) == [(1.0, None), (0.0, None)], fn


def test_bad_names_and_paths_are_clear_errors(tmp_path):
    with pytest.raises(RewardFunctionError, match=r"reward\.python_path: \[.*nowhere.*\] not found"):
        RewardScorer(RewardConfig(fn="m:f", python_path=[str(tmp_path / "nowhere")]))
    with pytest.raises(RewardFunctionError, match=r"reward\.fn: 'no_colon' must look like 'module:function'"):
        RewardScorer(RewardConfig(fn="no_colon"))
    with pytest.raises(RewardFunctionError, match=r"cannot import 'no_such_mod:f'.*reward\.python_path = \["):
        RewardScorer(RewardConfig(fn="no_such_mod:f", python_path=[str(tmp_path)]))
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(RewardFunctionError, match=r"importing 'broken_at_import:f' failed: RuntimeError: boom"):
        RewardScorer(RewardConfig(fn="broken_at_import:f", python_path=[str(tmp_path)]))


# ------------------------------------------------------------------------------------------ eval


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """An untrained tiny Llama with a freshly trained byte-level BPE tokenizer (seconds to build)."""
    from posttrain.models.io import save_model
    from posttrain.models.tiny import build_model
    from posttrain.models.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    texts = [f"{a}+{b}={a + b}" for a in range(40) for b in range(40)]
    tok = train_tokenizer(texts, 300, root / "tok")
    save_model(build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                       intermediate_size=64), tok), tok, root / "model")
    return root / "model"


def _eval_split(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"messages": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a), "task": None,
         "columns": {"meta": {"target": "?"}}} for a in range(6)]


def test_eval_k0_is_greedy_only_and_scores_through_the_user_function(tmp_path, tiny_model):
    from posttrain.eval import EvalReport, evaluate

    ds = _eval_split(tmp_path / "ds", ROWS)
    cfg = EvalConfig(num_problems=0, k=0, max_new_tokens=4)
    first = evaluate(tiny_model, ds, cfg, RewardConfig(fn="tests.reward_fns:always_one"))
    assert (first.greedy_accuracy, first.sampled_accuracy, first.pass_at_k) == (1.0, None, None)
    assert first.reward_calls == 6 and first.reward_failures == 0 and first.scorer == "tests.reward_fns:always_one"
    assert EvalReport.from_json(first.to_json()) == first
    # The function sees the completion, the prompt and the row's column: make meta.target the greedy text.
    greedy = [s["greedy"] for s in first.samples]
    rows = [{**r, "columns": {"meta": {"target": g}}} for r, g in zip(ROWS, greedy)]
    rows[0] = {**rows[0], "columns": {"meta": {"target": greedy[0] + "x"}}}
    r = evaluate(tiny_model, _eval_split(tmp_path / "ds2", rows), cfg, RewardConfig(fn="tests.reward_fns:uses_meta"))
    assert r.greedy_accuracy == pytest.approx(5 / 6) and r.reward_failures == 0


def test_eval_with_k_samples_and_failures_recorded(tmp_path, tiny_model):
    from posttrain.eval import evaluate

    ds = _eval_split(tmp_path / "ds", ROWS)
    r = evaluate(tiny_model, ds, EvalConfig(num_problems=4, k=2, max_new_tokens=4, top_k=5),
                 RewardConfig(fn="tests.reward_fns:everything"))
    assert (r.greedy_accuracy, r.sampled_accuracy, r.pass_at_k, r.reward_calls) == (1.0, 1.0, 1.0, 12)
    bad = evaluate(tiny_model, ds, EvalConfig(num_problems=4, k=1, max_new_tokens=4),
                   RewardConfig(fn="tests.reward_fns:raises"))
    assert (bad.greedy_accuracy, bad.sampled_accuracy, bad.reward_failures, bad.reward_calls) == (0.0, 0.0, 8, 8)
    assert bad.reward_failure_examples[0].startswith("ValueError: broken reward function")
    assert bad.samples[0]["failure"].startswith("ValueError")


def test_eval_refuses_a_missing_argument_before_loading_the_model(tmp_path):
    from posttrain.eval import evaluate

    ds = _eval_split(tmp_path / "ds", [{**r, "columns": {}} for r in ROWS])
    with pytest.raises(RewardFunctionError, match=r"uses_meta .*\['meta'\]"):  # the model folder does not exist
        evaluate(tmp_path / "no-model", ds, EvalConfig(k=0), RewardConfig(fn="tests.reward_fns:uses_meta"))


def test_eval_stage_with_k0_stores_no_sampled_numbers(tmp_path, tiny_model, capsys):
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(str(tmp_path / "store"))
    model = store.put("model", "tiny", tiny_model, run_id="t", parents=[], config={})
    ds = store.put("dataset", "ds", _eval_split(tmp_path / "ds", ROWS), run_id="t", parents=[], config={})
    out = stages.evaluate(EvalConfig(k=0, max_new_tokens=4), RewardConfig(fn="tests.reward_fns:raises"), model=model,
                          dataset=ds, run_id="t", store=store)
    assert (out.sampled_accuracy, out.pass_at_k, out.reward_failures) == (None, None, 6)
    assert "sampled n/a, pass@k n/a" in capsys.readouterr().out
    assert "sampled_accuracy" not in store.manifest(out.report.id).metrics


# ------------------------------------------------------------------------------------------ a real third-party scorer

RG_VERSION = "0.1.25"


@pytest.fixture(scope="session")
def reasoning_gym_dir(request):
    """reasoning-gym from PyPI, installed once with `pip install --target` into pytest's cache folder (about
    25 s, no torch); skipped when PyPI cannot be reached."""
    root = Path(request.config.cache.mkdir("reasoning_gym")) / RG_VERSION
    if not (root / "reasoning_gym").is_dir():
        tmp = root.with_name(f".tmp-{RG_VERSION}-{os.getpid()}")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--no-input", "--target", str(tmp), f"reasoning-gym=={RG_VERSION}"],
                              check=False, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"cannot install reasoning-gym=={RG_VERSION} from PyPI: {proc.stderr.strip()[-300:]}")
        if not root.exists():
            os.replace(tmp, root)
    return root


def test_reasoning_gym_scorer_needs_the_rows_metadata(tmp_path, reasoning_gym_dir):
    code = ("import json, reasoning_gym; print(json.dumps(list(reasoning_gym.create_dataset('countdown', size=3, "
            "seed=1))))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(reasoning_gym_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = json.loads(proc.stdout)
    rows = [{"messages": [{"role": "user", "content": e["question"]}], "answer": e["answer"], "task": None,
             "columns": {"metadata": e["metadata"]}} for e in entries]
    # Seed 1 of this pinned version: the first problem makes 309 from 6, 61, 94, 4 (reference '94*4 - 61 - 6').
    assert rows[0]["answer"] == "94*4 - 61 - 6" and rows[0]["columns"]["metadata"]["target"] == 309
    cfg = RewardConfig(fn="tests.reward_fns:reasoning_gym_score", python_path=[str(reasoning_gym_dir)], timeout_s=60)
    with RewardScorer(cfg) as s:
        s.check_arguments(["metadata"])
        samples = [RewardSample.from_example(r, r["answer"]) for r in rows]  # the references: correct
        samples += [RewardSample.from_example(rows[0], c) for c in (
            "4*94 - 6 - 61",   # another correct expression: checked against metadata numbers and target, not the answer
            "94*4 - 61 + 6",   # the right numbers, the wrong value (321)
            "1 + 1")]          # the wrong numbers
        samples.append(RewardSample.from_example({**rows[0], "columns": {}}, rows[0]["answer"]))  # no metadata
        got = s.score(samples)
    assert all(r.failure is None for r in got[:6]), got
    assert [r.score for r in got[:4]] == [1.0, 1.0, 1.0, 1.0]
    assert got[4].score < 1.0 and got[5].score < 1.0  # countdown gives 0.05 to a wrong expression, not 0
    assert got[6].score == 0.0 and "row has no column 'metadata'" in got[6].failure
