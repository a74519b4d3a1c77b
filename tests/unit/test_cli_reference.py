"""docs/cli.md is the reference of the `posttrain` command generated from its parser (docs/cli_reference.py): it
must match what the generator writes now, name every command, and every command and argument must have help."""

from pathlib import Path

from tests.docs_scripts import load

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    return load("cli_reference")


def test_every_command_and_argument_has_help():
    assert _generator().undocumented() == []


def test_the_page_is_current_and_names_every_command():
    from posttrain.cli.main import parser

    gen = _generator()
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == gen.render(), "docs/cli.md is stale: run `.venv/bin/python docs/cli_reference.py --write`"
    words = [" ".join(w) for w, _, _ in gen.commands(parser())]
    assert {"eval", "artifacts list", "runs", "show", "lineage", "verify", "index rebuild", "export", "channels",
            "promote"} <= set(words)
    for w in words:
        assert f"## `posttrain {w}`" in page
    assert "| `--require-gain` |" in page and "| `--limit LIMIT` |" in page
