"""TRL's GRPOTrainer with the calculator tool on the same work as the project's agentic GRPO: the TRL side of
bench/agent_vs_trl.py, run inside the throwaway TRL environment it installs (as bench/rl_trl.py is):

    PYTHONPATH=<cache>/trl-1.16.0 .venv/bin/python bench/agent_trl.py IN.json OUT.json

IN.json: {model_dir, out_dir, threads, seed, rl: the project's RLConfig as a dict, prompts: [{messages, ids,
answer, task}] - the project's PromptSampler order (episode prompts), steps x prompts_per_step rows}. OUT.json:
{wall_s (train() only), generated_tokens (tokens the policy sampled: TRL's tool mask summed, tool results left
out), tool_calls, tool_failures, step_s, reward_mean per step, versions}. The final model is saved with the
project's `save_model` to out_dir/model.

What makes both trainers see the same tokens. TRL renders tools, calls and results through the tokenizer's chat
template (`tools=`, `tool_calls`, `tool` turns) and parses calls with a response template; the tiny model's
template has neither, and TRL knows no template with the project's documented tool format
(posttrain.envs.calls). So this script gives the tokenizer TOOL_TEMPLATE - the tiny model's own turn layout
(`<|role|>\\n...<|end|>\\n`) rendering `tools` as the project's tools block, an assistant's `tool_calls` as
`<tool_call>{json}</tool_call>` and a `tool` turn as the project's `<tool_response>` user turn - and
RESPONSE_TEMPLATE to parse calls back. Each prompt is checked to tokenize to exactly the project's episode prompt
ids; TRL appends a tool result as the template's text after the finished turn (`_get_tool_suffix_ids`), the same
text the project's EpisodeLayout.env_ids appends (checked on the first result here).

Settings mapped beyond bench/rl_trl.py's (one generation batch = one optimizer step, the same optimizer, loss,
clip and advantage settings): max_tool_calling_iterations = rl.episode.max_turns - 1 (a turn without a call ends
the episode, as in the project); max_completion_length = rl.episode.max_total_tokens (TRL's budget for the whole
episode, tool results included, as the project's); the reward is the project's verifier on the last assistant
turn's text (the project's `texts`). Unavoidable differences: TRL gives each turn the whole remaining budget
(the project: rl.max_new_tokens per turn) and does not cut long tool results (rl.episode.max_env_tokens; a
calculator result never reaches it); a raising tool gives TRL's `{'error': ...}` text instead of the project's
message (the calculator's tool raises only on expressions the demonstrations never write).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ siblings
from rl_trl import grpo_config, project_optimizer, step_clock

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|system|>\\n' + header + '\\n<tools>\\n' }}"
    "{%- for t in tools %}{{ t | tojson(sort_keys=True) + '\\n' }}{%- endfor %}{{ '</tools><|end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}{{ '<|user|>\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' and m.get('tool_calls') %}{{ '<|assistant|>\\n' + (m['content'] or '') }}"
    "{%- for c in m['tool_calls'] %}"
    "{{ '<tool_call>' + ({'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson) + '</tool_call>' }}"
    "{%- endfor %}{{ '<|end|>\\n' }}"
    "{%- else %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}")
"""The tiny model's template (`<|role|>\\n content <|end|>\\n`) with the project's tool format as native turns;
`header` stands for posttrain.envs.calls.TOOLS_HEADER (put in by tool_tokenizer)."""

RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|end\|>\s*", "content": "text"},
    },
}
"""transformers' response template for the project's call format (what TRL's parse_response reads)."""


def tool_tokenizer(model_dir: str):
    """The model's tokenizer with TOOL_TEMPLATE (the header put in) and RESPONSE_TEMPLATE."""
    from posttrain.envs.calls import TOOLS_HEADER
    from posttrain.models.io import load_tokenizer

    tok = load_tokenizer(model_dir)
    tok.chat_template = TOOL_TEMPLATE.replace("+ header +", f"+ {json.dumps(TOOLS_HEADER)} +")  # a JSON string is a jinja literal
    tok.response_template = RESPONSE_TEMPLATE
    return tok


def calculator_tool():
    """The Calculator environment's tool as TRL takes it: a typed function with a Google docstring (the same
    schema as the project's, both from transformers.utils.get_json_schema)."""
    from posttrain.envs.builtin import Calculator

    return Calculator().calculate


def main(in_path: str, out_path: str) -> int:
    import importlib.metadata as md

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from posttrain.data.verifiers import score
    from posttrain.models.io import load_model, load_tokenizer, save_model

    spec = json.loads(Path(in_path).read_text())
    rl, prompts = spec["rl"], spec["prompts"]
    torch.set_num_threads(spec["threads"])
    tok, tool = tool_tokenizer(spec["model_dir"]), calculator_tool()
    for p in prompts:  # TRL renders a conversational prompt with the tools: it must give the project's ids
        ids = tok.apply_chat_template(p["messages"], tools=[tool], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        if ids != p["ids"]:
            raise SystemExit(f"episode prompt tokenization differs from the project's: {p['messages']!r}\n"
                             f"TRL:     {tok.decode(ids)!r}\nproject: {tok.decode(p['ids'])!r}")
    counted = {"tokens": 0, "rewards": [], "tool_calls": 0, "tool_failures": 0}

    class CountingGRPO(GRPOTrainer):
        """GRPOTrainer counting the tokens the policy sampled (TRL's tool mask: 0 on tool results)."""

        def _tool_call_loop(self, *args, **kwargs):
            out = super()._tool_call_loop(*args, **kwargs)
            counted["tokens"] += sum(sum(m) for m in out[0])
            counted["tool_calls"] += out[4]
            counted["tool_failures"] += out[5]
            return out

    def verifier(prompts, completions, answer, task, **_):
        """The project's verifier on the episode's last assistant turn (the project's `texts`)."""
        texts = [next((m["content"] for m in reversed(c) if m["role"] == "assistant"), "") for c in completions]
        scores = [score(t, x, a) for t, x, a in zip(task, texts, answer)]
        counted["rewards"].append(sum(scores) / len(scores))
        return scores

    args = grpo_config(spec)
    args.max_completion_length = rl["episode"]["max_total_tokens"]
    args.max_tool_calling_iterations = rl["episode"]["max_turns"] - 1
    model = load_model(spec["model_dir"])
    clock = step_clock()
    data = Dataset.from_list([{"prompt": p["messages"], "answer": p["answer"], "task": p["task"]} for p in prompts])
    trainer = CountingGRPO(model=model, reward_funcs=verifier, args=args, train_dataset=data, processing_class=tok,
                           tools=[tool], optimizers=project_optimizer(model, rl), callbacks=[clock])
    suffix = tok.decode(trainer._get_tool_suffix_ids([{"role": "tool", "name": "calculate", "content": "42"}]))
    print(f"trl: eos ids {trainer.eos_token_ids}, a tool result appends {suffix!r}, {rl['steps']} steps of "
          f"{rl['prompts_per_step']} x {rl['samples_per_prompt']}, torch threads {torch.get_num_threads()}", flush=True)
    clock.t = t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    save_model(trainer.model, load_tokenizer(spec["model_dir"]), Path(spec["out_dir"]) / "model")  # its own template
    out = {"wall_s": wall, "generated_tokens": counted["tokens"], "tool_calls": counted["tool_calls"],
           "tool_failures": counted["tool_failures"], "step_s": clock.steps, "reward_mean": counted["rewards"],
           "tool_result_suffix": suffix, "torch_threads": torch.get_num_threads(),
           "versions": {p: md.version(p) for p in ("trl", "accelerate", "transformers", "torch")}}
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
