"""Data as users have it: held-out eval files, extra columns, prompt-only rows, chat-format prompt/completion
lists, a system prompt, and chats without an assistant reply refused when SFT will train on them. Real files
(jsonl, csv, parquet) in tmp_path; errors are asserted word for word, with nothing written."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from posttrain.config import DataConfig, DataSchema
from posttrain.data.examples import read_examples
from posttrain.data.prepare import prepare_dataset, source_fingerprint
from posttrain.data.validation import DataValidationError, Problems, to_example

SFT_HINT = ("SFT (sft.enabled true) trains on the final assistant turn: end each chat with one, or set sft.enabled "
            "false for RL/eval-only prompt data")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _hf(path, rows):
    import datasets

    ds = datasets.Dataset.from_list(rows)
    ds.to_csv(str(path), index=False) if path.suffix == ".csv" else ds.to_parquet(str(path))
    return path


def _files(tmp_path, out: str) -> list[bytes]:
    return [(tmp_path / out / f).read_bytes() for f in ("train.jsonl", "eval.jsonl", "info.json")]


def _cfg(files, **kw) -> DataConfig:
    return DataConfig(task="", files=[str(f) for f in files], eval_size=kw.pop("eval_size", 2), **kw)


def _fails(cfg, out, **kw) -> str:
    with pytest.raises(DataValidationError) as e:
        prepare_dataset(cfg, out, **kw)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".staging-")]
    return str(e.value)


# ------------------------------------------------------------------------------------------- eval files


def test_eval_files_are_the_eval_split_as_given_and_overlap_is_counted(tmp_path, capsys):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(8)]
                   + [{"prompt": "q0", "completion": "a0"}])  # an exact duplicate: dropped from train
    held = _hf(tmp_path / "held.csv", [{"prompt": "q1", "completion": "other"},  # same prompt as a train row
                                       {"prompt": "x1", "completion": "y1"},
                                       {"prompt": "x1", "completion": "y1"},  # duplicate: kept, as given
                                       {"prompt": "q2", "completion": "a2"}])
    cfg = _cfg([train], eval_files=[str(held)], eval_size=0)
    info = prepare_dataset(cfg, tmp_path / "out")
    assert "data prep: 2 of 4 eval rows also occur in the train split (same prompt turns)" in capsys.readouterr().out
    ev = read_examples(tmp_path / "out", "eval")
    assert [(e["messages"][0]["content"], e["messages"][1]["content"]) for e in ev] == [
        ("q1", "other"), ("x1", "y1"), ("x1", "y1"), ("q2", "a2")]
    assert (info.num_train, info.num_eval, info.num_duplicates, info.num_eval_in_train) == (8, 4, 1, 2)
    assert sorted(e["messages"][0]["content"] for e in read_examples(tmp_path / "out", "train")) == [
        f"q{i}" for i in range(8)]  # nothing held out of the train files
    recorded = json.loads((tmp_path / "out" / "info.json").read_text())
    assert recorded["num_eval_in_train"] == 2 and recorded["eval_from_files"] is True
    assert [s["split"] for s in recorded["sources"]] == ["train", "eval"]

    prepare_dataset(cfg, tmp_path / "again")  # same input -> byte-identical files
    assert _files(tmp_path, "out") == _files(tmp_path, "again")

    fp = source_fingerprint(cfg)
    assert fp != source_fingerprint(_cfg([train]))
    held.write_text(held.read_text().replace("y1", "z1"))  # edited eval file at the same path
    assert source_fingerprint(cfg) != fp


def test_eval_files_are_validated_like_the_train_files(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(4)])
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "q", "completion": "a"}, {"prompt": "q"},
                                            {"prompt": "", "completion": "a"}])
    held_csv = _hf(tmp_path / "held.csv", [{"prompt": "q", "completion": "a"}, {"prompt": "q", "completion": None}])
    msg = _fails(_cfg([train], eval_files=[str(held), str(held_csv)], eval_size=0), tmp_path / "out")
    assert f"{held}:line 2: field 'completion': missing" in msg, msg
    assert f"{held}:line 3: field 'prompt': empty text" in msg, msg
    assert f"{held_csv}:row 2: field 'completion': missing" in msg, msg
    assert msg.startswith("3 problem(s)"), msg
    gone = tmp_path / "gone.jsonl"
    msg = _fails(_cfg([train], eval_files=[str(gone)], eval_size=0), tmp_path / "out")
    assert f"{gone}: file or folder does not exist (listed in data.eval_files)" in msg
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    msg = _fails(_cfg([train], eval_files=[str(empty)], eval_size=0), tmp_path / "out")
    assert f"data.eval_files: no rows in {empty}" in msg


# ---------------------------------------------------------------------------------------- extra columns


def test_extra_columns_are_kept_json_ready(tmp_path):
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "id": i, "ok": i % 2 == 0, "score": 0.5, "none": None,
             "meta": {"tags": ["x", i], "nested": {"deep": True}}} for i in range(4)]
    src = _jsonl(tmp_path / "d.jsonl", rows)
    src.write_text(src.read_text().replace('"score": 0.5', '"score": NaN', 1))  # python-json NaN -> null
    prepare_dataset(_cfg([src], eval_size=1), tmp_path / "out")
    ex = {e["messages"][0]["content"]: e for e in read_examples(tmp_path / "out", "train")
          + read_examples(tmp_path / "out", "eval")}
    assert ex["q1"]["columns"] == {"id": 1, "ok": False, "score": 0.5, "none": None,
                                   "meta": {"tags": ["x", 1], "nested": {"deep": True}}}
    assert ex["q0"]["columns"]["score"] is None
    assert json.loads((tmp_path / "out" / "info.json").read_text())["columns"] == ["id", "meta", "none", "ok", "score"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["p1", "p2", "p3"], "completion": ["c1", "c2", "c3"],
                      "when": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5)] * 3),
                      "day": pa.array([datetime.date(2024, 1, 2)] * 3),
                      "blob": pa.array([b"\x00\xff"] * 3, pa.binary()),
                      "price": pa.array([decimal.Decimal("1.50")] * 3, pa.decimal128(5, 2))})
    pq.write_table(table, tmp_path / "typed.parquet")
    prepare_dataset(_cfg([tmp_path / "typed.parquet"], eval_size=1), tmp_path / "typed")
    cols = read_examples(tmp_path / "typed", "eval")[0]["columns"]
    assert cols == {"when": "2024-01-02T03:04:05", "day": "2024-01-02", "blob": {"base64": "AP8="}, "price": "1.50"}


def test_columns_that_cannot_be_json_are_refused_naming_file_row_and_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["p1", "p2"], "completion": ["c1", "c2"],
                             "wait": pa.array([None, datetime.timedelta(seconds=3)], pa.duration("s"))}),
                   tmp_path / "d.parquet")
    msg = _fails(_cfg([tmp_path / "d.parquet"], eval_size=1), tmp_path / "out")
    assert msg == (f"1 problem(s) in the input data:\n  {tmp_path / 'd.parquet'}:row 2: field 'wait': a value of type "
                   f"timedelta cannot be stored as JSON; convert the column to text, numbers, booleans, lists or "
                   f"objects of those, or drop it"), msg
    src = tmp_path / "inf.jsonl"
    src.write_text('{"prompt": "p", "completion": "c", "meta": {"w": [1, Infinity]}}\n')
    msg = _fails(_cfg([src], eval_size=1), tmp_path / "out")
    assert f"{src}:line 1: field 'meta.w[1]': inf cannot be stored as JSON; use a finite number, text or null" in msg
    problems = Problems()
    assert to_example({"prompt": "p", "completion": "c", "obj": {3: "x"}}, "f.jsonl:line 7", _cfg([src]), problems,
                      require_completion=True) is None
    assert problems.items == ["f.jsonl:line 7: field 'obj': object key 3 is not text; JSON object keys must be text"]


def test_builtin_tasks_have_empty_columns(tmp_path):
    prepare_dataset(DataConfig(num_examples=50, eval_size=5), tmp_path / "out")
    assert all(e["columns"] == {} for e in read_examples(tmp_path / "out", "train"))


# ---------------------------------------------------------------------------------------- prompt-only rows


def test_prompt_only_rows_for_rl_and_eval(tmp_path):
    rows = [{"question": f"Q{i}", "answer": f"{i}", "meta": {"id": i}} for i in range(5)]
    src = _hf(tmp_path / "prompts.parquet", rows)
    cfg = _cfg([src], schema=DataSchema.PROMPT_ANSWER, prompt_field="question", answer_field="", eval_size=1)
    info = prepare_dataset(cfg, tmp_path / "out", require_completions=False)
    ex = sorted(read_examples(tmp_path / "out", "train") + read_examples(tmp_path / "out", "eval"),
                key=lambda e: e["messages"][0]["content"])
    assert ex[2] == {"messages": [{"role": "user", "content": "Q2"}], "answer": None, "task": None,
                     "columns": {"answer": "2", "meta": {"id": 2}}}  # an unused answer column is just a column
    assert info.require_completions is False

    msg = _fails(cfg, tmp_path / "out2", require_completions=True)
    assert msg == ("1 problem(s) in the input data:\n  data.schema: 'prompt_answer' rows (" + str(src) + ") are prompts "
                   "without completions, but SFT is enabled and needs an assistant reply to train on; set sft.enabled "
                   "false for RL/eval-only prompt data, or give prompt/completion pairs (schema 'prompt_completion') "
                   "or chats ('messages')"), msg

    with_answer = _cfg([_jsonl(tmp_path / "a.jsonl", [{"question": "Q", "answer": "1"}, {"question": "Q2"}])],
                       schema=DataSchema.PROMPT_ANSWER, prompt_field="question", eval_size=1)
    msg = _fails(with_answer, tmp_path / "out3", require_completions=False)
    assert f"{tmp_path / 'a.jsonl'}:line 2: field 'answer': missing" in msg  # with an answer field it is required


# --------------------------------------------------------------------------- chat-format prompt/completion


TURNS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
REPLY = [{"role": "assistant", "content": "It is 4.\n#### 4"}]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_conversational_prompt_completion(tmp_path, fmt):
    rows = [{"prompt": TURNS[:1] + [{"role": "user", "content": f"{i}+{i}?"}],
             "completion": [{"role": "assistant", "content": f"#### {2 * i}"}], "src": "t"} for i in range(4)]
    if fmt == "csv":  # csv holds the turns as their JSON text
        rows = [{**r, "prompt": json.dumps(r["prompt"]), "completion": json.dumps(r["completion"])} for r in rows]
    src = _jsonl(tmp_path / "c.jsonl", rows) if fmt == "jsonl" else _hf(tmp_path / f"c.{fmt}", rows)
    prepare_dataset(_cfg([src], answer_marker="####", eval_size=1), tmp_path / "out")
    ex = {e["messages"][1]["content"]: e for e in read_examples(tmp_path / "out", "train")
          + read_examples(tmp_path / "out", "eval")}
    assert ex["3+3?"] == {"messages": [TURNS[0], {"role": "user", "content": "3+3?"},
                                       {"role": "assistant", "content": "#### 6"}],
                          "answer": "6", "task": "exact", "columns": {"src": "t"}}
    # a prompt_answer prompt may be a list of turns too; plain text that merely starts with "[" stays text
    pa_rows = [{"prompt": TURNS, "answer": "4"}, {"prompt": "[1, 2] - how many items?", "answer": "2"}]
    prepare_dataset(_cfg([_jsonl(tmp_path / "pa.jsonl", pa_rows)], schema=DataSchema.PROMPT_ANSWER, eval_size=1),
                    tmp_path / "pa", require_completions=False)
    got = read_examples(tmp_path / "pa", "train") + read_examples(tmp_path / "pa", "eval")
    assert sorted((e["answer"], e["messages"]) for e in got) == [
        ("2", [{"role": "user", "content": "[1, 2] - how many items?"}]), ("4", TURNS)]


def test_prompt_completion_rows_may_carry_a_reference_answer_for_rl(tmp_path):
    """SFT pairs whose rows also name the answer (a task's train rows: SFT on them, then RL scores against the
    answer): the column is the reference, not a column, and its marker is applied; rows without it fall back to the
    completion's marker; an empty answer is refused naming the row and field."""
    rows = [{"prompt": "3+3?", "completion": "6", "answer": "3 and 3 #### 6", "src": "t"},
            {"prompt": "1+1?", "completion": "#### 2", "src": "t"},
            {"prompt": "2+5?", "completion": "7", "solution": "so: #### 7"}]
    prepare_dataset(_cfg([_jsonl(tmp_path / "a.jsonl", rows[:2])], answer_marker="####", eval_size=1), tmp_path / "o")
    got = {e["messages"][0]["content"]: e for e in read_examples(tmp_path / "o", "train")
           + read_examples(tmp_path / "o", "eval")}
    assert got["3+3?"]["answer"] == "6" and got["3+3?"]["columns"] == {"src": "t"}
    assert got["3+3?"]["messages"][-1] == {"role": "assistant", "content": "6"}
    assert got["1+1?"]["answer"] == "2"
    prepare_dataset(_cfg([_jsonl(tmp_path / "b.jsonl", rows[2:] * 2)], answer_field="solution", answer_marker="####",
                         eval_size=0), tmp_path / "p")
    (ex,) = read_examples(tmp_path / "p", "train")
    assert ex["answer"] == "7" and ex["columns"] == {"solution": "so: #### 7"}  # kept under its own name too
    prepare_dataset(_cfg([_jsonl(tmp_path / "n.jsonl", [{**rows[0], "answer": 6}] * 2)], eval_size=0), tmp_path / "n")
    assert read_examples(tmp_path / "n", "train")[0]["answer"] == "6"  # a number, as prompt_answer takes it
    msg = _fails(_cfg([_jsonl(tmp_path / "c.jsonl", [{**rows[0], "answer": " "}])], eval_size=0), tmp_path / "q")
    assert f"{tmp_path / 'c.jsonl'}:line 1: field 'answer': empty text" in msg


