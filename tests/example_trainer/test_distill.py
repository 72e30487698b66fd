"""On-policy distillation in the trainer: the teacher's arrays checked, aligned with the
label positions, turned into a loss whose gradient moves the student to the teacher,
and reported (docs/trainer.md, Distillation)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from atroposlib.protocol import ScoredData, group_problems  # noqa: E402
from example_trainer.data import flatten, micro_batches  # noqa: E402
from example_trainer.distill import TeacherTopK, distill_per_token  # noqa: E402
from example_trainer.loss import LossSettings, policy_loss  # noqa: E402
from example_trainer.objective import StepMetrics  # noqa: E402

INF = math.inf


def group(**fields):
    """Two sequences of 5 tokens, the last two trained; the teacher covers positions 1-4
    (position 0 has no context: vLLM's None, an empty row)."""
    tokens = [[1, 5, 6, 7, 2], [1, 5, 6, 8, 2]]
    ids = [[[], [5, 9], [6, 9], [7, 8], [2, 3]], [[], [5, 9], [6, 9], [7, 8], [2]]]
    lps = [
        [[], [-0.1, -2.5], [-0.2, -1.9], [-0.5, -1.0], [-0.05, -3.0]],
        [[], [-0.1, -2.5], [-0.2, -1.9], [-0.5, -1.0], [-0.01]],
    ]
    return {
        "tokens": tokens,
        "masks": [[-100, -100, -100, 7, 2], [-100, -100, -100, 8, 2]],
        "scores": [1.0, 0.0],
        "distill_token_ids": ids,
        "distill_logprobs": lps,
        **fields,
    }


def problems(**fields):
    return [message for _, message in group_problems(ScoredData(**group(**fields)), vocab_size=10)]


def test_well_formed_teacher_arrays_pass_and_each_misalignment_is_named():
    assert problems() == []
    short = group()["distill_token_ids"]
    short[1] = short[1][:4]
    assert "4 id rows and 5 logprob rows for 5 tokens" in problems(distill_token_ids=short)[0]
    narrow = group()["distill_logprobs"]
    narrow[0][3] = [-0.5]
    assert "position 3 of sequence 0 has 2 teacher ids but 1 logprobs" in problems(
        distill_logprobs=narrow
    )
    outside = group()["distill_token_ids"]
    outside[0][2] = [6, 10]
    assert (
        "teacher id 10 at position 2 of sequence 0 is outside 0 to 9"
        in problems(distill_token_ids=outside)[0]
    )
    for bad in (0.5, float("nan")):
        wrong = group()["distill_logprobs"]
        wrong[1][4] = [bad]
        assert "distill_logprobs[1][4]" in problems(distill_logprobs=wrong)[0]
    prompt_nan = group()["distill_logprobs"]
    prompt_nan[0][1] = [float("nan"), -1.0]  # an untrained position: never read as a value
    assert problems(distill_logprobs=prompt_nan) == []
    # one without the other is kept (upstream's API hands it on) and teaches nothing
    assert problems(distill_logprobs=None) == []
    (alone,) = flatten([group(distill_logprobs=None)], "group", seq_len=32)[:1]
    assert alone.teacher is None


def test_the_teacher_row_of_token_t_lands_on_the_label_position_that_predicts_it():
    sequences = flatten([group()], "group", seq_len=32)
    (padded,) = micro_batches(sequences, 1, pad_id=0)
    (packed,) = micro_batches(sequences, 1, pad_id=0, token_budget=64, pack=True)
    for chunk in (padded, packed):
        teacher = chunk.teacher
        assert teacher is not None and teacher.ids.shape[-1] == 2
        labels = chunk.input_ids[:, 1:]
        assert teacher.ids.shape == (*labels.shape, 2)
    # padded row 0 is sequence 0 (sorted by length, equal lengths keep their order)
    assert padded.teacher.ids[0, 2].tolist() == [7, 8]  # label position 2 predicts token 3
    assert padded.teacher.logprobs[0, 2].tolist() == pytest.approx([-0.5, -1.0])
    # sequence 1's last row had one entry: the second is absent (-inf)
    assert padded.teacher.logprobs[1, 3].tolist() == [pytest.approx(-0.01), -INF]
    # packed: sequence 1 starts after sequence 0's 4 label positions and the gap
    assert packed.teacher.ids[0, 5 + 2].tolist() == [7, 8]
    assert torch.isinf(packed.teacher.logprobs[0, 4]).all(), "the gap has no teacher"


def test_a_sequence_without_a_teacher_is_uncovered_and_one_cut_at_seq_len_is_cut_too():
    plain = {k: v for k, v in group().items() if not k.startswith("distill")}
    sequences = flatten([group(), plain], "group", seq_len=4)
    assert all(len(s.teacher.ids) == 4 for s in sequences if s.teacher is not None)
    (chunk,) = micro_batches(sequences, 1, pad_id=0)
    covered = torch.isfinite(chunk.teacher.logprobs).any(-1)
    # equal lengths keep their order: the teacher's group first
    assert [bool(row.any()) for row in covered] == [True, True, False, False]


def tensors(mode="reverse_kl"):
    """One row: the student's logits over 4 tokens at 3 label positions, 2 trained."""
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 4, requires_grad=True)
    labels = torch.tensor([[1, 2, 0]])
    trained = torch.tensor([[False, True, True]])
    teacher = TeacherTopK(
        torch.tensor([[[1, 0], [2, 3], [3, 1]]]),
        torch.tensor([[[-0.1, -2.0], [-1.2, -0.4], [-0.3, -1.5]]]),
    )
    return logits, labels, trained, teacher


