"""Plan-time advice: settings that are valid but very likely not what the user meant. The plan prints each
line (tasks/plan.py, through recipes.resolve_with_notes); nothing here refuses a run."""

from __future__ import annotations

from posttrain.config.pipeline import PipelineConfig

LORA_LR_FLOOR = 2e-5
"""A LoRA stage's learning rate below this is flagged: 10x under the lowest rate a LoRA run of this project
learned at (2e-4: small_instruct_calculator_cpu's SFT; small_instruct_lora_cpu's RL 3e-4, the embedded
default's GRPO with adapters 1e-3). Adapters start with B = 0 and need ~10x a full fine-tune's rate, so a full
fine-tune's 1e-6 or 1e-5 leaves them near where they started."""


def lora_lr_notes(cfg: PipelineConfig, sections: tuple[str, ...], rl_runs: bool) -> list[str]:
    """A line per stage that trains adapters (model.lora) at a rate under LORA_LR_FLOOR: SFT from a model
    (from scratch it trains every weight), RL when the workflow runs it (`rl_runs`), and the dense objectives of
    `sections`."""
    if cfg.model.lora is None:
        return []
    stages = []
    if cfg.sft.enabled and (cfg.model.base_path or cfg.model.artifact):
        stages.append(("sft", cfg.sft.lr))
    if rl_runs and cfg.rl.enabled:
        stages.append(("rl", cfg.rl.lr))
    stages += [(name, getattr(cfg, name).lr) for name in ("dpo", "reward_model", "distill") if name in sections]
    return [f"warning: model.lora trains adapters with {name}.lr = {lr:g}, far below what adapters need: LoRA "
            f"runs here learned at 2e-4 to 1e-3 (~10x a full fine-tune's rate; B starts at 0), and under "
            f"{LORA_LR_FLOOR:g} the adapters barely move. Raise {name}.lr (e.g. 2e-4) unless this is deliberate."
            for name, lr in stages if lr < LORA_LR_FLOOR]
