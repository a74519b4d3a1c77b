"""Every report page, as a file and inside Flyte's Deck template, opened in a real headless Chromium: each
chart's <svg> is laid out with a non-zero size and draws every expected series, and nothing is fetched.

Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`; `make test` installs it when
apt-get is usable) and the `playwright` package (dev extra) - never `playwright install`: the system browser
is driven as it is."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from posttrain.report import pages, render_page
from posttrain.report.html import document
from tests.report_inputs import EXPECTED, build_store, decision

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


_CHARTS_JS = """() => [...document.querySelectorAll('figure.chart')].filter(f => f.offsetParent !== null).map(f => {
    const box = f.querySelector('svg').getBoundingClientRect();
    const drawn = [...f.querySelectorAll('[id*="--series-"]')].filter(g => {
        const b = g.getBBox(); return g.querySelector('path') !== null && (b.width > 0 || b.height > 0); });
    return {chart: f.id.slice('chart-'.length), width: box.width, height: box.height,
            series: [...new Set(drawn.map(g => g.id.split('--series-')[1]))]};
})"""
"""Per visible chart: the rendered size of its <svg> and the series whose group holds a path with a box."""


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed: `apt-get install -y chromium` (Debian; make test does it when "
                    "apt-get is usable)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def fragments(tmp_path_factory) -> dict[str, str]:
    store, ids = build_store(tmp_path_factory.mktemp("decks"))
    dense = {name: render_page(store, ids[name], standalone=False)  # the dense stages' pages, as their Decks
             for name in ("dpo", "reward_model", "distill", "pairs", "eval_pairs", "preference_dataset")}
    return {"dataset": pages.dataset_page(store, ids["dataset"]), "sft": pages.sft_page(store, ids["sft"]),
            "rl": pages.rl_page(store, ids["rl"]), "eval": pages.eval_page(store, ids["rl_eval"]),
            "promotion": pages.promotion_page(decision()), **dense}


def _flyte_deck(name: str, fragment: str) -> str:
    """The deck.html flytekit writes for a task with this one Deck (its own template and tab script)."""
    from flytekit import Deck
    from flytekit.deck.deck import _get_deck

    params = types.SimpleNamespace(decks=[Deck(name, fragment, auto_add_to_deck=False)])
    return _get_deck(new_user_params=params, ignore_jupyter=True)


def _charts(browser, path: Path, deck_tab: str | None) -> list[dict]:
    """The visible charts of the page at `path` (after clicking the Deck tab `deck_tab`); anything it asks the
    network for is refused and, unless it is the web font Flyte's own template links, fails the test."""
    page = browser.new_page()
    asked = []

    def offline(route):
        asked.append(route.request.url)
        route.abort()

    page.route(lambda url: not url.startswith(("file:", "data:")), offline)
    page.goto(path.as_uri())
    if deck_tab:
        page.click(f"#flyte-frame-tabs li:text-is('{deck_tab}')")
    charts = page.evaluate(_CHARTS_JS)
    page.close()
    ours = [u for u in asked if "fonts.googleapis.com" not in u]
    assert not ours, f"{path.name} asked the network for {ours}"
    return charts


@pytest.mark.parametrize("in_deck", [False, True], ids=["file", "flyte-deck"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_chart_draws_its_series(browser, fragments, tmp_path, name, in_deck):
    html = _flyte_deck(name, fragments[name]) if in_deck else document(fragments[name], name)
    path = tmp_path / f"{name}.html"
    path.write_text(html)
    charts = {c["chart"]: c for c in _charts(browser, path, name if in_deck else None)}
    assert set(charts) == set(EXPECTED[name])
    for chart, series in EXPECTED[name].items():
        c = charts[chart]
        assert c["width"] > 50 and c["height"] > 50, c
        assert series <= set(c["series"]), (chart, series - set(c["series"]))
