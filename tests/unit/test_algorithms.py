"""Every RL algorithm is named in two places: its member and declaration (config/algorithms.py) and its loop's
row (rl/loops/__init__.py::ALGORITHMS); everything else reads the declaration."""

from __future__ import annotations

import re
from pathlib import Path

from posttrain.config import Algorithm, RLConfig
from posttrain.config.algorithms import DECLARED, read_by

SRC = Path(__file__).resolve().parents[2] / "src" / "posttrain"

USES = {"config/rl_sections.py": {"GRPO"}, "recipes/__init__.py": {"PPO"}}
"""Files that pick an algorithm without declaring anything of it: RLConfig's default, the PPO recipe."""


def test_every_algorithm_has_a_declaration_and_a_loop():
    from posttrain.rl.loops import ALGORITHMS

    assert set(DECLARED) == set(Algorithm) == set(ALGORITHMS)


def test_no_other_source_file_names_an_algorithm():
    named: dict[str, set[str]] = {}
    values = "|".join(re.escape(a.value) for a in Algorithm)
    for f in sorted(SRC.rglob("*.py")):
        rel = str(f.relative_to(SRC))
        text = f.read_text()
        members = set(re.findall(r"Algorithm\.([A-Z_]+)\b", text))
        compared = re.findall(rf"\.value\s*[!=]=\s*[\"']({values})[\"']", text)
        assert not compared, f"{rel} compares rl.algorithm with a string: {compared}"
        if members - USES.get(rel, set()):
            named[rel] = members
    assert set(named) == {"config/algorithms.py", "rl/loops/__init__.py"}, named


def test_the_settings_only_some_algorithms_read_keep_their_defaults_elsewhere():
    table = read_by()
    assert table["critic_lr"] == ((Algorithm.PPO,), "")
    assert table["gamma"][0] == (Algorithm.PPO, Algorithm.REINFORCE_PP)
    assert Algorithm.GSPO not in table["loss_agg"][0] and "gspo" in table["loss_agg"][1]
    for name in table:  # every declared setting is a real one
        assert hasattr(RLConfig(), name), name


def test_the_roles_a_run_starts_are_the_ones_its_loop_reads():
    """The registry starts a role from the settings and the declaration (critic, teacher); the loop reads the
    groups its `Roles` dataclass names. Every required group is started, and the critic and teacher are started
    exactly for the loops that name them."""
    from dataclasses import MISSING, fields

    from posttrain.config import ModelConfig, PlacementConfig, RewardConfig
    from posttrain.rl.loops import ALGORITHMS
    from posttrain.rl.roles import registry

    for algorithm, spec in ALGORITHMS.items():
        settings = registry.RunSettings(rl=RLConfig(algorithm=algorithm, teacher="/models/teacher"),
                                        reward=RewardConfig(), placement=PlacementConfig(), model=ModelConfig(),
                                        start_model_dir="/models/start")
        started = {name for name, role in registry.ROLES.items() if role.enabled(settings)}
        named = {f.name: f.default is MISSING and f.default_factory is MISSING for f in fields(spec.loop.Roles)}
        assert {n for n, required in named.items() if required} <= started, algorithm
        for role in ("critic", "teacher"):
            assert (role in started) == (role in named), (algorithm, role)
