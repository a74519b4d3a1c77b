"""LoRA adapters (posttrain.models.lora, models.folders): only adapters train, the disabled adapters give the base,
the merge equals the adapted forward, the stored adapter is peft's layout (peft loads it to the same logits), and
the merged folder of an adapter artifact is the base plus the adapter."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.config import LoraConfig, ModelConfig, SFTConfig
from posttrain.models.io import load_model, load_tokenizer, save_model
from posttrain.models.lora import (
    adapters_disabled,
    add_adapters,
    merge_state_dict,
    merged_with_adapter,
    read_adapter,
    save_adapter,
)
from posttrain.models.tiny import build_model

LORA = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from posttrain.config import DataConfig
    from posttrain.data.prepare import prepare_dataset
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer

    d = tmp_path_factory.mktemp("lora")
    prepare_dataset(DataConfig(num_examples=200, eval_size=20, num_digits=2), d / "ds")
    train_tokenizer(tokenizer_training_texts(d / "ds"), 300, d / "tok")
    tok = load_tokenizer(d / "tok")
    save_model(build_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                       intermediate_size=64, max_seq_len=32), tok), tok, d / "base")
    return d / "base"


def _ids():
    return torch.randint(0, 200, (3, 12), generator=torch.Generator().manual_seed(1))


def _trained(base_dir, steps=3):
    """The base with adapters after a few AdamW steps on random tokens (so B is no longer zero)."""
    from posttrain.sft.trainer import make_optimizer

    model = add_adapters(load_model(base_dir).train(), LORA, seed=0)
    opt = make_optimizer(model, SFTConfig(lr=1e-2))
    ids = _ids()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), opt


def test_only_the_adapters_train_and_start_as_the_base(base_dir):
    base = load_model(base_dir)
    model = add_adapters(load_model(base_dir), LORA, seed=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".lora_")[0].split(".")[-1] for n in trainable} == set(LORA.target_modules)
    ids = _ids()
    with torch.no_grad():  # B = 0: the adapted model computes its base
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    trained, opt = _trained(base_dir)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in trained.parameters() if p.requires_grad}  # the optimizer holds only adapters
    frozen = {n: p for n, p in trained.named_parameters() if not p.requires_grad}
    base_sd = base.state_dict()
    for n, p in frozen.items():  # the base weights did not move
        assert torch.equal(p, base_sd[n.replace(".base_layer.", ".")])


def test_disabled_adapters_give_the_base_and_the_merge_gives_the_adapted_model(base_dir):
    trained, _ = _trained(base_dir)
    base = load_model(base_dir)
    ids = _ids()
    with torch.no_grad():
        adapted = trained(input_ids=ids).logits
        with adapters_disabled(trained):
            off = trained(input_ids=ids).logits
        assert torch.equal(trained(input_ids=ids).logits, adapted)  # back on after the block
        assert torch.equal(off, base(input_ids=ids).logits)
        assert (adapted - off).abs().max() > 1e-3  # the adapters changed something
        merged = load_model(base_dir)
        merged.load_state_dict(merge_state_dict(trained.state_dict(), LORA), strict=True)
        assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=1e-5)


def test_the_stored_adapter_is_peft_layout_and_merges_to_the_same_model(base_dir, tmp_path):
    from peft import PeftModel

    trained, _ = _trained(base_dir)
    save_adapter(trained.state_dict(), LORA, tmp_path / "adapter", base="posttrain:abc")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["base_model_name_or_path"] == "posttrain:abc"
    got_cfg, tensors, _ = read_adapter(tmp_path / "adapter")
    assert got_cfg.rank == 4 and got_cfg.alpha == 8.0 and sorted(got_cfg.target_modules) == sorted(LORA.target_modules)
    assert all(".lora_" in k for k in tensors)
    ids = _ids()
    with torch.no_grad():
        want = trained(input_ids=ids).logits
        peft_model = PeftModel.from_pretrained(load_model(base_dir), str(tmp_path / "adapter")).eval()
        assert torch.allclose(peft_model(input_ids=ids).logits, want, atol=1e-5)
        merged = load_model(base_dir)
        merged.load_state_dict(merged_with_adapter(merged.state_dict(), tmp_path / "adapter"), strict=True)
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)


def test_a_target_module_the_model_lacks_is_refused_naming_the_layers(base_dir):
    with pytest.raises(ValueError, match=r"model.lora.target_modules: \['c_attn'\].*q_proj"):
        add_adapters(load_model(base_dir), LoraConfig(target_modules=["q_proj", "c_attn"]), seed=0)


def test_a_tied_output_head_is_refused_as_a_target(base_dir):
    with pytest.raises(ValueError, match="'lm_head' is this model's input embedding too"):
        add_adapters(load_model(base_dir), LoraConfig(target_modules=["q_proj", "lm_head"]), seed=0)


def test_merge_refuses_a_lora_tensor_it_cannot_place():
    sd = {"a.base_layer.weight": torch.zeros(2, 2), "a.lora_A.default.weight": torch.zeros(1, 2),
          "a.lora_B.default.weight": torch.zeros(2, 1), "b.lora_A.default.weight": torch.zeros(1, 2)}
    with pytest.raises(ValueError, match="b.lora_A.default.weight belongs to no adapted linear layer"):
        merge_state_dict(sd, LoraConfig(rank=1))


def test_an_adapter_artifact_names_its_base_and_opens_as_the_merged_model(base_dir, tmp_path):
    from posttrain.artifacts import ArtifactStore
    from posttrain.models.folders import model_folder

    store = ArtifactStore(tmp_path / "store")
    base_ref = store.put("model", "base", base_dir, run_id="r", parents=[], config={})
    trained, _ = _trained(base_dir)
    save_adapter(trained.state_dict(), LORA, tmp_path / "a", base=f"posttrain:{base_ref.id}")
    load_tokenizer(base_dir).save_pretrained(tmp_path / "a")
    ref = store.put("model", "sft", tmp_path / "a", run_id="r", parents=[base_ref.id], config={},
                    extra={"adapter_of": base_ref.id})
    assert store.get(ref) != model_folder(store, ref)
    folder = model_folder(store, ref)
    assert folder == tmp_path / "store" / "merged" / ref.id and model_folder(store, ref) == folder  # built once
    assert model_folder(store, base_ref) == store.get(base_ref)  # a full model is its own folder
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(load_model(folder)(input_ids=ids).logits, trained(input_ids=ids).logits, atol=1e-5)
    orphan = store.put("model", "orphan", tmp_path / "a", run_id="r2", parents=[], config={"x": 1})
    with pytest.raises(ValueError, match="names no base model"):
        model_folder(store, orphan)


def test_an_adapter_model_is_judged_promoted_and_held_by_a_channel(base_dir, tmp_path):
    """Channels and promotion take an adapter artifact like any model: the gate evaluates it merged, promotes it,
    and `channel:NAME` then names it (the setting resolves to the adapter's id)."""
    from posttrain import promotion
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import EvalConfig, RewardConfig
    from posttrain.models.refs import model_ref
    from posttrain.stages.gate import judge

    store = ArtifactStore(tmp_path / "store")
    base_ref = store.put("model", "base", base_dir, run_id="r", parents=[], config={})
    ds = store.put("dataset", "ds", base_dir.parent / "ds", run_id="r", parents=[], config={})
    trained, _ = _trained(base_dir)
    save_adapter(trained.state_dict(), LORA, tmp_path / "a", base=f"posttrain:{base_ref.id}")
    load_tokenizer(base_dir).save_pretrained(tmp_path / "a")
    ref = store.put("model", "sft-lora", tmp_path / "a", run_id="r", parents=[base_ref.id], config={},
                    extra={"adapter_of": base_ref.id})
    d = judge(channel="prod", model=ref, pin_to=ds, eval_cfg=EvalConfig(num_problems=8, max_new_tokens=4),
              reward=RewardConfig(), min_accuracy=0.0, tolerance=0.0, run_id="r", store=store, explicit_pin=True)
    assert d.promoted and promotion.current("prod", store)["model_id"] == ref.id
    assert model_ref("channel:prod", "model.artifact", run_id="r", store=store).id == ref.id
