"""Checkpoints the project saves load unchanged in transformers 4.57 (slow: installs it once into pytest's
cache folder): same chat text, token ids, logits within 1e-4, greedy tokens, pad and EOS ids, top-level
rope_theta."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHECK_SCRIPT = r"""
import json, sys
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
text = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True)
ids = tok(text, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=8, do_sample=False)
print("RESULT" + json.dumps({"version": transformers.__version__, "text": text, "ids": ids, "logits": logits.tolist(),
      "generated": out[0, len(ids):].tolist(), "pad": tok.pad_token_id, "eos": model.generation_config.eos_token_id}))
"""


@pytest.fixture(scope="session")
def transformers_457(request):
    """transformers 4.57.6 + tokenizers 0.22.2 (and their dependencies) installed once with pip --target into
    pytest's cache folder."""
    target = Path(request.config.cache.mkdir("transformers-4.57.6"))
    if not (target / "transformers-4.57.6.dist-info").exists():
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                            "transformers==4.57.6", "tokenizers==0.22.2"], check=False, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            if any(s in p.stderr for s in ("Could not find a version", "NewConnectionError", "Network is unreachable",
                                           "Temporary failure in name resolution", "No matching distribution")):
                pytest.skip(f"PyPI cannot be reached to install transformers 4.57.6: {p.stderr.strip()[-300:]}")
            raise AssertionError(f"pip install transformers==4.57.6 failed:\n{p.stderr[-3000:]}")
    return target


def _run_check(model_dir: Path, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(model_dir)], check=False, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.split("RESULT", 1)[1])


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["tiny", "llama"])
def test_saved_checkpoint_loads_unchanged_in_transformers_457(folders, transformers_457, name):
    new = _run_check(folders[name], None)
    old = _run_check(folders[name], str(transformers_457))
    assert old["version"] == "4.57.6" and new["version"].startswith("5.")
    assert old["text"] == new["text"] and old["ids"] == new["ids"]
    diff = float((torch.tensor(old["logits"]) - torch.tensor(new["logits"])).abs().max())
    assert diff < 1e-4, f"{name}: logits differ by {diff} between transformers 4.57 and 5"
    assert old["generated"] == new["generated"]
    assert old["pad"] == new["pad"] is not None
    assert old["eos"] == new["eos"] == ([folders["user"], folders["eos"]] if name == "llama" else folders["eos"])
    cfg = json.loads((folders[name] / "config.json").read_text())
    assert cfg["rope_theta"] == (500000.0 if name == "llama" else 10000.0) and "quantization_config" not in cfg
