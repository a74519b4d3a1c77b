"""Data prep: synthetic task or user files -> validated, de-duplicated, split structured examples.

Writes `train.jsonl`, `eval.jsonl` and `info.json` into `out_dir` (staged in a sibling temp folder and
renamed, so a failure leaves nothing half-written). Same input -> byte-identical files. Examples stay
structured ({"messages", "answer", "task", "columns"}): each model applies its own chat template when it
trains, and a reward function can read the row's other columns.

The eval split is either held out of the de-duplicated examples (`data.eval_size`, a seeded shuffle) or
the rows of `data.eval_files` exactly as given (no re-split, no de-duplication); either way, the eval rows
whose prompt turns also occur in the train split are counted and reported. `data.system_prompt` is put
first in every example that does not start with a system turn. When SFT will train on the data
(`require_completions`), every train row must end with an assistant turn (a preference row's chosen and
rejected turns are its completions). Token lengths are not measured here (there is no tokenizer yet): see
`posttrain.data.lengths.check_budget`.

Preference data (`data.schema: "preference"`) goes the same way: its examples' "messages" are the prompt, so
the held-out split holds out by prompt (no prompt in both splits, whatever its pairs), and de-duplication
compares prompt, chosen and rejected (two different pairs for one prompt are both kept).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from posttrain.config import DataConfig, DataSchema
from posttrain.data import synthetic
from posttrain.data.examples import dumps, episode_prompt, is_preference, prompt_messages, write_dataset
from posttrain.data.loaders import iter_rows
from posttrain.data.validation import DataValidationError, Problems, to_example


@dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    task: str | None
    """The built-in task, or None for user files."""
    schema: str
    num_train: int
    num_eval: int
    num_duplicates: int
    """Train rows dropped as exact duplicates (same turns and answer) of an earlier row."""
    num_eval_in_train: int
    """Eval rows whose prompt turns also occur in the train split (a held-out score is then optimistic). Always
    0 when the eval split is held out of the data: see `num_train_dropped_for_eval`."""
    num_train_dropped_for_eval: int
    """Held-out split only: rows left out of train because their prompt turns are an eval problem's (the same
    question with another completion)."""
    eval_from_files: bool
    """True when the eval split is `data.eval_files` (or a task's own eval problems: TaskSplit) as given, False
    when it was held out of the examples."""
    require_completions: bool
    """Every train row was required to end with an assistant turn (SFT trains on it)."""
    columns: list[str]
    """Names of the extra source columns kept under each example's "columns" (sorted)."""
    sources: list[dict]
    """{"path", "sha256", "split"} for every source file ("train" for data.files, "eval" for data.eval_files)."""
    rows_per_file: list[dict] = field(default_factory=list)
    """{"file", "rows", "train", "eval", "duplicates", "eval_prompt"} per source file (or built-in task): rows
    read, where they went, and why the others were left out. Not written to info.json (see _REPORT_ONLY)."""
    dropped_sample: list[dict] = field(default_factory=list)
    """Up to DROPPED_SAMPLE left-out rows, {"where", "reason", "prompt"}. Not written to info.json."""


_REPORT_ONLY = ("rows_per_file", "dropped_sample")
"""DatasetInfo fields kept out of info.json: they describe how the files were made, not what they hold, and
info.json is part of the dataset's content (its artifact id); stages.data_prep puts them in the manifest."""
DROPPED_SAMPLE = 5
_SOURCE = "_source"
"""Key of the (file, location) tag a row carries while it is prepared; removed before anything is written."""


@dataclass(frozen=True)
class TaskSplit:
    """What a task maker returns when its problems cannot be held out by prompt - a game whose games all open
    the same way (the secret is hidden): its train demonstrations, and its eval problems (episode prompts)."""
    train: list[dict]
    eval: list[dict]


TaskMakers = dict[str, Callable[[DataConfig], "list[dict] | TaskSplit"]]
"""Built-in tasks by name: each makes its examples from the data settings (or a TaskSplit)."""


def _digest(paths: list[str]) -> str:
    """sha256 over the bytes of every file (a saved folder is walked), with the paths."""
    h = hashlib.sha256()
    for name in paths:
        p = Path(name)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f).encode() + b"\0")
            h.update(f.read_bytes() if f.exists() else b"<missing>")
    return h.hexdigest()


def source_fingerprint(cfg: DataConfig) -> str:
    """sha256 over the bytes of every source file, train and eval files apart, or "synthetic"."""
    if cfg.task:
        return "synthetic"
    if not cfg.eval_files:
        return _digest(cfg.files)
    return hashlib.sha256(f"files={_digest(cfg.files)} eval_files={_digest(cfg.eval_files)}".encode()).hexdigest()


def with_system_prompt(example: dict, system_prompt: str) -> dict:
    """`example` with a system turn first, unless `system_prompt` is "" or the chat already opens with one."""
    msgs = example["messages"]
    if not system_prompt or (msgs and msgs[0]["role"] == "system"):
        return example
    return {**example, "messages": [{"role": "system", "content": system_prompt}] + msgs}


