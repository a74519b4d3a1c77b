"""The reward-model role on real models in-process: a tiny sequence classifier built here (a Llama body with a
scalar head, saved as transformers saves it) scores each sample exactly as its own pooled forward scores the
conversation; split across workers the scores come back in order; the controller trains on the weighted mix
of function and model scores, still reports the verifier's own accuracy, and with reward.fn_weight 0 the model
is the only reward."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from posttrain.config import RewardConfig, RLConfig
from posttrain.models.io import load_tokenizer, save_model
from posttrain.rl.remote import LocalActor


@pytest.fixture(scope="module")
def rm_dir(folders, tmp_path_factory):
    from posttrain.models.reward_model import build_reward_model

    tok = load_tokenizer(folders["llama"])
    torch.manual_seed(3)
    rm = build_reward_model(folders["llama"], tok)
    with torch.no_grad():
        rm.score.weight.normal_(0, 1.0)  # scores far enough apart to tell samples (and weights) apart
    out = tmp_path_factory.mktemp("rm") / "rm"
    save_model(rm, tok, out)
    return out


def _traj():
    from posttrain.rl.types import Trajectories

    msgs = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(1, 2), (30, 4), (5, 6), (7, 80)]]
    texts = ["3", "34", "the answer is 11", "87 87 87"]
    return Trajectories(policy_version=0, group_index=[0, 1, 2, 3], prompt_ids=[[1]] * 4, response_ids=[[2]] * 4,
                        logprobs=[[0.0]] * 4, finished=[True] * 4, texts=texts, answers=["3", "34", "12", "87"],
                        tasks=["addition"] * 4, messages=msgs, columns=[{}] * 4, compute_s=0.0)


def test_a_reward_model_scores_like_its_own_pooled_forward_in_any_split(rm_dir):
    from posttrain.models.reward_model import load_reward_model, score_conversations
    from posttrain.rl.roles.reward_model import RewardModelGroup, RewardModelWorker

    t = _traj()
    want = score_conversations(load_reward_model(rm_dir), load_tokenizer(rm_dir),
                               [m + [{"role": "assistant", "content": c}] for m, c in zip(t.messages, t.texts)])
    assert len({round(x, 4) for x in want}) == 4
    for n in (1, 2):
        workers = [RewardModelWorker([str(rm_dir)], r, n, batch_size=3) for r in range(n)]
        g = RewardModelGroup([LocalActor(w) for w in workers], [w.identity() for w in workers], 60, [str(rm_dir)])
        got = g.score(t)
        assert got.sources == [str(rm_dir)] and got.names == ["model0"] and len(got.scores) == 1
        assert max(abs(a - b) for a, b in zip(got.scores[0], want)) < 1e-5


def test_a_folder_without_a_chat_template_is_refused(rm_dir, tmp_path):
    from posttrain.rl.roles.reward_model import RewardModelWorker

    bare = tmp_path / "bare"
    shutil.copytree(rm_dir, bare)
    cfg = bare / "tokenizer_config.json"
    d = json.loads(cfg.read_text())
    d.pop("chat_template", None)
    cfg.write_text(json.dumps(d))
    for f in bare.glob("chat_template.*"):
        f.unlink()
    with pytest.raises(ValueError, match="has no chat template"):
        RewardModelWorker([str(bare)], 0, 1)


@pytest.mark.parametrize("fn_weight, weight", [(1.0, 0.5), (0.0, 1.0)])
def test_the_controller_trains_on_the_weighted_mix_and_reports_the_verifier(rm_dir, fn_weight, weight):
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles.reward_model import RewardModelGroup, RewardModelWorker
    from tests.rl_fakes import NullTracker, fake_sampler, make_fake_groups

    cfg = RLConfig(steps=1, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=3, checkpoint_every=0)
    groups = make_fake_groups(cfg)
    w = RewardModelWorker([str(rm_dir)], 0, 1)
    rm = RewardModelGroup([LocalActor(w)], [w.identity()], 60, [str(rm_dir)], weights=[weight])
    seen = {}

    class Spy(type(rm)):
        def score(self, trajectories):
            seen["scores"] = super().score(trajectories)
            return seen["scores"]

    rm.__class__ = Spy
    groups["reward_model"] = rm
    fn_scores = {}
    real_score = groups["reward"].score

    def spy_fn(traj):
        fn_scores["v"] = real_score(traj)
        return fn_scores["v"]

    groups["reward"].score = spy_fn
    groups["reward"].weight = fn_weight  # reward.fn_weight (the registry passes it to the reward group)
    c = Controller(cfg, groups, fake_sampler(cfg), NullTracker(), None)
    (m,) = c.run(1)
    fn, model = fn_scores["v"].scores, seen["scores"].scores[0]
    mixed = [fn_weight * f + weight * s for f, s in zip(fn, model)]
    assert abs(m.reward_mean - sum(mixed) / len(mixed)) < 1e-6
    assert m.extra["reward/fn_accuracy"] == sum(f >= 1 for f in fn) / len(fn)
    assert abs(m.extra["reward/model0_mean"] - sum(model) / len(model)) < 1e-6
    assert "reward_model" in m.phase_s


def test_reward_settings_are_checked_before_any_work():
    from posttrain.config import ConfigError, PipelineConfig, validate

    base = PipelineConfig()
    for reward, field in [(RewardConfig(models=["/m"], model_weights=[1.0, 2.0]), "reward.model_weights"),
                          (RewardConfig(fn_weight=0.0), "reward.fn_weight"),
                          (RewardConfig(fn_weight=0.5), "reward.fn_weight"),
                          (RewardConfig(models=[" "]), "reward.models")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            validate(replace(base, reward=reward), ())  # the plain pipeline: no reward model is trained


def test_a_new_scoring_role_is_one_registry_row(monkeypatch):
    """The extension point the reward model uses: a row with `scores=True` and a group with score/weighted is
    asked by every loop's score phase - here a length judge no loop or controller code names."""
    from posttrain.rl.controller import Controller
    from posttrain.rl.roles import registry
    from posttrain.rl.types import Scores
    from tests.rl_fakes import NullTracker, fake_sampler, make_fake_groups

    class LengthJudge:
        role = "judge"

        def identities(self):
            return []

        def score(self, t):
            return Scores(policy_version=t.policy_version, names=["judge"], sources=["length"],
                          scores=[[float(len(r)) for r in t.response_ids]], compute_s=0.0)

        def weighted(self, s):
            return [-0.1 * x for x in s.scores[0]]

    monkeypatch.setitem(registry.ROLES, "judge", replace(registry.ROLES["reward_model"], name="judge"))
    cfg = RLConfig(steps=1, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=3, checkpoint_every=0)
    groups = make_fake_groups(cfg)
    groups["judge"] = LengthJudge()
    (m,) = Controller(cfg, groups, fake_sampler(cfg), NullTracker(), None).run(1)
    assert m.extra["reward/judge_mean"] == m.response_len_mean > 0
    assert abs(m.reward_mean - (m.extra["reward/fn_mean"] - 0.1 * m.response_len_mean)) < 1e-6
    assert "judge" in m.phase_s
