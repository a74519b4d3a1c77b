"""RL checkpoints and resume, and the resumable prompt sampler.

Every `rl.checkpoint_every` steps (and after the last) `Checkpointer.save` writes:
- a `model` artifact through the ArtifactStore: the policy's HF checkpoint; parents = the starting model's
  artifact id and the dataset id; manifest `extra` = the reward function's identity (import path + source
  sha256, or the built-in verifier + sha256 of posttrain/data/verifiers.py), the policy version, step and
  every step's flat metrics so far (`history`, the curves of posttrain.report); metrics = that step's metrics;
  policy rank 0 writes and stores it itself (`PolicyGroup.save_model`), so no local path crosses nodes;
- training state, kept apart in `state_dir/step-NNNNNN/` - a local folder or an fsspec URL under the store's
  root (artifacts/state.py), so a task retried on another node resumes: the state of every role that trains
  (`RoleSpec.trains` in rl/roles/registry.py: the policy ranks' weights/optimizer/RNG/version, PPO's critic
  ranks' likewise) in `step-NNNNNN/<role>/` (`save_state`, each rank writing its own files), `controller.json`
  (step, policy version, prompt-sampler cursor, the controller's RNG, wandb run id, metrics history, model
  artifact id) and a copy of the step log.
Only when the step folder is complete does the `LATEST` file (one atomic write) point at it - a SIGKILL at
any moment leaves the previous checkpoint intact; a re-run clears a step folder LATEST never pointed at.

`steps.jsonl` in the state's local work folder is the per-step log (one line per finished update; the state
folder itself for a local store). On resume it is cut back to the checkpoint's step - to nothing when no
checkpoint was saved yet and the run starts again at step 1 - so after a kill and a restart every step
appears exactly once (a row torn by the kill is dropped too).

Leaves out: the start model and dataset folders the actors read are local paths (`ArtifactStore.get` in
the task's process): on a multi-node cluster they must be on a volume every node mounts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.artifacts.state import StateDir, write_atomic
from posttrain.config import RewardConfig
from posttrain.data.chat import encode_prompt
from posttrain.data.examples import prompt_messages
from posttrain.rl.metrics import StepMetrics
from posttrain.rl.roles.registry import training_roles
from posttrain.rl.types import ModelPut, PromptBatch

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
                 max_prompt_len: int | None = None, prompt_of: Callable[[dict], list[dict]] | None = None,
                 encode: Callable[[list[dict]], list[int]] | None = None, room_setting: str = "rl.max_new_tokens"):
        """`prompt_of` / `encode`: a row's prompt turns and their ids, for a rollout that opens its samples itself
        (protocols.ShapesPrompts: an episode opens with the tools' system turn); by default every turn before the
        row's last assistant turn, rendered by the chat template. `room_setting`: what sets the response's room
        that `max_prompt_len` leaves (named in the error when no prompt fits)."""
        self._prompt = prompt_of or prompt_messages
        encode = encode or (lambda messages: encode_prompt(tokenizer, messages))
        encoded = [(i, encode(self._prompt(ex))) for i, ex in enumerate(examples)]
        if not encoded:
            raise ValueError("prompt sampler: the train split has no prompts")
        if max_prompt_len is not None:  # leave room for the response within the model's max_seq_len
            kept = [(i, p) for i, p in encoded if len(p) <= max_prompt_len]
            if not kept:
                raise ValueError(f"prompt sampler: none of the {len(encoded)} train prompts (the shortest "
                                 f"{min(len(p) for _, p in encoded)} tokens) fits in the {max_prompt_len} tokens that "
                                 f"model.max_seq_len leaves after the response's room ({room_setting})")
            if len(kept) < len(encoded):
                print(f"prompt sampler: dropped {len(encoded) - len(kept)} prompts longer than {max_prompt_len} tokens")
            encoded = kept
        self.examples = examples
        self.rows = [i for i, _ in encoded]
        """Usable example ids (rows of the train split); the permutation runs over these."""
        self._encoded = dict(encoded)
        self.prompts_per_step, self.seed, self.cursor = prompts_per_step, seed, 0
        self.active = list(self.rows)
        """The rows drawn from: all usable ones, or those a curriculum kept (`set_active`)."""
        self.base, self.generation = 0, 0
        """The cursor when `active` was last set, and how many times it was set (each set starts new epochs)."""
        self._perm: tuple[tuple[int, int], torch.Tensor] | None = None

    def _index(self, k: int) -> int:
        epoch, pos = divmod(k - self.base, len(self.active))
        if self._perm is None or self._perm[0] != (self.generation, epoch):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + self.generation * 1_000_000_007)
            self._perm = ((self.generation, epoch), torch.randperm(len(self.active), generator=g))
        return self.active[int(self._perm[1][pos])]

    def set_active(self, ids: list[int]) -> None:
        """Draw from these rows from now on (a subset of `rows`), in new epochs of their own."""
        unknown = sorted(set(ids) - set(self.rows))
        if not ids or unknown:
            raise ValueError(f"prompt sampler: the rows to draw from must be a non-empty subset of the usable ones "
                             f"(got {len(ids)}, unknown {unknown[:5]})")
        self.active, self.base, self.generation, self._perm = sorted(ids), self.cursor, self.generation + 1, None

    def next_batch(self, policy_version: int) -> PromptBatch:
        ids = [self._index(k) for k in range(self.cursor, self.cursor + self.prompts_per_step)]
        self.cursor += self.prompts_per_step
        return self.batch_of(ids, policy_version)

    def batch_of(self, ids: list[int], policy_version: int) -> PromptBatch:
        """The prompts of these rows (of `rows`), in this order, without moving the cursor."""
        rows = [self.examples[i] for i in ids]
        return PromptBatch(policy_version=policy_version, example_ids=ids, prompt_ids=[self._encoded[i] for i in ids],
                           answers=[ex.get("answer") for ex in rows], tasks=[ex.get("task") for ex in rows],
                           messages=[self._prompt(ex) for ex in rows],
                           columns=[ex.get("columns") or {} for ex in rows])

    def column_names(self) -> list[str]:
        """Every column name that some usable example carries (what a reward function may ask for)."""
        return sorted({k for i in self.rows for k in (self.examples[i].get("columns") or {})})

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "seed": self.seed, "num_prompts": len(self.rows),
                **({"active": self.active, "base": self.base, "generation": self.generation} if self.generation else {})}

    def load_state_dict(self, state: dict) -> None:
        if state["num_prompts"] != len(self.rows) or state["seed"] != self.seed:
            raise ValueError(f"prompt sampler: checkpoint was made for {state['num_prompts']} prompts with seed "
                             f"{state['seed']}, this run has {len(self.rows)} with seed {self.seed}")
        self.cursor = state["cursor"]
        self.active, self.base = state.get("active", list(self.rows)), state.get("base", 0)
        self.generation, self._perm = state.get("generation", 0), None


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
    ahead: dict | None = None
    """rl.max_staleness > 0: the setting and the draws in flight (rl/ahead.Ahead.state_dict)."""


def _log_row(line: str) -> dict | None:
    """One steps.jsonl row, or None for a blank line or one torn by a kill while it was being written."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and "step" in row else None


class Checkpointer:
    """Writes model artifacts + resumable training state; restores the newest committed state.

    `state_dir`: a local folder or an fsspec URL under the store's root (artifacts/state.StateDir); the step
    log lives in its local work folder (the state folder itself when that is local)."""

    def __init__(self, *, state_dir: str | Path | StateDir, store_root: str, run_id: str, parents: list[str],
                 config: dict, extra: dict, name: str = "rl"):
        self.state = state_dir if isinstance(state_dir, StateDir) else StateDir(state_dir)
        self.store = ArtifactStore(store_root)
        self.run_id, self.parents, self.config, self.extra, self.name = run_id, parents, config, extra, name
        self.log_path = self.state.work / "steps.jsonl"

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
        write_atomic(self.log_path, "".join(line + "\n" for line in keep))

    # ----------------------------------------------------------------------------------- save

    def save(self, *, step: int, policy_version: int, groups: Mapping[str, Any], controller_state: dict,
             history: list[dict], transcripts: list[dict] | None = None) -> ArtifactRef:
        """`groups`: the run's role groups by name; the policy's model is stored, every training role's state
        is written. `transcripts`: the last step's rows shown turn by turn (StepMetrics.transcripts), kept in the
        model's manifest as "episodes" for the RL page."""
        name = f"step-{step:06d}"
        policy = groups["policy"]
        self.state.remove(name)  # a folder a killed run left uncommitted (LATEST never pointed at it)
        model_id = policy.save_model(ModelPut(
            store_root=str(self.store.root), name=f"{self.name}-step{step}", run_id=self.run_id, parents=self.parents,
            config=self.config, metrics=history[-1] if history else {},
            extra={**self.extra, "policy_version": policy_version, "step": step, "history": history,
                   **({"episodes": transcripts} if transcripts else {})},
            provenance={"parents": self.parents, "step": step, "policy_version": policy_version}))
        for role, group in training_roles(groups).items():
            group.save_state(self.state.url(name, role))
        state = {"step": step, "policy_version": policy_version, "model_id": model_id, "history": history,
                 **controller_state}
        self.state.write_text(f"{name}/controller.json", json.dumps(state))
        log = self.log_path.read_text() if self.log_path.exists() else ""
        self.state.write_text(f"{name}/steps.jsonl", log)  # the log up to this step: another node resumes from it
        self.state.write_text("LATEST", name)  # the commit: only now does a resume see this step
        for old in self.state.names("step-")[:-KEEP_CHECKPOINTS]:
            if old != name:
                self.state.remove(old)
        return self.store.ref(model_id)

    # ----------------------------------------------------------------------------------- resume

    def _latest_name(self) -> str | None:
        text = self.state.read_text("LATEST")
        return text.strip() if text else None

    def latest(self) -> ResumeState | None:
        name = self._latest_name()
        if name is None:
            return None
        d = json.loads(self.state.read_text(f"{name}/controller.json"))
        return ResumeState(step=d["step"], policy_version=d["policy_version"], sampler=d["sampler"],
                           rng_state=d["rng_state"], wandb_id=d.get("wandb_id"), model_id=d["model_id"],
                           history=d["history"], ahead=d.get("ahead"))

    def restore(self, groups: Mapping[str, Any]) -> ResumeState | None:
        """Load the newest committed state into every training role's group; None when there is none. A role
        without saved state (a checkpoint written before the role existed in this run) fails clearly. Either way the
        step log is cut back to the step the run continues from (`_cut_log`); a node that has no log of its
        own (a retry elsewhere) starts from the copy committed with the checkpoint."""
        state = self.latest()
        if state is None:  # nothing saved yet: the run starts again at step 1 and redoes every logged step
            self._cut_log(0)
            return None
        name = self._latest_name()
        versions = {role: group.load_state(self.state.url(name, role))
                    for role, group in training_roles(groups).items()}
        version = versions["policy"]
        if version != state.policy_version:
            raise RuntimeError(f"resume: policy state in {self.state.url(name)} holds version {version}, "
                               f"controller.json says {state.policy_version}")
        if not self.log_path.exists():
            self.log_path.write_text(self.state.read_text(f"{name}/steps.jsonl") or "")
        self._cut_log(state.step)  # drop steps done after the checkpoint: they are redone now
        return state

    def model_ref(self, model_id: str) -> ArtifactRef:
        return self.store.ref(model_id)
