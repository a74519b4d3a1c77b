"""The pass-rate curriculum (data.pass_rate.refresh_every, posttrain.rl.curriculum) driven by the controller over
the in-process fake groups (tests/rl_fakes.py: a real bigram LM that learns by real GRPO steps): a refresh
re-measures every pool prompt with the policy's current weights, keeps exactly those neither never nor always
solved, logs the kept fraction every step, and a resumed run refreshes and draws exactly as an uninterrupted one."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from posttrain.config import RLConfig
from posttrain.data.examples import write_dataset
from posttrain.rl.controller import Controller
from posttrain.rl.curriculum import Curriculum
from posttrain.rl.state import Checkpointer, PromptSampler
from tests.rl_fakes import (
    FakeRewardGroup,
    FakeRolloutGroup,
    FakeTokenizer,
    NullTracker,
    fake_examples,
    make_fake_groups,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py

CFG = RLConfig(steps=6, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=4, lr=0.3, inner_epochs=2,
               kl_coef=0.0, checkpoint_every=2, temperature=1.0)
POOL = 24
START_RATES = [(0.0, 0.25, 1.0, 0.5)[i % 4] for i in range(POOL)]  # what a selection recorded for the start model


def _curriculum(tmp_path, every: int = 2) -> Curriculum:
    """A pass-rate selection's dataset folder as posttrain.eval.pass_rate writes it, read back."""
    pool = fake_examples(POOL, seed=1)
    folder = tmp_path / "selected"
    if not folder.exists():
        write_dataset(folder, [ex for ex, r in zip(pool, START_RATES) if 0 < r < 1], [],
                      {"pass_rate": {"samples_per_prompt": 4, "min_rate": 0.0, "max_rate": 1.0,
                                     "refresh_every": every, "rates": [[i, r] for i, r in enumerate(START_RATES)]}},
                      more={"pool": pool})
    return Curriculum.read(folder)


def _controller(cur: Curriculum, checkpointer=None) -> Controller:
    sampler = PromptSampler(cur.pool, FakeTokenizer(), prompts_per_step=CFG.prompts_per_step, seed=CFG.seed)
    sampler.set_active(cur.start_rows(sampler))
    return Controller(CFG, make_fake_groups(CFG), sampler, NullTracker(), checkpointer, cur)


