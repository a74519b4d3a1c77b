"""Writes docs/settings.md, the reference of every setting, from the config dataclasses themselves.

    .venv/bin/python docs/settings_reference.py            # print the page
    .venv/bin/python docs/settings_reference.py --write    # rewrite docs/settings.md

For each setting: its name as overrides spell it (`rl.clip_low`), type, default, documentation (the attribute
docstring under the field in `src/posttrain/config/`; a field a subclass only re-defaults, like `dpo.lr`, takes its
base class's), the workflows that read its section (found in `workflows/*.py`: each workflow's `p.<section>`
accesses, through the helpers it calls), the algorithms that read an `rl` setting (the table `validate` enforces,
from the algorithms' declarations: `config/algorithms.py::read_by`), and an algorithm's published default where it
declares one (`config/algorithms.py::DECLARED`). `tests/unit/test_settings_reference.py` fails when the page is stale
or a setting has no documentation.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "settings.md"
CONFIG_SRC = ROOT / "src" / "posttrain" / "config"


def field_docs() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the attribute docstring written under the field."""
    docs = {}
    for f in sorted(CONFIG_SRC.glob("*.py")):
        for cls in (n for n in ast.parse(f.read_text()).body if isinstance(n, ast.ClassDef)):
            for st, nxt in zip(cls.body, [*cls.body[1:], None], strict=True):
                if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(nxt, ast.Expr)
                        and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                    docs[(cls.name, st.target.id)] = " ".join(nxt.value.value.split())
    return docs


def doc_of(cls: type, name: str, docs: dict) -> str:
    """The field's own docstring, else the nearest base class's (a subclass that only changes the default)."""
    for c in cls.__mro__:
        if (c.__name__, name) in docs:
            return docs[(c.__name__, name)]
    return ""


def workflow_sections() -> dict[str, list[str]]:
    """config section -> the workflows whose body (or a helper it calls) reads `p.<section>`."""
    reads: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    is_workflow: set[str] = set()
    for f in sorted((ROOT / "workflows").glob("*.py")):
        for fn in (n for n in ast.parse(f.read_text()).body if isinstance(n, ast.FunctionDef)):
            if any(isinstance(d, ast.Name) and d.id == "workflow" for d in fn.decorator_list):
                is_workflow.add(fn.name)
            nodes = list(ast.walk(fn))
            reads[fn.name] = {n.attr for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                              and n.value.id == "p"}
            calls[fn.name] = {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}

    def closure(name: str, seen: set[str]) -> set[str]:
        out = set(reads.get(name, ()))
        for c in calls.get(name, ()):
            if c in reads and c not in seen:
                out |= closure(c, seen | {c})
        return out

    by_section: dict[str, list[str]] = {}
    for wf in sorted(is_workflow):
        for section in closure(wf, {wf}):
            by_section.setdefault(section, []).append(wf)
    return by_section


def _type(t) -> str:
    s = t if isinstance(t, str) else getattr(t, "__name__", str(t))
    return s.replace("typing.", "")


def _default(f: dataclasses.Field, value) -> str:
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if dataclasses.is_dataclass(value):
        return "(section)"
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "(required)"
    return f"`{value!r}`".replace("|", "\\|")


def rows(section: str, cls: type, instance, docs: dict, read_by: dict, algo_defaults: dict) -> list[list[str]]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        name = f"{section}.{f.name}"
        hint = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(value) or (dataclasses.is_dataclass(_nested(hint)) and value is None):
            sub = _nested(hint)
            out.append([f"`{name}`", _type(f.type).replace("|", "\\|"), "`None`" if value is None else "(section)",
                        doc_of(cls, f.name, docs), ""])
            out += rows(name, sub, value if value is not None else sub(), docs, read_by, algo_defaults)
            continue
        readers = "all" if section == "rl" else ""
        if section == "rl" and f.name in read_by:
            algorithms, why = read_by[f.name]
            readers = ", ".join(a.value for a in algorithms) + (f" ({why})" if why else "")
        taken = [f"{a.value}: `{d.value!r}`" for a, entry in algo_defaults.items() if section == "rl"
                 for setting, d in entry.items() if setting == f.name]
        doc = doc_of(cls, f.name, docs) + (f" Algorithm defaults: {'; '.join(taken)}." if taken else "")
        out.append([f"`{name}`", _type(f.type).replace("|", "\\|"), _default(f, value), doc.replace("|", "\\|"),
                    readers])
    return out


def _nested(hint):
    """The dataclass inside `X | None`, or the hint itself."""
    for a in typing.get_args(hint) or (hint,):
        if isinstance(a, type) and dataclasses.is_dataclass(a):
            return a
    return hint


def render() -> str:
    from posttrain.config import PipelineConfig
    from posttrain.config.algorithm_defaults import DEFAULTS
    from posttrain.config.algorithms import read_by

    docs = field_docs()
    by_section = workflow_sections()
    top = PipelineConfig()
    lines = ["# Settings reference", "",
             ("<!-- Written by `.venv/bin/python docs/settings_reference.py --write` from the config dataclasses; "
              "do not edit by hand: tests/unit/test_settings_reference.py fails when it is stale. -->"), "",
             ("Every setting a recipe or `--overrides` JSON can set (`--overrides '{\"rl\": {\"lr\": 1e-4}}'` sets "
              "`rl.lr`), with its type, default, meaning and who reads it. A recipe (`--recipe`, "
              "`src/posttrain/recipes/`) starts from these defaults and changes some; an algorithm's published "
              "defaults fill the `rl` settings neither sets, and the plan prints which it took. An `rl` setting that "
              "would do nothing under the run's algorithm (a PPO setting under GRPO: the last column) is refused at "
              "plan, naming it."), ""]
    for f in dataclasses.fields(PipelineConfig):
        value = getattr(top, f.name)
        if not dataclasses.is_dataclass(value):
            continue
        cls = type(value)
        workflows = by_section.get(f.name, [])
        lines += [f"## `{f.name}`", ""]
        section_doc = doc_of(PipelineConfig, f.name, docs) or " ".join((cls.__doc__ or "").split())
        if section_doc and not section_doc.startswith(cls.__name__ + "("):
            lines += [section_doc, ""]
        lines += [f"`{cls.__name__}` (`{cls.__module__}`); read by the workflows: "
                  + (", ".join(f"`{w}`" for w in workflows) or "none directly") + ".", ""]
        table = rows(f.name, cls, value, docs, read_by(), DEFAULTS)
        any_readers = any(r[4] for r in table)
        header = ["setting", "type", "default", "meaning"] + (["read by (rl.algorithm)"] if any_readers else [])
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in table:
            lines.append("| " + " | ".join(r if any_readers else r[:4]) + " |")
        lines.append("")
    return "\n".join(lines)


def undocumented() -> list[str]:
    """Every setting (nested sections included) with no documentation of its own or a base class's."""
    from posttrain.config import PipelineConfig

    docs = field_docs()
    missing = []

    def walk(prefix: str, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _nested(hints.get(f.name, f.type))
            if prefix and not doc_of(cls, f.name, docs):
                missing.append(f"{prefix}{f.name} ({cls.__name__})")
            if isinstance(sub, type) and dataclasses.is_dataclass(sub):
                walk(f"{prefix}{f.name}.", sub)

    walk("", PipelineConfig)
    return missing


def main() -> None:
    page = render()
    if "--write" in sys.argv[1:]:
        PAGE.write_text(page + "\n")
        print(f"wrote {PAGE.relative_to(ROOT)}")
    else:
        print(page)


if __name__ == "__main__":
    main()
