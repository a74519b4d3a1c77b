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
        # --no-compile: the checks compile what they import, once (make test writes bytecode)
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(target),
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


RM_SCRIPT = r"""
import json, sys
import torch, transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
rm = AutoModelForSequenceClassification.from_pretrained(d, dtype=torch.float32).eval()
convs = [[{"role": "user", "content": "12+34="}, {"role": "assistant", "content": a}] for a in ("046", "056", "46")]
texts = [tok.apply_chat_template(c, tokenize=False) for c in convs]
batch = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")  # right padding
with torch.no_grad():
    scores = rm(**batch).logits[:, 0].tolist()
print("RESULT" + json.dumps({"version": transformers.__version__, "scores": scores, "labels": rm.config.num_labels,
      "cls": type(rm).__name__}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_saved_reward_model_loads_unchanged_in_transformers_457(folders, transformers_457, tmp_path):
    """A reward model as the trainer saves it (save_final: a fresh head on the llama body, weights set from the
    trained state dict) is an AutoModelForSequenceClassification folder that 4.57 and 5.x score identically, and
    both score as the trainer's per-position head does at the pooled token (TokenScores + collate's pool_index)."""
    from posttrain.data.chat import tokenize_for_training
    from posttrain.models.io import load_tokenizer, save_model
    from posttrain.models.reward_model import TokenScores, build_reward_model
    from posttrain.sft.batching import collate

    tok = load_tokenizer(folders["tok"])
    torch.manual_seed(3)
    rm = build_reward_model(folders["llama"], tok)
    with torch.no_grad():
        rm.score.weight.normal_(0, 1.0)  # a head that separates the inputs, as a trained one does
    save_model(rm, tok, tmp_path / "rm")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = []
    for path in (None, str(transformers_457)):
        p = subprocess.run([sys.executable, "-c", RM_SCRIPT, str(tmp_path / "rm")], capture_output=True, text=True,
                           check=False, timeout=300, env={**env, **({"PYTHONPATH": path} if path else {})})
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.split("RESULT", 1)[1]))
    new, old = runs
    assert old["version"] == "4.57.6" and new["version"].startswith("5.")
    assert old["labels"] == new["labels"] == 1 and new["cls"] == "LlamaForSequenceClassification"
    assert old["scores"] == pytest.approx(new["scores"], abs=1e-4)
    assert len({round(s, 3) for s in new["scores"]}) == 3
    convs = [[{"role": "user", "content": "12+34="}, {"role": "assistant", "content": a}] for a in ("046", "056", "46")]
    batch = collate([tokenize_for_training(tok, c, 64) for c in convs], pack=True, pack_length=64,
                    pad_id=tok.pad_token_id)
    with torch.no_grad():
        per_position = TokenScores(rm.eval())(batch.input_ids, batch.position_ids, batch.attention_mask)
    trained = per_position.reshape(-1)[batch.pool_index].tolist()  # packed rows, read where the trainer reads
    assert trained == pytest.approx(new["scores"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_exported_lora_model_generates_as_its_adapted_policy_in_both_versions(folders, transformers_457, tmp_path):
    """`posttrain export` of an adapter artifact (LoRA trained on the llama folder, stored with its base as parent)
    writes a plain HF folder: 5.x and 4.57 load it with no peft and generate the greedy tokens the adapted model
    generates, with logits within 1e-4."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.cli.main import main
    from posttrain.config import LoraConfig, SFTConfig
    from posttrain.models.io import load_model, load_tokenizer
    from posttrain.models.lora import add_adapters, save_adapter
    from posttrain.sft.trainer import make_optimizer

    lora = LoraConfig(rank=4, alpha=16.0)
    model = add_adapters(load_model(folders["llama"]).train(), lora, seed=0)
    opt = make_optimizer(model, SFTConfig(lr=3e-2))
    ids = torch.randint(0, 250, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    store = ArtifactStore(tmp_path / "store")
    base = store.put("model", "base", folders["llama"], run_id="r", parents=[], config={})
    save_adapter(model.state_dict(), lora, tmp_path / "adapter", base=f"posttrain:{base.id}")
    load_tokenizer(folders["llama"]).save_pretrained(tmp_path / "adapter")
    ref = store.put("model", "sft-lora", tmp_path / "adapter", run_id="r", parents=[base.id], config={},
                    extra={"adapter_of": base.id})
    assert main(["--home", str(tmp_path / "store"), "export", ref.id[:12], str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "adapter_config.json").exists() and (tmp_path / "out" / "config.json").exists()
    assert main(["--home", str(tmp_path / "store"), "export", ref.id[:12], str(tmp_path / "out")]) == 1  # not over
    new = _run_check(tmp_path / "out", None)
    old = _run_check(tmp_path / "out", str(transformers_457))
    assert old["version"] == "4.57.6" and new["version"].startswith("5.")
    prompt = torch.tensor([new["ids"]])
    with torch.no_grad():
        want_logits = model(prompt).logits[0]
        want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    want = want[0, prompt.shape[1]:].tolist()
    base_out = _run_check(folders["llama"], None)
    assert base_out["generated"] != want or base_out["logits"] != new["logits"]  # the adapter changed the model
    for got in (new, old):
        assert got["generated"] == want
        assert float((torch.tensor(got["logits"]) - want_logits).abs().max()) < 1e-4