def test_conversational_turn_errors_name_the_turn(tmp_path):
    rows = [
        {"prompt": TURNS, "completion": REPLY},  # line 1: fine
        {"prompt": TURNS, "completion": [{"role": "user", "content": "x"}]},  # line 2
        {"prompt": [{"role": "bot", "content": "x"}, {"role": "user", "content": " "}], "completion": REPLY},  # 3
        {"prompt": '[{"role": "user", "content": "x"', "completion": REPLY},  # line 4: broken JSON text
        {"prompt": [], "completion": REPLY},  # line 5
        {"prompt": TURNS, "completion": ["hi"]},  # line 6
    ]
    src = _jsonl(tmp_path / "c.jsonl", rows)
    msg = _fails(_cfg([src], eval_size=1), tmp_path / "out")
    expected = [
        "line 2: field 'completion[0].role': a completion turn must be an assistant turn, got 'user'",
        "line 3: field 'prompt[0].role': invalid chat role 'bot'; allowed: ['system', 'user', 'assistant']",
        "line 3: field 'prompt[1].content': empty text",
        "line 4: field 'prompt': not a list of messages (invalid JSON text)",
        "line 5: field 'prompt': expected text or a non-empty list of {role, content} messages",
        "line 6: field 'completion[0]': expected an object with role and content, got str",
    ]
    assert msg == f"{len(expected)} problem(s) in the input data:\n  " + "\n  ".join(f"{src}:{e}" for e in expected)
    pa = _jsonl(tmp_path / "pa.jsonl", [{"prompt": TURNS + REPLY, "answer": "4"}])
    msg = _fails(_cfg([pa], schema=DataSchema.PROMPT_ANSWER, eval_size=1), tmp_path / "out",
                 require_completions=False)
    assert (f"{pa}:line 1: field 'prompt[2].role': a prompt must not end with an assistant turn (it would be taken "
            f"for the completion)") in msg


