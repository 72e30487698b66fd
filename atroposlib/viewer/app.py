"""The Gradio page of `view-run`: a button that pulls one batch and shows its groups.

Gradio is imported only through `import_gradio`, inside functions, so importing the
viewer works without it and the tools say how to install it. `serve_page` is the start
both modes share (the RUN_DIR page of a finished run is `browse.py`'s).
Pulling happens on a click (one `/batch` call each), never in a loop: a page left open
does not drain the run, and an API that is down or empty is reported at once instead of
hanging the page. The tokenizer is loaded before the page starts, so a wrong
`--tokenizer` stops the tool with a message rather than failing on the first click.

The Gradio page is mounted in a FastAPI app of our own, served by uvicorn, so that the
listeners' one `RequestGuard` sits in front of every route (page, assets, Gradio's API,
its WebSocket): the token when the page has one (a browser gives it once, then holds a
session cookie), a local Host when it has none, and no other site's page either way.
`/health` answers for pollers; `share` is never possible.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from atroposlib.utils import listen
from atroposlib.utils.listen import ListenError, listen_socket
from atroposlib.utils.request_guard import RequestGuard
from atroposlib.utils.tokenizers import TokenizerLoadError
from atroposlib.utils.tokenizers import load_tokenizer as load_named_tokenizer
from atroposlib.viewer.render import Decoder, render_batch, render_notice, scoped_css
from atroposlib.viewer.settings import RecordedViewSettings, ViewRunSettings
from atroposlib.viewer.source import GroupSource

INSTALL_HINT = "view-run needs Gradio: pip install '.[viewer]' (in a checkout) or gradio"
PULL_BUTTON = "Grab next batch"
OPEN_PATHS = frozenset({"/health"})
MAX_BODY_BYTES = 1 << 20
"""Gradio's posts from this page are a button's event: small."""
PAGE_TOKEN_HINT = (
    "missing or wrong token: open the page once as /?token=<key> (a cookie keeps it), "
    "or send 'Authorization: Bearer <key>'"
)


class ViewerError(RuntimeError):
    """A problem that stops the tool before the page starts (message for the user)."""


def load_tokenizer(name: str) -> Decoder:
    """The tokenizer that decodes the tokens; ViewerError when it cannot be loaded."""
    try:
        return load_named_tokenizer(name, "--tokenizer")
    except TokenizerLoadError as error:
        raise ViewerError(str(error)) from None


def import_gradio() -> Any:
    """Gradio, imported only when a page is built; ViewerError says how to install it."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home
    try:
        import gradio
    except ImportError:
        raise ViewerError(INSTALL_HINT) from None
    return gradio


def build_app(
    settings: ViewRunSettings, decoder: Decoder, source: GroupSource, multimodal: bool
) -> Any:
    """The Gradio Blocks of the page (not launched)."""
    gr = import_gradio()
    title = tool_name(multimodal)
    pulled = {"batches": 0}

    def grab() -> tuple[Any, Any]:
        result = source.pull()
        if result.groups is None:
            return render_notice(result.kind, result.message), gr.skip()
        pulled["batches"] += 1
        notice = render_notice("ok", f"Batch {pulled['batches']} from {settings.api_url}")
        return notice, render_batch(result.groups, decoder, show_images=multimodal)

    with gr.Blocks(title=title) as app:
        gr.Markdown(
            f"## {title}\nGroups pulled from the trajectory API at `{settings.api_url}` "
            f"(batches of {settings.batch_size} sequences). Each click takes one batch "
            "off the queue: this page acts as the run's trainer."
        )
        button = gr.Button(PULL_BUTTON, variant="primary", elem_id="grab-batch")
        status = gr.HTML(
            render_notice("waiting", f"Press '{PULL_BUTTON}' to pull a batch."),
            elem_id="view-status",
        )
        groups = gr.HTML("", elem_id="view-groups")
        button.click(grab, outputs=[status, groups], api_name="get_batch")
    return app


def page_app(settings: ViewRunSettings, blocks: Any) -> Any:
    """The FastAPI app that serves `blocks` at /, with /health and the token guard."""
    gr = import_gradio()
    from fastapi import FastAPI

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app = gr.mount_gradio_app(
        app, blocks, path="/", css=scoped_css(), footer_links=[], ssr_mode=False
    )
    app.add_middleware(
        RequestGuard,
        api_key=settings.api_key,
        max_body_bytes=MAX_BODY_BYTES,
        open_paths=OPEN_PATHS,
        listener="view-run",
        browser_cookie=f"atropos_view_{settings.port}",
        unauthorized_message=PAGE_TOKEN_HINT,
    )
    return app


def tool_name(multimodal: bool) -> str:
    return "view-run-multimodal" if multimodal else "view-run"


def serve_view(settings: ViewRunSettings, run_dir: str | None, multimodal: bool) -> int:
    """The tools' entry: a finished run's files when RUN_DIR is given, else the live API."""
    if run_dir is None:
        return serve(settings, multimodal)
    from atroposlib.viewer.browse import serve_recorded

    return serve_recorded(RecordedViewSettings.from_flags(settings, run_dir), multimodal)


def serve(settings: ViewRunSettings, multimodal: bool = False) -> int:
    """Check the bind, load the tokenizer, then serve the page until stopped (Ctrl-C: 0)."""

    def prepare(resolved: ViewRunSettings) -> Prepared:
        # the tokenizer first: a mistyped name fails in a second, not after Gradio
        decoder = load_tokenizer(resolved.tokenizer)
        import_gradio()
        source = GroupSource(resolved.api_url, resolved.batch_size, resolved.max_token_len)
        return build_app(resolved, decoder, source, multimodal), source.close

    return serve_page(settings, tool_name(multimodal), prepare)


Prepared = tuple[Any, Callable[[], None]]
"""A page's Gradio Blocks, and what to close once it stops."""


def serve_page(
    settings: ViewRunSettings, tool: str, prepare: Callable[[ViewRunSettings], Prepared]
) -> int:
    """Both modes' start: the exposure rule, then the port (a busy one is one line and
    exit 2 before any slow work), then `prepare` (tokenizer, Gradio: a ViewerError is one
    line and exit 2), then the page behind the guard until stopped (Ctrl-C: 0)."""
    try:
        return _serve_page(settings, tool, prepare)
    except KeyboardInterrupt:  # while the tokenizer or Gradio loads
        print(f"{tool}: stopped", file=sys.stderr)
        return 0


def _serve_page(
    settings: ViewRunSettings, tool: str, prepare: Callable[[ViewRunSettings], Prepared]
) -> int:
    settings = settings.resolved()
    problem = settings.exposure_problem()
    if warning := settings.exposure_warning():
        print(f"{tool}: {warning}", file=sys.stderr)
    if problem:
        print(f"{tool}: {problem}", file=sys.stderr)
        return 2
    try:
        sock = listen_socket(settings.host, settings.port)
    except ListenError as error:
        print(f"{tool}: {error}", file=sys.stderr)
        return 2
    with sock:
        try:
            blocks, close = prepare(settings)
        except ViewerError as error:
            print(f"{tool}: error: {error}", file=sys.stderr)
            return 2
        try:
            app = page_app(settings, blocks)
            print(f"{tool}: serving on http://{settings.host}:{settings.port}/", flush=True)
            return listen.serve(
                app,
                sock,
                tool,
                host=settings.host,
                port=settings.port,
                access_log=False,
                timeout_graceful_shutdown=5,
            )
        finally:
            close()
