"""The batched frame step: every active row advances by one codec frame.

For rows ``[0, B)`` of the slot pool, one step does what faster-qwen3-tts's streaming loop
does for one stream, in the same order:

1. the code predictor turns (the talker's last hidden state, the frame's first-codebook
   token) into the other 15 codebooks (2-token prefill, then 14 single-token steps);
2. the 16 codes are the frame: they are decoded into 1920 PCM samples (``codec``);
3. the sum of the 16 codes' embeddings plus the ``tts_pad`` text embedding is the talker's
   next input; the talker runs one position (each row at its own position, with its own
   attention mask, over its own KV region);
4. the first codebook of the next frame is sampled (repetition penalty, suppressed control
   ids, EOS held back until ``min_new_tokens``), and whether it is EOS is flagged.

All of it reads and writes static per-slot buffers, so one step for a batch bucket can be
captured as one CUDA graph. The talker attends to the first ``length`` positions only
(a length bucket), so short streams do not pay for the whole cache.

On CUDA the layers run as Triton kernels (``FusedLayer.fast``, ``kernels``): each row's
attention reads its own filled positions only, and each draw is one sampler kernel with the
eager sampler's draws. ``QWEN3TTS_KERNELS=eager`` keeps the eager PyTorch path (the CPU's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import kernels
from .kernels.weight import Weight, use_fused
from .layers import FusedLayer, attention_mask, rope_tables, write_rows
from .sampling import RowParams, effective, gumbel, penalise, sample

#: Positions of the code predictor's sequence: the talker state, the first codebook, then
#: 14 more codebooks (faster-qwen3-tts's PredictorGraph uses the same 17).
PREDICTOR_POSITIONS = 17
#: Talker ids from ``vocab_size - 1024`` up are control ids; all but EOS are never sampled
#: (faster-qwen3-tts 0.5.4 ``fast_generate_streaming``; qwen_tts does the same).
SUPPRESSED_BAND = 1024


class SlotState:
    """Per-slot tensors of one model's pool (first dimension: the slot).

    Args:
        talker: the loaded talker (``Qwen3TTSTalkerForConditionalGeneration``).
        slots: pool size.
        max_len: talker KV positions per slot (prompt + generated frames).
    """

    def __init__(self, talker: Any, slots: int, max_len: int) -> None:
        config = talker.config
        param = next(talker.parameters())
        device, dtype = param.device, param.dtype
        self.slots, self.max_len = slots, max_len
        attn = talker.model.layers[0].self_attn
        shape = (slots, config.num_key_value_heads, max_len, attn.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in talker.model.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in talker.model.layers]

        def longs() -> torch.Tensor:
            return torch.zeros(slots, dtype=torch.int64, device=device)

        def floats(value: float) -> torch.Tensor:
            return torch.full((slots,), value, dtype=torch.float32, device=device)

        #: Talker positions filled (prompt + frames so far); the next token goes here.
        self.position = longs()
        #: Index of the frame whose first-codebook token is in ``token``.
        self.frame = longs()
        self.token = longs()
        self.seed = longs()
        self.min_new_tokens = longs()
        self.past_hidden = torch.zeros(slots, config.hidden_size, dtype=dtype, device=device)
        self.seen = torch.zeros(slots, config.vocab_size, dtype=torch.bool, device=device)
        self.temperature, self.top_k, self.top_p = floats(0.9), longs(), floats(2.0)
        self.penalty = floats(1.0)
        self.pred_temperature, self.pred_top_k, self.pred_top_p = floats(0.9), longs(), floats(2.0)
        #: Outputs of the last step: the frame's 16 codes, and whether the next token is EOS.
        self.codes = torch.zeros(slots, config.num_code_groups, dtype=torch.int64, device=device)
        self.eos = torch.zeros(slots, dtype=torch.bool, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor (for moving a row)."""
        return [*self.keys, *self.values, *(v for v in vars(self).values() if isinstance(v, torch.Tensor))]

    def set_sampling_rows(self, start: int, samplings: list[Any]) -> None:
        """Store the ``Sampling`` of rows ``[start, start + n)`` (top-k/top-p as
        ``sampling.effective`` makes them) with one host-to-device copy per dtype and one slice
        copy per setting, whatever ``n`` (running streams wait for every kernel of a join).
        The host tensors are pinned on CUDA so that the copy does not wait for the step in
        flight."""
        n = len(samplings)
        talker = [effective(x.top_k, x.top_p) for x in samplings]
        predictor = [effective(x.predictor_top_k, x.predictor_top_p) for x in samplings]
        floats = torch.tensor(
            [[x.temperature for x in samplings], [p for _, p in talker], [x.repetition_penalty for x in samplings],
             [x.predictor_temperature for x in samplings], [p for _, p in predictor]],
            dtype=torch.float32,
        )
        longs = torch.tensor([[k for k, _ in talker], [k for k, _ in predictor]], dtype=torch.int64)
        if self.temperature.is_cuda:
            floats, longs = floats.pin_memory(), longs.pin_memory()
        floats = floats.to(self.temperature.device, non_blocking=True)
        longs = longs.to(self.temperature.device, non_blocking=True)
        rows = slice(start, start + n)
        for tensor, value in zip(
            (self.temperature, self.top_p, self.penalty, self.pred_temperature, self.pred_top_p), floats, strict=True
        ):
            tensor[rows].copy_(value)
        self.top_k[rows].copy_(longs[0])
        self.pred_top_k[rows].copy_(longs[1])

    def move_row(self, src: int, dst: int) -> None:
        """Slot ``src``'s tensors into slot ``dst`` (compaction), as one multi-tensor copy."""
        tensors = self.tensors()
        torch._foreach_copy_([t[dst] for t in tensors], [t[src] for t in tensors])

    def talker_params(self, b: int) -> RowParams:
        return RowParams(self.temperature[:b], self.top_k[:b], self.top_p[:b])

    def predictor_params(self, b: int) -> RowParams:
        return RowParams(self.pred_temperature[:b], self.pred_top_k[:b], self.pred_top_p[:b])


