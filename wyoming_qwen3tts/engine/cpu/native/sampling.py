"""Token sampling for one generation, in numpy: the batched engine's sampler
(``engine.batched.sampling``) for a single row, without torch.

Order, as there (and as faster-qwen3-tts / transformers): suppress -> repetition penalty ->
temperature -> top-k -> top-p -> draw, the draw being Gumbel-max over the ``CANDIDATES`` most
likely ids. The random numbers are the same counter-based hash of (seed, frame index, draw)
as the batched engine's (``uniform``): a seed replays the same codes, whatever else runs,
and the talker's draw of frame ``f`` is (counter ``f``, stream 0), code ``s + 1``'s draw of
frame ``f`` is (counter ``f``, stream ``s + 1``), as ``batched.step`` draws them.
"""

from __future__ import annotations

import numpy as np

from ...segment import Sampling

#: The batched sampler's candidate count (``batched.sampling.CANDIDATES``).
CANDIDATES = 64
_M32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """Chris Wellons' "lowbias32" on uint64 arrays < 2**32 (``batched.sampling._mix32``)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _M32
    return x ^ (x >> np.uint64(16))


def uniform(seed: int, counter: int, stream: int, n: int = CANDIDATES) -> np.ndarray:
    """Counter-based uniforms float32 [n] in (0, 1): ``batched.sampling.uniform`` for one row
    and one draw (seed: 0 .. 2**63 - 1, its low 62 bits used)."""
    with np.errstate(over="ignore"):
        s_lo = np.uint64(seed & 0xFFFFFFFF)
        s_hi = np.uint64((seed >> 32) & 0x3FFFFFFF)
        inner = _mix32(np.array([stream + 0x632BE5AB], dtype=np.uint64) & _M32)
        key = _mix32(s_lo ^ _mix32(s_hi ^ _mix32((np.uint64(counter) & _M32) ^ inner)))
        rank = np.arange(n, dtype=np.uint64)
        bits = _mix32(_mix32(key ^ rank) ^ np.uint64(0x9E3779B9))
    return (((bits >> np.uint64(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / (1 << 24))).astype(np.float32)


def gumbel(seed: int, counter: int, stream: int) -> np.ndarray:
    """Gumbel noise float32 [CANDIDATES] for one draw."""
    return -np.log(-np.log(uniform(seed, counter, stream)))


def pick(logits: np.ndarray, temperature: float, top_k: int, top_p: float, noise: np.ndarray) -> int:
    """One id from ``logits`` float32 [V] (already suppressed / penalised; -inf = never):
    argmax when ``temperature`` is 0, else a draw among the top-k (0: ``CANDIDATES``) ids
    within mass ``top_p`` (1: off) of ``softmax(logits / temperature)``."""
    if temperature <= 0:
        return int(np.argmax(logits))
    k = top_k if 0 < top_k <= CANDIDATES else CANDIDATES
    p = top_p if top_p < 1.0 else 2.0
    scaled = logits.astype(np.float32) / np.float32(max(temperature, 1e-5))
    n = min(CANDIDATES, len(scaled))
    ids = np.argpartition(-scaled, n - 1)[:n]
    ids = ids[np.argsort(-scaled[ids], kind="stable")]
    top = scaled[ids].copy()
    rank = np.arange(n)
    top[rank >= k] = -np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(top - top[0])
        mass = np.cumsum(weights / weights.sum())
    top[(mass > p) & (rank > 0)] = -np.inf
    return int(ids[int(np.argmax(top + noise[:n]))])


class FrameSampler:
    """The draws of one generation: the first codebook (talker) and codebooks 2..16
    (code predictor), frame by frame.

    Args:
        sampling: the segment's settings.
        seed: the request's seed (0 .. 2**63 - 1).
        vocab: talker vocabulary size; eos: the codec EOS id. As qwen_tts, the talker never
            picks the last 1024 ids of its vocabulary (control ids) except EOS.
    """

    def __init__(self, sampling: Sampling, seed: int, vocab: int, eos: int) -> None:
        self.sampling, self.seed, self.eos = sampling, seed, eos
        self._suppressed = np.zeros(vocab, dtype=bool)
        self._suppressed[vocab - 1024 :] = True
        self._suppressed[eos] = False
        self._seen = np.zeros(vocab, dtype=bool)

    def first(self, logits: np.ndarray, frame: int, allow_eos: bool) -> int:
        """Frame ``frame``'s first code from the talker's logits float32 [vocab]: repetition
        penalty on the first codes generated so far, suppressed ids, EOS held back unless
        ``allow_eos``. The pick joins the penalty's history."""
        s = self.sampling
        logits = logits.astype(np.float32, copy=True)
        if s.repetition_penalty != 1.0:
            seen = self._seen
            penalty = np.float32(s.repetition_penalty)
            logits[seen] = np.where(logits[seen] > 0, logits[seen] / penalty, logits[seen] * penalty)
        logits[self._suppressed] = -np.inf
        if not allow_eos:
            logits[self.eos] = -np.inf
        noise = gumbel(self.seed, frame, 0) if s.temperature > 0 else np.zeros(CANDIDATES, np.float32)
        code = pick(logits, s.temperature, s.top_k, s.top_p, noise)
        self._seen[code] = True
        return code

    def rest(self, logits: np.ndarray, frame: int, group: int) -> int:
        """Code ``group`` (1..15) of frame ``frame`` from the predictor's logits [2048]."""
        s = self.sampling
        noise = gumbel(self.seed, frame, group) if s.predictor_temperature > 0 else np.zeros(CANDIDATES, np.float32)
        return pick(logits, s.predictor_temperature, s.predictor_top_k, s.predictor_top_p, noise)
