"""Admitting streams into the pool: one batched talker forward, then each row's slot state."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import torch

from .codec import StreamingDecoder
from .prompt import Prompt
from .segment import Segment
from .step import FrameStep, SlotState

#: Decoder states after an ICL reference's codes, kept per reference (each a few MB).
PREFIX_CACHE_SIZE = 16


class Prefill:
    """Start new segments in slots ``[start, start + n)``.

    The prompts are left-padded into one batch and run through the talker's own forward
    (``Qwen3TTSTalkerForConditionalGeneration.forward``, as faster-qwen3-tts prefills); each
    row's keys and values are copied to positions ``[0, P)`` of its slot, its first token is
    sampled, and its codec decoder state is reset or, for an ICL clone, set to the state after
    the reference codes (computed once per reference and cached), so the reference is never
    decoded again.

    Args:
        talker: the loaded talker.
        state, step: the pool's slot tensors and frame step.
        decoder: the pool's codec decoder.
    """

    def __init__(self, talker: Any, state: SlotState, step: FrameStep, decoder: StreamingDecoder) -> None:
        self.talker = talker
        self.state = state
        self.step = step
        self.decoder = decoder
        self.device = state.token.device
        self._scratch = StreamingDecoder(decoder.decoder, 1)
        self._prefixes: OrderedDict[str, list[torch.Tensor]] = OrderedDict()

    @torch.inference_mode()
    def run(self, start: int, batch: list[tuple[Segment, Prompt]]) -> list[int]:
        """Prefill ``batch`` into slots ``start, start + 1, ...``; returns each prompt's length.

        Raises:
            RuntimeError: from the model (e.g. out of memory); no slot is then in use.
        """
        s = self.state
        lengths = [p.embeds.shape[0] for _, p in batch]
        longest = max(lengths)
        first = batch[0][1]
        embeds = torch.zeros(len(batch), longest, first.embeds.shape[-1], dtype=first.embeds.dtype, device=self.device)
        mask = torch.zeros(len(batch), longest, dtype=torch.int64, device=self.device)
        for i, (_, prompt) in enumerate(batch):
            embeds[i, longest - lengths[i] :] = prompt.embeds
            mask[i, longest - lengths[i] :] = 1
        pad = first.pad_embed.view(1, 1, -1)
        out = self.talker.forward(
            inputs_embeds=embeds, attention_mask=mask, use_cache=True, output_hidden_states=True,
            return_dict=True, trailing_text_hidden=pad, tts_pad_embed=pad, generation_step=None,
            past_hidden=None, past_key_values=None,
        )
        for i, ((segment, prompt), length) in enumerate(zip(batch, lengths, strict=True)):
            slot = start + i
            for layer, cache in enumerate(out.past_key_values.layers):
                s.keys[layer][slot, :, :length] = cache.keys[i, :, longest - length :]
                s.values[layer][slot, :, :length] = cache.values[i, :, longest - length :]
            s.position[slot] = length
            s.frame[slot] = 0
            s.seed[slot] = segment.seed if segment.seed is not None else random.randrange(2**62)
            s.min_new_tokens[slot] = max(1, segment.min_new_tokens)  # a segment has >= 1 frame
            s.set_sampling(slot, segment.sampling)
            s.seen[slot] = False
            s.past_hidden[slot] = out.past_hidden[i, -1]
            self._start_decoder(slot, prompt)
        rows = torch.arange(start, start + len(batch), device=self.device)
        s.token[rows] = self.step.first_token(out.logits[:, -1].float(), rows)
        return lengths

    def _start_decoder(self, slot: int, prompt: Prompt) -> None:
        if prompt.ref_codes is None or prompt.ref_key is None:
            self.decoder.reset(slot)
            return
        saved = self._prefixes.get(prompt.ref_key)
        if saved is None:
            self._scratch.reset(0)
            self._scratch.step(prompt.ref_codes.to(self.device).T[None])
            saved = [t[0].clone() for t in self._scratch.state()]
            self._prefixes[prompt.ref_key] = saved
            if len(self._prefixes) > PREFIX_CACHE_SIZE:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(prompt.ref_key)
        for buffer, value in zip(self.decoder.state(), saved, strict=True):
            buffer[slot].copy_(value)
