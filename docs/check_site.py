"""Open every page of the built documentation site in headless chromium, as a reader would, and fail on a broken
link, anchor, image, stylesheet or script.

    .venv/bin/python docs/check_site.py docs/_build/html      # make docs runs it after the build

For each page: every resource the page requested from the site must load (a failed request is named), every
image must have decoded (naturalWidth > 0), and every link into the site must reach a page that exists and, when
it has a #fragment, an element with that id on that page (ids read from the rendered pages). Links off the site
are listed, not fetched: the machine that builds the docs may reach no network. Needs Debian's chromium at
/usr/bin/chromium (`apt-get install -y chromium`; make test installs it where apt-get works) and the playwright
package of the dev extra - never `playwright install`: the system browser is driven as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

_PAGE_JS = """() => ({
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    images: [...document.querySelectorAll('img')].map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
})"""
"""Per page: the ids it holds, its links (absolute, as the browser resolved them) and its images' decode state."""


def _local(url: str, site: Path) -> Path | None:
    """The file under `site` a file:// URL names, or None for a URL off the site."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    return path / "index.html" if path.is_dir() else path


def check(site: Path) -> tuple[list[str], dict]:
    """(problems, counts) for the built site in `site`: each problem names the page and what is broken in it."""
    site = site.resolve()
    pages = sorted(site.rglob("*.html"))
    if not (site / "index.html").is_file():
        return [f"{site}: no index.html (was the site built? make docs)"], {}
    if not CHROMIUM.exists():
        return [f"{CHROMIUM} not found: the site is checked in chromium (`apt-get install -y chromium`)"], {}
    from playwright.sync_api import sync_playwright

    problems, seen, links, external = [], {}, [], set()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page()
        failed: list[str] = []
        page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
        page.on("response", lambda r: failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
        for html in pages:
            name = str(html.relative_to(site))
            failed.clear()
            page.goto(html.as_uri(), wait_until="load")
            got = page.evaluate(_PAGE_JS)
            seen[html] = set(got["ids"])
            problems += [f"{name}: could not load {f}" for f in failed]
            problems += [f"{name}: image {i['src']} did not load" for i in got["images"] if not i["ok"]]
            links += [(name, url) for url in got["links"]]
        browser.close()
    for name, url in links:
        target, fragment = urldefrag(url)
        path = _local(target, site)
        if path is None:
            external.add(target)
        elif not path.is_file() or site not in path.resolve().parents:
            problems.append(f"{name}: link {url} leads to {path}, which is not a page of the site")
        elif fragment and path in seen and unquote(fragment) not in seen[path]:
            problems.append(f"{name}: link {url}: {path.name} has no element with id {unquote(fragment)!r}")
    return problems, {"pages": len(pages), "links": len(links), "external": sorted(external)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems, counts = check(Path(argv[0]))
    for line in problems:
        print(f"BROKEN {line}", file=sys.stderr)
    if counts:
        print(f"checked {counts['pages']} pages, {counts['links']} links in chromium; off the site (not fetched): "
              f"{', '.join(counts['external']) or 'none'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
