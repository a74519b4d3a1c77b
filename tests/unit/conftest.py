"""Fixtures shared by the unit tests of pretrained-model handling, the policy update and checkpoint formats."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.config import ModelConfig
from posttrain.models.io import load_tokenizer, save_model
from posttrain.models.tiny import build_model
from posttrain.models.tokenizer import train_tokenizer

TEXTS = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)] + ["the answer is"] * 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The project's own trained tokenizer; a tiny from-scratch model saved with it; a pretrained-like Llama
    (rope_theta 5e5, untied head, two EOS ids in its config) saved with the same tokenizer."""
    return build_folders(tmp_path_factory.mktemp("pretrained"))


def build_folders(root):
    """`folders`' models under `root` (bench/mismatch.py builds them too)."""
    train_tokenizer(TEXTS, 300, root / "tok")
    tok = load_tokenizer(root / "tok")
    save_model(build_model(ModelConfig(), tok), tok, root / "tiny")
    torch.manual_seed(1)
    user = tok.convert_tokens_to_ids("<|user|>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, rope_theta=500000.0, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=[user, tok.eos_token_id], pad_token_id=None,
                      bos_token_id=None)
    save_model(LlamaForCausalLM(cfg), tok, root / "llama")
    return {"root": root, "tok": root / "tok", "tiny": root / "tiny", "llama": root / "llama", "user": user,
            "eos": tok.eos_token_id}


@pytest.fixture()
def world_of_one(monkeypatch):
    """A gloo process group of one rank in this process (removed afterwards)."""
    import torch.distributed as dist

    from posttrain.spmd.dist import _free_port, init_distributed

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    info = init_distributed()
    yield info
    dist.destroy_process_group()


@pytest.fixture
def one_torch_thread():
    """torch at one intra-op thread for the test: the in-process fakes' ops are tiny, and more threads only add
    contention on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