def _load_files(files: list[str], setting: str, cfg: DataConfig, problems: Problems,
                require_completion: bool) -> list[dict]:
    out = []
    for where, row in iter_rows(files, cfg.format, problems, setting=setting):
        ex = to_example(row, where, cfg, problems, require_completion=require_completion)
        if ex is not None:
            out.append({**with_system_prompt(ex, cfg.system_prompt), _SOURCE: (where.rsplit(":", 1)[0], where)})
    return out


def load_examples(cfg: DataConfig, *, require_completions: bool, tasks: TaskMakers | None = None
                  ) -> tuple[list[dict], list[dict] | None]:
    """(train examples, eval examples or None without `data.eval_files` or a task's own eval problems
    (TaskSplit)), validated, in source order. Each
    carries a `_SOURCE` tag (file, location) until `_untagged` removes it. `tasks`: built-in tasks beyond
    this package's own (the data stage passes those played in an environment, posttrain.envs.tasks).

    Raises DataValidationError listing every problem of every file."""
    if cfg.task:
        makers = {**synthetic.TASKS, **(tasks or {})}
        if cfg.task not in makers:
            raise DataValidationError([(f"data.task: {cfg.task!r} is not made here (the built-in tasks made are "
                                        f"{sorted(makers)}); run it through the data stage")])
        made = (synthetic.PAIR_TASKS if cfg.schema == DataSchema.PREFERENCE else makers)[cfg.task](cfg)
        source = f"task:{cfg.task}"

        def tagged(rows: list[dict], row: str) -> list[dict]:
            return [{**with_system_prompt({**ex, "columns": ex.get("columns", {})}, cfg.system_prompt),
                     _SOURCE: (source, f"{source} {row} {i}")} for i, ex in enumerate(rows, start=1)]
        if isinstance(made, TaskSplit):
            return tagged(made.train, "train row"), tagged(made.eval, "eval row")
        return tagged(made, "row"), None
    if require_completions and cfg.schema == DataSchema.PROMPT_ANSWER:
        raise DataValidationError([
            (f"data.schema: {cfg.schema.value!r} rows ({', '.join(cfg.files)}) are prompts without completions, "
             "but SFT is enabled and needs an assistant reply to train on; set sft.enabled false for RL/eval-only "
             "prompt data, or give prompt/completion pairs (schema 'prompt_completion') or chats ('messages')")])
    problems = Problems()
    train = _load_files(cfg.files, "data.files", cfg, problems, require_completions)
    held = _load_files(cfg.eval_files, "data.eval_files", cfg, problems, False) if cfg.eval_files else None
    problems.raise_if_any()
    return train, held


def _dedupe(examples: list[dict]) -> list[dict]:
    """Exact duplicates (same turns and answer - for a preference pair, same prompt, chosen and rejected; other
    columns are not compared) dropped, first one kept."""
    seen, unique = set(), []
    for ex in examples:
        pair = {"c": ex["chosen"], "r": ex["rejected"]} if is_preference(ex) else {}
        k = dumps({"m": ex["messages"], "a": ex["answer"], **pair})
        if k not in seen:
            seen.add(k)
            unique.append(ex)
    return unique


def _hold_out(examples: list[dict], order: list[int], eval_size: int, where: str
              ) -> tuple[list[dict], list[dict], int]:
    """(eval, train, rows dropped from train): `eval_size` distinct prompts are held out - the first row of
    each, in shuffled order - and no row with one of those prompts stays in train, so a held-out problem was
    never seen in training, not even with another completion (a dataset with several completions per
    prompt, or the built-in task's occasional repeats, would otherwise leak)."""
    key = [dumps(prompt_messages(ex)) for ex in examples]
    held, eval_idx = set(), []
    for i in order:
        if len(eval_idx) == eval_size:
            break
        if key[i] not in held:
            held.add(key[i])
            eval_idx.append(i)
    train_idx = [i for i in order if key[i] not in held]
    if len(eval_idx) < eval_size or not train_idx:
        raise DataValidationError([(f"data.eval_size: {eval_size} eval problems requested but only {len(held)} "
                                    f"distinct prompts exist ({where}), and train needs some of its own; lower "
                                    "data.eval_size")])
    return ([examples[i] for i in sorted(eval_idx)], [examples[i] for i in train_idx],
            len(examples) - len(eval_idx) - len(train_idx))


def _untagged(examples: list[dict]) -> list[dict]:
    """The examples without their `_SOURCE` tag, as they are written."""
    return [{k: v for k, v in ex.items() if k != _SOURCE} for ex in examples]


