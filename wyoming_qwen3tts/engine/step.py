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
"""

from __future__ import annotations

from typing import Any

import torch

from .layers import layer_step, write_rows
from .sampling import RowParams, penalise, sample

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
        self.temperature, self.top_k, self.top_p = floats(0.9), longs(), floats(1.0)
        self.penalty = floats(1.0)
        self.pred_temperature, self.pred_top_k, self.pred_top_p = floats(0.9), longs(), floats(1.0)
        #: Outputs of the last step: the frame's 16 codes, and whether the next token is EOS.
        self.codes = torch.zeros(slots, config.num_code_groups, dtype=torch.int64, device=device)
        self.eos = torch.zeros(slots, dtype=torch.bool, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor (for moving a row)."""
        return [*self.keys, *self.values, *(v for v in vars(self).values() if isinstance(v, torch.Tensor))]

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
        pred_cfg = predictor.model.config
        pred_attn = predictor.model.layers[0].self_attn
        self.pred_keys = [
            torch.zeros(state.slots, pred_cfg.num_key_value_heads, PREDICTOR_POSITIONS, pred_attn.head_dim,
                        dtype=state.keys[0].dtype, device=device)
            for _ in predictor.model.layers
        ]
        self.pred_values = [torch.zeros_like(k) for k in self.pred_keys]
        positions = torch.arange(PREDICTOR_POSITIONS, device=device)[None, :]
        probe = torch.zeros(1, dtype=state.keys[0].dtype, device=device)
        cos, sin = predictor.model.rotary_emb(probe, positions)
        self.pred_cos, self.pred_sin = cos[0], sin[0]  # [17, head_dim]

    # --- sampling ---------------------------------------------------------------------------

    def first_token(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Sample the first frame's token from prefill logits, float32 [n, vocab], for slots
        ``rows`` (int64 [n]): no repetition history yet; counter 0."""
        s = self.state
        logits = logits.masked_fill(self.suppressed, float("-inf"))
        hold = (s.min_new_tokens[rows] > 0)[:, None] & self.is_eos
        logits = logits.masked_fill(hold, float("-inf"))
        params = RowParams(s.temperature[rows], s.top_k[rows], s.top_p[rows])
        return sample(logits, params, s.seed[rows], torch.zeros_like(rows), 0)

    # --- the step ---------------------------------------------------------------------------

    def _predict(self, past_hidden: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The 15 other codebooks of each row's frame, int64 [B, 15]."""
        b = first.shape[0]
        s, pred = self.state, self.predictor
        model = pred.model
        params = s.predictor_params(b)
        first_embed = self.talker.get_input_embeddings()(first)
        h = pred.small_to_mtp_projection(torch.stack([past_hidden, first_embed], dim=1))
        codes = []
        for step in range(pred.config.num_code_groups - 1):
            start = 0 if step == 0 else step + 1
            n = h.shape[1]
            where = torch.arange(start, start + n, device=h.device)
            positions = where[None, :].expand(b, n)
            cos = self.pred_cos[where][None].expand(b, n, -1)
            sin = self.pred_sin[where][None].expand(b, n, -1)
            keys_at = torch.arange(PREDICTOR_POSITIONS, device=h.device)
            allowed = (keys_at[None, :] <= where[:, None])[None].expand(b, n, PREDICTOR_POSITIONS)
            for i, layer in enumerate(model.layers):

                def kv(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                    write_rows(self.pred_keys[i][:b], k, positions)
                    write_rows(self.pred_values[i][:b], v, positions)
                    return self.pred_keys[i][:b], self.pred_values[i][:b]

                h = layer_step(layer, h, cos, sin, kv, allowed)
            logits = pred.lm_head[step](model.norm(h[:, -1])).float()
            code = sample(logits, params, s.seed[:b], s.frame[:b], 1 + step)
            codes.append(code)
            if step + 1 < pred.config.num_code_groups - 1:
                h = pred.small_to_mtp_projection(model.codec_embedding[step](code))[:, None]
        return torch.stack(codes, dim=1)

    def _talker(self, embeds: torch.Tensor, length: int) -> torch.Tensor:
        """One talker position for rows [0, B): [B, hidden] in, last hidden [B, hidden] out."""
        b = embeds.shape[0]
        s, model = self.state, self.talker.model
        position = s.position[:b]
        h = embeds[:, None]
        rope_ids = position.view(1, b, 1).expand(3, b, 1)
        cos, sin = model.rotary_emb(h, rope_ids)
        cos, sin = cos[0], sin[0]  # all three mrope sections share the position: plain rope
        allowed = (torch.arange(length, device=h.device)[None, :] <= position[:, None])[:, None, :]
        where = position[:, None]
        for i, layer in enumerate(model.layers):

            def kv(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                write_rows(s.keys[i][:b], k, where)
                write_rows(s.values[i][:b], v, where)
                return s.keys[i][:b, :, :length], s.values[i][:b, :, :length]

            h = layer_step(layer, h, cos, sin, kv, allowed)
        return model.norm(h)[:, 0]

    def run(self, b: int, length: int) -> torch.Tensor:
        """Advance rows [0, b) by one frame; the talker attends to ``length`` positions.

        Updates the state in place: ``codes`` holds the finished frame, ``token`` /
        ``past_hidden`` / ``position`` / ``frame`` move on, ``eos`` flags rows whose next
        token is EOS. Rows past the active ones are padding: their results are ignored.

        Returns:
            The frame's codes, int64 [b, 16] (a view of ``state.codes``).
        """
        s = self.state
        token, past_hidden = s.token[:b], s.past_hidden[:b]
        rest = self._predict(past_hidden, token)
        s.codes[:b, 0] = token
        s.codes[:b, 1:] = rest
        embeds = self.talker.get_input_embeddings()(token)
        for i, table in enumerate(self.predictor.model.codec_embedding):
            embeds = embeds + table(rest[:, i])
        hidden = self._talker(embeds + self.pad_embed, length)
        logits = self.talker.codec_head(hidden).float()
        seen = s.seen[:b]
        seen.scatter_(1, token[:, None], True)
        logits = penalise(logits, seen, s.penalty[:b]).masked_fill(self.suppressed, float("-inf"))
        hold = ((s.frame[:b] + 1) < s.min_new_tokens[:b])[:, None] & self.is_eos
        logits = logits.masked_fill(hold, float("-inf"))
        nxt = sample(logits, s.talker_params(b), s.seed[:b], s.frame[:b] + 1, 0)
        s.eos[:b] = nxt == self.eos_id
        token.copy_(nxt)
        past_hidden.copy_(hidden)
        s.position[:b] = (s.position[:b] + 1).clamp(max=s.max_len - 1)
        s.frame[:b] += 1
        return s.codes[:b]
