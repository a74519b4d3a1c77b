"""Data prep: every loader format and schema, every validation error path (naming file, row and field),
awkward-but-valid files, determinism, de-duplication, source fingerprints, synthetic tasks, tokenizer."""

from __future__ import annotations

import json

import pytest

from posttrain.config import DataConfig, DataFormat, DataSchema
from posttrain.data import synthetic, verifiers
from posttrain.data.examples import read_examples
from posttrain.data.prepare import prepare_dataset, source_fingerprint
from posttrain.data.validation import DataValidationError


def test_held_out_prompts_never_occur_in_train_with_another_completion(tmp_path):
    """Several completions per prompt (or the sloppy teacher's right and wrong demonstration of one problem):
    the split holds out prompts, so an eval problem is never trained on, whatever its completion."""
    rows = [{"prompt": f"q{i}", "completion": f"a{i}-{v}"} for i in range(10) for v in range(3)]
    info = prepare_dataset(_cfg([_write(tmp_path / "m.jsonl", "jsonl", rows)], eval_size=3), tmp_path / "out")
    train = read_examples(tmp_path / "out", "train")
    ev = read_examples(tmp_path / "out", "eval")
    assert len(ev) == 3 and len({e["messages"][0]["content"] for e in ev}) == 3  # 3 distinct problems
    assert not {e["messages"][0]["content"] for e in ev} & {e["messages"][0]["content"] for e in train}
    assert (info.num_train, info.num_train_dropped_for_eval, info.num_eval_in_train) == (21, 6, 0)
    synth = prepare_dataset(DataConfig(num_examples=3000, eval_size=200, num_digits=2, demo_error_rate=0.6),
                            tmp_path / "syn")
    assert synth.num_train_dropped_for_eval > 0  # right and wrong demonstrations of one problem: both dropped
    ev_prompts = {e["messages"][0]["content"] for e in read_examples(tmp_path / "syn", "eval")}
    assert not ev_prompts & {e["messages"][0]["content"] for e in read_examples(tmp_path / "syn", "train")}
    with pytest.raises(DataValidationError, match="only 10 distinct prompts exist"):
        prepare_dataset(_cfg([tmp_path / "m.jsonl"], eval_size=10), tmp_path / "none-left")


ROWS = [{"prompt": f"q{i} ünïcødé 🙂", "completion": f"a{i}", "answer": f"{i}", "extra": i} for i in range(12)]


def _cfg(files, **kw) -> DataConfig:
    return DataConfig(task="", files=[str(f) for f in files], eval_size=kw.pop("eval_size", 2), **kw)


def _write(path, fmt, rows):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        import datasets

        ds = datasets.Dataset.from_list(rows)
        if fmt == "parquet":
            ds.to_parquet(str(path))
        elif fmt == "csv":
            ds.to_csv(str(path), index=False)
        else:
            ds.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv", "saved"])
@pytest.mark.parametrize("schema", [DataSchema.PROMPT_COMPLETION, DataSchema.PROMPT_ANSWER])
def test_every_format_and_schema(tmp_path, fmt, schema):
    src = _write(tmp_path / (f"d.{fmt}" if fmt != "saved" else "saved"), fmt, ROWS)
    info = prepare_dataset(_cfg([src], schema=schema), tmp_path / "out",
                           require_completions=schema == DataSchema.PROMPT_COMPLETION)
    assert (info.num_train, info.num_eval) == (10, 2)
    ex = sorted(read_examples(tmp_path / "out", "train") + read_examples(tmp_path / "out", "eval"),
                key=lambda e: int(e["messages"][0]["content"].split()[0][1:]))
    assert ex[3]["messages"][0] == {"role": "user", "content": "q3 ünïcødé 🙂"}  # structured, not templated
    if schema == DataSchema.PROMPT_COMPLETION:
        # the rows' answer column is the reference (SFT pairs that RL scores against it)
        assert ex[3]["messages"][1] == {"role": "assistant", "content": "a3"} and ex[3]["answer"] == "3"
        # columns the schema does not use are kept (as the reader typed them: csv infers numbers)
        assert ex[3]["columns"] == {"extra": 3}
    else:
        assert len(ex[3]["messages"]) == 1 and ex[3]["answer"] == "3" and ex[3]["task"] == "exact"
        assert ex[3]["columns"] == {"completion": "a3", "extra": 3}
    assert info.columns == sorted(ex[3]["columns"])