# --------------------------------------------------------------------------------------------- system prompt


def test_system_prompt_goes_first_unless_the_chat_has_one(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(3)] + [{"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "q"},
                                                {"role": "assistant", "content": "a"}]}]
    src = _jsonl(tmp_path / "m.jsonl", rows)
    prepare_dataset(_cfg([src], schema=DataSchema.MESSAGES, system_prompt="Be terse.", eval_size=1), tmp_path / "out")
    ex = read_examples(tmp_path / "out", "train") + read_examples(tmp_path / "out", "eval")
    firsts = sorted(e["messages"][0]["content"] for e in ex)
    assert firsts == ["Be terse.", "Be terse.", "Be terse.", "own"]
    assert all(e["messages"][0]["role"] == "system" and e["messages"][1]["role"] == "user" for e in ex)
    prepare_dataset(DataConfig(num_examples=30, eval_size=3, system_prompt="Add."), tmp_path / "syn")
    syn = read_examples(tmp_path / "syn", "train")
    assert all([m["role"] for m in e["messages"]] == ["system", "user", "assistant"] for e in syn)
    assert syn[0]["messages"][0] == {"role": "system", "content": "Add."}


# ------------------------------------------------------------------------------- chats without a reply


def test_chats_without_an_assistant_reply_are_refused_when_sft_trains(tmp_path):
    u = {"role": "user", "content": "q"}
    a = {"role": "assistant", "content": "a"}
    rows = [{"messages": [u, a]}, {"messages": [u, a, {"role": "user", "content": "and?"}]}, {"messages": [u]},
            {"messages": [{"role": "system", "content": "s"}, u, a]}]
    src = _jsonl(tmp_path / "chats.jsonl", rows)
    cfg = _cfg([src], schema=DataSchema.MESSAGES, eval_size=1)
    msg = _fails(cfg, tmp_path / "out", require_completions=True)
    assert msg == ("2 problem(s) in the input data:\n"
                   f"  {src}:line 2: field 'messages': the chat ends with a 'user' turn; {SFT_HINT}\n"
                   f"  {src}:line 3: field 'messages': the chat has no assistant turn; {SFT_HINT}"), msg
    info = prepare_dataset(cfg, tmp_path / "rl", require_completions=False)  # RL/eval-only: fine
    assert info.num_train + info.num_eval + info.num_train_dropped_for_eval == 4
    # held-out eval files are never trained on, so their prompts need no reply
    held = _jsonl(tmp_path / "held.jsonl", [{"messages": [u]}])
    ok = _cfg([_jsonl(tmp_path / "t.jsonl", [rows[0], rows[3]])], schema=DataSchema.MESSAGES,
              eval_files=[str(held)], eval_size=0)
    prepare_dataset(ok, tmp_path / "sft", require_completions=True)
    assert read_examples(tmp_path / "sft", "eval")[0]["messages"] == [u]


