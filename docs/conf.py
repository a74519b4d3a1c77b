"""The documentation site: Sphinx with MyST Markdown and the Furo theme, pinned in requirements-docs.lock.

    make docs        # builds docs/ into docs/_build/html, every warning an error, then checks the site in chromium

The pages are the Markdown files of docs/, as GitHub also shows them; the home page is the README
(docs/index.md includes it, its `docs/...` links made relative). The build imports no posttrain code: the
settings reference (settings.md) is generated from the config dataclasses by docs/settings_reference.py and kept
current by tests/unit/test_settings_reference.py.
"""

import re

project = "posttrain"
author = "the posttrain developers"
copyright = "2026, the posttrain developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings up to ### get the anchors GitHub gives them, so `ppo.md#ppo` works on the site as on GitHub.
myst_heading_anchors = 3

html_theme = "furo"
html_title = "posttrain"
html_show_sourcelink = False
html_copy_source = False

# Nothing is fetched from the network: the build must work on a machine that reaches only package registries.
html_theme_options = {"navigation_with_keys": True}


def _site_links(app, docname: str, source: list[str]) -> None:
    """The pages link to the README as GitHub shows it (`../README.md`); on the site the README is the home page.
    The README's links into examples/ lead to the site's examples page, which shows the examples' files."""
    source[0] = source[0].replace("](../README.md", "](index.md")


def _readme_links(app, relative_path, parent_docname: str, content: list[str]) -> None:
    if str(relative_path).endswith("README.md"):
        content[0] = re.sub(r"\]\(examples/[^)#]*", "](docs/examples.md", content[0])


def setup(app):
    app.connect("source-read", _site_links)
    app.connect("include-read", _readme_links)
    return {"parallel_read_safe": True}
