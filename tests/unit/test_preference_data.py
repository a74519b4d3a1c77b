"""Preference data (`data.schema: "preference"`): prompt / chosen / rejected rows in TRL's three forms (text,
conversational with an explicit prompt, conversational with the prompt implicit in the shared turns) through
data prep, from jsonl, csv, parquet and a save_to_disk folder; every refusal naming file, row and field with
nothing written; de-duplication and the held-out split by prompt; the round trip to `pair_conversations`."""

from __future__ import annotations

import json

import pytest

from posttrain.config import ConfigError, DataConfig, DataSchema
from posttrain.data.examples import is_preference, pair_conversations, prompt_messages, read_examples
from posttrain.data.prepare import prepare_dataset
from posttrain.data.validation import DataValidationError, Problems, to_example

SYS = {"role": "system", "content": "be brief"}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def bot(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _cfg(files, **kw) -> DataConfig:
    return DataConfig(task="", files=[str(f) for f in files], schema=DataSchema.PREFERENCE,
                      eval_size=kw.pop("eval_size", 1), **kw)


def _write(path, rows):
    """rows as jsonl, csv, parquet or a save_to_disk folder (no suffix), by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return path
    import datasets

    ds = datasets.Dataset.from_list(rows)
    if path.suffix == ".csv":
        ds.to_csv(str(path), index=False)
    elif path.suffix == ".parquet":
        ds.to_parquet(str(path))
    else:
        ds.save_to_disk(str(path))
    return path


def _all(out) -> list[dict]:
    return read_examples(out, "train") + read_examples(out, "eval")


def _fails(cfg, out, **kw) -> str:
    with pytest.raises(DataValidationError) as e:
        prepare_dataset(cfg, out, **kw)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".staging-")]
    return str(e.value)


# ---------------------------------------------------------------------------------------------- accepted forms


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_text_prompt_chosen_rejected(tmp_path, suffix):
    rows = [{"prompt": f"q{i} ünï", "chosen": f"good {i}", "rejected": f"bad {i}", "answer": f"{i}", "src": "hh"}
            for i in range(4)]
    src = _write(tmp_path / f"p{suffix}", rows)
    info = prepare_dataset(_cfg([src], system_prompt="Be terse."), tmp_path / "out")  # SFT's default: not refused
    assert (info.num_train, info.num_eval, info.schema) == (3, 1, "preference")
    assert json.loads((tmp_path / "out" / "info.json").read_text())["schema"] == "preference"
    ex = {e["messages"][1]["content"]: e for e in _all(tmp_path / "out")}
    system = {"role": "system", "content": "Be terse."}
    assert ex["q2 ünï"] == {"messages": [system, user("q2 ünï")], "chosen": [bot("good 2")],
                            "rejected": [bot("bad 2")], "answer": "2", "task": "exact", "columns": {"src": "hh"}}
    assert pair_conversations(ex["q2 ünï"]) == ([system, user("q2 ünï"), bot("good 2")],
                                                [system, user("q2 ünï"), bot("bad 2")])
    assert is_preference(ex["q2 ünï"]) and prompt_messages(ex["q2 ünï"]) == [system, user("q2 ünï")]
    assert info.columns == ["src"]  # the consumed fields (prompt, chosen, rejected, answer) are not columns


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ""])  # "" = a save_to_disk folder
def test_conversational_with_an_explicit_prompt(tmp_path, suffix):
    rows = [{"prompt": [SYS, user(f"{i}+{i}?")], "chosen": [bot(f"{2 * i}")], "rejected": [bot(f"{2 * i + 1}")],
             "meta": {"id": i}} for i in range(4)]
    src = _write(tmp_path / f"conv{suffix}", rows)
    prepare_dataset(_cfg([src]), tmp_path / "out")
    ex = {e["messages"][1]["content"]: e for e in _all(tmp_path / "out")}
    assert ex["3+3?"] == {"messages": [SYS, user("3+3?")], "chosen": [bot("6")], "rejected": [bot("7")],
                          "answer": None, "task": None, "columns": {"meta": {"id": 3}}}
    assert pair_conversations(ex["3+3?"]) == ([SYS, user("3+3?"), bot("6")], [SYS, user("3+3?"), bot("7")])


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_implicit_prompt_is_the_shared_turns(tmp_path, suffix):
    """TRL's implicit prompt: no prompt column; chosen and rejected are whole conversations (csv: their JSON
    text). A multi-turn chat that differs only in its last reply keeps the earlier turns as the prompt."""
    history = [SYS, user("hi"), bot("hello"), user("2+2?")]
    rows = [{"chosen": history + [bot("4")], "rejected": history + [bot("5")]},
            # shared assistant turns right before the difference go with the continuations
            {"chosen": [user("tell"), bot("Once"), bot("upon a time")],
             "rejected": [user("tell"), bot("Once"), bot("... no")]}]
    if suffix == ".csv":
        rows = [{k: json.dumps(v) for k, v in r.items()} for r in rows]
    src = _write(tmp_path / f"implicit{suffix}", rows)
    prepare_dataset(_cfg([src]), tmp_path / "out")
    ex = {e["messages"][-1]["content"]: e for e in _all(tmp_path / "out")}
    assert ex["2+2?"] == {"messages": history, "chosen": [bot("4")], "rejected": [bot("5")], "answer": None,
                          "task": None, "columns": {}}
    assert (ex["tell"]["messages"], ex["tell"]["chosen"], ex["tell"]["rejected"]) == (
        [user("tell")], [bot("Once"), bot("upon a time")], [bot("Once"), bot("... no")])
    assert pair_conversations(ex["2+2?"]) == (history + [bot("4")], history + [bot("5")])  # the rows as given


def test_a_row_without_a_prompt_in_a_file_with_prompts_uses_the_shared_turns(tmp_path):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"},
            {"prompt": None, "chosen": [user("r"), bot("c")], "rejected": [user("r"), bot("d")]}]
    prepare_dataset(_cfg([_write(tmp_path / "mixed.jsonl", rows)]), tmp_path / "out")
    got = sorted(((e["messages"], e["chosen"], e["rejected"]) for e in _all(tmp_path / "out")), key=json.dumps)
    assert got == [([user("q")], [bot("a")], [bot("b")]), ([user("r")], [bot("c")], [bot("d")])]


def test_custom_fields_and_the_answer_marker(tmp_path):
    rows = [{"question": f"Q{i}", "good": f"G{i}", "bad": f"B{i}", "solution": f"work\n#### {i}"} for i in range(3)]
    cfg = _cfg([_write(tmp_path / "c.jsonl", rows)], prompt_field="question", chosen_field="good",
               rejected_field="bad", answer_field="solution", answer_marker="####")
    prepare_dataset(cfg, tmp_path / "out")
    ex = {e["messages"][0]["content"]: e for e in _all(tmp_path / "out")}
    assert (ex["Q1"]["chosen"], ex["Q1"]["rejected"], ex["Q1"]["answer"]) == ([bot("G1")], [bot("B1")], "1")
    assert ex["Q1"]["columns"] == {"solution": "work\n#### 1"}  # the answer column, under its own name too


# -------------------------------------------------------------------------------------------------- refusals


def test_every_refusal_names_file_line_and_field(tmp_path):
    rows = [
        {"prompt": "q0", "chosen": "a", "rejected": "b"},  # line 1: fine
        {"prompt": "q", "rejected": "b"},  # line 2
        {"prompt": "q", "chosen": "a"},  # line 3
        {"prompt": "q", "chosen": "  ", "rejected": "b"},  # line 4
        {"prompt": "q", "chosen": "same", "rejected": "same"},  # line 5
        {"prompt": [user("q")], "chosen": [bot("a")], "rejected": [bot("b"), user("more?")]},  # line 6
        {"prompt": [user("q"), bot("a")], "chosen": "c", "rejected": "d"},  # line 7
        {"prompt": [user("q")], "chosen": [user("q"), bot("a")], "rejected": [bot("b")]},  # line 8
        {"chosen": "a", "rejected": "b"},  # line 9: text needs a prompt
        {"chosen": [user("x"), bot("a")], "rejected": [user("y"), bot("b")]},  # line 10: nothing shared
        {"chosen": [user("x"), bot("a"), user("p")], "rejected": [user("x"), bot("a"), user("q")]},  # line 11
        {"chosen": [user("x"), bot("a")], "rejected": [user("x")]},  # line 12
        {"chosen": [user("x"), bot("a")], "rejected": [user("x"), bot("a")]},  # line 13
        {"prompt": "q", "chosen": [], "rejected": [{"role": "bot", "content": "b"}]},  # line 14
        {"prompt": "q", "chosen": "a", "rejected": '[{"role": "assistant"'},  # line 15: broken JSON text
    ]
    src = _write(tmp_path / "pref.jsonl", rows)
    msg = _fails(_cfg([src]), tmp_path / "out")
    expected = [
        "line 2: field 'chosen': missing",
        "line 3: field 'rejected': missing",
        "line 4: field 'chosen': empty text",
        "line 5: field 'rejected': identical to 'chosen'; a preference pair needs two different completions",
        "line 6: field 'rejected[1].role': a completion turn must be an assistant turn, got 'user'",
        ("line 7: field 'prompt[1].role': a prompt must not end with an assistant turn (it would be taken for the "
         "completion)"),
        ("line 8: field 'chosen': repeats the 'prompt' turns; give only the continuation, or leave out 'prompt' "
         "(the turns chosen and rejected share are then the prompt)"),
        ("line 9: field 'prompt': missing: text chosen/rejected need a prompt (without one, chosen and rejected must "
         "be lists of {role, content} turns that share their prompt turns)"),
        ("line 10: field 'prompt': missing, and chosen and rejected share no opening user or system turn to take as "
         "the prompt; give a prompt column or start both with the same prompt turns"),
        ("line 11: field 'chosen[2].role': chosen and rejected first differ at this 'user' turn; a preference pair "
         "shares its prompt turns and differs only in the assistant's reply"),
        "line 12: field 'rejected': no assistant turn after the prompt turns it shares with 'chosen'",
        "line 13: field 'rejected': identical to 'chosen'; a preference pair needs two different completions",
        "line 14: field 'chosen': expected text or a non-empty list of {role, content} messages",
        "line 14: field 'rejected[0].role': invalid chat role 'bot'; allowed: ['system', 'user', 'assistant']",
        "line 15: field 'rejected': not a list of messages (invalid JSON text)",
    ]
    assert msg == f"{len(expected)} problem(s) in the input data:\n  " + "\n  ".join(f"{src}:{e}" for e in expected)


def test_refusals_in_csv_and_parquet_name_the_row(tmp_path):
    csv = _write(tmp_path / "p.csv", [{"prompt": "q", "chosen": "a", "rejected": "b"},
                                      {"prompt": "q2", "chosen": None, "rejected": "b"},
                                      {"prompt": "q3", "chosen": "a", "rejected": "a"}])
    msg = _fails(_cfg([csv]), tmp_path / "out")
    assert f"{csv}:row 2: field 'chosen': missing" in msg, msg
    assert f"{csv}:row 3: field 'rejected': identical to 'chosen'" in msg, msg
    pq = _write(tmp_path / "p.parquet", [{"chosen": [user("x"), bot("a")], "rejected": [user("x"), bot("b")]},
                                         {"chosen": [user("x"), bot("a")], "rejected": [user("y"), user("b")]}])
    msg = _fails(_cfg([pq]), tmp_path / "out")
    assert msg.startswith("1 problem(s)") and (
        f"{pq}:row 2: field 'prompt': missing, and chosen and rejected share no opening user or system turn") in msg


def test_long_prompts_and_bad_columns_are_refused_like_other_schemas(tmp_path):
    src = _write(tmp_path / "long.jsonl", [{"prompt": "p" * 50, "chosen": "a", "rejected": "b"},
                                           {"chosen": [user("x" * 50), bot("a")], "rejected": [user("x" * 50), bot("b")]}])
    msg = _fails(_cfg([src], max_prompt_chars=40), tmp_path / "out")
    assert f"{src}:line 1: field 'prompt': prompt is 50 characters" in msg
    assert f"{src}:line 2: field 'chosen': prompt is 50 characters" in msg  # the implicit prompt is chosen's
    problems = Problems()
    row = {"prompt": "p", "chosen": "a", "rejected": "b", "obj": {3: "x"}}
    assert to_example(row, "f.jsonl:line 7", _cfg([src]), problems, require_completion=True) is None
    assert problems.items == ["f.jsonl:line 7: field 'obj': object key 3 is not text; JSON object keys must be text"]


def test_config_refuses_clashing_preference_fields():
    from posttrain.config.checks import _check_data

    _check_data(_cfg(["x.jsonl"]))
    with pytest.raises(ConfigError, match=r"data.rejected_field: must differ from data.chosen_field \('c'\)"):
        _check_data(_cfg(["x.jsonl"], chosen_field="c", rejected_field="c"))
    with pytest.raises(ConfigError, match=r"data.prompt_field: 'chosen' is also data.chosen_field"):
        _check_data(_cfg(["x.jsonl"], prompt_field="chosen"))
    with pytest.raises(ConfigError, match=r"data.chosen_field: must name"):
        _check_data(_cfg(["x.jsonl"], chosen_field=""))


# ------------------------------------------------------------------------------------- de-duplication and split


def test_two_pairs_for_one_prompt_are_both_kept_and_never_split_across(tmp_path):
    rows = [{"prompt": f"q{i}", "chosen": f"good{v}", "rejected": f"bad{v}"} for i in range(6) for v in range(2)]
    rows += [rows[0], rows[3]]  # exact duplicates: dropped
    info = prepare_dataset(_cfg([_write(tmp_path / "p.jsonl", rows)], eval_size=2), tmp_path / "out")
    assert info.num_duplicates == 2
    train, ev = read_examples(tmp_path / "out", "train"), read_examples(tmp_path / "out", "eval")
    assert info.num_train + info.num_eval + info.num_train_dropped_for_eval == 12
    assert (len(ev), info.num_train_dropped_for_eval, len(train)) == (2, 2, 8)  # the other pair of each eval prompt
    eval_prompts = {json.dumps(prompt_messages(e)) for e in ev}
    assert len(eval_prompts) == 2 and not eval_prompts & {json.dumps(prompt_messages(e)) for e in train}
    pairs = {(e["messages"][0]["content"], e["chosen"][0]["content"]) for e in train}
    assert len(pairs) == 8 and len({p for p, _ in pairs}) == 4  # both pairs of every train prompt
    prepare_dataset(_cfg([tmp_path / "p.jsonl"], eval_size=2), tmp_path / "again")  # byte-identical
    for f in ("train.jsonl", "eval.jsonl", "info.json"):
        assert (tmp_path / "out" / f).read_bytes() == (tmp_path / "again" / f).read_bytes()


def test_eval_files_of_preference_rows(tmp_path):
    train = _write(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(3)])
    held = _write(tmp_path / "h.csv", [{"prompt": "q1", "chosen": "x", "rejected": "y"},
                                       {"prompt": "z", "chosen": "x", "rejected": "y"}])
    info = prepare_dataset(_cfg([train], eval_files=[str(held)], eval_size=0), tmp_path / "out")
    assert (info.num_train, info.num_eval, info.num_eval_in_train) == (3, 2, 1)
    assert all(is_preference(e) for e in _all(tmp_path / "out"))


def test_pair_conversations_refuses_a_plain_example():
    with pytest.raises(ValueError, match="not a preference example"):
        pair_conversations({"messages": [user("q"), bot("a")], "answer": None, "task": None, "columns": {}})
    assert not is_preference({"messages": [user("q"), bot("a")]})
