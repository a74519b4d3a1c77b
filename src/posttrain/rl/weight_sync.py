"""Weight sync checks: policy -> rollout, verified by version AND checksum; the rollout/policy drift check.

After every update the controller hands the policy's `WeightsHandle` (version, checksum, tensors) to the
rollout group; every rollout worker answers with a `WeightReport` whose checksum it computed from the
weights it actually holds. `verify_reports` accepts the sync only if every worker of the group reported
exactly the policy's version and checksum - a worker that claims the right version while still holding
the previous weights is named in the `StaleWeightsError`.

The checksum alone cannot catch an engine that holds the right weights but samples from a different
distribution (wrong temperature, lower precision, a broken KV cache). `check_drift` compares, token by
token, the log-probs the rollout reported while sampling with the policy's teacher-forced log-probs of the
same tokens under the same version (the policy update's own first forward measures it, posttrain.rl.roles.policy);
a mean |difference| above `rl.drift_threshold`, or NaN, raises `WeightDriftError` (`drift_gate`).

Leaves out: how the tensors travel (the role groups do that: a Ray object ref, or the dict in-process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from posttrain.rl.types import WeightReport, WeightsHandle, WorkerId


class StaleWeightsError(RuntimeError):
    """A rollout worker does not hold the weights the policy just published."""


class WeightDriftError(RuntimeError):
    """Rollout log-probs and policy log-probs of the same tokens disagree beyond rl.drift_threshold."""


def weights_checksum(named_tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the sorted parameter names, shapes and each tensor's fp32 bytes (contiguous, CPU).

    The one checksum of the package: the policy computes it over what it publishes, every rollout worker
    over what it holds after loading."""
    h = hashlib.sha256()
    for name in sorted(named_tensors):
        add_to_checksum(h, name, named_tensors[name])
    return h.hexdigest()


def add_to_checksum(h: hashlib._Hash, name: str, tensor: torch.Tensor) -> None:
    """One tensor's share of `weights_checksum`; fed in sorted name order it gives the same digest. For an
    engine that hashes its tensors while it streams them in (posttrain.rl.roles.rollout_vllm)."""
    t = tensor.detach().to("cpu", torch.float32).contiguous()
    h.update(name.encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0")
    h.update(t.numpy())  # the array's buffer itself: no copy of the tensor's bytes


def verify_reports(expected: WeightsHandle, reports: Sequence[WeightReport],
                   workers: Sequence[WorkerId] | None = None) -> None:
    """Raise StaleWeightsError unless every rollout worker reported `expected.version` and `.checksum`.

    `workers` (the group's identities) makes a missing report an error too: a worker that never
    answered is as stale as one that answered wrongly.
    """
    problems = []
    for r in reports:
        if r.version != expected.version or r.checksum != expected.checksum:
            problems.append(f"{r.worker} reports version {r.version} checksum {r.checksum[:12]}, expected "
                            f"version {expected.version} checksum {expected.checksum[:12]}")
    if workers is not None:
        seen = {(w.role, w.rank) for w in (r.worker for r in reports)}
        problems += [f"{w} sent no weight report" for w in workers if (w.role, w.rank) not in seen]
    if problems:
        raise StaleWeightsError("weight sync failed (rollout would sample from stale weights):\n  "
                                + "\n  ".join(problems))


def drift_gate(drift: float, *, version: int, threshold: float, rollout_workers: Sequence[WorkerId]) -> float:
    """Return `drift`; raise WeightDriftError (naming the rollout workers and version) when it is above
    `threshold` or not a number (NaN log-probs on either side fail the gate, they do not slip past `>`)."""
    if not drift <= threshold:
        names = ", ".join(str(w) for w in rollout_workers)
        raise WeightDriftError(
            f"rollout/policy drift at policy version {version}: mean |logprob diff| = {drift:.4f} > "
            f"rl.drift_threshold = {threshold} on the same tokens; rollout worker(s) {names} sample from a "
            "different distribution than the policy (wrong weights, temperature or precision?)")
    return drift
