"""The built-in environment tasks `calculator` and `guess_number` (posttrain.envs.tasks) and agent_pipeline's
plan: the problems are distinct and answered right, the sloppy teacher skips the tool (or steps instead of
halving) only where documented, and a demonstration's tokens are exactly the tokens of the episode in which the
model samples the demonstration's turns - so SFT trains on what RL and evaluation then sample. Data prep makes
the tasks only through the data stage's makers (guess_number with its own eval games), and agent_pipeline
refuses a recipe without an environment."""

from __future__ import annotations

from dataclasses import replace

import pytest

from posttrain.config import ConfigError, DataConfig
from posttrain.data.chat import tokenize_for_training
from posttrain.data.examples import episode_prompt, prompt_messages, read_examples
from posttrain.data.prepare import prepare_dataset
from posttrain.data.validation import DataValidationError
from posttrain.data.verifiers import score
from posttrain.envs.builtin import Calculator, GuessNumber, evaluate
from posttrain.envs.calls import parse_call
from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits, run_episodes
from posttrain.envs.tasks import GUESS_TURNS, TASKS, calculator, estimate, guess_game, guess_number
from posttrain.envs.tools import environment_tools
from posttrain.models.io import load_tokenizer
from posttrain.models.tokenizer import train_tokenizer
from posttrain.recipes import resolve
from tests.unit.test_episodes import Script, in_process


def _texts(examples):
    return [m["content"] for ex in examples for m in ex["messages"]]


