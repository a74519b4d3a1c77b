"""The reasoning-gym task of the real-model benches (bench/real_model.py, bench/real_model_sweep.py,
bench/task_probe.py): the pinned install, the task families, the three splits and the reward modules.

- reasoning-gym is installed with `pip install --target` into `<cache>/reasoning-gym/<version>` (never `.venv`);
  rows are generated in a child process with only that folder on its path (`GENERATE`).
- A family (`FAMILIES`, `--family`) is a default task config, the rewards that read its answers (the first is the
  default) and how a completion's answer is read for the table's "right" column: `arithmetic` (reasoning-gym
  `chain_sum`, the completion's last number) and `spelling` (`spell_backward`: spell a word backward, the
  completion's last word; reasoning-gym's scorer ignores case and gives a right prefix partial credit). The
  spelling config is the package's own word list cut to 3-5 letters; nothing in the recipe was chosen for it.
- `split_questions` cuts the generated rows into train / validation / test with no question in two splits, and
  validation and test the same mix (a question's held-out split is a hash of its text): sweeps and recipe choices
  read validation, reported figures come from test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

RG_VERSION = "0.1.25"
CACHE = Path(os.environ.get("POSTTRAIN_MODELS", Path.home() / ".cache/posttrain/models")).parent
TASK = {"name": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
SPELL_TASK = {"name": "spell_backward", "min_word_len": 3, "max_word_len": 5}
SORT_TASK = {"name": "number_sorting", "min_numbers": 3, "max_numbers": 4, "min_decimals": 0, "max_decimals": 0,
             "min_value": 0, "max_value": 99}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
WORD = re.compile(r"[^\W_]+")
LIST = re.compile(r"\[[^\[\]]*\]")
SPLITS = ("train", "validation", "test")


def last_number(completion: str) -> str | None:
    """The completion's last number (commas dropped), as reward `number` reads it; None when it has none."""
    found = NUMBER.findall(completion.replace(",", ""))
    return found[-1] if found else None


def last_word(completion: str) -> str | None:
    """The completion's last word (a run of letters and digits: "is 'elppa'." -> elppa), as reward `word` reads it."""
    found = WORD.findall(completion)
    return found[-1] if found else None


def last_list(completion: str) -> str | None:
    """The completion's last bracketed list ("... is ['3.0', '7.0']." -> "['3.0', '7.0']"), as reward `list` reads it."""
    found = LIST.findall(completion)
    return found[-1] if found else None


def same_list(found: str | None, answer: str) -> bool:
    """Whether a bracketed list holds the answer's numbers in its order (quotes and spacing aside)."""
    try:
        got, want = (json.loads(x.replace("'", '"')) for x in (found or "", answer))
        return [Decimal(str(g)) for g in got] == [Decimal(str(w)) for w in want]
    except (ValueError, TypeError, InvalidOperation):
        return False


def same_number(found: str | None, answer: str) -> bool:
    try:
        return found is not None and Decimal(found) == Decimal(str(answer).replace(",", ""))
    except InvalidOperation:
        return False


def same_word(found: str | None, answer: str) -> bool:
    return found is not None and found.casefold() == str(answer).casefold()


@dataclass(frozen=True)
class Family:
    """A kind of reasoning-gym task the real-model bench runs."""

    task: dict
    """The default `--task`: a reasoning-gym dataset name and its config fields."""
    rewards: tuple[str, ...]
    """The `--reward` choices that read this family's answers; the first is the default."""
    extract: Callable[[str], str | None]
    """The answer in a completion, as the default reward reads it (for the table's "right" column)."""
    same: Callable[[str | None, str], bool]
    """Whether an extracted answer is the row's answer."""
    right: str
    """The table's column: what "right" means, whatever the wording of the completion."""
    rule: str
    """How that column is counted, for the table's text."""


FAMILIES = {
    "arithmetic": Family(TASK, ("number", "shaped", "raw"), last_number, same_number, "arithmetic right",
                         "greedy completions whose last number is the answer"),
    "spelling": Family(SPELL_TASK, ("word", "raw"), last_word, same_word, "word right",
                       "greedy completions whose last word is the answer (case ignored)"),
    "sorting": Family(SORT_TASK, ("list",), last_list, same_list, "list right",
                      "greedy completions whose last bracketed list is the answer's numbers in order"),
}
"""`--family`: the task families of the real-model bench."""


@dataclass(frozen=True)
class Sizes:
    """How many questions each split holds: train (generated; fewer once held-out questions are dropped),
    validation and test (exactly that many distinct questions each)."""

    train: int
    validation: int
    test: int

    def __post_init__(self):
        for name, flag in zip(SPLITS, ("--train", "--validation-n", "--eval")):
            if getattr(self, name) < 1:
                raise SystemExit(f"{flag}: the {name} split needs at least one question, got {getattr(self, name)}")


