"""The per-row, counter-based sampler (pure tensor code; the real models use it in test_engine)."""

from __future__ import annotations

import torch

from wyoming_qwen3tts.engine.batched.sampling import CANDIDATES, RowParams, effective, gumbel, penalise, sample, uniform


def params(n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> RowParams:
    k, p = effective(top_k, top_p)
    return RowParams(torch.full((n,), temperature), torch.full((n,), k, dtype=torch.int64), torch.full((n,), p))


def noise(seeds: torch.Tensor, counter: int = 0) -> torch.Tensor:
    return gumbel(seeds, torch.full((len(seeds), 1), counter), torch.zeros(1, dtype=torch.int64))[:, 0]


def test_uniforms_are_a_function_of_seed_counter_and_stream_only() -> None:
    seed = torch.tensor([5, 6, 5], dtype=torch.int64)
    frame = torch.zeros(3, 2, dtype=torch.int64)
    streams = torch.tensor([0, 3])
    u = uniform(seed, frame, streams, 8)
    assert u.shape == (3, 2, 8)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert not torch.equal(u[0, 0], u[0, 1])  # another draw of the same frame
    assert torch.equal(u[:1], uniform(seed[:1], frame[:1], streams, 8))  # the batch does not matter
    assert not torch.equal(u[0, 0], uniform(seed[:1], frame[:1] + 1, streams, 8)[0, 0])
    big = uniform(torch.full((1,), 2**62 + 12345), torch.tensor([[7]]), torch.tensor([1]), 4096)
    assert 0.0 < float(big.min()) and float(big.max()) < 1.0
    assert abs(float(big.mean()) - 0.5) < 0.03


def test_draws_follow_the_softmax() -> None:
    n = 6000
    logits = torch.full((n, 100), float("-inf"))
    logits[:, :3] = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    drawn = sample(logits, params(n), noise(torch.arange(n)))
    share = torch.bincount(drawn, minlength=4).float()[:4] / n
    assert torch.allclose(share, torch.tensor([0.6, 0.3, 0.1, 0.0]), atol=0.025)


def test_per_row_greedy_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-6] * 96))[None].expand(4, 100).clone()
    rows = [effective(0, 1.0), effective(1, 1.0), effective(2, 1.0), effective(0, 0.5)]
    p = RowParams(
        torch.tensor([0.0, 1.0, 1.0, 1.0]),  # row 0 greedy
        torch.tensor([k for k, _ in rows]),  # row 1: top-1 (always id 0); row 2: top-2
        torch.tensor([q for _, q in rows]),  # row 3: nucleus 0.5 keeps ids 0 and 1
    )
    seen = set()
    for seed in range(300):
        drawn = sample(logits, p, noise(torch.full((4,), seed)))
        assert drawn[0] == 0 and drawn[1] == 0 and drawn[2] in (0, 1) and drawn[3] in (0, 1)
        seen.add(int(drawn[2]))
    assert seen == {0, 1}


def test_top_k_beyond_the_candidates_is_capped() -> None:
    assert effective(0, 1.0) == (CANDIDATES, 2.0)
    assert effective(500, 0.9) == (CANDIDATES, 0.9)
    assert effective(50, 1.0) == (50, 2.0)


def test_repetition_penalty_per_row() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False], [True, True, False]])
    out = penalise(logits, seen, torch.tensor([2.0, 1.0]))
    assert torch.equal(out[0], torch.tensor([1.0, -4.0, 1.0])) and torch.equal(out[1], logits[1])