def test_stage_cache_key_includes_require_completions_and_eval_files(tmp_path, capsys):
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TokenizerConfig

    store = ArtifactStore(str(tmp_path / "store"))
    train = _jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(6)])
    held = _jsonl(tmp_path / "h.jsonl", [{"prompt": "q1", "completion": "a1"}, {"prompt": "z", "completion": "y"}])
    cfg = _cfg([train], eval_files=[str(held)], eval_size=0, tokenizer=TokenizerConfig(train=False))
    out = stages.data_prep(cfg, require_completions=True, run_id="r1", store=store)
    manifest = {m.id: m for m in store.list()}[out.dataset.id]
    assert manifest.metrics["num_eval_in_train"] == 1 and manifest.metrics["num_eval"] == 2
    capsys.readouterr()
    stages.data_prep(cfg, require_completions=True, run_id="r2", store=store)
    assert "cache hit" in capsys.readouterr().out
    stages.data_prep(cfg, require_completions=False, run_id="r3", store=store)
    assert "cache hit" not in capsys.readouterr().out
    _jsonl(held, [{"prompt": "z", "completion": "y"}])  # the eval file's bytes count
    out2 = stages.data_prep(cfg, require_completions=True, run_id="r4", store=store)
    assert "cache hit" not in capsys.readouterr().out and out2.dataset.id != out.dataset.id
