"""SFT from a user's local HF model folder: its own tokenizer and chat template are used, nothing is
fetched, and the base model becomes a parent artifact of the fine-tuned checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from dataclasses import replace
from pathlib import Path
from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import ModelConfig, SFTConfig, TrackingConfig
home, base, ds = sys.argv[1], sys.argv[2], sys.argv[3]
store = ArtifactStore(home)
data = store.put("dataset", "addition", Path(ds), run_id="t", parents=[], config={})
ref = stages.sft(ModelConfig(base_path=base, max_seq_len=32), SFTConfig(steps=3, global_batch_size=16, micro_batch_size=16,
                 nproc=1, warmup_steps=1, save_every=0), TrackingConfig(wandb=False), dataset=data,
                 tokenizer=None, run_id="t", store=store)
print("MODEL", ref.id)
"""


@pytest.mark.timeout(1200)  # the first user of the shared fixture trains it (a few minutes)
def test_sft_from_a_local_model_folder_records_it_as_a_parent(tmp_path, tiny_sft_model):
    from posttrain.artifacts import ArtifactStore
    from posttrain.models.io import load_model

    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "home"), str(tiny_sft_model["model_dir"]),
                        str(tiny_sft_model["dataset_dir"])], capture_output=True, text=True, timeout=500, cwd=ROOT,
                       check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    model_id = p.stdout.split("MODEL")[1].strip()
    store = ArtifactStore(tmp_path / "home")
    m = store.manifest(model_id)
    kinds = sorted(store.manifest(x).kind for x in m.parents)
    assert kinds == ["dataset", "model"]
    base = next(store.manifest(x) for x in m.parents if store.manifest(x).kind == "model")
    assert base.config["base_path"] == str(tiny_sft_model["model_dir"])
    out = store.get(model_id)
    assert (out / "chat_template.jinja").read_text() == (tiny_sft_model["model_dir"] / "chat_template.jinja").read_text()
    assert load_model(out) is not None
