"""The run report in a real browser: the summary table, each environment's row, and the
figure, as a reader sees them."""

from __future__ import annotations

import pytest

from atroposlib.launch.report import run_numbers, write_report
from tests.support.browser import headless_chromium
from tests.support.report_runs import made_up_run

pytestmark = pytest.mark.e2e


def test_the_report_page_shows_the_run_then_each_environment(tmp_path):
    plan = made_up_run(tmp_path)
    numbers = run_numbers(plan)
    numbers["resume_command"] = f"atropos-launch --resume {tmp_path}"
    page_path = write_report(plan, "model: tiny\n", numbers)
    with headless_chromium() as browser:
        page = browser.new_page()
        page.goto(page_path.as_uri())
        summary = page.locator("table.summary").inner_text()
        rows = page.locator("table.environments tr.env")
        texts = [rows.nth(i).inner_text() for i in range(rows.count())]
        figure_width = page.locator("img").evaluate("image => image.naturalWidth")
        verdict_color = page.locator("tr.verdict").evaluate(
            "row => getComputedStyle(row).backgroundColor"
        )
    assert "Steps trained\t20" in summary
    assert f"Continue this run\tatropos-launch --resume {tmp_path}" in summary
    assert len(texts) == 2
    learns = next(t for t in texts if t.startswith("learns"))
    flat = next(t for t in texts if t.startswith("flat<b>"))  # shown as text, not markup
    assert "the score rose by" in learns and "step 20: accuracy 1.000" in learns
    assert "THE SCORE DID NOT RISE" in flat and "none" in flat
    assert figure_width > 500  # the embedded figure decoded
    assert verdict_color in ("rgb(221, 255, 221)", "rgb(255, 221, 221)")
