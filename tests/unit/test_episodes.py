"""Multi-turn episodes (posttrain.envs.episodes), token-exact: the sampled ids are kept as sampled, the
environment's turns are appended as the ids of the model's own template, the model continues from exactly the
ids it will be trained on, and the mask says which tokens the policy sampled. A template that cannot keep
an episode's tokens is refused, naming the problem. With the shared tiny SFT model and a retry game (a real
multi-turn episode), the log-probs recorded while sampling equal the teacher-forced log-probs of the whole
episode at every sampled token."""

from __future__ import annotations

import pytest
import torch

from posttrain.envs.builtin import Calculator
from posttrain.envs.calls import render_call
from posttrain.envs.episodes import EpisodeLayout, EpisodeLimits, LocalEnv, run_episodes
from posttrain.envs.host import EnvironmentHost
from posttrain.envs.tools import ToolError
from posttrain.models.generate import Generation
from tests.integration.retry_env import Retry

TEXTS = ["What is 123 * 456?", render_call("calculate", {"expression": "123 * 456"}), "The answer is 56088.",
         "<tool_response>\n56088\n</tool_response>", "Guess the number between 1 and 32. higher lower correct"] * 20


def in_process(env_cls) -> LocalEnv:
    """The episodes' environment over an in-process host (the tool process itself is tested in test_envs.py)."""
    return LocalEnv(EnvironmentHost(env_cls))


class Script:
    """An engine that 'samples' the given turn texts in order (every context the same turn), each ending at
    the stop id, with log-prob -1 per token; it records the contexts it was asked to continue."""

    def __init__(self, tokenizer, stop: int, turns: list[str]):
        self.tokenizer, self.stop, self.turns, self.contexts = tokenizer, stop, turns, []

    def generate(self, prompts, *, n, temperature, max_new_tokens, seed, top_p=1.0, top_k=0):
        t = len(self.contexts)
        self.contexts.append([list(p) for p in prompts])
        ids = self.tokenizer(self.turns[t], add_special_tokens=False)["input_ids"] + [self.stop]
        out = ids[:max_new_tokens]
        return [Generation(prompt_ids=list(p), response_ids=out, logprobs=[-1.0] * len(out),
                           finished=len(out) == len(ids)) for p in prompts]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from posttrain.models.io import load_tokenizer
    from posttrain.models.tokenizer import train_tokenizer

    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(TEXTS, 300, d)
    return load_tokenizer(d)


def test_a_tool_episode_keeps_the_sampled_ids_and_appends_the_templates_ids(tok):
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    call = render_call("calculate", {"expression": "123 * 456"})
    engine = Script(tok, stop, [call, "The answer is 56088."])
    messages = [[{"role": "user", "content": "What is 123 * 456?"}]]
    (ep,) = run_episodes(engine, layout, in_process(Calculator), [{}], messages, n=1,
                         limits=EpisodeLimits(max_new_tokens=64), temperature=1.0, seed=0)
    t1 = tok(call, add_special_tokens=False)["input_ids"] + [stop]
    t2 = tok("The answer is 56088.", add_special_tokens=False)["input_ids"] + [stop]
    env = ep.response_ids[len(t1):len(ep.response_ids) - len(t2)]
    assert ep.response_ids == t1 + env + t2 and ep.sampled == [1] * len(t1) + [0] * len(env) + [1] * len(t2)
    assert ep.logprobs == [-1.0] * len(t1) + [0.0] * len(env) + [-1.0] * len(t2)
    # the second turn continued from exactly the ids the episode holds (no re-tokenizing)
    assert engine.contexts[1] == [ep.prompt_ids + t1 + env]
    # and those ids are the template's own rendering of the conversation
    full = tok.apply_chat_template(
        [{"role": "system", "content": tok.decode(ep.prompt_ids).split("<|system|>\n")[1].split("<|end|>")[0]},
         messages[0][0], {"role": "assistant", "content": call},
         {"role": "user", "content": "<tool_response>\n56088\n</tool_response>"},
         {"role": "assistant", "content": "The answer is 56088."}], tokenize=False)
    assert tok.decode(ep.prompt_ids + ep.response_ids) + "\n" == full  # the template's "\n" after the last stop
    assert ep.finished and ep.turns == 2 and ep.tool_calls == 1 and ep.final_text == "The answer is 56088."
    assert [w for w, _ in ep.transcript] == ["policy", "tool", "policy"] and ep.transcript[1][1] == "56088"


