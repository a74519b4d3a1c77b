"""Write docs/cli.md, the reference of the `posttrain` command, from its argparse parser (posttrain.cli.main.parser).

    .venv/bin/python docs/cli_reference.py            # print the page
    .venv/bin/python docs/cli_reference.py --write    # rewrite docs/cli.md

tests/unit/test_cli_reference.py fails when docs/cli.md is stale or an argument has no help text.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "cli.md"


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str,
                                                                                          argparse.ArgumentParser]]:
    """(words after `posttrain`, help, parser) for every command that runs, subcommands included, in order."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, "", parser)]
    out = []
    for action in subs:
        helps = {c.dest: c.help or "" for c in action._choices_actions}
        for name, sub in action.choices.items():
            found = commands(sub, (*path, name))
            if len(found) == 1 and found[0][0] == (*path, name):
                found = [((*path, name), helps.get(name, ""), sub)]
            out += found
    return out


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def undocumented() -> list[str]:
    """Every command or argument without help text, as `posttrain WORDS ARG`."""
    from posttrain.cli.main import parser

    top = parser()
    missing = [f"posttrain {a.option_strings[0]}" for a in _arguments(top) if not a.help]
    for words, help_text, sub in commands(top):
        if not help_text:
            missing.append(f"posttrain {' '.join(words)}")
        missing += [f"posttrain {' '.join(words)} {a.option_strings[0] if a.option_strings else a.dest}"
                    for a in _arguments(sub) if not a.help]
    return missing


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(actions: list[argparse.Action]) -> list[str]:
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for a in actions:
        name = ", ".join(a.option_strings) or a.dest.upper()
        if a.option_strings and a.nargs != 0:
            name += f" {a.metavar or a.dest.upper()}"
        default = "" if a.default in (None, False, argparse.SUPPRESS, "", []) or not a.option_strings \
            else f"`{a.default}`"
        rows.append(f"| `{name}` | {default} | {_cell((a.help or '') % {'default': a.default})} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line wrapped at 100 columns (format_usage wraps at the terminal's width: the page must not vary)."""
    fmt = argparse.HelpFormatter(parser.prog, width=100)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return fmt.format_help().strip()


def render() -> str:
    from posttrain.cli import main as cli

    top = cli.parser()
    first, _, rest = cli.__doc__.strip().partition("\n\n")
    usage, _, prose = rest.partition("\n\n")
    lines = ["# The `posttrain` command", "",
             ("<!-- Written by `.venv/bin/python docs/cli_reference.py --write` from the command's parser "
              "(posttrain.cli.main.parser); do not edit by hand: tests/unit/test_cli_reference.py fails when it is "
              "stale. -->"), "",
             f"{first} It is installed with the package (`.venv/bin/posttrain`, or `python -m posttrain.cli`).",
             "", "```text", textwrap.dedent(usage), "```", "", prose, "",
             "## Options of every command", "", *_table(_arguments(top)), ""]
    for words, help_text, sub in commands(top):
        lines += [f"## `posttrain {' '.join(words)}`", "", f"{_cell((help_text[:1].upper() + help_text[1:]) % {})}.", ""]
        if sub.description:
            lines += [_cell(sub.description), ""]
        lines += ["```text", _usage(sub), "```", ""]
        args = [a for a in _arguments(sub) if a.dest != "debug"]
        if args:
            lines += [*_table(args), ""]
        if sub.epilog:
            lines += [_cell(sub.epilog[:1].upper() + sub.epilog[1:]) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    text = render()
    if "--write" in sys.argv[1:]:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
