"""RL checkpoints and resume, and the resumable prompt sampler.

Every `rl.checkpoint_every` steps (and after the last) `Checkpointer.save` writes:
- a `model` artifact through the ArtifactStore: the policy's HF checkpoint; parents = the starting model's
  artifact id and the dataset id; manifest `extra` = the reward function's identity (import path + source
  sha256, or the built-in verifier + sha256 of posttrain/data/verifiers.py), the policy version and step;
  metrics = that step's metrics;
- training state, kept apart in `state_dir/step-NNNNNN/`: the policy ranks' optimizer/RNG/version
  (`PolicyGroup.save_state`), and `controller.json` (step, policy version, prompt-sampler cursor, the
  controller's RNG, wandb run id, metrics history, model artifact id).
The step folder is assembled under a temporary name, renamed into place, and only then does the `LATEST`
file (replaced atomically) point at it - a SIGKILL at any moment leaves the previous checkpoint intact.

`steps.jsonl` in state_dir is the per-step log (one line per finished update). On resume it is cut back
to the checkpoint's step - to nothing when no checkpoint was saved yet and the run starts again at step 1 -
so after a kill and a restart every step appears exactly once (a row torn by the kill is dropped too).

Leaves out: shared storage. state_dir and the policy's checkpoint folder must be reachable from the
controller and policy rank 0 (one node locally; a shared volume on a multi-node cluster).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import RewardConfig
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages
from posttrain.rl.metrics import StepMetrics
from posttrain.rl.types import PolicyGroup, PromptBatch

KEEP_CHECKPOINTS = 2
"""Step folders kept in state_dir (the newest ones); older ones are deleted after a successful save."""


# --------------------------------------------------------------------------------------------- prompts


class PromptSampler:
    """Deterministic, cursor-based prompts: epoch e visits the train split in permutation(seed, e) order.

    The cursor (prompts drawn so far) is the whole state: restoring it continues the exact sequence.
    Prompts are rendered once, up front, with the model's own chat template (encode_prompt,
    add_generation_prompt=True); those longer than `max_prompt_len` are left out (and counted).
    """

    def __init__(self, examples: list[dict], tokenizer, *, prompts_per_step: int, seed: int,
                 max_prompt_len: int | None = None):
        encoded = [(i, encode_prompt(tokenizer, prompt_messages(ex))) for i, ex in enumerate(examples)]
        if max_prompt_len is not None:  # leave room for the response within the model's max_seq_len
            kept = [(i, p) for i, p in encoded if len(p) <= max_prompt_len]
            if len(kept) < len(encoded):
                print(f"prompt sampler: dropped {len(encoded) - len(kept)} prompts longer than {max_prompt_len} tokens")
            encoded = kept
        if not encoded:
            raise ValueError("prompt sampler: no usable prompts in the train split")
        self.examples = examples
        self.rows = [i for i, _ in encoded]
        """Usable example ids (rows of the train split); the permutation runs over these."""
        self._encoded = dict(encoded)
        self.prompts_per_step, self.seed, self.cursor = prompts_per_step, seed, 0
        self._perm: tuple[int, torch.Tensor] | None = None

    def _index(self, k: int) -> int:
        epoch, pos = divmod(k, len(self.rows))
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(len(self.rows), generator=g))
        return self.rows[int(self._perm[1][pos])]

    def next_batch(self, policy_version: int) -> PromptBatch:
        ids = [self._index(k) for k in range(self.cursor, self.cursor + self.prompts_per_step)]
        self.cursor += self.prompts_per_step
        rows = [self.examples[i] for i in ids]
        return PromptBatch(policy_version=policy_version, example_ids=ids, prompt_ids=[self._encoded[i] for i in ids],
                           answers=[ex.get("answer") for ex in rows], tasks=[ex.get("task") for ex in rows],
                           messages=[prompt_messages(ex) for ex in rows],
                           columns=[ex.get("columns") or {} for ex in rows])

    def column_names(self) -> list[str]:
        """Every column name that some usable example carries (what a reward function may ask for)."""
        return sorted({k for i in self.rows for k in (self.examples[i].get("columns") or {})})

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "seed": self.seed, "num_prompts": len(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        if state["num_prompts"] != len(self.rows) or state["seed"] != self.seed:
            raise ValueError(f"prompt sampler: checkpoint was made for {state['num_prompts']} prompts with seed "
                             f"{state['seed']}, this run has {len(self.rows)} with seed {self.seed}")
        self.cursor = state["cursor"]


# --------------------------------------------------------------------------------------------- identity


def reward_identity(reward: RewardConfig | str, tasks: list[str | None]) -> dict:
    """What scored the rollouts, for the manifest: a user function's import path + source hash (read in a
    short-lived reward process, with `reward.python_path` on its sys.path), or the built-in verifier(s) +
    the sha256 of posttrain/data/verifiers.py. A bare string is `reward.fn` with no python_path."""
    cfg = reward if isinstance(reward, RewardConfig) else RewardConfig(fn=reward)
    if cfg.fn:
        from posttrain.rewards import reward_identity as user_identity

        return {"kind": "user", **user_identity(cfg)}
    from posttrain.data import verifiers

    src = Path(verifiers.__file__).read_bytes()
    return {"kind": "verifier", "verifiers": sorted({t for t in tasks if t}),
            "import_path": "posttrain.data.verifiers:score", "source_sha256": hashlib.sha256(src).hexdigest()}


# --------------------------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True, kw_only=True)
class ResumeState:
    step: int
    policy_version: int
    sampler: dict
    rng_state: list
    """random.Random.getstate() of the controller, as JSON lists."""
    wandb_id: str | None
    model_id: str
    history: list[dict] = field(default_factory=list)
    """StepMetrics.flat() of every step so far."""


def _log_row(line: str) -> dict | None:
    """One steps.jsonl row, or None for a blank line or one torn by a kill while it was being written."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and "step" in row else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Checkpointer:
    """Writes model artifacts + resumable training state; restores the newest complete state."""

    def __init__(self, *, state_dir: str | Path, store_root: str, run_id: str, parents: list[str], config: dict,
                 extra: dict, name: str = "rl"):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = ArtifactStore(store_root)
        self.run_id, self.parents, self.config, self.extra, self.name = run_id, parents, config, extra, name
        self.log_path = self.state_dir / "steps.jsonl"

    # ----------------------------------------------------------------------------------- per-step log

    def record(self, m: StepMetrics) -> None:
        """Append one finished step to steps.jsonl (flushed; cut back to the checkpoint on resume)."""
        with open(self.log_path, "a") as f:
            f.write(json.dumps(m.flat(), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def logged_steps(self) -> list[int]:
        """The step of every complete row of steps.jsonl, in file order."""
        if not self.log_path.exists():
            return []
        return [row["step"] for row in map(_log_row, self.log_path.read_text().splitlines()) if row is not None]

    def _cut_log(self, last_step: int) -> None:
        """Keep only the rows of steps <= `last_step` (the restored checkpoint's step; 0 for a start from
        scratch): the steps after it are redone now and log their rows again. Rewritten atomically; a row
        torn by a kill in the middle of `record` is dropped."""
        if not self.log_path.exists():
            return
        keep = [line for line in self.log_path.read_text().splitlines()
                if (row := _log_row(line)) is not None and row["step"] <= last_step]
        _write_atomic(self.log_path, "".join(line + "\n" for line in keep))

    # ----------------------------------------------------------------------------------- save

    def save(self, *, step: int, policy_version: int, policy: PolicyGroup, controller_state: dict,
             history: list[dict]) -> ArtifactRef:
        final = self.state_dir / f"step-{step:06d}"
        tmp = self.state_dir / f".tmp-step-{step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        policy.save(str(tmp / "model"))
        # Provenance inside the content: an RL checkpoint is its own artifact even when its weights equal the
        # start model's (e.g. every reward was 0, so nothing moved) - otherwise content addressing would fold
        # it into the start model and its lineage would be lost. Deterministic: no timestamps.
        (tmp / "model" / "posttrain_rl.json").write_text(json.dumps(
            {"parents": self.parents, "step": step, "policy_version": policy_version}, sort_keys=True) + "\n")
        policy.save_state(str(tmp / "policy"))
        ref = self.store.put("model", f"{self.name}-step{step}", tmp / "model", run_id=self.run_id,
                             parents=self.parents, config=self.config, metrics=history[-1] if history else {},
                             extra={**self.extra, "policy_version": policy_version, "step": step})
        state = {"step": step, "policy_version": policy_version, "model_id": ref.id, "history": history,
                 **controller_state}
        _write_atomic(tmp / "controller.json", json.dumps(state))
        shutil.rmtree(tmp / "model")  # the store holds the model; the state folder keeps only what resumes
        shutil.rmtree(final, ignore_errors=True)  # a re-run after a kill may redo a step folder
        os.replace(tmp, final)
        _write_atomic(self.state_dir / "LATEST", final.name)
        for old in sorted(self.state_dir.glob("step-*"))[:-KEEP_CHECKPOINTS]:
            if old.name != final.name:
                shutil.rmtree(old, ignore_errors=True)
        return ref

    # ----------------------------------------------------------------------------------- resume

    def latest(self) -> ResumeState | None:
        pointer = self.state_dir / "LATEST"
        if not pointer.exists():
            return None
        d = json.loads((self.state_dir / pointer.read_text().strip() / "controller.json").read_text())
        return ResumeState(step=d["step"], policy_version=d["policy_version"], sampler=d["sampler"],
                           rng_state=d["rng_state"], wandb_id=d.get("wandb_id"), model_id=d["model_id"],
                           history=d["history"])

    def restore(self, policy: PolicyGroup) -> ResumeState | None:
        """Load the newest state into the policy group; None when state_dir holds no checkpoint. Either way
        steps.jsonl is cut back to the step the run continues from (`_cut_log`)."""
        state = self.latest()
        if state is None:  # nothing saved yet: the run starts again at step 1 and redoes every logged step
            self._cut_log(0)
            return None
        folder = self.state_dir / (self.state_dir / "LATEST").read_text().strip()
        version = policy.load_state(str(folder / "policy"))
        if version != state.policy_version:
            raise RuntimeError(f"resume: policy state in {folder} holds version {version}, controller.json says "
                               f"{state.policy_version}")
        self._cut_log(state.step)  # drop steps done after the checkpoint: they are redone now
        return state

    def model_ref(self, model_id: str) -> ArtifactRef:
        return self.store.ref(model_id)