def test_bad_calls_are_answered_and_counted_and_limits_end_episodes(tok):
    stop = tok.eos_token_id
    layout = EpisodeLayout.check(tok, [stop])
    bad = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 ** 99"}}</tool_call>'
    engine = Script(tok, stop, [bad, "<tool_call>oops</tool_call>", "no"])
    (ep,) = run_episodes(engine, layout, in_process(Calculator), [{}], [[{"role": "user", "content": "q"}]], n=1,
                         limits=EpisodeLimits(max_turns=2, max_new_tokens=64), temperature=1.0, seed=0)
    assert ep.tool_failures == {"raised": 1, "bad_call": 1} and ep.turns == 2 and not ep.finished
    assert "ValueError: only integers" in ep.transcript[1][1] and "not valid JSON" in ep.transcript[3][1]
    # one environment answer (after turn 1) between the two sampled turns; none after the last turn
    runs = [k for k, s in enumerate(ep.sampled) if k and s != ep.sampled[k - 1]]
    assert len(runs) == 2 and ep.sampled[0] == 1 and ep.sampled[-1] == 1 and ep.response_ids[-1] == stop
    # a long tool answer is cut to max_env_tokens with a visible marker
    assert layout.cut("9" * 500, 8).endswith("[... 492 more tokens cut]")
    # max_total_tokens: the episode ends unfinished where the tokens run out
    engine = Script(tok, stop, [render_call("calculate", {"expression": "1 + 1"})] * 3)
    (ep,) = run_episodes(engine, layout, in_process(Calculator), [{}], [[{"role": "user", "content": "q"}]], n=1,
                         limits=EpisodeLimits(max_turns=3, max_new_tokens=64, max_total_tokens=60), temperature=1.0, seed=0)
    assert len(ep.response_ids) <= 60 and not ep.finished


def test_templates_that_cannot_keep_an_episodes_tokens_are_refused(tok):
    stop = tok.eos_token_id
    forgetful = type(tok).from_pretrained(tok.name_or_path)
    forgetful.chat_template = ("{% for m in messages[-2:] %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
                               "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
    with pytest.raises(ToolError, match="does not render an episode's earlier turns as a prefix"):
        EpisodeLayout.check(forgetful, [stop])
    unended = type(tok).from_pretrained(tok.name_or_path)
    unended.chat_template = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}"
                             "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
    with pytest.raises(ToolError, match=r"ends an assistant turn with '\\n', which starts with none"):
        EpisodeLayout.check(unended, [stop])


def test_a_real_model_plays_several_turns_and_its_sampling_logprobs_are_the_teacher_forced_ones(tiny_sft_model):
    from posttrain.models.generate import forward_response_logits, sampling_logprobs
    from posttrain.models.io import load_model
    from posttrain.rl.roles.rollout import TransformersEngine

    engine = TransformersEngine(str(tiny_sft_model["model_dir"]), device="cpu")
    tok = engine.tokenizer
    layout = EpisodeLayout.check(tok, engine.eos_ids)
    # The prompt is the model's own task (it answers "46" and stops: an in-distribution first turn on any CPU);
    # the game wants words from two of the rows (never written: the model writes digits), so those are told "no" and the model plays on.
    rows = [{"answer": a} for a in ("46", "none", "never")]
    messages = [[{"role": "user", "content": "12+34="}]] * 3
    eps = run_episodes(engine, layout, in_process(Retry), rows, messages, n=2,
                       limits=EpisodeLimits(max_turns=3, max_new_tokens=12, max_total_tokens=200),
                       temperature=1.0, seed=3)
    assert len(eps) == 6 and all(e.turns >= 2 and 0 in e.sampled for e in eps[2:])
    assert all(e.env_reward == 0.0 for e in eps[2:])  # never right: the game's reward at the end is 0
    assert all(e.env_reward in (0.0, 1.0, 0.5, 1 / 3) and (e.env_reward == 0 or e.finished) for e in eps[:2])
    model = load_model(str(tiny_sft_model["model_dir"]), device="cpu")
    model.eval()
    with torch.no_grad():
        logits, targets, _ = forward_response_logits(model, [e.prompt_ids for e in eps],
                                                        [e.response_ids for e in eps], tok.pad_token_id)
        teacher = sampling_logprobs(logits, targets, 1.0)
    for i, e in enumerate(eps):
        for t, (s, lp) in enumerate(zip(e.sampled, e.logprobs)):
            if s:
                assert abs(float(teacher[i, t]) - lp) < 1e-4, (i, t)


def test_the_rl_stage_checks_its_episodes_before_any_actor_and_keys_on_their_source(tmp_path):
    """envs.plan.check_episodes (stages.rl, before Ray): the environment imports in a short-lived child and
    its source hash is returned for the cache key; a bad import path or a template that cannot keep an
    episode's tokens is refused, naming it."""
    from posttrain.config import RLConfig
    from posttrain.envs.plan import check_episodes
    from posttrain.models.tokenizer import train_tokenizer

    folder = tmp_path / "tok"
    train_tokenizer(TEXTS, 300, folder)
    assert check_episodes(RLConfig(), str(folder)) == {}
    ident = check_episodes(RLConfig(environment="posttrain.envs.builtin:Calculator"), str(folder))
    assert list(ident) == ["posttrain.envs.builtin:Calculator"] and len(ident["posttrain.envs.builtin:Calculator"]) == 64
    with pytest.raises(ToolError, match="rl.environment"):
        check_episodes(RLConfig(environment="posttrain.envs.builtin:NoSuchGame"), str(folder))
    (folder / "chat_template.jinja").write_text(  # a template that renders only the last turn
        "{% for m in messages[-1:] %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ToolError, match=f"the chat template of {folder} does not render"):
        check_episodes(RLConfig(environment="posttrain.envs.builtin:Calculator"), str(folder))