def _distinct(rows: list[dict], exclude: set[str] = frozenset()) -> list[dict]:
    """The rows with a question not in `exclude`, each question once, in their order."""
    return list({r["question"]: r for r in rows if r["question"] not in exclude}.values())


def check_split(order: str, other_train: bool) -> None:
    """Refuse a `--split` that is neither order, or `--train-task` (train from another config) with train_first."""
    if order not in ("train_first", "held_out_first"):
        raise SystemExit(f"--split: train_first or held_out_first, got {order!r}")
    if other_train and order != "held_out_first":
        raise SystemExit("--train-task needs --split held_out_first: validation and test are --task's own mix")


def side(question: str) -> str:
    """"validation" or "test": the held-out split a question belongs to, by the first bit of its text's sha256 -
    independent of the question's kind, so the two splits are the same mix of the task, and of the split sizes."""
    return ("validation", "test")[hashlib.sha256(question.encode()).digest()[0] & 1]


def split_questions(rows: list[dict], sizes: Sizes, order: str,
                    train_rows: list[dict] | None = None) -> dict[str, list[dict]]:
    """{"train", "validation", "test": rows} from reasoning-gym rows, no question in two splits.

    The held-out questions are distinct questions of the task's own mix: with `order` held_out_first, those of the
    first 4 x (validation + test) rows, and train is the remaining rows without them, or `train_rows` (another
    config's rows) without them; with train_first, train is the first `sizes.train` rows and the held-out questions
    are the later ones not in train (a small problem space ends up mostly in train). Each held-out question goes to
    validation or test by `side` - a hash of its text - and each split takes its first questions in order. So both
    splits are the same mix (dealing validation first took the early, distinct-rich part of a small problem space:
    chain_sum's 2-term questions were 110 of 256 in validation and 57 of 256 in test), and changing one split's size
    never moves a question into the other. Train may repeat a question (it is a sample); validation and test never do.

    Since 2026-11-30: before it, validation was the first 256 held-out questions, which runs before the three splits
    had chosen on; about half of those are now test questions, so test figures come from choices made on this
    validation split."""
    check_split(order, train_rows is not None)
    if order == "train_first":
        train = rows[: sizes.train]
        candidates = _distinct(rows[sizes.train:], {r["question"] for r in train})
    else:
        candidates = _distinct(rows[: 4 * (sizes.validation + sizes.test)])
    dealt = {"validation": [], "test": []}
    for r in candidates:
        dealt[side(r["question"])].append(r)
    val, test = dealt["validation"][: sizes.validation], dealt["test"][: sizes.test]
    if len(val) < sizes.validation or len(test) < sizes.test:
        raise SystemExit(f"only {len(dealt['validation'])} + {len(dealt['test'])} distinct questions not in train for "
                         f"validation and test; need {sizes.validation} + {sizes.test} (--validation-n, --eval)")
    if order == "held_out_first":
        seen = {r["question"] for r in val + test}
        pool = rows[4 * (sizes.validation + sizes.test):] if train_rows is None else train_rows
        train = [r for r in pool if r["question"] not in seen]
    if not train:
        raise SystemExit("no train question is left once the validation and test questions are dropped")
    return {"train": train, "validation": val, "test": test}


def install_reasoning_gym() -> Path:
    """reasoning-gym==RG_VERSION in its own folder (atomic: a half-done install is never used)."""
    root = CACHE / "reasoning-gym" / RG_VERSION
    if not (root / "reasoning_gym").is_dir():
        tmp = root.with_name(f".tmp-{RG_VERSION}-{os.getpid()}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-input", "--target", str(tmp), f"reasoning-gym=={RG_VERSION}"], check=True, timeout=900)
        os.replace(tmp, root)
    return root


GENERATE = '''import json, sys, reasoning_gym as rg
spec, size, seed = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
name = spec.pop("name")
for r in rg.create_dataset(name, size=size, seed=seed, **spec):  # item i is seeded by seed + i
    print(json.dumps({"question": r["question"], "answer": r["answer"], "metadata": r["metadata"]}))
'''


