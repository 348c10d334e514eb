"""The three computations of a frame, as ggml graphs: the talker (prefill, then one position
a frame against its key/value cache), the code predictor's 15 passes, and the text
projection of prompt tokens.

What each computes is qwen_tts's (``Qwen3TTSTalkerForConditionalGeneration.forward`` and
its code predictor's ``generate``), in float32 activations:

* talker: the layers over the input embeddings, the final RMSNorm of the last position
  (the "past hidden" the predictor starts from) and the codec head's logits of it. A decode
  step's input is the frame's 16 code embeddings summed (the talker's codec table for code
  0, the predictor's table ``i - 1`` for code ``i``) plus the text embedding of the step
  (``tts_pad`` once the whole text is in the prompt);
* code predictor, pass 0: [past hidden, talker codec embedding of code 0] at positions 0, 1;
  pass ``s`` (1..14): the predictor's table ``s - 1`` embedding of code ``s`` at position
  ``s + 1``; each through the input projection (``small_to_mtp_projection``, absent where
  the widths match, as at 0.6B), the layers, the final norm and head ``s``: the logits of
  code ``s + 1``;
* text projection: ``fc2(silu(fc1(x)))`` with biases.

The predictor's 15 graphs have the same shapes every frame: they are built once and run
again with new inputs. The talker's decode graph grows by a position a frame and is built
for each step (about 30 nodes a layer).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .api import F32, I32
from .blocks import Stacked
from .runtime import Allocator, Backend, Graph, KvCache
from .weights import TalkerFile, Weights


#: Positions the talker's cache grows by beyond what a call needs (or it doubles, if more).
CACHE_STEP = 128


class Talker:
    """The talker stack on its key/value cache: ``start``, ``prefill``, then ``step`` a frame.

    Not thread-safe: one generation at a time.
    """

    def __init__(self, backend: Backend, weights: Weights, file: TalkerFile) -> None:
        self.backend, self.ggml = backend, backend.ggml
        self.stack = file.talker
        self.blocks = Stacked(self.ggml, weights, "talker", file.talker)
        self.head = weights.tensor("talker.codec_head.weight")
        self.tables = [weights.tensor("talker.codec_embd.weight")] + [
            weights.tensor(f"code_pred.codec_embd.{i}.weight") for i in range(file.groups - 1)
        ]
        self.allocator = Allocator(backend)
        self.cache: KvCache | None = None
        #: Positions in the cache (prompt and frames so far), and the most this generation may use.
        self.length = 0
        self.limit = 0

    def start(self, limit: int) -> None:
        """Begin a generation of at most ``limit`` positions (prompt + frames). The cache is
        kept from the last generation and grows as positions come (``_room``), never past
        the limit: a segment that ends early does not hold memory for its whole cap."""
        self.length, self.limit = 0, limit

    def _room(self, n: int) -> KvCache:
        """A cache with room for ``n`` positions: the current one, or a larger one (at least
        ``CACHE_STEP`` more positions, or twice as many) with the current positions copied in.

        Raises:
            ValueError: ``n`` exceeds the generation's limit.
        """
        if n > self.limit:
            raise ValueError(f"{n} positions exceed this generation's {self.limit}")
        old = self.cache
        if old is not None and old.capacity >= n:
            return old
        capacity = min(self.limit, max(n + CACHE_STEP, 2 * (old.capacity if old is not None else 0)))
        new = KvCache(self.backend, self.stack.layers, self.stack.kv_heads * self.stack.head_dim, capacity)
        if old is not None:
            if self.length:
                self._copy(old, new, self.length)
            old.close()
        self.cache = new
        return new

    def _copy(self, old: KvCache, new: KvCache, n: int) -> None:
        """Copy positions 0 .. n - 1 of every layer from ``old`` into ``new`` (one graph)."""
        ggml, width = self.ggml, old.width
        g = Graph(ggml, nodes=8 * self.stack.layers)
        allocator = Allocator(self.backend)
        try:
            for i in range(self.stack.layers):
                g.expand(ggml.ggml_cpy(g.ctx, ggml.ggml_view_1d(g.ctx, old.keys[i], width * n, 0),
                                       ggml.ggml_view_1d(g.ctx, new.keys[i], width * n, 0)))
                g.expand(ggml.ggml_cpy(g.ctx, ggml.ggml_view_2d(g.ctx, old.values[i], n, width, old.capacity * 4, 0),
                                       ggml.ggml_view_2d(g.ctx, new.values[i], n, width, new.capacity * 4, 0)))
            g.allocate(allocator)
            self.backend.compute(g.graph)
        finally:
            g.close()
            allocator.close()

    def prefill(self, embeds: np.ndarray, stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Run the prompt: ``embeds`` float32 [P, hidden]. Returns (past hidden float32
        [hidden], codec logits float32 [vocab]) of its last position, or None when ``stop()``
        turned true meanwhile (asked between the graph's nodes: a prefill of a long prompt
        takes a second or more on a CPU core).

        Raises:
            ValueError: the prompt exceeds the limit ``start`` set.
        """
        p = len(embeds)
        g = Graph(self.ggml)
        try:
            x = g.input(F32, self.stack.hidden, p)
            return self._run(g, x, [(x, embeds.astype(np.float32, copy=False))], p, stop)
        finally:
            g.close()

    def step(self, codes: np.ndarray, text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One frame: ``codes`` int [16] (the frame just made), ``text`` float32 [hidden] (the
        step's text embedding). Returns (past hidden [hidden], codec logits [vocab]).

        Raises:
            ValueError: the generation's position limit is reached.
        """
        g = Graph(self.ggml)
        try:
            ggml, ctx = self.ggml, g.ctx
            ids = g.input(I32, len(self.tables))
            txt = g.input(F32, self.stack.hidden, 1)
            x = txt
            for i, table in enumerate(self.tables):
                x = ggml.ggml_add(ctx, x, ggml.ggml_get_rows(ctx, table, ggml.ggml_view_1d(ctx, ids, 1, 4 * i)))
            out = self._run(g, x, [(ids, np.asarray(codes, dtype=np.int32)), (txt, text)], 1)
            assert out is not None
            return out
        finally:
            g.close()

    def _run(self, g: Graph, x: int, inputs: list[tuple[int, np.ndarray]], t: int,
             stop: Callable[[], bool] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Build the layers, norm and head over ``x`` [hidden, t] in ``g``, then set
        ``inputs`` (tensor, values), run, and move the cache on by ``t`` positions (None,
        and the cache not moved on, if ``stop`` ended the graph)."""
        cache = self._room(self.length + t)
        positions = g.input(I32, t)
        y = self.blocks.forward(g, x, positions, cache, self.length, t)
        hidden = g.output(self.blocks.last_normed(g, y, t))
        logits = g.output(self.blocks.linear(g, self.head, hidden))
        g.allocate(self.allocator)
        for tensor, data in inputs:
            g.set(tensor, data)
        g.set(positions, np.arange(self.length, self.length + t, dtype=np.int32))
        if not self.backend.compute(g.graph, stop):
            return None
        self.length += t
        return g.get(hidden, (self.stack.hidden,)), g.get(logits, (self.stack.vocab,))

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        self.allocator.close()


class _Pass:
    """One predictor pass's graph, kept: its inputs and outputs and its own allocator."""

    def __init__(self, graph: Graph, allocator: Allocator, inputs: dict[str, int], logits: int) -> None:
        self.graph, self.allocator, self.inputs, self.logits = graph, allocator, inputs, logits


class Predictor:
    """The code predictor's 15 passes of a frame (graphs built once, on a 16-position cache).

    Not thread-safe: one generation at a time.
    """

    def __init__(self, backend: Backend, weights: Weights, file: TalkerFile) -> None:
        self.backend, self.ggml = backend, backend.ggml
        self.stack = file.predictor
        self.talker_hidden = file.talker.hidden
        self.blocks = Stacked(self.ggml, weights, "code_pred", file.predictor)
        self.steps = file.groups - 1
        self.cache = KvCache(backend, self.stack.layers, self.stack.kv_heads * self.stack.head_dim, self.steps + 1)
        has_proj = weights.has("code_pred.mtp_proj.weight")
        self._proj = (weights.tensor("code_pred.mtp_proj.weight"), weights.tensor("code_pred.mtp_proj.bias")) if has_proj else None
        self._first_table = weights.tensor("talker.codec_embd.weight")
        self._tables = [weights.tensor(f"code_pred.codec_embd.{i}.weight") for i in range(self.steps)]
        self._heads = [weights.tensor(f"code_pred.lm_head.{i}.weight") for i in range(self.steps)]
        self._passes = [self._build(s) for s in range(self.steps)]

    def _build(self, s: int) -> _Pass:
        ggml = self.ggml
        g = Graph(self.ggml, nodes=512)
        ctx = g.ctx
        code = g.input(I32, 1)
        inputs = {"code": code}
        if s == 0:
            past = g.input(F32, self.talker_hidden, 1)
            inputs["past"] = past
            x = ggml.ggml_concat(ctx, past, ggml.ggml_get_rows(ctx, self._first_table, code), 1)
            p0, t = 0, 2
        else:
            x = ggml.ggml_get_rows(ctx, self._tables[s - 1], code)
            p0, t = s + 1, 1
        if self._proj is not None:
            x = self.blocks.linear(g, self._proj[0], x, self._proj[1])
        positions = g.input(I32, t)
        inputs["positions"] = positions
        y = self.blocks.forward(g, x, positions, self.cache, p0, t)
        logits = g.output(self.blocks.linear(g, self._heads[s], self.blocks.last_normed(g, y, t)))
        allocator = Allocator(self.backend)
        g.allocate(allocator)
        return _Pass(g, allocator, inputs, logits)

    def run(self, s: int, code: int, past: np.ndarray | None = None) -> np.ndarray:
        """Pass ``s`` (0..14): logits float32 [vocab] of code ``s + 1``. ``code``: code ``s``
        of the frame (the first code for pass 0); ``past``: the talker's past hidden float32
        [talker hidden], for pass 0 only. Passes run in order 0, 1, ... within a frame."""
        p = self._passes[s]
        g = p.graph
        g.set(p.inputs["code"], np.array([code], dtype=np.int32))
        if s == 0:
            assert past is not None
            g.set(p.inputs["past"], past.astype(np.float32, copy=False))
            g.set(p.inputs["positions"], np.array([0, 1], dtype=np.int32))
        else:
            g.set(p.inputs["positions"], np.array([s + 1], dtype=np.int32))
        self.backend.compute(g.graph)
        return g.get(p.logits, (self.stack.vocab,))

    def close(self) -> None:
        for p in self._passes:
            p.graph.close()
            p.allocator.close()
        self._passes = []
        self.cache.close()


class TextProjection:
    """``fc2(silu(fc1(x) + b1)) + b2`` of text embeddings, on the weights in the buffer."""

    def __init__(self, backend: Backend, weights: Weights, text_hidden: int, hidden: int) -> None:
        self.backend, self.ggml = backend, backend.ggml
        self.text_hidden, self.hidden = text_hidden, hidden
        self._w = [weights.tensor(f"talker.text_proj.fc{i}.{p}") for i in (1, 2) for p in ("weight", "bias")]
        self.allocator = Allocator(backend)

    def __call__(self, embeds: np.ndarray) -> np.ndarray:
        """``embeds`` float32 [n, text_hidden] -> float32 [n, hidden]."""
        n = len(embeds)
        if n == 0:
            return np.zeros((0, self.hidden), dtype=np.float32)
        ggml = self.ggml
        g = Graph(ggml, nodes=64)
        try:
            x = g.input(F32, self.text_hidden, n)
            w1, b1, w2, b2 = self._w
            h = ggml.ggml_silu(g.ctx, ggml.ggml_add(g.ctx, ggml.ggml_mul_mat(g.ctx, w1, x), b1))
            y = g.output(ggml.ggml_add(g.ctx, ggml.ggml_mul_mat(g.ctx, w2, h), b2))
            g.allocate(self.allocator)
            g.set(x, embeds.astype(np.float32, copy=False))
            self.backend.compute(g.graph)
            return g.get(y, (n, self.hidden))
        finally:
            g.close()

    def close(self) -> None:
        self.allocator.close()
