"""Upstream's path of the static jsonl -> HTML viewer, kept so its imports and
`python -m atroposlib.frontend.jsonl2html` work; the code is `atroposlib.viewer.jsonl2html`."""

from atroposlib.viewer.jsonl2html import *  # noqa: F403
from atroposlib.viewer.jsonl2html import CSS, create_html_for_group, generate_html, main

__all__ = ["CSS", "create_html_for_group", "generate_html", "main"]

if __name__ == "__main__":
    main()