def test_calculator_problems_demonstrations_and_the_sloppy_teacher():
    examples = calculator(3000, 3, seed=0, demo_error_rate=0.6)
    specs = environment_tools(Calculator)
    assert len({ex["messages"][1]["content"] for ex in examples}) == 3000  # distinct problems
    sloppy_by_lead = {True: [], False: []}
    for ex in examples:
        a, b = (int(x) for x in ex["messages"][1]["content"].rstrip("=").split("*"))
        assert 100 <= a <= 999 and 100 <= b <= 999 and ex["answer"] == str(a * b) and ex["task"] == "exact"
        turns = ex["messages"][2:]
        sloppy = len(turns) == 1
        sloppy_by_lead[a >= 500].append(sloppy)
        if sloppy:  # answered in its head: the estimate, which the verifier scores as wrong unless it is exact
            assert turns[0]["content"] == str(estimate(a, b)) == str(a // 100 * 100 * (b // 100 * 100))
            assert score("exact", turns[0]["content"], ex["answer"]) == float(estimate(a, b) == a * b)
        else:  # a well-formed call of the problem, its true result, the answer copied from it
            call = parse_call(turns[0]["content"], specs)
            assert call.name == "calculate" and evaluate(call.arguments["expression"]) == a * b
            assert turns[1] == {"role": "user", "content": f"<tool_response>\n{a * b}\n</tool_response>"}
            assert score("exact", turns[2]["content"], ex["answer"]) == 1.0
    assert not any(sloppy_by_lead[False])  # only first factors starting with 5-9 are answered in the head
    assert 0.55 < sum(sloppy_by_lead[True]) / len(sloppy_by_lead[True]) < 0.65
    # the problems do not depend on the teacher's error rate
    clean = calculator(3000, 3, seed=0, demo_error_rate=0.0)
    assert [ex["messages"][:2] for ex in clean] == [ex["messages"][:2] for ex in examples]
    assert all(len(ex["messages"]) == 5 for ex in clean)
    # the lazy teacher: the same problems, the tool skipped on about the same share of EVERY problem
    lazy = calculator(3000, 3, seed=0, demo_error_rate=0.6, lazy=True)
    assert [ex["messages"][:2] for ex in lazy] == [ex["messages"][:2] for ex in examples]
    for low in (True, False):
        share = [len(ex["messages"]) == 3 for ex in lazy if (int(ex["messages"][1]["content"][0]) < 5) == low]
        assert 0.55 < sum(share) / len(share) < 0.65
    assert TASKS["calculator_lazy"](DataConfig(task="calculator_lazy", num_examples=50, num_digits=3, seed=0,
                                               demo_error_rate=0.6)) == calculator(50, 3, 0, 0.6, lazy=True)
    # an episode's prompt is the system turn with the tools and the question; SFT's prompt is longer
    assert episode_prompt(clean[0]) == clean[0]["messages"][:2] != prompt_messages(clean[0])


def test_a_demonstration_is_the_episode_the_model_plays_when_it_samples_its_turns(tmp_path):
    examples = calculator(200, 3, seed=1, demo_error_rate=0.5)
    train_tokenizer(_texts(examples), 768, tmp_path, split_words=False)
    tok = load_tokenizer(tmp_path)
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    for ex in (next(e for e in examples if len(e["messages"]) == 5), next(e for e in examples if len(e["messages"]) == 3)):
        ids, loss_mask = tokenize_for_training(tok, ex["messages"], 10_000)
        said = [m["content"] for m in ex["messages"][2:] if m["role"] == "assistant"]
        engine = Script(tok, stop, said)
        (ep,) = run_episodes(engine, layout, in_process(Calculator), [{}], [episode_prompt(ex)], n=1,
                             limits=EpisodeLimits(max_turns=3, max_new_tokens=64, max_total_tokens=256),
                             temperature=1.0, seed=0)
        # the episode's ids are the demonstration's (up to the template's newline after the last turn), the
        # tools block shown once, and SFT's loss falls on exactly the tokens the policy sampled - and on the
        # template's newline after each end-of-turn token, which no episode samples (a turn ends at the stop)
        assert ep.prompt_ids + ep.response_ids == ids[:-1]
        sampled_by_sft = [int(m and ids[k - 1] != stop) for k, m in enumerate(loss_mask)]
        assert ep.sampled == sampled_by_sft[len(ep.prompt_ids):-1] and 1 in ep.sampled
        assert ep.finished and ep.turns == len(said) and ep.tool_calls == len(said) - 1
        assert score("exact", ep.final_text, ex["answer"]) == float(len(said) == 2)
    # merging across words makes the tools block a few tokens (the tiny model's sequences stay short)
    split = tmp_path / "split"
    train_tokenizer(_texts(examples), 768, split)
    n_merged, n_split = (len(tokenize_for_training(load_tokenizer(d), examples[0]["messages"], 10_000)[0])
                         for d in (tmp_path, split))
    assert n_merged < n_split / 2


@pytest.mark.real_model
def test_smollm2s_calculator_demonstration_is_the_episode_it_plays(smollm2_dir):
    """small_instruct_calculator_cpu: SmolLM2's own chat template (no tool turns: the documented format in plain
    turns) renders a demonstration as exactly the episode's tokens, so its SFT trains on what its RL samples."""
    tok = load_tokenizer(smollm2_dir)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    layout = EpisodeLayout.check(tok, [stop])
    examples = calculator(50, 3, seed=2, demo_error_rate=0.5, lazy=True)
    for ex in (next(e for e in examples if len(e["messages"]) == 5), next(e for e in examples if len(e["messages"]) == 3)):
        ids, _ = tokenize_for_training(tok, ex["messages"], 10_000)
        said = [m["content"] for m in ex["messages"][2:] if m["role"] == "assistant"]
        (ep,) = run_episodes(Script(tok, stop, said), layout, in_process(Calculator), [{}], [episode_prompt(ex)], n=1,
                             limits=EpisodeLimits(max_turns=3, max_new_tokens=40, max_total_tokens=96),
                             temperature=1.0, seed=0)
        assert ep.prompt_ids + ep.response_ids == ids[:-1]  # the template's newline after the last turn aside
        assert ep.finished and ep.turns == len(said) and score("exact", ep.final_text, ex["answer"]) == float(len(said) == 2)
        assert len(ep.prompt_ids) + len(ep.response_ids) <= resolve("small_instruct_calculator_cpu").model.max_seq_len


def test_the_calculator_task_is_made_by_the_data_stages_makers_only(tmp_path):
    cfg = DataConfig(task="calculator", num_examples=300, eval_size=50, num_digits=3, demo_error_rate=0.6)
    with pytest.raises(DataValidationError, match="data.task: 'calculator' is not made here"):
        prepare_dataset(cfg, tmp_path / "bare")
    assert not (tmp_path / "bare").exists()
    info = prepare_dataset(cfg, tmp_path / "ds", tasks=TASKS)
    assert (info.num_train, info.num_eval) == (250, 50)
    train, held = read_examples(tmp_path / "ds", "train"), read_examples(tmp_path / "ds", "eval")
    assert not {ex["messages"][1]["content"] for ex in held} & {ex["messages"][1]["content"] for ex in train}
    # a held-out row is the problem (tools and question): evaluated without the environment, a model is not
    # shown the tool's result
    assert all([m["role"] for m in ex["messages"]] == ["system", "user"] for ex in held)
    assert {len(ex["messages"]) for ex in train} == {3, 5}


def test_agent_pipeline_refuses_a_recipe_without_an_environment():
    cfg = resolve("tiny_calculator", workflow="agent_pipeline")
    assert cfg.rl.environment == cfg.eval.environment == "posttrain.envs.builtin:Calculator"
    with pytest.raises(ConfigError, match=r"rl.environment: agent_pipeline trains and evaluates in an environment"):
        resolve("tiny_cpu", workflow="agent_pipeline")
    plain_eval = {"eval": {"environment": "", "episode": {"max_turns": 4, "max_env_tokens": 64,
                                                          "max_total_tokens": 256}}}
    with pytest.raises(ConfigError, match=r"eval.environment: agent_pipeline"):
        resolve("tiny_calculator", plain_eval, workflow="agent_pipeline")
    resolve("tiny_calculator", plain_eval, workflow="pipeline")  # other workflows allow it
    with pytest.raises(ConfigError, match="data.task"):
        resolve("tiny_cpu", {"data": {"task": "calc"}})


def test_guess_number_games_the_careful_and_the_sloppy_guesser():
    careful = {s: guess_game(s, sloppy=False) for s in range(1, 33)}
    sloppy = {s: guess_game(s, sloppy=True) for s in range(1, 33)}
    assert all(g[0] == 16 for g in [*careful.values(), *sloppy.values()])  # the first guess is shared
    assert all(g[-1] == s for s, g in careful.items()) and max(len(g) for g in careful.values()) == 6
    assert careful[32] == [16, 24, 28, 30, 31, 32] and careful[1] == [16, 8, 4, 2, 1]
    assert sloppy[17] == [16, 17] and sloppy[9] == [16, 15, 14, 13, 12, 11, 10]  # 7 guesses, unsolved
    assert [s for s, g in sloppy.items() if g[-1] == s] == list(range(10, 23))  # 13 of 32 within 7 guesses
    split = guess_number(2000, 40, seed=0, demo_error_rate=0.6)
    n_sloppy = 0
    for ex in split.train:
        secret, msgs = ex["columns"]["secret"], ex["messages"]
        guesses = [int(m["content"]) for m in msgs if m["role"] == "assistant"]
        assert ex["answer"] == str(secret) and guesses in (careful[secret], sloppy[secret])
        assert ex["columns"] == {"low": 1, "high": 32, "max_turns": GUESS_TURNS, "secret": secret}
        n_sloppy += guesses != careful[secret]
        # every guess but a solving one is answered, as the game answers it
        said = [m["content"] for m in msgs[2::2]]
        assert said == ["higher" if g < secret else "lower" for g in guesses[:len(said)]]
    assert 0.5 < n_sloppy / len(split.train) < 0.65  # 0.6 of the games, less those a step solves at once (16)
    # the eval games: every secret of the range in turn, each opening with the game's first observation
    assert [ex["columns"]["secret"] for ex in split.eval] == [*range(1, 33), *range(1, 9)]
    assert all(ex["messages"] == split.train[0]["messages"][:1] for ex in split.eval)
    assert split.eval[0]["messages"][0]["content"] == GuessNumber().reset(1, 32, 5, GUESS_TURNS)


def test_a_guess_number_demonstration_is_the_game_the_model_plays(tmp_path):
    split = guess_number(300, 32, seed=1, demo_error_rate=0.5)
    train_tokenizer(_texts(split.train), 300, tmp_path, split_words=False)
    tok = load_tokenizer(tmp_path)
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    for ex in (next(e for e in split.train if len(e["messages"]) == 2 * GUESS_TURNS),  # an unsolved sloppy game
               next(e for e in split.train if e["messages"][-1]["content"] == e["answer"] and len(e["messages"]) > 4)):
        ids, loss_mask = tokenize_for_training(tok, ex["messages"], 10_000)
        said = [m["content"] for m in ex["messages"] if m["role"] == "assistant"]
        (ep,) = run_episodes(Script(tok, stop, said), layout, in_process(GuessNumber), [ex["columns"]],
                             [episode_prompt(ex)], n=1, temperature=1.0, seed=0,
                             limits=EpisodeLimits(max_turns=GUESS_TURNS, max_new_tokens=6, max_total_tokens=256))
        # the game's first observation IS the demonstration's user turn: shown once, not appended again
        assert ep.prompt_ids + ep.response_ids == ids[:-1]
        sampled_by_sft = [int(m and ids[k - 1] != stop) for k, m in enumerate(loss_mask)]
        assert ep.sampled == sampled_by_sft[len(ep.prompt_ids):-1]
        assert ep.finished and ep.turns == len(said) and ep.tool_calls == 0
        assert score("exact", ep.final_text, ex["answer"]) == float(said[-1] == ex["answer"])
    # the whole game fits the recipe's episode budget
    assert len(ep.response_ids) <= resolve("tiny_guess_number").rl.episode.max_total_tokens


def test_guess_number_data_prep_and_its_plan(tmp_path):
    cfg = resolve("tiny_guess_number").data
    info = prepare_dataset(replace(cfg, num_examples=500), tmp_path / "ds", tasks=TASKS)
    assert (info.num_train, info.num_eval, info.num_duplicates) == (500, 32, 0) and info.eval_from_files
    held = read_examples(tmp_path / "ds", "eval")
    assert sorted(int(ex["answer"]) for ex in held) == list(range(1, 33))
    assert all(len(ex["messages"]) == 1 and ex["columns"]["secret"] == int(ex["answer"]) for ex in held)
    with pytest.raises(ConfigError, match="data.dedupe: must be false with data.task guess_number"):
        resolve("tiny_guess_number", {"data": {"dedupe": True}})
    cfg = resolve("tiny_guess_number", workflow="agent_pipeline")
    assert cfg.rl.environment == cfg.eval.environment == "posttrain.envs.builtin:GuessNumber"
