"""Each algorithm's published defaults for the `rl` settings the user did not set.

They are declared with each algorithm (algorithms.py: `Declared.defaults`); DEFAULTS gathers them:
`rl.algorithm` -> {rl setting: Default(value, source)}. An algorithm missing from it, or a setting missing from
its entry, runs with RLConfig's own default. A number is listed only where the paper (or the standard
implementation) prescribes it and RLConfig's default does not fit the algorithm; DAPO's entry repeats RLConfig's
clip defaults, which are DAPO's clip-higher, so a DAPO run keeps them whatever RLConfig's defaults become.

How they are applied (`posttrain.recipes.resolve`, once, after the overrides and before `validate`):
- a setting is *explicit* when the JSON overrides name it (`{"rl": {"clip_high": 0.28}}`, even at RLConfig's
  default value) or the recipe gives it a value other than RLConfig's default (`explicit_settings`);
- every declared setting of the run's algorithm that is not explicit takes the declared value
  (`apply_algorithm_defaults`), and the plan prints which it took (`describe_taken`);
- an explicit value is kept as given, so one that cannot work (gspo with rl.clip_high 0.28) is still refused
  by `validate` with the reason.
`validate` itself applies nothing: a config built in Python and validated directly is checked as it is.
"""

from __future__ import annotations

import enum
from dataclasses import fields, replace

from posttrain.config.algorithms import DECLARED, Algorithm, Default
from posttrain.config.pipeline import PipelineConfig
from posttrain.config.rl_sections import RLConfig

DEFAULTS: dict[Algorithm, dict[str, Default]] = {a: d.defaults for a, d in DECLARED.items() if d.defaults}
"""rl.algorithm -> {rl setting name: its published default} (declared in algorithms.py): what a run of that
algorithm uses for a setting the user left unset (see the module docstring)."""


def explicit_settings(recipe: PipelineConfig, overrides: dict) -> set[str]:
    """The rl settings ("rl.clip_high", ...) the user chose: those the JSON `overrides` name under "rl", and
    those `recipe` (the recipe function's config, before the overrides) sets to a value other than RLConfig's
    default."""
    default = RLConfig()
    chosen = {f"rl.{f.name}" for f in fields(RLConfig) if getattr(recipe.rl, f.name) != getattr(default, f.name)}
    rl = overrides.get("rl") if isinstance(overrides, dict) else None
    return chosen | ({f"rl.{name}" for name in rl} if isinstance(rl, dict) else set())


def apply_algorithm_defaults(cfg: PipelineConfig, explicit: set[str]) -> tuple[PipelineConfig, list[str]]:
    """`cfg` with its algorithm's DEFAULTS for every declared setting not in `explicit`, and the settings taken
    ("rl.clip_low", ...; empty when none)."""
    take = {name: d.value for name, d in DEFAULTS.get(cfg.rl.algorithm, {}).items() if f"rl.{name}" not in explicit}
    if not take:
        return cfg, []
    return replace(cfg, rl=replace(cfg.rl, **take)), [f"rl.{name}" for name in take]


def describe_taken(cfg: PipelineConfig, taken: list[str]) -> str:
    """The plan's line for the defaults `apply_algorithm_defaults` took ("" when none), e.g. "rl: gspo's published
    defaults taken: rl.clip_low 0.0003, rl.clip_high 0.0004 (set them to override)"."""
    if not taken:
        return ""
    values = []
    for path in taken:
        v = getattr(cfg.rl, path.removeprefix("rl."))
        values.append(f"{path} {v.value if isinstance(v, enum.Enum) else v}")
    return (f"rl: {cfg.rl.algorithm.value}'s published defaults taken: {', '.join(values)} "
            f"(set {'it' if len(taken) == 1 else 'them'} to override)")
