"""RL through the vLLM rollout engine on a real local Ray (markers `vllm` and `ray`; `make test-vllm` runs them in
.venv-vllm, in a pytest process of their own): the controller's weight sync into live vLLM engines every step,
and a stale vLLM worker stopping the run.

The model is a from-scratch tiny one (no SFT needed): the reward (`tests.reward_fns:batch_len`, the completion's
length) differs between samples, so every update changes the weights and a stale engine is visible."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from posttrain.config import PlacementConfig, RewardConfig, RLConfig, RolloutBackend, TrackingConfig
from posttrain.config.checks import vllm_installed
from posttrain.rl.roles.rollout import RolloutWorker
from posttrain.rl.types import WeightReport

pytestmark = [pytest.mark.vllm, pytest.mark.ray,
              pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here: `make install-vllm`, "
                                 "then `make test-vllm` runs these tests in .venv-vllm")]

REPO = Path(__file__).resolve().parents[2]
REWARD = RewardConfig(fn="tests.reward_fns:batch_len", python_path=[str(REPO)])
RL = RLConfig(steps=2, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, lr=1e-3, kl_coef=0.0,
              checkpoint_every=0, remote_timeout_s=120, rollout_backend=RolloutBackend.VLLM)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A from-scratch tiny model and the default recipe's prompt data."""
    from dataclasses import replace

    from posttrain.data.prepare import prepare_dataset
    from posttrain.models.io import save_model
    from posttrain.models.tiny import build_model
    from posttrain.models.tokenizer import tokenizer_training_texts, train_tokenizer
    from posttrain.recipes import tiny_cpu

    root, recipe = tmp_path_factory.mktemp("vllm_ray"), tiny_cpu()
    data = replace(recipe.data, num_examples=400, eval_size=20)
    prepare_dataset(data, root / "dataset")
    tok = train_tokenizer(tokenizer_training_texts(root / "dataset"), data.tokenizer.vocab_size, root / "tok")
    save_model(build_model(recipe.model, tok), tok, root / "model")
    return {"model_dir": root / "model", "dataset_dir": root / "dataset", "max_seq_len": recipe.model.max_seq_len}


def _run(tmp_path, tiny, rl: RLConfig = RL, **kw):
    from posttrain.artifacts import ArtifactStore
    from posttrain.rl.run import run_rl

    store = ArtifactStore(tmp_path / "store")
    model = store.put("model", "start", tiny["model_dir"], run_id="test", parents=[], config={})
    data = store.put("dataset", "addition", tiny["dataset_dir"], run_id="test", parents=[], config={})
    return run_rl(rl_cfg=rl, reward_cfg=REWARD, placement_cfg=PlacementConfig(policy_workers=1),
                  max_seq_len=tiny["max_seq_len"], tracking_cfg=TrackingConfig(wandb=False, log_every=1),
                  start_model_dir=tiny["model_dir"], dataset_dir=tiny["dataset_dir"], store_root=str(store.root),
                  run_id="vllm", parents=[model.id, data.id], state_dir=tmp_path / "state", start_model_id=model.id,
                  **kw)


@pytest.mark.timeout(900)
def test_rl_steps_through_vllm_engines_sync_every_step(ray_local, tiny, tmp_path):
    res = _run(tmp_path, tiny)  # every sync is verified (version + checksum) and every step drift-gated
    assert [m.policy_version for m in res.history] == [1, 2]
    for m in res.history:
        assert m.generated_tokens > 0 and m.drift < RL.drift_threshold
        assert m.reward_failures == 0


class StaleRolloutWorker(RolloutWorker):
    """Acknowledges each new version but pushes the START weights back into its engine right after (a dropped
    transfer) - works for any engine, vLLM's included, whose weights cannot be read back."""

    def __init__(self, model_dir, *args, **kwargs):
        from posttrain.models.io import load_model

        super().__init__(model_dir, *args, **kwargs)
        self._start = load_model(model_dir).state_dict()

    def load_weights(self, state, version: int) -> WeightReport:
        super().load_weights(state, version)
        self.engine.load_weights(self._start)
        return WeightReport(worker=self.id, version=version, checksum=self.engine.checksum())