def generate(deps: Path, spec: dict, size: int, seed: int) -> list[dict]:
    """`size` rows of reasoning-gym dataset `spec` ({"name", its config fields}) made with `seed`, in a child process
    with only the install folder `deps` on its path."""
    out = subprocess.run([sys.executable, "-c", GENERATE, json.dumps(spec), str(size), str(seed)], check=False,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(deps)})
    if out.returncode != 0:
        raise SystemExit(f"reasoning-gym could not build {json.dumps(spec)}:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def build_task(folder: Path, deps: Path, sizes: Sizes, reward: str, split: str, task: dict | None = None,
               train_task: dict | None = None, evaluate: str = "test") -> dict:
    """train.jsonl, validation.jsonl, test.jsonl and rewards/rg_reward.py in `folder` for reasoning-gym dataset
    `task` ({"name": ..., its config fields}; default TASK) split by `split_questions`; with `train_task` (split
    held_out_first only) the train questions come from that config instead, none of them held out. Each row is
    question / answer / completion (the answer: what a recipe's SFT trains on) / metadata, read as
    `prompt_completion` with the answer as the reference. Returns the data and reward overrides of a run that
    evaluates on split `evaluate` (validation or test)."""
    if evaluate not in ("validation", "test"):
        raise ValueError(f"evaluate: validation or test, got {evaluate!r}")
    check_split(split, train_task is not None)
    rows = generate(deps, task or TASK, sizes.train + 4 * (sizes.validation + sizes.test), seed=1)
    train_rows = None if train_task is None else generate(deps, train_task, sizes.train, seed=2)
    parts = split_questions(rows, sizes, split, train_rows)
    (folder / "rewards").mkdir(parents=True, exist_ok=True)
    (folder / "rewards" / "rg_reward.py").write_text(REWARDS[reward])
    for name, part in parts.items():  # the answer is also the completion: a recipe with SFT trains on it
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({**r, "completion": str(r["answer"])}) + "\n"
                                                      for r in part))
    (folder / "splits.json").write_text(json.dumps({"evaluated": evaluate, **{k: len(v) for k, v in parts.items()}}))
    print(" ".join(f"{k} {len(v)}" for k, v in parts.items()), f"(train distinct {len(_distinct(parts['train']))})")
    return {"data": {"task": "", "files": [str(folder / "train.jsonl")],
                     "eval_files": [str(folder / f"{evaluate}.jsonl")], "eval_size": 0, "schema": "prompt_completion", "prompt_field": "question"},
            "reward": {"fn": "rg_reward:score", "python_path": [str(folder / "rewards"), str(deps)]},
            "eval": {"num_problems": len(parts[evaluate])}}


REWARDS = {
    "number": '''"""Reward for reasoning-gym rows: the completion's last number, scored by reasoning-gym's own scorer."""
import re

from reasoning_gym import get_score_answer_fn

NUMBER = re.compile(r"-?\\d+(?:\\.\\d+)?")


def score(completion, answer, metadata):
    found = NUMBER.findall(completion.replace(",", ""))
    return get_score_answer_fn(metadata["source_dataset"])(found[-1] if found else None,
                                                          {"answer": answer, "metadata": metadata})
''',
    "word": '''"""Reward for reasoning-gym rows whose answer is one word (spell_backward): the completion's last
word - a run of letters and digits, so "The word backward is 'elppa'." reads elppa - scored by reasoning-gym's
own scorer."""
import re

from reasoning_gym import get_score_answer_fn

WORD = re.compile(r"[^\\W_]+")


def score(completion, answer, metadata):
    found = WORD.findall(completion)
    return get_score_answer_fn(metadata["source_dataset"])(found[-1] if found else None,
                                                          {"answer": answer, "metadata": metadata})
''',
    "list": '''"""Reward for reasoning-gym rows whose answer is a list (number_sorting): the completion's last bracketed
list, scored by reasoning-gym's own scorer (the numbers in the asked order, each within its tolerance)."""
import re

from reasoning_gym import get_score_answer_fn

LIST = re.compile(r"\\[[^\\[\\]]*\\]")


def score(completion, answer, metadata):
    found = LIST.findall(completion)
    return get_score_answer_fn(metadata["source_dataset"])(found[-1] if found else None,
                                                          {"answer": answer, "metadata": metadata})
''',
    "shaped": '''"""Reward for reasoning-gym rows, reasoning-gym's own scorer twice: half for the completion's last number, half
for the completion as it is (1.0 only for exactly the answer). 1.0 - what evaluation counts as correct - is only the
answer and nothing else; a right number inside a sentence gets about half."""
import re

from reasoning_gym import get_score_answer_fn

NUMBER = re.compile(r"-?\\d+(?:\\.\\d+)?")


def score(completion, answer, metadata):
    fn, entry = get_score_answer_fn(metadata["source_dataset"]), {"answer": answer, "metadata": metadata}
    found = NUMBER.findall(completion.replace(",", ""))
    return 0.5 * fn(found[-1] if found else None, entry) + 0.5 * fn(completion.strip(), entry)
''',
    "raw": '''"""Reward for reasoning-gym rows: reasoning-gym's own scorer for the row's dataset, on the completion as it is
(1.0 for exactly the answer; an answer inside other words gets len(answer) / len(completion))."""
from reasoning_gym import get_score_answer_fn


def score(completion, answer, metadata):
    return get_score_answer_fn(metadata["source_dataset"])(completion, {"answer": answer, "metadata": metadata})
''',
}
"""The reward module written for the run (`--reward`): `rg_reward:score`."""
