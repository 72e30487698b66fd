"""`view-run RUN_DIR`: a finished run's groups on the viewer's page, one at a time.

The live page takes batches off a running API as the run's trainer. A finished run has
no API, but its environments wrote every group they sent to its files (`recorded.py`),
so this page reads those and steps through them, environment by environment, first to
last, drawn by the live page's renderer. It starts, binds and guards as the live page
does (`app.serve_page`: loopback by default, the page's token, one line and exit 2 for
what cannot be shown). `RecordedPage` holds the logic without Gradio, so it is tested
in-process; `build_recorded_app` only wires it to a dropdown, buttons and a number.
"""

from __future__ import annotations

import sys
from typing import Any

from atroposlib.viewer.app import (
    Prepared,
    import_gradio,
    load_tokenizer,
    serve_page,
    tool_name,
)
from atroposlib.viewer.recorded import RecordedRun, RecordedRunError, read_run, skipped_lines
from atroposlib.viewer.render import Decoder, render_notice, render_recorded
from atroposlib.viewer.settings import RecordedViewSettings, ViewRunSettings

ACTIONS = ("first", "previous", "next", "last")
"""The page's buttons, in order; "go" (the group number typed in) is the fifth move."""


def target(action: str, position: Any, count: int) -> int:
    """The 1-based group a move leads to, kept within 1..count (a bad number is 1)."""
    try:
        current = int(position)
    except (TypeError, ValueError, OverflowError):
        current = 1
    wanted = {"first": 1, "previous": current - 1, "next": current + 1, "last": count}
    return min(max(wanted.get(action, current), 1), count)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class RecordedPage:
    """What the page shows of a `RecordedRun`, as HTML, with no Gradio involved."""

    def __init__(self, run: RecordedRun, decoder: Decoder | None, multimodal: bool) -> None:
        self.run = run
        self.decoder = decoder
        self.multimodal = multimodal

    @property
    def first_env(self) -> str:
        return next(iter(self.run.groups))

    def choices(self) -> list[tuple[str, str]]:
        """The environment picker's (label, value) pairs, in file order."""
        pairs = []
        for env, groups in self.run.groups.items():
            skipped = len(self.run.skipped.get(env, []))
            extra = f", {_plural(skipped, 'unreadable line')} skipped" if skipped else ""
            pairs.append((f"{env} ({_plural(len(groups), 'group')}{extra})", env))
        return pairs

    def summary(self) -> str:
        """The notice above the page: what was read, from where, and what was skipped."""
        run = self.run
        text = (
            f"{_plural(run.group_count, 'group')} from "
            f"{_plural(len(run.groups), 'environment')}, read from {run.source}: "
            "a finished run's files, no API (nothing is pulled or registered)."
        )
        if run.skipped_count:
            text += f" {_plural(run.skipped_count, 'unreadable line')} skipped."
        if self.decoder is None:
            text += " Shown as their environments recorded them (messages)."
        return render_notice("warning" if run.skipped_count else "ok", text)

    def view(self, env: Any, position: Any, action: str = "go") -> tuple[int, str, str]:
        """The group a move leads to: its number, the status line and the group's HTML."""
        env = env if env in self.run.groups else self.first_env
        groups = self.run.groups[env]
        number = target(action, position, len(groups))
        status = render_notice("ok", f"Group {number} of {len(groups)} in {env}")
        group = render_recorded(groups[number - 1], number, self.decoder, self.multimodal)
        return number, status, group


def build_recorded_app(page: RecordedPage, title: str) -> Any:
    """The Gradio Blocks of the page (not launched), showing the first group at once."""
    gr = import_gradio()
    number, status_html, group_html = page.view(page.first_env, 1, "first")

    def move(action: str) -> Any:
        def show(env: Any, position: Any) -> tuple[int, str, str]:
            return page.view(env, position, action)

        return show

    with gr.Blocks(title=title) as app:
        gr.Markdown(f"## {title}")
        gr.HTML(page.summary(), elem_id="view-summary")
        env = gr.Dropdown(
            choices=page.choices(),
            value=page.first_env,
            label="Environment",
            elem_id="view-env",
            interactive=True,
        )
        with gr.Row():
            buttons = [gr.Button(a.capitalize(), elem_id=f"view-{a}") for a in ACTIONS]
            # no `minimum`: Gradio would refuse 0 with an error; `target` keeps it in range
            position = gr.Number(value=number, precision=0, label="Group", elem_id="view-position")
        status = gr.HTML(status_html, elem_id="view-status")
        group = gr.HTML(group_html, elem_id="view-groups")
        outputs = [position, status, group]
        for action, button in zip(ACTIONS, buttons, strict=True):
            button.click(move(action), [env, position], outputs, api_name=f"{action}_group")
        position.submit(move("go"), [env, position], outputs, api_name="show_group")
        env.change(move("first"), [env, position], outputs, api_name="pick_environment")
    return app


def serve_recorded(settings: RecordedViewSettings, multimodal: bool = False) -> int:
    """Read the run's files (bad input: one line, exit 2), then serve them as the live
    page is served (`serve_page`: exposure rule, port, tokenizer, Gradio)."""
    tool = tool_name(multimodal)
    try:
        run = read_run(settings.run_dir)
    except RecordedRunError as error:
        print(f"{tool}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{tool}: stopped", file=sys.stderr)
        return 0
    if unused := settings.unused_flags():
        said = ", ".join(unused)
        print(f"{tool}: {said} ignored: RUN_DIR's groups come from its files", file=sys.stderr)
    for line in skipped_lines(run):
        print(f"{tool}: {line}", file=sys.stderr)
    print(
        f"{tool}: {_plural(run.group_count, 'group')} from "
        f"{_plural(len(run.groups), 'environment')} in {settings.run_dir}",
        flush=True,
    )

    def prepare(_resolved: ViewRunSettings) -> Prepared:  # the key is the guard's alone
        tokenizer = settings.decode_with
        decoder = load_tokenizer(tokenizer) if tokenizer else None
        page = RecordedPage(run, decoder, multimodal)
        return build_recorded_app(page, tool), lambda: None  # files: nothing to close

    return serve_page(settings, tool, prepare)
