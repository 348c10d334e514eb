"""The per-row, counter-based sampler (pure tensor code; the real models use it in test_engine)."""

from __future__ import annotations

import torch

from wyoming_qwen3tts.engine.sampling import RowParams, penalise, sample, uniform


def params(n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> RowParams:
    return RowParams(
        torch.full((n,), temperature), torch.full((n,), top_k, dtype=torch.int64), torch.full((n,), top_p)
    )


def test_uniforms_are_a_function_of_seed_counter_and_stream_only() -> None:
    seed = torch.tensor([5, 6, 5], dtype=torch.int64)
    frame = torch.tensor([0, 0, 0], dtype=torch.int64)
    u = uniform(seed, frame, 0, 8)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert torch.equal(u[:1], uniform(seed[:1], frame[:1], 0, 8))  # batch does not matter
    assert not torch.equal(u[0], uniform(seed[:1], frame[:1] + 1, 0, 8)[0])
    assert not torch.equal(u[0], uniform(seed[:1], frame[:1], 3, 8)[0])
    big = uniform(torch.full((1,), 2**62 + 12345), torch.tensor([7]), 1, 4096)
    assert 0.0 < float(big.min()) and float(big.max()) < 1.0
    assert abs(float(big.mean()) - 0.5) < 0.03


def test_draws_follow_the_softmax() -> None:
    n = 6000
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1, 1e-9]])).expand(n, 4)
    drawn = sample(logits, params(n), torch.arange(n), torch.zeros(n, dtype=torch.int64), 0)
    share = torch.bincount(drawn, minlength=4).float() / n
    assert torch.allclose(share, torch.tensor([0.6, 0.3, 0.1, 0.0]), atol=0.025)


def test_per_row_greedy_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))[None].expand(4, 4).clone()
    p = RowParams(
        torch.tensor([0.0, 1.0, 1.0, 1.0]),  # row 0 greedy
        torch.tensor([0, 1, 2, 0]),  # row 1: top-1 (always id 0); row 2: top-2
        torch.tensor([1.0, 1.0, 1.0, 0.5]),  # row 3: nucleus 0.5 keeps ids 0 and 1
    )
    for seed in range(200):
        drawn = sample(logits, p, torch.full((4,), seed), torch.zeros(4, dtype=torch.int64), 0)
        assert drawn[0] == 0 and drawn[1] == 0 and drawn[2] in (0, 1) and drawn[3] in (0, 1)


def test_repetition_penalty_per_row() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False], [True, True, False]])
    out = penalise(logits, seen, torch.tensor([2.0, 1.0]))
    assert torch.equal(out[0], torch.tensor([1.0, -4.0, 1.0])) and torch.equal(out[1], logits[1])
