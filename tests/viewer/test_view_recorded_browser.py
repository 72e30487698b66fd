"""`view-run RUN_DIR` as a user runs it: a real process over a run directory written in-process
(tests/support/recorded_runs.py), on a free 127.0.0.1 port, with no API anywhere, driven over HTTP
and by headless chromium.

One process for the module (its start imports Gradio: about 8 s of CPU). It keeps the
default host and has a page token, so it answers the exposure questions too: the
loopback bind, the token's guard in front of the page and Gradio's API. The module ends with
Ctrl-C. `view-run-multimodal RUN_DIR` differs only in showing the pictures, which
test_view_recorded.py checks in-process.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atroposlib.utils.waiting import answers_200
from tests.support.recorded_runs import ARITHMETIC, COUNTING, write_run
from tests.support.viewer import ViewerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

TOKEN = "page-s3cret"
PAGE_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "quickstart_cpu-20260101-000000")


@pytest.fixture(scope="module")
def recorded_view(tmp_path_factory, run_dir) -> Iterator[ViewerProcess]:
    """`view-run RUN_DIR --api-key TOKEN`, up once /health answers (the page wants the token)."""
    log_dir = tmp_path_factory.mktemp("view-run")
    viewer = ViewerProcess(log_dir, "view_run", str(run_dir), "--api-key", TOKEN)

    def up() -> bool:
        assert viewer.proc.poll() is None, f"view-run exited:\n{viewer.log()}"
        return answers_200(f"{viewer.url}/health")

    try:
        wait_until(up, 120, "view-run RUN_DIR did not answer /health")
        yield viewer
    finally:
        viewer.stop()


@pytest.mark.integration
def test_the_page_listens_on_loopback_and_wants_its_token(recorded_view, run_dir):
    with httpx.Client(base_url=recorded_view.url, timeout=30) as anyone:
        assert anyone.get("/").status_code == 401
        assert anyone.post("/gradio_api/call/next_group", json={"data": []}).status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    page = httpx.get(recorded_view.url, headers=bearer, timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    log = recorded_view.log()
    assert "view-run: mod_arithmetic.jsonl: skipped 3 unreadable line(s) (line 4: " in log
    assert f"view-run: 5 groups from 2 environments in {run_dir}" in log
    # the address it bound, by default: the line prints the host the socket was bound to
    assert f"view-run: serving on http://127.0.0.1:{recorded_view.port}/" in log


@pytest.mark.e2e  # a real browser
def test_a_browser_steps_through_each_environments_groups(recorded_view, chromium):
    from playwright.sync_api import expect

    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    page.goto(f"{recorded_view.url}/?token={TOKEN}")
    status, shown = page.locator("#view-status"), page.locator("#view-groups")

    def at(number: int, env: str = "mod_arithmetic", count: int = 3) -> None:
        expect(status).to_contain_text(
            f"Group {number} of {count} in {env}", timeout=PAGE_TIMEOUT_MS
        )
        expect(page.locator("#view-position input")).to_have_value(str(number))

    def shows_arithmetic(number: int) -> None:
        question, replies, scores = ARITHMETIC[number - 1]
        expect(shown.locator(".shared-prompt")).to_contain_text(question)
        assert shown.inner_text().count(question) == 1  # the prompt once
        items = shown.locator(".item")
        expect(items).to_have_count(len(replies))
        for i, (reply, score) in enumerate(zip(replies, scores, strict=True)):
            expect(items.nth(i)).to_contain_text(f"#{i} · score {score:.4g}")
            expect(items.nth(i).locator(".content")).to_have_text(reply)

    expect(page.locator("#view-summary")).to_contain_text(
        "5 groups from 2 environments", timeout=PAGE_TIMEOUT_MS
    )
    expect(page.locator("#view-summary")).to_contain_text("3 unreadable lines skipped")
    at(1)
    shows_arithmetic(1)
    for button, number in [("next", 2), ("last", 3), ("next", 3), ("previous", 2), ("first", 1)]:
        page.locator(f"#view-{button}").click()
        at(number)
        shows_arithmetic(number)
    page.locator("#view-position input").fill("3")
    page.locator("#view-position input").press("Enter")
    at(3)
    shows_arithmetic(3)

    page.locator("#view-env input").click()
    page.get_by_role("option", name="multimodal_counting (2 groups)").click()
    at(1, "multimodal_counting", 2)
    expect(shown).to_contain_text(COUNTING[0][0])
    expect(shown).to_contain_text("1 image(s) attached: view-run-multimodal shows them")
    page.locator("#view-last").click()
    at(2, "multimodal_counting", 2)
    page.close()


@pytest.mark.integration
def test_ctrl_c_stops_it_with_one_line(recorded_view):
    """Last in the module: it ends the module's view-run."""
    recorded_view.proc.send_signal(signal.SIGINT)
    assert recorded_view.proc.wait(30) == 0
    log = recorded_view.log()
    assert "Traceback" not in log and log.rstrip().endswith("view-run: stopped"), log