def test_chat_messages_and_gsm8k_marker(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"What is {i}+1?"},
                          {"role": "assistant", "content": f"{i} plus 1 is {i + 1}.\n#### {i + 1}"}]} for i in range(8)]
    src = _write(tmp_path / "chat.jsonl", "jsonl", rows)
    prepare_dataset(_cfg([src], schema=DataSchema.MESSAGES, answer_marker="####"), tmp_path / "out")
    ex = read_examples(tmp_path / "out", "train")[0]
    assert [m["role"] for m in ex["messages"]] == ["system", "user", "assistant"]
    n = int(ex["messages"][1]["content"].split()[2].split("+")[0])
    assert ex["answer"] == str(n + 1) and verifiers.score("exact", f"so #### {n + 1}", ex["answer"]) == 1.0
    gsm = [{"question": f"Q{i}", "answer": f"work {i}\n#### 1,{i:03d}"} for i in range(6)]
    src2 = _write(tmp_path / "gsm.jsonl", "jsonl", gsm)
    prepare_dataset(_cfg([src2], schema=DataSchema.PROMPT_ANSWER, prompt_field="question", answer_marker="####"),
                    tmp_path / "out2", require_completions=False)
    answers = sorted(e["answer"] for e in read_examples(tmp_path / "out2", "train"))
    assert answers[0] == "1,000" and verifiers.score("exact", "1000", "1,000") == 1.0


def test_awkward_but_valid_files_load(tmp_path):
    jl = tmp_path / "bom.jsonl"
    jl.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in ROWS).encode())
    csv = tmp_path / "quoted.csv"
    csv.write_bytes(("\ufeffprompt,completion,extra\r\n" + "".join(
        f'"line one\nline two, {i}","a ""{i}""",x{i}\r\n' for i in range(6))).encode())
    prepare_dataset(_cfg([jl, csv]), tmp_path / "out")
    ex = read_examples(tmp_path / "out", "train") + read_examples(tmp_path / "out", "eval")
    prompts = {e["messages"][0]["content"] for e in ex}
    assert "line one\nline two, 3" in prompts and "q5 ünïcødé 🙂" in prompts and len(ex) == 18
    assert any(e["messages"][1]["content"] == 'a "2"' for e in ex)


def test_every_problem_is_reported_with_file_row_and_field(tmp_path):
    good = [json.dumps(r) for r in ROWS[:4]]
    bad = good + [
        json.dumps({"completion": "x"}),  # line 5: missing prompt
        json.dumps({"prompt": 3, "completion": "x"}),  # line 6: wrong type
        json.dumps({"prompt": "  ", "completion": "x"}),  # line 7: empty
        json.dumps({"prompt": "p" * 50, "completion": "x"}),  # line 8: too long
        "{not json",  # line 9
    ]
    src = tmp_path / "bad.jsonl"
    src.write_bytes(("\n".join(bad) + "\n").encode() + b'{"prompt": "\xff\xfe", "completion": "x"}\n')  # line 10
    with pytest.raises(DataValidationError) as e:
        prepare_dataset(_cfg([src], max_prompt_chars=40), tmp_path / "out")
    msg = str(e.value)
    for needle in ["bad.jsonl:line 5: field 'prompt': missing", "bad.jsonl:line 6: field 'prompt': expected text",
                   "bad.jsonl:line 7: field 'prompt': empty text", "bad.jsonl:line 8: field 'prompt': prompt is 50",
                   "bad.jsonl:line 9: invalid JSON", "bad.jsonl:line 10: undecodable bytes"]:
        assert needle in msg, msg
    assert "6 problem(s)" in msg and not (tmp_path / "out").exists()


def test_chat_problems_name_the_turn_and_the_marker(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "no marker"}]},
            {"messages": [{"role": "user", "content": "q"}, "hi"]},
            {"messages": "[not json"}]
    src = _write(tmp_path / "m.jsonl", "jsonl", rows)
    with pytest.raises(DataValidationError) as e:
        prepare_dataset(_cfg([src], schema=DataSchema.MESSAGES, answer_marker="####"), tmp_path / "o")
    msg = str(e.value)
    assert "m.jsonl:line 1: field 'messages': no '####' marker" in msg, msg
    assert "m.jsonl:line 2: field 'messages[1]': expected an object with role and content, got str" in msg, msg
    assert "m.jsonl:line 3: field 'messages': not a list of messages (invalid JSON text)" in msg, msg
    assert "3 problem(s)" in msg and not (tmp_path / "o").exists()


def test_chat_role_errors_and_empty_results(tmp_path):
    rows = [{"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": ""}]}]
    src = _write(tmp_path / "c.jsonl", "jsonl", rows)
    with pytest.raises(DataValidationError) as e:
        prepare_dataset(_cfg([src], schema=DataSchema.MESSAGES), tmp_path / "o")
    assert "c.jsonl:line 1: field 'messages[0].role': invalid chat role 'wizard'" in str(e.value)
    assert "messages[1].content" in str(e.value)
    dup = _write(tmp_path / "dup.jsonl", "jsonl", [ROWS[0]] * 5)
    with pytest.raises(DataValidationError, match="data.eval_size"):
        prepare_dataset(_cfg([dup]), tmp_path / "o2")
    with pytest.raises(DataValidationError, match="does not exist"):
        prepare_dataset(_cfg([tmp_path / "missing.jsonl"]), tmp_path / "o3")
    csv = tmp_path / "bad.csv"
    csv.write_bytes(b"prompt,completion\nok,fine\n\xff,x\n")
    with pytest.raises(DataValidationError, match=r"bad.csv:line 3: undecodable"):
        prepare_dataset(_cfg([csv], format=DataFormat.CSV), tmp_path / "o4")
    with pytest.raises(DataValidationError, match=r"row 2: field 'completion': missing"):
        prepare_dataset(_cfg([_write(tmp_path / "m.csv", "csv", [{"prompt": "a", "completion": "b"},
                                                                 {"prompt": "c", "completion": None}])]), tmp_path / "o5")