def _rates(weights: dict, sampler: PromptSampler, cur: Curriculum, *, version: int, seed: int) -> list[float]:
    """Each pool prompt's pass rate under `weights`, sampled apart from the controller with the refresh's seeds."""
    rollout, rates = FakeRolloutGroup(weights), []
    chunk = CFG.prompts_per_step * CFG.samples_per_prompt // cur.samples_per_prompt
    for start in range(0, POOL, chunk):
        traj = rollout.generate(sampler.batch_of(list(range(start, min(start + chunk, POOL))), version),
                                n=cur.samples_per_prompt, temperature=CFG.temperature,
                                max_new_tokens=CFG.max_new_tokens, seed=seed + start)
        scores = FakeRewardGroup().score(traj).scores
        rates += [sum(scores[g * cur.samples_per_prompt:(g + 1) * cur.samples_per_prompt]) / cur.samples_per_prompt
                  for g in range(len(traj.prompt_ids) // cur.samples_per_prompt)]
    return rates


def test_a_refresh_keeps_the_prompts_the_current_policy_solves_sometimes(tmp_path):
    cur = _curriculum(tmp_path)
    assert cur.every == 2 and cur.pool == [{**ex, "columns": {}} for ex in fake_examples(POOL, seed=1)]
    c = _controller(cur)
    assert c.sampler.active == [i for i, r in enumerate(START_RATES) if 0 < r < 1]  # the start model's selection
    c.run(2)
    weights = {k: v.clone() for k, v in c.groups["rollout"].model.state_dict().items()}  # version 2's
    history = c.run(3)  # step 3 starts with the refresh (2 steps done)
    rng = random.Random(CFG.seed)
    rng.randrange(2**31), rng.randrange(2**31)  # the seeds of steps 1 and 2
    rates = _rates(weights, c.sampler, cur, version=2, seed=rng.randrange(2**31))
    kept = [i for i, r in enumerate(rates) if 0 < r < 1]
    assert 0.0 in rates and 0 < len(kept) < POOL  # prompts the policy never solves exist and are left out
    assert c.sampler.active == kept  # ... exactly those in the band under the policy's own samples, none else
    assert all(i in kept for i in c.sampler.next_batch(policy_version=3).example_ids)
    assert [h.extra["pass_rate/kept_fraction"] for h in history] == [0.5, 0.5, len(kept) / POOL]
    assert "pass_rate/in_band_fraction" not in history[1].extra and "pass_rate" not in history[1].phase_s
    assert history[2].extra["pass_rate/in_band_fraction"] == len(kept) / POOL and history[2].phase_s["pass_rate"] > 0
    assert "pass_rate" in history[2].compute_s and "pass_rate" not in history[1].compute_s
    assert history[2].extra["pass_rate/never_fraction"] == sum(r == 0 for r in rates) / POOL
    assert history[2].extra["pass_rate/mean_rate"] == pytest.approx(sum(rates) / POOL)


def test_a_resumed_run_refreshes_and_draws_as_the_uninterrupted_one(tmp_path):
    """Refreshes at the starts of steps 3 and 5; the run is killed after step 4's checkpoint (which holds the
    prompts step 3's refresh kept) and resumed: same rewards every step, same prompts kept, same weights."""
    cur = _curriculum(tmp_path)
    full = _controller(cur)
    whole = full.run(6)

    def checkpointer():
        return Checkpointer(state_dir=tmp_path / "state", store_root=str(tmp_path / "store"), run_id="t",
                            parents=[], config={}, extra={"reward": "fake"})

    _controller(cur, checkpointer()).run(4)
    state = json.loads((tmp_path / "state" / "step-000004" / "controller.json").read_text())["sampler"]
    assert state["generation"] == 2 and state["base"] == 8  # the start selection, then step 3's refresh
    resumed = _controller(cur, checkpointer())
    hist = resumed.run(6)
    assert [m.step for m in hist] == [1, 2, 3, 4, 5, 6]
    assert [m.reward_mean for m in hist] == [m.reward_mean for m in whole]
    assert [m.extra["pass_rate/kept_fraction"] for m in hist] == [m.extra["pass_rate/kept_fraction"] for m in whole]
    assert resumed.sampler.active == full.sampler.active and resumed.sampler.generation == 3
    assert resumed.groups["policy"].weights().checksum == full.groups["policy"].weights().checksum


def test_a_refresh_with_no_prompt_in_the_band_keeps_the_prompts_before(tmp_path, capsys):
    cur = replace(_curriculum(tmp_path, every=1), max_rate=0.01)  # no rate lies strictly inside (0, 0.01)
    assert cur.start_rows(SimpleNamespace(rows=list(range(POOL)))) == []
    c = Controller(CFG, make_fake_groups(CFG), PromptSampler(cur.pool, FakeTokenizer(), prompts_per_step=4, seed=0),
                   NullTracker(), None, cur)
    c.sampler.set_active([1, 3, 5])
    c.run(2)  # step 2 starts with a refresh
    assert "no prompt's pass rate lies strictly between 0.0 and 0.01" in capsys.readouterr().out
    assert c.sampler.active == [1, 3, 5] and c.history[1].extra["pass_rate/in_band_fraction"] == 0.0


def test_a_curriculum_is_refused_with_rollout_ahead(tmp_path):
    with pytest.raises(ValueError, match="refresh_every: not with rl.max_staleness"):
        Controller(replace(CFG, max_staleness=1), make_fake_groups(CFG), PromptSampler(
            fake_examples(8), FakeTokenizer(), prompts_per_step=4, seed=0), NullTracker(), None, _curriculum(tmp_path))