def test_reverse_kl_is_the_sampled_tokens_log_ratio_as_a_per_token_reward():
    logits, labels, trained, teacher = tensors()
    logp = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    per_token, k1, covered = distill_per_token(
        "reverse_kl", logp, teacher.ids, teacher.logprobs, labels, trained
    )
    # position 2's label (0) is not in the teacher's list: not covered; position 0 untrained
    assert covered.tolist() == [[False, True, False]]
    assert k1[0, 1].item() == pytest.approx(logp[0, 1].item() + 1.2)
    per_token.sum().backward()
    expected = torch.zeros_like(logits)
    probs = torch.softmax(logits.detach()[0, 1], -1)
    expected[0, 1] = k1[0, 1] * (torch.nn.functional.one_hot(labels[0, 1], 4) - probs)
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_forward_topk_is_the_kl_over_the_listed_ids_and_the_rest():
    logits, labels, trained, teacher = tensors()
    every = torch.log_softmax(logits, -1)
    logp = every.gather(-1, labels[..., None]).squeeze(-1)
    student_topk = every.gather(-1, teacher.ids)
    per_token, kl, covered = distill_per_token(
        "forward_topk", logp, teacher.ids, teacher.logprobs, labels, trained, student_topk
    )
    assert covered.tolist() == [[False, True, True]]
    p, q = teacher.logprobs[0, 2].exp(), student_topk[0, 2].detach().exp()
    by_hand = (p * (p / q).log()).sum() + (1 - p.sum()) * ((1 - p.sum()) / (1 - q.sum())).log()
    assert kl[0, 2].item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert kl[0, 0].item() == 0.0 and (kl >= 0).all()
    # the student equal to the teacher on its list and the rest: no KL, no gradient
    same = teacher.logprobs.clone().requires_grad_(True)
    at_teacher, _, _ = distill_per_token(
        "forward_topk", logp, teacher.ids, teacher.logprobs, labels, trained, same
    )
    at_teacher.sum().backward()
    assert at_teacher.abs().max() < 1e-6 and same.grad.abs().max() < 1e-5