def test_deterministic_split_dedupe_and_fingerprint(tmp_path):
    cfg = DataConfig(num_examples=3000, eval_size=200, num_digits=2)
    a = prepare_dataset(cfg, tmp_path / "a")
    prepare_dataset(cfg, tmp_path / "b")
    for f in ("train.jsonl", "eval.jsonl", "info.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert a.num_duplicates > 0 and a.num_train + a.num_eval + a.num_duplicates + a.num_train_dropped_for_eval == 3000
    prepare_dataset(DataConfig(num_examples=3000, eval_size=200, num_digits=2, seed=1), tmp_path / "c")
    assert (tmp_path / "a" / "eval.jsonl").read_bytes() != (tmp_path / "c" / "eval.jsonl").read_bytes()
    ev = {json.dumps(e["messages"]) for e in read_examples(tmp_path / "a", "eval")}
    assert not ev & {json.dumps(e["messages"]) for e in read_examples(tmp_path / "a", "train")}
    src = _write(tmp_path / "u.jsonl", "jsonl", ROWS)
    fp1 = source_fingerprint(_cfg([src]))
    src.write_text(src.read_text().replace("q3", "q9"))  # edited at the same path
    assert source_fingerprint(_cfg([src])) != fp1


def test_synthetic_tasks_are_verifiable():
    for ex in synthetic.addition(200, 3, seed=0):
        p, c = ex["messages"][0]["content"], ex["messages"][1]["content"]
        a, b = p[:-1].split("+")
        assert len(a) == len(b) == 3 and c == str(int(a) + int(b)).zfill(4) == ex["answer"]
        assert verifiers.score("addition", c, ex["answer"]) == 1.0
        wrong = str((int(c) + 1) % 10000).zfill(4)
        assert verifiers.score("addition", wrong, ex["answer"]) == 0.0
    assert synthetic.addition(1, 3, 0)[0]["messages"][0]["content"] != synthetic.addition(1, 3, 1)[0]["messages"][0]["content"]
    for ex in synthetic.chain(200, 3, seed=0):
        c = ex["messages"][1]["content"]
        steps = c.split("####")[0].split(",")
        assert len(steps) == 2 and verifiers.score("chain", c, ex["answer"]) == 1.0
        assert verifiers.score("chain", steps[0], ex["answer"]) == 0.0  # an intermediate result is not the answer
    # each step depends on the previous result (left to right), not on operator precedence
    assert synthetic.chain_solution(7, [("+", 5), ("*", 2), ("-", 9)]) == [12, 24, 15]


def test_tokenizer_is_deterministic_splits_digits_and_has_the_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

    prepare_dataset(DataConfig(num_examples=1000, eval_size=50), tmp_path / "ds")
    for out in ("t1", "t2"):
        train_tokenizer(tokenizer_training_texts(tmp_path / "ds"), 300, tmp_path / out)
    for f in (tmp_path / "t1").iterdir():
        assert f.read_bytes() == (tmp_path / "t2" / f.name).read_bytes(), f.name
    tok = AutoTokenizer.from_pretrained(tmp_path / "t1")
    ids = tok("12345+678=", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[:5] == ["1", "2", "3", "4", "5"]
    for text in ["347+086=0433", "héllo wörld 世界 🙂"]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    msgs = [{"role": "user", "content": "347+086="}, {"role": "assistant", "content": "0433"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|user|>\n347+086=<|end|>\n<|assistant|>\n0433<|end|>\n"
    assert (tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
            == "<|user|>\n347+086=<|end|>\n<|assistant|>\n")
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<|pad|>"


@pytest.mark.parametrize("name,content,why", [("e.jsonl", "", "empty file"), ("blank.jsonl", "\n \r\n", "empty file"),
                                              ("e.csv", "", "empty file"),
                                              ("h.csv", "\ufeffprompt,completion\r\n", "only a header line")])
def test_a_file_without_rows_is_named(tmp_path, name, content, why):
    """An empty file is a mistake to name, not a smaller dataset (alone it used to end as an unnamed
    "nothing left after filtering")."""
    empty = tmp_path / name
    empty.write_text(content, encoding="utf-8")
    good = _write(tmp_path / "good.jsonl", "jsonl", ROWS)
    for files in ([empty], [good, empty]):
        with pytest.raises(DataValidationError) as e:
            prepare_dataset(_cfg(files), tmp_path / "out")
        assert str(e.value) == f"1 problem(s) in the input data:\n  data.files: no rows in {empty} ({why})"
        assert not (tmp_path / "out").exists()
