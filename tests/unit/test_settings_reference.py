"""docs/settings.md is the settings reference generated from the config dataclasses (docs/settings_reference.py):
it must match what the generator writes now, and every setting must carry documentation."""

from pathlib import Path

from tests.docs_scripts import load

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    return load("settings_reference")


def test_every_setting_is_documented():
    gen = _generator()
    missing = gen.undocumented()
    assert not missing, ("settings with no docstring under their field in src/posttrain/config/ (the reference shows "
                         f"it): {missing}")


def test_the_page_is_current_and_covers_every_setting():
    import dataclasses

    from posttrain.config import PipelineConfig

    gen = _generator()
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == gen.render() + "\n", "docs/settings.md is stale: run `.venv/bin/python docs/settings_reference.py --write`"
    for section in ("data", "model", "sft", "eval", "rl", "reward", "placement", "tracking", "pairs", "dpo",
                    "reward_model", "distill"):
        cls = type(getattr(PipelineConfig(), section))
        for f in dataclasses.fields(cls):
            assert f"| `{section}.{f.name}` |" in page, f"{section}.{f.name} missing from docs/settings.md"
    assert "| `model.lora.rank` |" in page and "| `data.tokenizer.vocab_size` |" in page  # nested sections
    # the algorithms that read a setting come from validate's own table, the workflows from workflows/*.py
    lam = next(line for line in page.splitlines() if line.startswith("| `rl.lam` |"))
    assert lam.endswith("| ppo |"), lam
    assert "`dpo.beta`" in page and "read by the workflows: `dpo_pipeline`." in page


def test_a_field_without_documentation_is_found(tmp_path, monkeypatch):
    """The documentation check is not vacuous: a field with no docstring under it is reported."""
    gen = _generator()
    (tmp_path / "x.py").write_text("class RLConfig:\n    lr: float = 1.0\n    seed: int = 0\n    \"\"\"Seed.\"\"\"\n")
    monkeypatch.setattr(gen, "CONFIG_SRC", tmp_path)
    docs = gen.field_docs()
    assert ("RLConfig", "seed") in docs and ("RLConfig", "lr") not in docs
