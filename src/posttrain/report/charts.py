"""Charts as inline SVG text (matplotlib, no JavaScript): readable offline, in a Flyte Deck or a saved page.

Every chart comes back as `<figure class="chart" id="chart-<name>">` holding one `<svg>`; every series in
it is an SVG group with the id `<name>--series-<series>`, so a test (or a reader's devtools) can find each
plotted line, bar set or band. Figures are made with matplotlib's object API (`Figure`, no pyplot): it
renders SVG without any backend being chosen, so importing this module never switches a user's backend (as
`matplotlib.use("Agg")` would in a notebook), and the style is applied per chart (`_styled`), not globally.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure

_SIZE = (6.0, 2.8)
"""Inches: small enough for two charts side by side in a Deck tab."""
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "posttrain", "font.size": 9}
"""Text stays text (smaller, searchable SVG), and ids are stable so the same data gives the same SVG."""


def _styled(chart: Callable[..., str]) -> Callable[..., str]:
    """Run a chart function under _STYLE, leaving matplotlib's global settings as they were."""
    @functools.wraps(chart)
    def wrapper(*args, **kwargs) -> str:
        with matplotlib.rc_context(_STYLE):
            return chart(*args, **kwargs)
    return wrapper


def _svg(fig: Figure, name: str, title: str) -> str:
    """The figure as a `<figure>` with inline SVG (no XML prolog, no timestamp, so output is reproducible)."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return f'<figure class="chart" id="chart-{name}">{text[text.index("<svg"):]}</figure>'


def slug(text: str) -> str:
    """`text` as an id part: lower case, runs of anything but letters and digits as one "-"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _gid(name: str, series: str) -> str:
    return f"{name}--series-{slug(series)}"


@_styled
def line_chart(name: str, title: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
               xlabel: str = "step", ylabel: str = "", logy: bool = False) -> str:
    """One line per entry of `series` (same length as `x`); non-finite points are left out of the line."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    for label, ys in series.items():
        pts = [(a, b) for a, b in zip(x, ys) if b is not None and math.isfinite(b)]
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None,
                          label=label)
        line.set_gid(_gid(name, label))
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _svg(fig, name, title)


@_styled
def bar_chart(name: str, title: str, categories: Sequence[str], series: Mapping[str, Sequence[float]], *,
              ylabel: str = "", errors: Mapping[str, Sequence[tuple[float, float]]] | None = None,
              stacked: bool = False, hline: tuple[str, float] | None = None) -> str:
    """Bars per category, one colour per entry of `series` (side by side, or `stacked`). `errors`: optional
    (low, high) interval per bar, drawn as error bars; `hline`: (label, y) drawn as a dashed reference line."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    xs = range(len(categories))
    width = 0.8 if stacked else 0.8 / max(len(series), 1)
    bottom = [0.0] * len(categories)
    for i, (label, ys) in enumerate(series.items()):
        pos = list(xs) if stacked else [x - 0.4 + width * (i + 0.5) for x in xs]
        bars = ax.bar(pos, ys, width, bottom=bottom if stacked else None, label=label)
        for bar in bars:
            bar.set_gid(_gid(name, label))
        if errors and label in errors:
            yerr = [[max(y - lo, 0.0) for y, (lo, _) in zip(ys, errors[label])],
                    [max(hi - y, 0.0) for y, (_, hi) in zip(ys, errors[label])]]
            bars_ci = ax.errorbar(pos, ys, yerr=yerr, fmt="none", ecolor="black", capsize=4).lines[2][0]
            bars_ci.set_gid(_gid(name, f"{label}-ci"))
        if stacked:
            bottom = [b + y for b, y in zip(bottom, ys)]
    if hline:
        ax.axhline(hline[1], color="red", linestyle="--", label=hline[0]).set_gid(_gid(name, hline[0]))
    ax.set_xticks(list(xs), categories, rotation=15 if max(map(len, categories), default=0) > 12 else 0)
    ax.set(ylabel=ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1 or hline:  # beside the axes: bars fill them up to the top
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig, name, title)


@_styled
def histogram(name: str, title: str, series: Mapping[str, Sequence[float]], *, xlabel: str, bins: int = 30) -> str:
    """Overlaid step histograms of each entry of `series`, on shared bins."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    values = [v for vs in series.values() for v in vs]
    lo, hi = (min(values), max(values)) if values else (0, 1)
    for label, vs in series.items():
        *_, patches = ax.hist(vs, bins=bins, range=(lo, hi if hi > lo else lo + 1), histtype="step", linewidth=1.5,
                              label=f"{label} (n={len(vs)})")
        for p in patches:
            p.set_gid(_gid(name, label))
    ax.set(xlabel=xlabel, ylabel="rows")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig, name, title)


@_styled
def stacked_area(name: str, title: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *,
                 xlabel: str = "step", ylabel: str = "seconds") -> str:
    """Series stacked on each other (e.g. per-phase seconds of a step), one band per entry."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    bands = ax.stackplot(list(x), *[list(v) for v in series.values()], labels=list(series))
    for band, label in zip(bands, series):
        band.set_gid(_gid(name, label))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _svg(fig, name, title)


@_styled
def binned_histogram(name: str, title: str, edges: Sequence[float], series: Mapping[str, Sequence[int]], *,
                     xlabel: str, ylabel: str = "count") -> str:
    """Overlaid step histograms of counts already binned on shared `edges` (len(edges) == len(counts) + 1), e.g.
    the score histograms a reward model's eval stores."""
    fig = Figure(figsize=_SIZE)
    ax = fig.add_subplot()
    for label, counts in series.items():
        ax.stairs(counts, edges, linewidth=1.5, label=f"{label} (n={sum(counts)})").set_gid(_gid(name, label))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig, name, title)
