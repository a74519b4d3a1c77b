"""Evaluation in an environment (eval.environment; posttrain.eval.episodes), with the shared tiny SFT model and the
retry game (tests/integration/retry_env.py: a wrong answer is told "no" and tried again) imported by import path
in its sandboxed tool process: each problem is an episode whose last sampled turn is scored; the stage keys its
cache on the game's source and the eval page shows episodes turn by turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.config import EpisodeConfig, EvalConfig, RewardConfig

GAME_DIR = Path(__file__).parents[1] / "integration"
EPISODE = EpisodeConfig(python_path=[str(GAME_DIR)], max_turns=3, max_total_tokens=60)


@pytest.mark.timeout(900)
def test_each_problem_is_an_episode_whose_last_turn_is_scored(tiny_sft_model):
    from posttrain.eval import evaluate

    model, data = tiny_sft_model["model_dir"], tiny_sft_model["dataset_dir"]
    plain = evaluate(model, data, EvalConfig(num_problems=60, max_new_tokens=8))
    game = evaluate(model, data, EvalConfig(num_problems=60, k=2, max_new_tokens=8, environment="retry_env:Retry",
                                            episode=EPISODE))
    assert plain.episodes is None and "episode" not in plain.problems[0]
    assert 0 < plain.greedy_accuracy < 1, plain.samples[:3]  # the fixture model gets some right, some wrong
    # The first turn is the plain greedy completion (same prompt ids, greedy): a right one ends the episode
    # at once; a wrong one ending its turn is told "no" and the model tries again - so the game only adds.
    for p, g in zip(plain.problems, game.problems):
        assert g["episode"][0] == ["policy", p["greedy"]]
        if p["correct"]:
            assert g["correct"] and len(g["episode"]) == 1
    retried = [g for g in game.problems if len(g["episode"]) > 1]
    assert retried and all(g["episode"][1] == ["env", "no"] for g in retried)
    assert all(g["greedy"] == g["episode"][-1][1] for g in game.problems if g["episode"][-1][0] == "policy")
    assert game.greedy_accuracy >= plain.greedy_accuracy and game.num_problems == 60 and game.reward_calls == 180
    e = game.episodes
    assert e["environment"] == "retry_env:Retry" and e["episodes"] == 180 and e["tool_calls_mean"] == 0
    assert 1 < e["turns_mean"] <= 3 and e["tool_failures"] == {} and 0 <= e["env_reward_mean"] <= 1
    assert 0 < game.mean_response_tokens < EPISODE.max_total_tokens


@pytest.mark.timeout(900)
def test_the_eval_stage_keys_on_the_environments_source_and_the_page_shows_episodes(tiny_sft_model, tmp_path):
    from posttrain import stages
    from posttrain.artifacts import ArtifactStore
    from posttrain.report import render_page

    store = ArtifactStore(str(tmp_path / "home"))
    data = store.put("dataset", "addition", tiny_sft_model["dataset_dir"], run_id="t", parents=[], config={})
    model = store.put("model", "sft", tiny_sft_model["model_dir"], run_id="t", parents=[data.id], config={})
    game_dir = tmp_path / "game"
    game_dir.mkdir()
    (game_dir / "retry_env.py").write_text((GAME_DIR / "retry_env.py").read_text())
    cfg = EvalConfig(num_problems=12, max_new_tokens=8, environment="retry_env:Retry",
                     episode=EpisodeConfig(python_path=[str(game_dir)], max_turns=3, max_total_tokens=60))
    first = stages.evaluate(cfg, RewardConfig(), model=model, dataset=data, run_id="t", store=store)
    again = stages.evaluate(cfg, RewardConfig(), model=model, dataset=data, run_id="t", store=store)
    assert again.report.id == first.report.id  # cached
    m = store.manifest(first.report.id)
    assert set(m.config["environment"]) == {"retry_env:Retry"} and m.metrics["env/turns_mean"] > 1
    html = render_page(store, first.report.id)
    assert "Episodes" in html and "turns per episode" in html and "<td>env</td>" in html
    # the game's code changed: evaluated again, not returned from the cache
    (game_dir / "retry_env.py").write_text((GAME_DIR / "retry_env.py").read_text() + "\n# edited\n")
    assert stages.evaluate(cfg, RewardConfig(), model=model, dataset=data, run_id="t",
                           store=store).report.id != first.report.id
    with pytest.raises(Exception, match=r"retry_env:Nope"):  # refused before anything is generated
        stages.evaluate(EvalConfig(num_problems=12, environment="retry_env:Nope", episode=cfg.episode),
                        RewardConfig(), model=model, dataset=data, run_id="t", store=store)
