"""docs/check_site.py, the check `make docs` runs on the built site in chromium: it names a broken link, a missing
anchor, an image that does not load and a missing stylesheet, and passes a site without them. (`make docs` itself
builds the real site with warnings as errors and runs the check on it; `make test` runs `make docs`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_scripts import load


@pytest.fixture(scope="module")
def check_site():
    mod = load("check_site")
    if not mod.CHROMIUM.exists():
        pytest.skip("chromium is not installed: `apt-get install -y chromium` (make test does it when apt-get works)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    return mod


# A 1x1 PNG.
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000005000100"
                    "0d0a2db40000000049454e44ae426082")


def _site(root: Path, *, broken: bool) -> Path:
    root.mkdir()
    (root / "logo.png").write_bytes(PNG)
    (root / "style.css").write_text("body { color: black; }")
    (root / "page.html").write_text('<html><body><h1 id="intro">Intro</h1><a href="index.html">home</a></body></html>')
    extra = ('<a href="gone.html">gone</a><a href="page.html#missing">no anchor</a><img src="nope.png">'
             '<link rel="stylesheet" href="absent.css">') if broken else ""
    (root / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="style.css"></head><body><img src="logo.png">'
        '<a href="page.html#intro">intro</a><a href="https://example.org/x">off the site</a>'
        f"{extra}</body></html>")
    return root


def test_a_site_without_broken_parts_passes(check_site, tmp_path):
    problems, counts = check_site.check(_site(tmp_path / "ok", broken=False))
    assert problems == []
    assert counts["pages"] == 2 and counts["external"] == ["https://example.org/x"]


def test_each_broken_link_anchor_image_and_stylesheet_is_named(check_site, tmp_path):
    problems, _ = check_site.check(_site(tmp_path / "bad", broken=True))
    text = "\n".join(problems)
    assert "index.html: link" in text and "gone.html" in text and "not a page of the site" in text
    assert "has no element with id 'missing'" in text
    assert "nope.png" in text  # the image: a failed request and an image that did not decode
    assert "absent.css" in text
    assert all(p.startswith("index.html:") for p in problems), problems


def test_a_folder_without_a_built_site_is_refused(check_site, tmp_path):
    problems, _ = check_site.check(tmp_path)
    assert problems and "no index.html" in problems[0]
