"""Each algorithm's published defaults (posttrain.config.algorithm_defaults): taken at plan for the rl settings
neither the recipe nor the overrides set, named in the plan's output; an explicit value is kept, and refused when
it cannot work."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from posttrain import recipes
from posttrain.config import Algorithm, ConfigError, PipelineConfig, RLConfig, apply_overrides, validate
from posttrain.config.algorithm_defaults import DEFAULTS, apply_algorithm_defaults, explicit_settings
from posttrain.recipes import RECIPES, resolve, resolve_with_notes, same_ranks

GSPO = {"rl": {"algorithm": "gspo"}}
GSPO_NOTE = "rl: gspo's published defaults taken: rl.clip_low 0.0003, rl.clip_high 0.0004 (set them to override)"


def test_gspo_set_alone_plans_with_the_papers_clip_range_and_says_so():
    cfg, notes = resolve_with_notes("tiny_cpu", GSPO)
    assert (cfg.rl.clip_low, cfg.rl.clip_high) == (3e-4, 4e-4)  # RLConfig's 0.2 / 0.28 are refused under gspo
    assert notes == [GSPO_NOTE]
    assert resolve("tiny_cpu", '{"rl": {"algorithm": "gspo"}}') == cfg  # a JSON string, as the workflows pass


def test_without_the_defaults_gspo_alone_is_refused():
    """What resolve did before the defaults: the same config, unfilled, fails validation."""
    with pytest.raises(ConfigError, match="almost never clip"):
        validate(same_ranks(apply_overrides(RECIPES["tiny_cpu"](), GSPO)))


def test_the_plan_task_prints_the_defaults_it_took(capsys):
    from tasks.plan import plan

    out = plan(recipe="tiny_cpu", overrides='{"rl": {"algorithm": "gspo"}}', run_id="r1")
    assert (out.rl.clip_low, out.rl.clip_high) == (3e-4, 4e-4)
    assert f"plan: {GSPO_NOTE}" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("overrides", [{"rl": {"algorithm": "gspo", "clip_high": 0.28}},
                                       '{"rl": {"algorithm": "gspo", "clip_low": 0.2, "clip_high": 0.28}}'])
def test_an_explicit_value_is_kept_and_refused_when_it_cannot_work(overrides):
    """0.28 is RLConfig's default, but the overrides name it: it is the user's, not left unset."""
    with pytest.raises(ConfigError, match=r"rl\.clip_low / rl\.clip_high: gspo clips the sequence-level ratio.*"
                                          r"0\.28 would almost never clip; the paper uses 0\.0003 / 0\.0004"):
        resolve("tiny_cpu", overrides)


def test_an_explicit_value_that_works_is_kept_and_the_other_default_taken():
    cfg, notes = resolve_with_notes("tiny_cpu", {"rl": {"algorithm": "gspo", "clip_high": 1e-3}})
    assert (cfg.rl.clip_low, cfg.rl.clip_high) == (3e-4, 1e-3)
    assert notes == ["rl: gspo's published defaults taken: rl.clip_low 0.0003 (set it to override)"]


def test_a_value_the_recipe_sets_counts_as_explicit(monkeypatch):
    def gspo_recipe() -> PipelineConfig:
        base = RECIPES["tiny_cpu"]()
        return replace(base, rl=replace(base.rl, algorithm=Algorithm.GSPO, clip_high=1e-3))

    monkeypatch.setitem(recipes.RECIPES, "gspo_recipe", gspo_recipe)
    cfg, notes = resolve_with_notes("gspo_recipe")
    assert (cfg.rl.clip_low, cfg.rl.clip_high) == (3e-4, 1e-3)
    assert notes == ["rl: gspo's published defaults taken: rl.clip_low 0.0003 (set it to override)"]
    assert resolve("gspo_recipe", {"rl": {"clip_low": 1e-4}}).rl.clip_low == 1e-4  # the overrides win


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_resolves_as_before(name):
    """The built-in recipes (grpo, ppo) take no defaults: the config equals the one resolved without them."""
    before = validate(same_ranks(apply_overrides(RECIPES[name](), "")))
    assert resolve_with_notes(name) == (before, [])
    over = {"rl": {"clip_high": 0.3}}
    assert resolve_with_notes(name, over) == (validate(same_ranks(apply_overrides(RECIPES[name](), over))), [])


def test_dapo_keeps_its_clip_higher():
    cfg, notes = resolve_with_notes("tiny_cpu", {"rl": {"algorithm": "dapo"}})
    assert (cfg.rl.clip_low, cfg.rl.clip_high) == (0.2, 0.28)
    assert notes == ["rl: dapo's published defaults taken: rl.clip_low 0.2, rl.clip_high 0.28 (set them to override)"]
    assert resolve("tiny_cpu", {"rl": {"algorithm": "dapo", "clip_high": 0.3}}).rl.clip_high == 0.3


def test_explicit_settings_are_the_overrides_keys_and_the_recipes_changes():
    recipe = replace(PipelineConfig(), rl=replace(RLConfig(), lr=1e-4))
    assert explicit_settings(recipe, {"rl": {"clip_high": 0.28}, "sft": {"steps": 3}}) == {"rl.lr", "rl.clip_high"}
    assert explicit_settings(PipelineConfig(), {}) == set()
    cfg = replace(PipelineConfig(), rl=replace(RLConfig(), algorithm=Algorithm.GSPO))
    assert apply_algorithm_defaults(cfg, {"rl.clip_low", "rl.clip_high"}) == (cfg, [])


def test_every_declared_default_names_an_rl_setting_of_its_type_and_its_source():
    rl_fields = {f.name: f for f in dataclasses.fields(RLConfig)}
    for algorithm, settings in DEFAULTS.items():
        assert isinstance(algorithm, Algorithm)
        for name, d in settings.items():
            assert name in rl_fields, f"{algorithm.value}: {name} is not an rl setting"
            assert isinstance(d.value, type(getattr(RLConfig(), name))), f"{algorithm.value}: rl.{name}"
            assert d.source.strip(), f"{algorithm.value}: rl.{name} needs its source"
        cfg = replace(PipelineConfig(), rl=replace(RLConfig(), algorithm=algorithm))
        validate(apply_algorithm_defaults(cfg, set())[0], ())  # an algorithm's defaults pass its own checks


def test_a_lora_stage_far_below_what_adapters_need_is_warned_about_at_plan():
    """small_instruct_cpu's full fine-tune rates with adapters: SFT 1e-5 and RL 1e-6 are each named; RL only where
    the workflow runs it; SFT of a from-scratch model trains every weight, so its rate is not an adapter's."""
    from posttrain.config.advice import LORA_LR_FLOOR

    lora = {"model": {"lora": {}}}
    _, notes = resolve_with_notes("small_instruct_cpu", lora)  # its full fine-tune's sft.lr 1e-5, rl.lr 1e-6
    assert [n.split(",")[0] for n in notes] == ["warning: model.lora trains adapters with sft.lr = 1e-05",
                                                "warning: model.lora trains adapters with rl.lr = 1e-06"], notes
    assert "Raise rl.lr (e.g. 2e-4)" in notes[1]
    _, notes = resolve_with_notes("small_instruct_cpu", lora, workflow="sft_pipeline")
    assert len(notes) == 1 and "sft.lr" in notes[0]  # no RL in that workflow
    _, notes = resolve_with_notes("small_instruct_cpu", {**lora, "sft": {"lr": 2e-4}, "rl": {"lr": LORA_LR_FLOOR}})
    assert notes == []
    _, notes = resolve_with_notes("small_instruct_cpu")
    assert notes == []  # no adapters: a full fine-tune's rates are the user's business
    _, notes = resolve_with_notes("tiny_cpu", {**lora, "sft": {"lr": 1e-6}, "rl": {"lr": 3e-4}})
    assert notes == []  # SFT from scratch trains every weight; RL's rate is an adapter's