def test_forward_topk_with_the_sampled_token_alone_pulls_it_both_ways():
    """top_k 0: one listed id. The term is that token's Bernoulli KL, so a student more
    sure of it than the teacher is pushed down, not up (no self-imitation)."""
    labels, trained = torch.tensor([[1]]), torch.tensor([[True]])
    ids, teacher = torch.tensor([[[1]]]), torch.log(torch.tensor([[[0.3]]]))
    for student_p, direction in ((0.9, -1), (0.1, 1)):
        student = torch.log(torch.tensor([[[student_p]]])).requires_grad_(True)
        loss, _, _ = distill_per_token(
            "forward_topk", student[..., 0], ids, teacher, labels, trained, student
        )
        loss.sum().backward()
        assert torch.sign(-student.grad).item() == direction  # descent moves it this way


@pytest.mark.parametrize("mode", ["reverse_kl", "forward_topk"])
def test_descending_the_term_brings_the_student_to_the_teacher(mode):
    """A free student distribution, sampled on policy, follows the term's gradient to a
    teacher that puts 0.9 on token 2: the KL between them falls by an order of magnitude."""
    generator = torch.Generator().manual_seed(1)
    teacher_log = torch.log(torch.tensor([0.04, 0.03, 0.9, 0.03]))
    logits = torch.zeros(4, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=0.5)

    def kl_to_teacher() -> float:
        student = torch.log_softmax(logits.detach(), -1)
        return float((student.exp() * (student - teacher_log)).sum())

    before = kl_to_teacher()
    for _ in range(150):
        samples = torch.multinomial(
            torch.softmax(logits.detach(), -1), 32, True, generator=generator
        )
        every = torch.log_softmax(logits, -1).expand(1, 32, 4)
        labels = samples[None]
        ids = torch.arange(4).expand(1, 32, 4)
        teacher = teacher_log.expand(1, 32, 4)
        logp = every.gather(-1, labels[..., None]).squeeze(-1)
        per_token, _, _ = distill_per_token(
            mode, logp, ids, teacher, labels, torch.ones(1, 32, dtype=torch.bool), every
        )
        optimizer.zero_grad()
        per_token.mean().backward()
        optimizer.step()
    assert kl_to_teacher() < before / 10, (before, kl_to_teacher())


def loss_of(settings, advantages, logits, labels, trained, teacher, student_topk=None):
    logp = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    return policy_loss(
        logp,
        logp.detach(),
        advantages,
        trained,
        settings,
        total_tokens=int(trained.sum()),
        total_sequences=1,
        teacher=teacher,
        labels=labels,
        student_topk=student_topk,
    )


def test_pure_distillation_trains_with_zero_advantages_and_a_zero_coef_only_reports():
    logits, labels, trained, teacher = tensors()
    zero = torch.zeros(1, 3)
    loss, metrics = loss_of(LossSettings(distill_coef=0.5), zero, logits, labels, trained, teacher)
    loss.backward()
    assert logits.grad.abs().sum() > 0, "zero rewards still learn from the teacher"
    assert metrics["distill_positions"] == 1.0
    logp = torch.log_softmax(logits.detach(), -1)[0, 1, 2].item()
    k1 = logp + 1.2  # the teacher's -1.2 for token 2 at position 1
    assert metrics["distill_kl_sum"] == pytest.approx(k1, rel=1e-5)
    # dapo's normaliser: over the 2 trained tokens
    assert metrics["distill_loss"] == pytest.approx(k1 * logp / 2, rel=1e-5)
    logits.grad = None
    loss, metrics = loss_of(LossSettings(distill_coef=0.0), zero, logits, labels, trained, teacher)
    loss.backward()
    assert logits.grad.abs().sum() == 0, "coef 0: no distillation gradient"
    assert "distill_kl_sum" in metrics, "the KL to the teacher is still reported"


def test_the_step_reports_kl_per_covered_position_and_the_covered_share():
    joined = {"loss": 1.0, "distill_loss": 0.3, "distill_kl_sum": 6.0, "distill_positions": 12.0}
    out = StepMetrics.finished(joined, total_tokens=16)
    assert out == {"loss": 1.0, "distill_loss": 0.3, "distill_kl": 0.5, "distill_coverage": 0.75}
    none = StepMetrics.finished({"loss": 1.0, "distill_positions": 0.0}, total_tokens=16)
    assert none == {"loss": 1.0}, "no teacher: no distillation figures"
