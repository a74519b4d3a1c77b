"""Token-length budget: every row rendered with a real tokenizer's chat template, measured, and refused with
a message naming the count, the longest row and the setting to change."""

from __future__ import annotations

import dataclasses
import json

import pytest

from posttrain.config import ConfigError, DataConfig, DataSchema
from posttrain.data.lengths import LengthReport, check_budget
from posttrain.data.prepare import prepare_dataset

ROWS = [{"prompt": "hi", "completion": "ok"}, {"prompt": "hello there", "completion": "fine thanks"},
        {"prompt": "a much longer question about numbers 12345", "completion": "answer"},
        {"prompt": "hey", "completion": "a rather long reply with many words in it"}]


@pytest.fixture()
def setup(tmp_path):
    from posttrain.models.tokenizer import train_tokenizer

    tok = train_tokenizer([r["prompt"] + " " + r["completion"] for r in ROWS] * 3, 300, tmp_path / "tok")
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    prepare_dataset(DataConfig(task="", files=[str(src)], eval_size=1), tmp_path / "ds")
    return tok, tmp_path / "ds"


def _rows(ds, split):
    return [json.loads(line) for line in (ds / f"{split}.jsonl").read_text().splitlines()]


def _prompt_len(tok, ex):
    msgs = ex["messages"][:-1]
    return len(tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"])


def _conv_len(tok, ex):
    return len(tok(tok.apply_chat_template(ex["messages"], tokenize=False), add_special_tokens=False)["input_ids"])


def test_report_measures_every_row_with_the_chat_template(setup):
    tok, ds = setup
    train, ev = _rows(ds, "train"), _rows(ds, "eval")
    prompts = [_prompt_len(tok, e) for e in train + ev]
    rep = check_budget(ds, tok, max_seq_len=max(prompts) + 8, max_new_tokens=8, sft=False)
    assert rep == LengthReport(num_rows=4, max_prompt_tokens=max(prompts), mean_prompt_tokens=sum(prompts) / 4,
                               max_conversation_tokens=None, longest=rep.longest, max_seq_len=max(prompts) + 8,
                               max_new_tokens=8, sft=False, splits=("train", "eval"))
    i = prompts.index(max(prompts))
    assert rep.longest == (f"train.jsonl line {i + 1}" if i < len(train) else "eval.jsonl line 1")
    convs = [_conv_len(tok, e) for e in train]
    sft = check_budget(ds, tok, max_seq_len=max(convs), max_new_tokens=0, sft=True)
    assert (sft.num_rows, sft.max_conversation_tokens, sft.splits) == (3, max(convs), ("train",))
    assert sft.total_conversation_tokens == sum(convs) and rep.total_conversation_tokens is None  # sft.tokens' base
    with pytest.raises(dataclasses.FrozenInstanceError):
        sft.num_rows = 0


def test_prompts_that_leave_no_room_for_the_completion_are_refused(setup):
    tok, ds = setup
    rows = [("train", n, e) for n, e in enumerate(_rows(ds, "train"), 1)] + [("eval", 1, _rows(ds, "eval")[0])]
    lens = [_prompt_len(tok, e) for _, _, e in rows]
    order = sorted(range(4), key=lambda i: -lens[i])
    assert lens[order[0]] > lens[order[1]] > lens[order[2]]  # the long question is the longest prompt
    split, line, _ = rows[order[0]]
    # only the longest prompt overflows, and it would fit with fewer new tokens
    budget, new = lens[order[0]] + 1, lens[order[0]] - lens[order[1]] + 1
    with pytest.raises(ConfigError) as e:
        check_budget(ds, tok, max_seq_len=budget, max_new_tokens=new, sft=False, new_tokens_setting="rl.max_new_tokens")
    assert str(e.value) == (
        f"1 of 4 rows (train, eval) do not fit model.max_seq_len={budget} as prompts + rl.max_new_tokens={new} new "
        f"tokens; the longest is {split}.jsonl line {line} ({lens[order[0]]} prompt tokens + {new} = "
        f"{lens[order[0]] + new}; prompt 'a much longer question about numbers 12345'). Raise model.max_seq_len to at "
        f"least {lens[order[0]] + new} or lower rl.max_new_tokens to at most 1, or shorten or drop the long rows in "
        f"your data.")
    assert check_budget(ds, tok, max_seq_len=budget, max_new_tokens=1, sft=False).num_rows == 4  # the fix works
    with pytest.raises(ConfigError, match=r"^4 of 4 rows .* Raise model.max_seq_len to at least \d+, or shorten"):
        check_budget(ds, tok, max_seq_len=3, max_new_tokens=1, sft=False)  # no prompt fits at all
    # only the split a stage uses is measured: the eval split alone may fit where train does not
    short = "train" if split == "eval" else "eval"
    rep = check_budget(ds, tok, max_seq_len=lens[order[1]] + 1, max_new_tokens=1, sft=False, splits=(short,))
    assert rep.splits == (short,) and rep.num_rows == (3 if short == "train" else 1)


def test_sft_conversations_longer_than_max_seq_len_are_refused(setup):
    tok, ds = setup
    train = _rows(ds, "train")
    convs = [_conv_len(tok, e) for e in train]
    worst = convs.index(max(convs))
    over = sum(c > max(convs) - 1 for c in convs)
    with pytest.raises(ConfigError) as e:
        check_budget(ds, tok, max_seq_len=max(convs) - 1, max_new_tokens=99, sft=True)
    prompt = train[worst]["messages"][0]["content"]
    assert str(e.value) == (
        f"{over} of 3 rows (train) do not fit model.max_seq_len={max(convs) - 1} as whole conversations (prompt + "
        f"completion, which SFT trains on); the longest is train.jsonl line {worst + 1} ({max(convs)} tokens; prompt "
        f"{prompt!r}). Raise model.max_seq_len to at least {max(convs)}, or shorten or drop the long rows in your data.")


def test_prompt_only_rows_and_system_prompts_count(tmp_path):
    from posttrain.models.tokenizer import train_tokenizer

    tok = train_tokenizer(["what is two plus two", "you are terse"] * 3, 300, tmp_path / "tok")
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["what is two", "plus two", "two"]))
    cfg = {"task": "", "files": [str(src)], "schema": DataSchema.PROMPT_ANSWER, "answer_field": "", "eval_size": 1}
    prepare_dataset(DataConfig(**cfg), tmp_path / "plain", require_completions=False)
    prepare_dataset(DataConfig(**cfg, system_prompt="you are terse"), tmp_path / "sys", require_completions=False)
    plain = check_budget(tmp_path / "plain", tok, max_seq_len=64, max_new_tokens=8, sft=False)
    sys_ = check_budget(tmp_path / "sys", tok, max_seq_len=64, max_new_tokens=8, sft=False)
    system_turn = len(tok(tok.apply_chat_template([{"role": "system", "content": "you are terse"}], tokenize=False),
                          add_special_tokens=False)["input_ids"])
    assert plain.num_rows == 3 and sys_.max_prompt_tokens == plain.max_prompt_tokens + system_turn


def test_a_token_budget_becomes_steps_and_refuses_a_warm_up_it_cannot_hold(setup):
    from posttrain.config import SFTConfig
    from posttrain.stages.sft import with_token_budget

    tok, ds = setup
    lengths = check_budget(ds, tok, max_seq_len=256, max_new_tokens=0, sft=True)
    mean = sum(_conv_len(tok, e) for e in _rows(ds, "train")) / 3
    cfg = SFTConfig(steps=0, tokens=int(10 * 4 * mean) + 1, global_batch_size=4, warmup_steps=2)
    assert with_token_budget(cfg, lengths, "sft").steps == 11  # 10 steps of 4 rows and one token more: 11
    assert with_token_budget(SFTConfig(steps=7), lengths, "sft").steps == 7  # a budget in steps is left alone
    with pytest.raises(ConfigError, match=r"^dpo.warmup_steps=2 does not fit: dpo.tokens=\d+ gives 1 steps of 4 "
                                          r"examples \(the 3 train rows hold [\d.]+ tokens each on average\)"):
        with_token_budget(SFTConfig(steps=0, tokens=10, global_batch_size=4, warmup_steps=2), lengths, "dpo")
