"""The RL policy and PPO's critic on the shared training core (posttrain.spmd): their real workers, in a real
2-rank gloo group (rl_spmd_driver.py as ranks: tests/ranks.py), run two updates of a fixed batch - 2 mini-batches x 2
inner epochs, gradient clipping engaged, mismatch correction's extra pass, a KL term - with uneven forwards
between them (rank r scores r + 1 rows: the reference with LoRA, the policy's log-probs, the critic's values).

- FSDP2 == DDP within 1e-5 (weights, gradient norms, the uneven passes), with and without LoRA, for both roles.
- Split invariance: 1 rank x 4 micro-batches == 2 ranks x 2 (FSDP2 against DDP: both changes at once).
- The ranks of an FSDP2 group report one checksum, the one DDP's ranks report for the same weights.

A wrong world-size factor, an FSDP2 gradient that is not reduced, a rank left out of a gathered tensor, or a
forward that is a collective on one rank only (a hang: the ranks' timeout) fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.ranks import run_ranks
from tests.torchrun_output import stderr_excerpt

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("rl_spmd_driver.py")
TEXTS = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)] + ["the answer is"] * 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from posttrain.config import ModelConfig
    from posttrain.models.io import load_tokenizer, save_model
    from posttrain.models.tiny import build_model
    from posttrain.models.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("rl-spmd")
    train_tokenizer(TEXTS, 300, root / "tok")
    tok = load_tokenizer(root / "tok")
    save_model(build_model(ModelConfig(), tok), tok, root / "tiny")
    return root / "tiny"


def run(tmp: Path, model: Path, role: str, parallelism: str, lora: str, ranks: int) -> dict:
    """One driver run: `ranks` ranks at one row per micro-batch (4 rows per mini-batch: 1 x 4 or 2 x 2)."""
    out = tmp / f"{role}-{parallelism}-{lora or 'full'}-{ranks}"
    out.mkdir()
    p = run_ranks(ranks, DRIVER, out, model, role, parallelism, lora, "1")  # forked warm: tests/ranks.py
    assert p.returncode == 0, stderr_excerpt(p.stderr)
    return {"ranks": [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)],
            "weights": load_file(str(out / "weights.safetensors")), "moved": json.loads((out / "moved.json").read_text())}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def uneven_diff(a: dict, b: dict) -> float:
    return max(abs(x - y) for k in ("uneven0", "uneven1") for ra, rb in zip(a[k], b[k]) for x, y in zip(ra, rb))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lora", ["", "lora"])
@pytest.mark.parametrize("role", ["policy", "critic"])
def test_fsdp2_matches_ddp_and_splits_agree(tmp_path, tiny, role, lora):
    ddp = run(tmp_path, tiny, role, "ddp", lora, 2)
    fsdp = run(tmp_path, tiny, role, "fsdp2", lora, 2)
    moved = ddp["moved"]
    assert len(moved) >= 10 and (not lora or all(".lora_" in k or "score" in k for k in moved)), moved
    assert ddp["ranks"][0]["stats"][0][1] > 0.5, "gradient clipping (rl.max_grad_norm 0.5) was not engaged"
    assert max_diff(fsdp["weights"], ddp["weights"]) < 1e-5
    for a, b in zip(fsdp["ranks"], ddp["ranks"]):
        assert [s[1] for s in a["stats"]] == pytest.approx([s[1] for s in b["stats"]], rel=1e-5)  # grad norms
        assert uneven_diff(a, b) < 1e-5
    # each group's ranks agree; FSDP2's gathered weights are DDP's within rounding (their checksums may differ)
    assert len({r["checksum"] for r in fsdp["ranks"]}) == 1 and len({r["checksum"] for r in ddp["ranks"]}) == 1
    if not lora:  # 1 rank x 4 micro-batches under FSDP2 == 2 ranks x 2 under DDP (accumulation order differs)
        one = run(tmp_path, tiny, role, "fsdp2", lora, 1)
        assert max_diff(one["weights"], ddp["weights"]) < 5e-5
        assert [s[1] for s in one["ranks"][0]["stats"]] == pytest.approx([s[1] for s in ddp["ranks"][0]["stats"]],
                                                                         rel=1e-5)
