"""The package layout (docs/architecture.md, "Package layout"): the root holds folders for its concerns, each at
one layer; a module imports only from its own folder or a lower layer, and no module imports itself back through
others (lazy imports inside functions count too: they run). Read from the source with `ast`, nothing imported."""

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "posttrain"

LAYERS = ["config", "data", "artifacts", "promotion", "tracking", "models", "rewards", "envs", "spmd", "sft", "rl",
          "eval", "report", "stages", "recipes", "cli"]
"""Lowest first: settings; datasets; the artifact store and its channels; step tracking; models and their
generation; reward scoring; environments and tools; the SPMD training core; the dense trainer; RL; evaluation; the report pages; the
pipeline stages; the recipes; the console command."""


def _modules() -> dict[str, Path]:
    return {".".join(f.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): f
            for f in SRC.rglob("*.py")}


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the posttrain modules it imports (a name imported from a package counts as the package)."""
    out: dict[str, set[str]] = defaultdict(set)
    for mod, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "posttrain":
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out[mod].add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                out[mod].update(a.name for a in node.names if a.name.split(".")[0] == "posttrain")
    return out


def _layer(mod: str) -> str:
    return mod.split(".")[1] if mod.count(".") else ""


def test_the_root_holds_only_folders_of_the_layers():
    loose = sorted(p.name for p in SRC.iterdir() if p.suffix == ".py" and p.name != "__init__.py")
    folders = sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert loose == [], f"modules loose in src/posttrain (give them a folder): {loose}"
    assert sorted(folders) == sorted(LAYERS), (folders, LAYERS)


def _upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts
                  if _layer(m) and _layer(t) and LAYERS.index(_layer(t)) > LAYERS.index(_layer(m)))


def _cycles(mods: dict[str, Path], edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other (Tarjan's strongly connected components of size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in mods:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(mods):
        if m not in index:
            visit(m)
    return out


def test_no_import_reaches_a_higher_layer():
    upward = _upward(_imports(_modules()))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_cycle():
    mods = _modules()
    cycles = _cycles(mods, _imports(mods))
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_checks_see_a_violation(tmp_path):
    """The checks are not vacuous: a lazy import from `config` up to `rl`, and back, is found by both."""
    mods = {"posttrain.config.x": tmp_path / "x.py", "posttrain.rl.y": tmp_path / "y.py"}
    mods["posttrain.config.x"].write_text("def f():\n    from posttrain.rl.y import g\n")
    mods["posttrain.rl.y"].write_text("from posttrain.config.x import f\n")
    edges = _imports(mods)
    assert _upward(edges) == ["posttrain.config.x -> posttrain.rl.y"]
    assert _cycles(mods, edges) == [["posttrain.config.x", "posttrain.rl.y"]]


def test_the_store_commands_old_module_name_says_where_they_moved():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "posttrain.artifacts.cli", "runs"], capture_output=True, text=True, check=False,
                       timeout=60)
    assert r.returncode == 1 and "moved to posttrain.cli.store" in r.stderr, (r.returncode, r.stderr)
