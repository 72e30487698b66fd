"""The end-of-run verdict: a run that does not learn is called flat, plainly."""

from __future__ import annotations

import random

from atroposlib.launch.report import learning_verdict, summary
from atroposlib.trainer_contract import MetricsRow


def noisy(mean: float, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean + rng.uniform(-0.05, 0.05) for _ in range(count)]


def test_a_clear_rise_is_called_learning():
    learned, verdict = learning_verdict(noisy(0.3, 10, 0) + noisy(0.5, 80, 1) + noisy(0.7, 10, 2))
    assert learned is True
    assert verdict.startswith("the score rose by 0.")
    assert "over the first 10 steps" in verdict and "over the last 10" in verdict


def test_wobble_around_a_flat_mean_is_not_learning():
    scores = noisy(0.11, 100, 3)
    learned, verdict = learning_verdict(scores)
    assert learned is False
    first, last = sum(scores[:10]) / 10, sum(scores[-10:]) / 10
    assert verdict.startswith(
        f"THE SCORE DID NOT RISE: mean score {first:.3f} over the first 10 steps, "
        f"{last:.3f} over the last 10"
    )
    assert verdict.endswith("the policy did not learn in this run")


def test_a_small_rise_within_the_noise_is_not_learning():
    # first 10: mean 0.5, standard error 0.167; a rise of 0.1 is well inside twice that
    assert learning_verdict([0.0, 1.0] * 5 + [0.6] * 10)[0] is False


def test_a_falling_score_is_not_learning():
    assert learning_verdict([0.6] * 10 + [0.2] * 10)[0] is False


def test_too_short_a_run_is_not_judged():
    learned, verdict = learning_verdict([0.1, 0.9, 0.9])
    assert learned is None and verdict.startswith("too few steps to judge learning (3 < 20)")


def test_summary_carries_the_verdict():
    rows = [MetricsRow(step=i, score_mean=0.2 if i <= 10 else 0.8, loss=0.0) for i in range(1, 31)]
    numbers = summary(rows)
    assert numbers["learned"] is True and numbers["first_10_mean_score"] == 0.2
    assert summary([]) == {"steps": 0}


def test_summary_counts_what_the_staleness_bound_dropped():
    rows = [
        MetricsRow(step=1, score_mean=0.1, loss=0.0, staleness_max=0.0, stale_sequences_dropped=0),
        MetricsRow(step=2, score_mean=0.1, loss=0.0, staleness_max=1.0, stale_sequences_dropped=5),
        MetricsRow(step=3, score_mean=0.1, loss=0.0, stale_sequences_dropped=8),
    ]
    numbers = summary(rows)
    assert numbers["stale_sequences_dropped"] == 13 and numbers["staleness_max"] == 1
    plain = summary([MetricsRow(step=1, score_mean=0.1, loss=0.0)])
    assert "stale_sequences_dropped" not in plain and "staleness_max" not in plain


def test_sample_rollouts_are_drawn_by_the_rollout_viewer(tmp_path):
    import json

    from atroposlib.launch.report import _groups_html, sample_groups

    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<4>"}]
    lines = [
        {"scores": [1.0, 0.0], "messages": [chat, chat]},
        {"scores": [0.5], "tokens": [[1, 2]]},  # sent without messages
    ]
    (rollouts / "arith.jsonl").write_text("\n".join(json.dumps(g) for g in lines) + "\n")
    first, _ = sample_groups(rollouts)
    page = _groups_html(first)
    assert page.count("<h4>arith</h4>") == 2
    assert 'class="group"' in page and "score 1" in page  # jsonl2html's group and scores
    assert "&lt;4&gt;" in page  # the text is escaped
    assert "scores 0.5 (no text recorded)" in page
    assert _groups_html([]) == "<p>(no rollouts recorded)</p>"


def test_a_multimodal_groups_picture_is_shown_once_above_its_answers(tmp_path):
    from atroposlib.launch.report import _groups_html
    from atroposlib.utils.counting_pictures import make_item

    picture = make_item(5, "total")["image"]
    chat = [
        {"role": "user", "content": "How many?\n<image>"},
        {"role": "assistant", "content": "5"},
    ]
    group = {"scores": [1.0, 0.0], "messages": [chat, chat], "images": [picture, picture]}
    page = _groups_html([{**group, "_env": "multimodal_counting"}])
    assert page.count('<img class="picture"') == 1
    assert f'src="data:image/png;base64,{picture}"' in page
    assert page.index("<img") < page.index('class="group"')
    assert "<img" not in _groups_html([{"scores": [1.0], "messages": [chat], "_env": "arith"}])