def _row_report(loaded: list[dict], unique: list[dict], train: list[dict], held: list[dict] | None, eval_: list[dict]
                ) -> tuple[list[dict], list[dict]]:
    """(rows per source file, a sample of left-out rows with the reason), from the tagged examples: `loaded`
    (data.files or the task, before de-duplication), `unique` (after it), the splits, and `held`
    (data.eval_files rows, which are all kept)."""
    in_train, in_eval, in_unique = ({id(ex) for ex in xs} for xs in (train, eval_, unique))
    per_file: dict[str, dict] = {}
    dropped = []
    for ex in loaded + (held or []):
        file, where = ex[_SOURCE]
        row = per_file.setdefault(file, {"file": file, "rows": 0, "train": 0, "eval": 0, "duplicates": 0,
                                         "eval_prompt": 0})
        row["rows"] += 1
        outcome = ("train" if id(ex) in in_train else "eval" if id(ex) in in_eval
                   else "eval_prompt" if id(ex) in in_unique else "duplicates")
        row[outcome] += 1
        if outcome in ("duplicates", "eval_prompt") and len(dropped) < DROPPED_SAMPLE:
            reason = ("exact duplicate of an earlier row" if outcome == "duplicates"
                      else "same prompt as a held-out eval problem")
            dropped.append({"where": where, "reason": reason, "prompt": prompt_messages(ex)[-1]["content"][:200]})
    return list(per_file.values()), dropped


def prepare_dataset(cfg: DataConfig, out_dir: str | Path, *, require_completions: bool = True,
                    tasks: TaskMakers | None = None) -> DatasetInfo:
    """Validate, de-duplicate and split the data into `out_dir`; nothing is written when anything is wrong.

    `require_completions`: SFT will train on the train split, so every train row must end with an assistant
    turn (prompt-only data is refused, naming the file and line). Pass `sft.enabled`. The default is the
    stricter choice; it changes nothing for the built-in tasks, whose rows all have completions. `tasks`: as
    `load_examples`'s; the held-out rows of a task from `tasks` - played in an environment - are its problems,
    the turns before the demonstration's first assistant turn and the answer: a held-out row that kept the
    demonstration would hand a model evaluated without the environment the tool's result in its prompt."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"dataset output folder {out_dir} is not empty")
    examples, held = load_examples(cfg, require_completions=require_completions, tasks=tasks)
    loaded, n_before = examples, len(examples)
    if cfg.dedupe:
        examples = _dedupe(examples)
    where = "data.files" if cfg.files else f"data.task={cfg.task}"
    if not examples:
        raise DataValidationError([f"{where}: nothing left after filtering and de-duplication"])
    order = list(range(len(examples)))
    random.Random(f"split-{cfg.seed}").shuffle(order)
    dropped_for_eval = 0
    if held is not None:
        if not held:
            raise DataValidationError([f"data.eval_files: no rows in {', '.join(cfg.eval_files)}" if cfg.eval_files
                                       else f"data.eval_size: {where} made no eval problems"])
        eval_ex, train_ex = held, [examples[i] for i in order]
    else:
        eval_ex, train_ex, dropped_for_eval = _hold_out(examples, order, cfg.eval_size, where)
    rows_per_file, dropped_sample = _row_report(loaded, examples, train_ex, held, eval_ex)
    if cfg.task in (tasks or {}):  # played in an environment: a held-out row is the problem, not the episode
        eval_ex = [{**ex, "messages": episode_prompt(ex)} for ex in eval_ex]
    train_prompts = {dumps(prompt_messages(ex)) for ex in train_ex}
    in_train = sum(dumps(prompt_messages(ex)) in train_prompts for ex in eval_ex)
    if held is not None and cfg.task:
        print(f"data prep: {len(eval_ex)} eval problems of {where} made by the task (its games all open with the "
              "same prompt, the secret hidden: nothing to hold out by prompt)")
    elif held is not None or in_train:
        print(f"data prep: {in_train} of {len(eval_ex)} eval rows also occur in the train split (same prompt turns)"
              + (" - held-out scores on them are optimistic" if in_train else ""))
    sources = ([{"path": str(f), "sha256": _digest([f]), "split": "train"} for f in cfg.files]
               + [{"path": str(f), "sha256": _digest([f]), "split": "eval"} for f in cfg.eval_files])
    columns = sorted({c for ex in train_ex + eval_ex for c in ex["columns"]})
    info = DatasetInfo(task=cfg.task or None, schema=cfg.schema.value, num_train=len(train_ex),
                       num_eval=len(eval_ex), num_duplicates=n_before - len(examples), num_eval_in_train=in_train,
                       num_train_dropped_for_eval=dropped_for_eval,
                       eval_from_files=held is not None, require_completions=require_completions,
                       columns=columns, sources=sources, rows_per_file=rows_per_file, dropped_sample=dropped_sample)

    write_dataset(out_dir, _untagged(train_ex), _untagged(eval_ex),
                  {k: v for k, v in asdict(info).items() if k not in _REPORT_ONLY})
    return info
