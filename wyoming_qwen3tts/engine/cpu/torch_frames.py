"""Codec frames from the checkpoint's own PyTorch modules: a ``pipeline.FrameSource``.

One generator a stream, each with its own talker and code-predictor KV caches
(``transformers``' ``DynamicCache``), so the pipeline engine's generation thread can advance
several streams a frame at a time, in turn. What a frame is, in the batched engine's order
(``batched.step``):

1. the prompt (``batched.prompt.PromptBuilder``: every voice kind, clone prompts included)
   runs through the talker (its decoder stack, ``talker.model``), whose last hidden state
   and codec head give the frame's first code;
2. the code predictor (``talker.code_predictor``) turns (that hidden state, the first code)
   into codebooks 2..16, one position at a time;
3. the sum of the 16 codes' embeddings plus the ``tts_pad`` text embedding is the talker's
   next input, one position, whose logits give the next frame's first code (or EOS).

Sampling is the batched engine's (``batched.sampling``): counter-based noise from (the
segment's seed, the frame, the codebook), so a stream's codes do not depend on what else
runs; suppressed control ids, repetition penalty, EOS held back until ``min_new_tokens``.
The modules run in float32 as loaded: slower than qwentts.cpp's quantized kernels, but real
generation on any checkpoint (the tiny test ones too), until the ggml generation graphs
(issue 50 part 1) serve as the source.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ...common.vocabulary import ModelKind, Reference
from ..base import ModelMismatchError
from ..batched.prompt import PromptBuilder
from ..batched.sampling import RowParams, effective, gumbel, penalise, sample
from ..batched.step import SUPPRESSED_BAND
from ..prompts import ClonePrompts
from ..segment import Segment


class TorchFrameSource:
    """Codec frames of one model from its PyTorch modules (see the module docstring).

    Args:
        kind: the model kind (checked against the checkpoint).
        qwen: the loaded ``qwen_tts.Qwen3TTSModel`` (float32 on the CPU).
        streams: generators open at once (streams generated at once by the engine).
        max_len: talker positions a stream may reach (prompt + frames; as the batched
            engine's ``max_len``).

    Attributes:
        streams: as given.
        backend: one line naming the source, for the engine's description.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
    """

    backend = "qwen_tts's modules in PyTorch (float32)"

    def __init__(self, kind: ModelKind, qwen: Any, streams: int = 2, max_len: int = 2048) -> None:
        from faster_qwen3_tts import FasterQwen3TTS

        model_type = getattr(qwen.model, "tts_model_type", None)
        if model_type != kind.value:
            raise ModelMismatchError(f"checkpoint is a {model_type!r} model, expected {kind.value!r}")
        self.kind = kind
        self.streams = streams
        self.max_len = max_len
        self._qwen = qwen
        self.prompts = ClonePrompts(qwen)
        # Only its prompt pieces are used; its own single-stream graphs are never built.
        tts = FasterQwen3TTS(qwen, None, None, device="cpu", dtype=torch.float32, max_seq_len=max_len)
        self._builder = PromptBuilder(kind, tts, self.prompts)
        talker = qwen.model.talker
        self._talker = talker
        config = talker.config
        self._eos = int(config.codec_eos_token_id)
        vocab = int(config.vocab_size)
        #: Control ids never sampled (all of the top band but EOS), bool [vocab].
        self._suppressed = torch.zeros(vocab, dtype=torch.bool)
        self._suppressed[max(0, vocab - SUPPRESSED_BAND):] = True
        self._suppressed[self._eos] = False
        self._is_eos = torch.zeros(vocab, dtype=torch.bool)
        self._is_eos[self._eos] = True
        self._groups = int(config.num_code_groups)
        #: Draws a frame: the next first code (stream 0), then codebooks 2..16.
        self._draws = torch.arange(self._groups)

    def speakers(self) -> list[str]:
        """CustomVoice speaker ids (lower case); [] for other kinds."""
        if self.kind is not ModelKind.CUSTOM_VOICE:
            return []
        return list(self._qwen.get_supported_speakers() or [])

    def prime(self, reference: Reference) -> bool:
        """Compute ``reference``'s clone prompt (x-vector, ICL codes) now; True if a Base model.

        Raises:
            ValueError / RuntimeError: from qwen_tts for a clip it cannot encode.
        """
        if self.kind is not ModelKind.BASE:
            return False
        self.prompts.get(reference)
        return True

    def decoder_context(self, reference: Reference) -> np.ndarray | None:
        """An ICL clone's reference codes, int64 [n, 16], which the codec decodes before the
        segment's frames (as qwen_tts does); None for an x-vector clone or another kind."""
        if self.kind is not ModelKind.BASE:
            return None
        code = getattr(self.prompts.get(reference)[0], "ref_code", None)
        return None if code is None else code.detach().cpu().numpy().astype(np.int64)

    def frames(self, segment: Segment, cancelled: Callable[[], bool]) -> Iterator[np.ndarray]:
        """Generate ``segment``: yields each codec frame's codes, int64 [16], as it is made.

        Stops at EOS, after ``segment.max_new_tokens`` frames, at the talker's ``max_len``
        positions, or before the next frame once ``cancelled()`` is true. Several generators
        may be open at once and advanced in turn from one thread.

        Raises:
            ValueError: a Base segment without a reference, an unknown language or speaker.
            NotImplementedError: a language or speaker id the model's config lacks.
        """
        prompt = self._builder.build(segment)
        s = segment.sampling
        seed = torch.tensor([segment.seed if segment.seed is not None else random.randrange(2**62)])
        k, p = effective(s.top_k, s.top_p)
        talker_params = RowParams(torch.tensor([s.temperature]), torch.tensor([k]), torch.tensor([p]))
        k, p = effective(s.predictor_top_k, s.predictor_top_p)
        predictor_params = RowParams(torch.tensor([s.predictor_temperature]), torch.tensor([k]), torch.tensor([p]))
        penalty = torch.tensor([s.repetition_penalty])
        min_new = max(1, segment.min_new_tokens)
        seen = torch.zeros(1, self._suppressed.shape[0], dtype=torch.bool)
        hidden, logits, cache = self._talker_step(prompt.embeds[None], None)
        token = self._first_token(logits, seed, talker_params)
        position = prompt.embeds.shape[0]
        pad = prompt.pad_embed
        for frame in range(max(1, segment.max_new_tokens)):
            if cancelled() or int(token) == self._eos or position >= self.max_len:
                return
            counters = (frame + (self._draws == 0).long())[None]
            noise = gumbel(seed, counters, self._draws)  # [1, 16, candidates]
            rest = self._predict(hidden, token, noise[:, 1:], predictor_params)
            yield torch.cat([token, rest[0]]).numpy().astype(np.int64)
            if frame + 1 >= segment.max_new_tokens:
                return
            hidden, logits, cache = self._talker_step(self._next_input(token, rest, pad), cache)
            position += 1
            seen[0, token] = True
            token = self._next_token(logits, seen, penalty, frame + 1 < min_new, noise[:, 0], talker_params)

    # --- one frame's parts ----------------------------------------------------------------

    @torch.inference_mode()
    def _talker_step(self, embeds: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The talker over ``embeds`` [1, T, hidden] after ``cache`` (None: a new stream):
        (last hidden state [1, hidden] after the final norm, its logits float32 [1, vocab],
        the cache)."""
        out = self._talker.model(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
        hidden = out.last_hidden_state[:, -1]
        return hidden, self._talker.codec_head(hidden).float(), out.past_key_values

    @torch.inference_mode()
    def _first_token(self, logits: torch.Tensor, seed: torch.Tensor, params: RowParams) -> torch.Tensor:
        """The first frame's first code, int64 [1]: no history, EOS held back (frame 0, draw 0)."""
        logits = logits.masked_fill(self._suppressed | self._is_eos, float("-inf"))
        noise = gumbel(seed, torch.zeros(1, 1, dtype=torch.int64), self._draws[:1])
        return sample(logits, params, noise[:, 0])

    @torch.inference_mode()
    def _next_token(self, logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor, hold: bool,
                    noise: torch.Tensor, params: RowParams) -> torch.Tensor:
        """The next frame's first code, int64 [1] (``noise``: float32 [1, candidates])."""
        logits = penalise(logits, seen, penalty).masked_fill(self._suppressed, float("-inf"))
        if hold:
            logits = logits.masked_fill(self._is_eos, float("-inf"))
        return sample(logits, params, noise)

    @torch.inference_mode()
    def _predict(self, hidden: torch.Tensor, token: torch.Tensor, noise: torch.Tensor, params: RowParams) -> torch.Tensor:
        """Codebooks 2..16 of the frame whose first code is ``token``: int64 [1, 15]
        (``noise``: float32 [1, 15, candidates])."""
        predictor = self._talker.code_predictor
        project = predictor.small_to_mtp_projection
        first = self._talker.get_input_embeddings()(token)
        h = project(torch.stack([hidden, first], dim=1))
        cache = None
        codes = []
        for step in range(self._groups - 1):
            out = predictor.model(inputs_embeds=h, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = predictor.lm_head[step](out.last_hidden_state[:, -1]).float()
            code = sample(logits, params, noise[:, step])
            codes.append(code)
            h = project(predictor.model.codec_embedding[step](code))[:, None]
        return torch.stack(codes, dim=1)

    @torch.inference_mode()
    def _next_input(self, token: torch.Tensor, rest: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The talker's next input [1, 1, hidden]: the 16 codes' embeddings summed, plus ``tts_pad``."""
        tables = self._talker.code_predictor.model.codec_embedding
        total = self._talker.get_input_embeddings()(token)
        for i in range(rest.shape[1]):
            total = total + tables[i](rest[:, i])
        return (total + pad)[:, None]
