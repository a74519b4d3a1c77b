"""Start models and training state, through `posttrain.stages` in real subprocesses (world size 1):

- `model.artifact`: SFT starts from a stored model artifact given by id prefix, reads its weights from the store
  (the user's folder may be gone), and records it as a parent; with sft.enabled=false the artifact passes through.
- the token budget is checked before any training (no state folder is created for a budget that cannot fit);
- `sft.tokens`: the steps are worked out from the train rows' measured tokens, run and stored in the config;
- SFT's resumable state is deleted once the model is stored and kept with sft.keep_state (kept when the run dies,
  and the re-run resumes from it: tests/integration/test_wandb_runs.py, whose killed run checks its wandb run too).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import stage_script

SCRIPT = r"""
import json, shutil, sys
from pathlib import Path
from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import ConfigError, ModelConfig, SFTConfig, TrackingConfig
home, base, ds, mode = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
store = ArtifactStore(home)
data = store.put("dataset", "addition", ds, run_id="t", parents=[], config={})
track = TrackingConfig(wandb=False, log_every=1)
def sft_cfg(**kw):
    return SFTConfig(**{"steps": 2, "global_batch_size": 16, "micro_batch_size": 16, "nproc": 1, "warmup_steps": 0,
                        "save_every": 1, **kw})
out = {}
if mode == "artifact":
    user = Path(home).parent / "user-model"
    shutil.copytree(base, user)
    start = stages.start_model(ModelConfig(base_path=str(user)), run_id="t", store=store)
    shutil.rmtree(user)  # the user's folder is gone: SFT must read the stored artifact
    trained = stages.sft(ModelConfig(artifact=start.id[:10]), sft_cfg(), track, dataset=data, tokenizer=None,
                         run_id="t", store=store)
    same = stages.sft(ModelConfig(base_path=str(user)), sft_cfg(), track, dataset=data, tokenizer=None, start=start,
                      run_id="t", store=store)  # the same inputs by content: a cache hit, not a second run
    skipped = stages.sft(ModelConfig(artifact=start.id[:10]), sft_cfg(enabled=False), track, dataset=data,
                         tokenizer=None, run_id="t", store=store)
    out = {"start": start.id, "trained": trained.id, "same": same.id, "skipped": skipped.id}
elif mode == "budget":
    try:
        stages.sft(ModelConfig(base_path=str(base), max_seq_len=6), sft_cfg(), track, dataset=data, tokenizer=None,
                   run_id="t", store=store)
    except ConfigError as e:
        out = {"error": str(e)}
else:  # "keep" / "drop": train, then report what is left under state/; "drop" under a budget in tokens
    from posttrain.data.lengths import check_budget
    from posttrain.models.io import load_tokenizer
    lengths = check_budget(ds, load_tokenizer(base), max_seq_len=256, max_new_tokens=0, sft=True)
    tokens = int(2.5 * 16 * lengths.total_conversation_tokens / lengths.num_rows)  # 2.5 steps of 16 rows: 3 steps
    budget = {"steps": 3} if mode == "keep" else {"steps": 0, "tokens": tokens}
    ref = stages.sft(ModelConfig(base_path=str(base)), sft_cfg(**budget, keep_state=mode == "keep"), track,
                     dataset=data, tokenizer=None, run_id="t", store=store)
    m = store.manifest(ref.id)
    out = {"model": ref.id, "tokens": tokens, "config": m.config["sft"], "history": len(m.extra["history"])}
state = Path(home) / "state" / "sft"
out["state"] = sorted(str(p.relative_to(state)) for p in state.glob("*/*")) if state.exists() else []
print("RESULT" + json.dumps(out))
"""


def _run(home: Path, fixture: dict, mode: str) -> tuple[dict, str]:
    return stage_script.run(SCRIPT, home, fixture, mode)


@pytest.mark.timeout(1500)  # the first user of the shared fixture trains it (a few minutes)
def test_sft_from_a_model_artifact_reads_the_stored_weights_and_records_the_parent(tmp_path, tiny_sft_model):
    from posttrain.artifacts import ArtifactStore

    out, _ = _run(tmp_path / "home", tiny_sft_model, "artifact")
    store = ArtifactStore(tmp_path / "home")
    start = store.manifest(out["start"])
    assert start.kind == "model" and start.extra == {"stage": "base"} and start.config["base_path"].endswith("user-model")
    trained = store.manifest(out["trained"])
    assert out["start"] in trained.parents and trained.extra["start_model"] == out["start"]
    assert out["trained"] != out["start"] and out["same"] == out["trained"]
    assert out["skipped"] == out["start"]  # sft.enabled=false: passed through, untrained
    assert out["state"] == []  # deleted after success (keep_state is false by default)


@pytest.mark.timeout(900)
def test_a_budget_that_cannot_fit_stops_sft_before_any_training(tmp_path, tiny_sft_model):
    out, _ = _run(tmp_path / "home", tiny_sft_model, "budget")
    assert "model.max_seq_len=6" in out["error"] and "train.jsonl line" in out["error"]
    assert out["state"] == []  # nothing started: no state folder


@pytest.mark.timeout(900)
def test_sft_state_is_deleted_after_success_and_kept_with_keep_state(tmp_path, tiny_sft_model):
    dropped, log = _run(tmp_path / "a", tiny_sft_model, "drop")
    assert dropped["state"] == []
    # sft.tokens: 2.5 steps' worth of the train rows' mean conversation -> 3 steps, run, stored and printed
    assert (dropped["config"]["steps"], dropped["config"]["tokens"], dropped["history"]) == (3, dropped["tokens"], 3)
    assert f"sft: sft.tokens={dropped['tokens']} gives 3 steps of 16 examples" in log
    kept, _ = _run(tmp_path / "b", tiny_sft_model, "keep")
    assert kept["state"] and all(p.split("/")[1].startswith("step-") for p in kept["state"])