@pytest.mark.timeout(900)
def test_stale_vllm_worker_stops_the_run(ray_local, tiny, tmp_path):
    from posttrain.rl.weight_sync import StaleWeightsError

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(StaleWeightsError, match=r"rollout\[0/1\].*reports version 1 checksum"):
        _run(tmp_path, tiny, workers={"rollout": StaleRolloutWorker})


@pytest.mark.timeout(900)
def test_on_policy_distillation_with_vllm_rollouts(ray_local, tiny, tmp_path):
    """The student samples with vLLM and the advantages come from vLLM's log-probs of those samples, which the
    teacher (a heavily noised copy of the start model) scores token by token; every step passes the drift gate. (That
    the student moves toward the teacher: tests/unit/test_rl_distill.py, with the transformers engine.)"""
    from dataclasses import replace

    from posttrain.config import Algorithm
    from tests.files import noised_model_copy

    # far from the student (a from-scratch model's near-uniform distributions are all alike): a clearly positive KL
    teacher = noised_model_copy(tiny["model_dir"], tmp_path / "teacher", 1.0)
    cfg = replace(RL, algorithm=Algorithm.ON_POLICY_DISTILL, teacher=str(teacher), steps=2)
    res = _run(tmp_path, tiny, rl=cfg)
    assert [m.policy_version for m in res.history] == [1, 2]
    for m in res.history:
        flat = m.flat()
        assert flat["distill/reverse_kl"] > 0 and flat["compute/teacher_s"] > 0, flat
        assert m.drift < cfg.drift_threshold and m.generated_tokens > 0


@pytest.mark.timeout(900)
def test_lora_policy_hands_vllm_its_merged_weights_every_step(ray_local, tiny, tmp_path):
    """model.lora with vLLM rollouts: each sync streams W + B A x alpha / rank under the base model's names into
    the live engines (their checksum must equal the policy's merged view, or the sync fails), the drift gate
    passes every step, and the checkpoint is an adapter artifact of the start model."""
    from posttrain.artifacts import ArtifactStore
    from posttrain.config import LoraConfig, ModelConfig

    res = _run(tmp_path, tiny, model_cfg=ModelConfig(lora=LoraConfig(rank=4, alpha=8.0)))
    assert [m.policy_version for m in res.history] == [1, 2]
    for m in res.history:
        assert m.generated_tokens > 0 and m.drift < RL.drift_threshold and m.reward_failures == 0
    store = ArtifactStore(tmp_path / "store")
    assert (store.get(res.model) / "adapter_model.safetensors").exists()


@pytest.mark.timeout(900)
def test_grpo_on_multi_turn_episodes_with_vllm_rollouts(ray_local, tiny_sft_model, tmp_path):
    """rl.environment with vLLM rollouts: the shared tiny SFT model plays the retry game (a wrong answer is told
    "no" and tried again) on its own data; every turn is sampled by the vLLM engines from the episode's exact ids,
    and the drift gate - the policy's teacher-forced log-probs of whole episodes against vLLM's, at the sampled
    tokens only - passes every step."""
    from dataclasses import replace

    from posttrain.config import EpisodeConfig
    from posttrain.recipes import tiny_cpu

    sft = {"model_dir": tiny_sft_model["model_dir"], "dataset_dir": tiny_sft_model["dataset_dir"],
           "max_seq_len": tiny_cpu().model.max_seq_len}
    cfg = replace(RL, environment="retry_env:Retry", lr=1e-4,
                  episode=EpisodeConfig(python_path=[str(REPO / "tests" / "integration")], max_turns=3,
                                        max_total_tokens=20))  # the prompt and the episode share max_seq_len 32
    res = _run(tmp_path, sft, rl=cfg)
    assert [m.policy_version for m in res.history] == [1, 2]
    for m in res.history:
        flat = m.flat()
        print(f"step {m.policy_version}: turns/episode {flat['env/turns_mean']:.2f}, drift {m.drift:.2e}")
        assert flat["env/turns_mean"] > 1 and m.drift < cfg.drift_threshold and m.generated_tokens > 0, flat
        assert m.reward_failures == 0