class FrameStep:
    """The talker + code predictor step over a slot pool, and the first-token sampler.

    Args:
        talker: the loaded talker module (weights are used in place, never copied).
        state: the pool's slot tensors.
        pad_embed: the ``tts_pad`` text embedding added to every generated frame's input,
            [hidden] (``_build_talker_inputs_local``'s ``tts_pad_embed``).
    """

    def __init__(self, talker: Any, state: SlotState, pad_embed: torch.Tensor) -> None:
        self.talker = talker
        self.state = state
        self.pad_embed = pad_embed.reshape(-1)
        config = talker.config
        self.eos_id = int(config.codec_eos_token_id)
        vocab = int(config.vocab_size)
        device = state.token.device
        band = torch.zeros(vocab, dtype=torch.bool, device=device)
        band[max(0, vocab - SUPPRESSED_BAND) :] = True
        band[self.eos_id] = False
        self.suppressed = band
        self.is_eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.is_eos[self.eos_id] = True
        predictor = talker.code_predictor
        self.predictor = predictor
        self.groups = int(config.num_code_groups)
        self.talker_layers = [FusedLayer(layer) for layer in talker.model.layers]
        self.pred_layers = [FusedLayer(layer) for layer in predictor.model.layers]
        # The 15 codebook embeddings as one table (the modules' weights become views into it),
        # so a frame's embeddings are one gather.
        tables = list(predictor.model.codec_embedding)
        self.code_vocab = int(tables[0].num_embeddings)
        stacked = torch.cat([t.weight.data for t in tables])
        for i, t in enumerate(tables):
            t.weight = torch.nn.Parameter(stacked[i * self.code_vocab : (i + 1) * self.code_vocab], requires_grad=False)
        self.code_table = stacked
        self.code_offsets = torch.arange(len(tables), device=device) * self.code_vocab
        self.lm_heads = [head.weight for head in predictor.lm_head]
        #: The same heads, and the talker-to-predictor projection (None: an identity), for
        #: ``kernels.linear``.
        self.lm_head_weights = [Weight(w) for w in self.lm_heads]
        self.projection = Weight.of(predictor.small_to_mtp_projection)
        pred_cfg = predictor.model.config
        dtype = state.keys[0].dtype
        self.pred_keys = [
            torch.zeros(state.slots, pred_cfg.num_key_value_heads, PREDICTOR_POSITIONS,
                        self.pred_layers[0].head_dim, dtype=dtype, device=device)
            for _ in predictor.model.layers
        ]
        self.pred_values = [torch.zeros_like(k) for k in self.pred_keys]
        # Everything of the predictor's 15 steps that does not depend on the rows: positions,
        # rotary tables and masks (broadcast over the batch).
        keys_at = torch.arange(PREDICTOR_POSITIONS, device=device)
        probe = torch.zeros(1, dtype=dtype, device=device)
        self.pred_steps: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for step in range(self.groups - 1):
            start, n = (0, 2) if step == 0 else (step + 1, 1)
            where = torch.arange(start, start + n, device=device)
            cos, sin = rope_tables(*predictor.model.rotary_emb(probe, where[None, :]))
            allowed = (keys_at[None, :] <= where[:, None])[None]
            mask = attention_mask(allowed, self.pred_layers[0].group, dtype)
            self.pred_steps.append((start, n, cos, sin, mask))
        #: Draws per frame: the next talker token (stream 0), then codebooks 2..16.
        self.streams = torch.arange(self.groups, device=device)
        #: Whether the step runs the Triton kernels (CUDA; see ``kernels.enabled``).
        self.fused = kernels.enabled(state.keys[0])
        #: (cos, signed sin) of every talker position, [max_len, 2, head_dim] (the three mrope
        #: sections share a generated frame's position): a fused step's rotary tables are one
        #: gather (``_talker_rope``), as the prefill's are (``prefill.Prefill``).
        at = torch.arange(state.max_len, device=device).view(1, 1, -1).expand(3, 1, -1)
        cos, sin = talker.model.rotary_emb(torch.zeros(1, 1, config.hidden_size, dtype=dtype, device=device), at)
        self.talker_rope = torch.stack(rope_tables(cos[0, 0], sin[0, 0]), dim=1)
        #: The predictor steps' cache positions, int64 [1, n] each (``FusedLayer.fast``).
        self.pred_positions = [
            torch.arange(start, start + n, device=device)[None] for start, n, *_ in self.pred_steps
        ]

    # --- sampling ---------------------------------------------------------------------------

    def first_token(self, logits: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
        """Sample the first frame's token from prefill logits, float32 [n, vocab], for slots
        ``rows`` (int64 [n], or a slice of n slots): no repetition history yet; frame 0,
        stream 0."""
        s = self.state
        logits = logits.masked_fill(self.suppressed, float("-inf"))
        hold = (s.min_new_tokens[rows] > 0)[:, None] & self.is_eos
        logits = logits.masked_fill(hold, float("-inf"))
        params = RowParams(s.temperature[rows], s.top_k[rows], s.top_p[rows])
        seeds = s.seed[rows]
        noise = gumbel(seeds, torch.zeros_like(seeds)[:, None], self.streams[:1])
        return sample(logits, params, noise[:, 0])

    # --- the step ---------------------------------------------------------------------------

    def _embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the predictor's codebook embeddings of ``codes`` int64 [B, k] (codebooks
        2..k+1): [B, hidden]."""
        return self.code_table[codes + self.code_offsets[: codes.shape[1]]].sum(dim=1)

    def _predict(self, past_hidden: torch.Tensor, first: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The 15 other codebooks of each row's frame, int64 [B, 15]; ``noise`` [B, 15, K]."""
        if self.fused:
            return self._predict_fast(past_hidden, first, noise)
        b = first.shape[0]
        s, pred = self.state, self.predictor
        model = pred.model
        params = s.predictor_params(b)
        first_embed = self.talker.get_input_embeddings()(first)
        h = pred.small_to_mtp_projection(torch.stack([past_hidden, first_embed], dim=1))
        codes = []
        for step, (start, n, cos, sin, mask) in enumerate(self.pred_steps):
            for i, layer in enumerate(self.pred_layers):

                def kv(k: torch.Tensor, v: torch.Tensor, i: int = i, start: int = start, n: int = n) -> tuple[torch.Tensor, torch.Tensor]:
                    keys, values = self.pred_keys[i][:b], self.pred_values[i][:b]
                    keys[:, :, start : start + n] = k
                    values[:, :, start : start + n] = v
                    return keys, values

                h = layer(h, cos, sin, kv, mask)
            last = F.rms_norm(h[:, -1], (h.shape[-1],), model.norm.weight, model.norm.variance_epsilon)
            logits = F.linear(last, self.lm_heads[step]).float()
            code = sample(logits, params, noise[:, step])
            codes.append(code)
            if step + 1 < len(self.pred_steps):
                embed = self.code_table[code + step * self.code_vocab]
                h = pred.small_to_mtp_projection(embed)[:, None]
        return torch.stack(codes, dim=1)

    def _predict_fast(self, past_hidden: torch.Tensor, first: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``_predict`` in Triton kernels (``FusedLayer.fast``, one sampler kernel a codebook)."""
        from .kernels.linear import fused_linear
        from .kernels.rmsnorm import add_rms_norm
        from .kernels.sampler import sample_fused

        b = first.shape[0]
        s, pred = self.state, self.predictor
        norm = (pred.model.norm.weight, float(pred.model.norm.variance_epsilon))
        params = s.predictor_params(b)
        codes = torch.empty(b, self.groups - 1, dtype=torch.int64, device=first.device)
        first_embed = self.talker.get_input_embeddings()(first)
        h = self._project(torch.stack([past_hidden, first_embed], dim=1))
        for step, (_start, _n, cos, sin, _mask) in enumerate(self.pred_steps):
            positions = self.pred_positions[step]
            branch = None
            for i, layer in enumerate(self.pred_layers):
                h, branch = layer.fast(h, branch, cos, sin, positions, self.pred_keys[i][:b], self.pred_values[i][:b])
            if branch is None:  # lean layers: the head's product normalises its input itself
                logits = fused_linear(h[:, -1], self.lm_head_weights[step], norm=norm)
            else:
                logits = F.linear(add_rms_norm(h[:, -1], branch[:, -1], *norm)[1], self.lm_heads[step])
            sample_fused(logits, params, noise[:, step], codes[:, step])
            if step + 1 < len(self.pred_steps):
                h = self._project_codes(codes[:, step], step)[:, None]
        return codes

    def _project_codes(self, code: torch.Tensor, step: int) -> torch.Tensor:
        """The projected embedding of codebook ``step + 2``'s ``code`` int64 [B]: [B, hidden]
        (a lone row's lookup runs inside the projection's kernel)."""
        from .kernels import fused_matmul

        hidden = self.code_table.shape[1]
        if self.projection is not None and fused_matmul(self.code_table) and use_fused(code.shape[0], hidden):
            from .kernels.linear import fused_linear

            return fused_linear(self.code_table, self.projection, gather=(code, step * self.code_vocab))
        return self._project(self.code_table[code + step * self.code_vocab])

    def _project(self, h: torch.Tensor) -> torch.Tensor:
        """The talker-to-predictor projection of [..., talker hidden] (one kernel on CUDA)."""
        from .kernels import fused_matmul

        if self.projection is not None and fused_matmul(h) and use_fused(h.numel() // h.shape[-1], h.shape[-1]):
            from .kernels.linear import fused_linear

            return fused_linear(h, self.projection)
        return self.predictor.small_to_mtp_projection(h)

    def _talker_rope(self, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope_tables`` for one talker position per row, int64 [B]: [B, 1, head_dim] each
        (views of one gather from ``talker_rope``)."""
        both = self.talker_rope[position]  # [B, 2, head_dim]
        return both[:, 0:1], both[:, 1:2]

    def _talker_fast(self, embeds: torch.Tensor, length: int) -> torch.Tensor:
        """``_talker`` in Triton kernels: each row's attention reads its positions
        ``0..position`` only, split over ``CHUNK``-position programs when ``length`` is longer."""
        from .kernels.attention import CHUNK
        from .kernels.rmsnorm import add_rms_norm

        b = embeds.shape[0]
        s, model = self.state, self.talker.model
        position = s.position[:b]
        h = embeds[:, None]
        cos, sin = self._talker_rope(position)
        splits = -(-length // CHUNK)
        branch = None
        for i, layer in enumerate(self.talker_layers):
            h, branch = layer.fast(h, branch, cos, sin, position[:, None], s.keys[i][:b], s.values[i][:b], splits)
        rest = branch[:, 0] if branch is not None else None
        return add_rms_norm(h[:, 0], rest, model.norm.weight, float(model.norm.variance_epsilon))[1]

    def _talker(self, embeds: torch.Tensor, length: int) -> torch.Tensor:
        """One talker position for rows [0, B): [B, hidden] in, last hidden [B, hidden] out."""
        if self.fused:
            return self._talker_fast(embeds, length)
        b = embeds.shape[0]
        s, model = self.state, self.talker.model
        position = s.position[:b]
        h = embeds[:, None]
        rope_ids = position.view(1, b, 1).expand(3, b, 1)
        cos, sin = model.rotary_emb(h, rope_ids)
        cos, sin = rope_tables(cos[0], sin[0])  # the three mrope sections share the position
        allowed = (torch.arange(length, device=h.device)[None, :] <= position[:, None])[:, None, :]
        mask = attention_mask(allowed, self.talker_layers[0].group, h.dtype)
        for i, layer in enumerate(self.talker_layers):

            def kv(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                write_rows(s.keys[i][:b], k, position)
                write_rows(s.values[i][:b], v, position)
                return s.keys[i][:b, :, :length], s.values[i][:b, :, :length]

            h = layer(h, cos, sin, kv, mask)
        return F.rms_norm(h[:, 0], (h.shape[-1],), model.norm.weight, model.norm.variance_epsilon)

    def run(self, b: int, length: int) -> torch.Tensor:
        """Advance rows [0, b) by one frame; the talker attends to ``length`` positions.

        Updates the state in place: ``codes`` holds the finished frame, ``token`` /
        ``past_hidden`` / ``position`` / ``frame`` move on, ``eos`` flags rows whose next
        token is EOS. Rows past the active ones are padding: their results are ignored.

        Returns:
            The frame's codes, int64 [b, 16] (a view of ``state.codes``).
        """
        s = self.state
        token, past_hidden, frame = s.token[:b], s.past_hidden[:b], s.frame[:b]
        # This frame's draws: codebooks 2..16 of frame f, and the first codebook of frame f + 1.
        if self.fused:
            from .kernels.noise import frame_noise

            noise = frame_noise(s.seed[:b], frame, self.groups)
        else:
            counters = (frame[:, None] + (self.streams == 0)).expand(b, self.groups)
            noise = gumbel(s.seed[:b], counters, self.streams)
        rest = self._predict(past_hidden, token, noise[:, 1:])
        if self.fused:
            from .kernels.embed import frame_embeds

            table = self.talker.get_input_embeddings().weight
            hidden = self._talker(frame_embeds(token, rest, table, self.code_table, self.pad_embed, s.codes[:b]), length)
        else:
            s.codes[:b, 0] = token
            s.codes[:b, 1:] = rest
            embeds = self.talker.get_input_embeddings()(token) + self._embed_codes(rest)
            hidden = self._talker(embeds + self.pad_embed, length)
        seen = s.seen[:b]
        seen.scatter_(1, token[:, None], True)
        if self.fused:
            from .kernels.sampler import sample_fused

            # The next token straight into ``token``, and its EOS flag (one kernel).
            hold = (frame, s.min_new_tokens[:b], self.eos_id)
            sample_fused(self.talker.codec_head(hidden), s.talker_params(b), noise[:, 0], token,
                         seen, s.penalty[:b], self.suppressed, hold, s.eos[:b])
            return self._advance(b, hidden)
        logits = self.talker.codec_head(hidden).float()
        logits = penalise(logits, seen, s.penalty[:b]).masked_fill(self.suppressed, float("-inf"))
        hold = ((frame + 1) < s.min_new_tokens[:b])[:, None] & self.is_eos
        logits = logits.masked_fill(hold, float("-inf"))
        nxt = sample(logits, s.talker_params(b), noise[:, 0])
        s.eos[:b] = nxt == self.eos_id
        token.copy_(nxt)
        return self._advance(b, hidden)

    def _advance(self, b: int, hidden: torch.Tensor) -> torch.Tensor:
        """Move rows [0, b) on by one frame (hidden state, position, frame index); returns
        the frame's codes [b, 16]."""
        s = self.state
        s.past_hidden[:b].copy_(hidden)
        s.position[:b] = (s.position[:b] + 1).clamp(max=s.max_len - 1)
        s.frame[:b] += 1
        return s.codes[:b]
