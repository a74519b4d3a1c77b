"""On-policy distillation (rl.algorithm on_policy_distill) on real workers in-process: the teacher role scores the
student's own samples in the distribution they were drawn from, every token's advantage is teacher log p -
student log p (plus the task reward's group advantage with rl.distill_reward_weight), training on it brings the
student toward the teacher (the reverse KL on its samples falls), and a teacher with another tokenizer is
refused when the worker starts, naming both folders."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from posttrain.config import Algorithm, RLConfig
from posttrain.models.io import load_tokenizer, save_model
from posttrain.rl.algorithms.grpo import group_advantages
from posttrain.rl.loops.common import response_mask
from posttrain.rl.ragged import pad_rows
from posttrain.rl.remote import LocalActor
from tests.unit.test_rl_pg_family import Reward01, _examples

OPD = RLConfig(algorithm=Algorithm.ON_POLICY_DISTILL, steps=6, prompts_per_step=4, samples_per_prompt=2,
               max_new_tokens=4, lr=3e-3, checkpoint_every=0, micro_batch_size=8, seed=0, teacher="(set per test)")


def _run(folders, cfg, teacher_dir):
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles.policy import PolicyWorker
    from posttrain.rl.roles.policy_group import PolicyGroup
    from posttrain.rl.roles.rollout import RolloutGroup, RolloutWorker
    from posttrain.rl.roles.teacher import TeacherGroup, TeacherWorker
    from posttrain.rl.state import PromptSampler
    from tests.rl_fakes import NullTracker

    md = str(folders["llama"])
    rollout, policy = RolloutWorker(md, 0, 1), PolicyWorker(md, cfg, 0, 1)
    teacher = TeacherWorker(str(teacher_dir), md, 0, 1, cfg)
    pg = PolicyGroup([LocalActor(policy)], [policy.identity()], 60, cfg.micro_batch_size, seed=cfg.seed)
    pg.setup()
    seen = {"batches": [], "teacher": [], "rewards": []}
    real_update = pg.update
    pg.update = lambda batch, **kw: seen["batches"].append(batch) or real_update(batch, **kw)
    tg = TeacherGroup([LocalActor(teacher)], [teacher.identity()], 60)
    real_lp = tg.log_probs
    tg.log_probs = lambda t, **kw: seen["teacher"].append(real_lp(t, **kw)) or seen["teacher"][-1]
    reward = Reward01()
    real_score = reward.score
    reward.score = lambda t: seen["rewards"].append(real_score(t)) or seen["rewards"][-1]
    groups = {"rollout": RolloutGroup([LocalActor(rollout)], [rollout.identity()], 60), "reward": reward,
              "policy": pg, "teacher": tg}
    sampler = PromptSampler(_examples(), load_tokenizer(md), prompts_per_step=cfg.prompts_per_step, seed=cfg.seed)
    return Controller(cfg, groups, sampler, NullTracker(), None).run(cfg.steps), seen


@pytest.mark.parametrize("reward_weight", [0.0, 0.5])
def test_each_token_is_advantaged_by_the_teachers_log_prob_over_the_students(folders, world_of_one, reward_weight):
    cfg = replace(OPD, steps=2, distill_reward_weight=reward_weight)
    history, seen = _run(folders, cfg, folders["tiny"])
    for batch, teacher, rewards in zip(seen["batches"], seen["teacher"], seen["rewards"]):
        mask = response_mask(batch)
        want = (pad_rows(teacher.values, mask.shape) - pad_rows(batch.old_logprobs, mask.shape)) * mask
        if reward_weight:
            want = want + reward_weight * group_advantages(torch.tensor(rewards.scores), 2, std_normalize=True)[:, None] * mask
        assert torch.allclose(pad_rows(batch.advantages, mask.shape), want, atol=1e-6)
        assert want.abs().sum() > 0
    assert [m.policy_version for m in history] == [1, 2] and "teacher" in history[0].phase_s
    assert history[0].extra["distill/reverse_kl"] > 0


def test_training_on_it_brings_the_student_toward_the_teacher(folders, world_of_one):
    history, _seen = _run(folders, OPD, folders["tiny"])
    kl = [m.extra["distill/reverse_kl"] for m in history]
    assert kl[-1] < 0.8 * kl[0], kl


def test_a_teacher_with_another_tokenizer_is_refused_naming_both_folders(folders, tmp_path):
    from transformers import AutoModelForCausalLM

    from posttrain.rl.roles.teacher import TeacherVocabularyError, TeacherWorker

    tok = load_tokenizer(folders["llama"])
    tok.add_tokens(["<|tool|>"])  # one more token: ids no longer line up with the student's
    model = AutoModelForCausalLM.from_pretrained(folders["llama"])
    model.resize_token_embeddings(len(tok))
    save_model(model, tok, tmp_path / "other")
    with pytest.raises(TeacherVocabularyError, match=r"rl\.teacher: .*other tokenizes differently.*llama"):
        TeacherWorker(str(tmp_path / "other"), str(folders["llama"]), 0, 1, OPD)


def test_on_policy_distill_needs_a_teacher_and_only_it_reads_one():
    from posttrain.config import ConfigError, PipelineConfig, validate

    base = PipelineConfig()
    with pytest.raises(ConfigError, match=r"rl\.teacher: on_policy_distill needs a teacher"):
        validate(replace(base, rl=replace(base.rl, algorithm=Algorithm.ON_POLICY_DISTILL)), ())
    with pytest.raises(ConfigError, match=r"rl\.teacher: only means something"):
        validate(replace(base, rl=replace(base.rl, teacher="/m")), ())
