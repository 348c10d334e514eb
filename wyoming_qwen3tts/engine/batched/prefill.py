"""Admitting streams into the pool: one talker forward over the new prompts, replayed from a
CUDA graph captured per (rows, token bucket), writing each row's keys and values straight into
its slot; then each row's slot state.

A join is what running streams wait for, so it must be one short graph replay: the prompts
(ICL clone prompts of 80-200 positions, x-vector clone, VoiceDesign and CustomVoice prompts)
are right-padded to the smallest token bucket that holds the longest, the rows are the exact
number joining (1..``MAX_JOIN``: no padding rows, so no row ever writes a slot it does not
own), and every (rows, bucket) graph is captured at start. The forward is our own, built from
the talker's loaded weights (``layers.FusedLayer``, as the frame step), and masks padding:
a row's queries attend only to its own prompt, causally, and a padded position's key and value
never reach the cache (the slot keeps what it had there). A prompt longer than the largest
bucket falls back to the talker's own forward, eagerly (logged at DEBUG, counted in
``Prefill.eager_fallbacks``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F

from .codec import StreamingDecoder
from .graphs import StepGraphs
from .layers import FusedLayer, attention_mask, rope_tables
from .prompt import Prompt
from ..segment import Segment
from .step import FrameStep, SlotState

_LOGGER = logging.getLogger(__name__)

#: Decoder states after an ICL reference's codes, kept per reference (each a few MB).
PREFIX_CACHE_SIZE = 16
#: Most rows one prefill replay admits (nari-qwen3-tts captures its prefill for batches 1-8).
MAX_JOIN = 8
#: Token buckets of the prefill graphs (positions). ICL clone prompts are 80-200 positions
#: (a 3 s reference is ~40 codec frames plus both transcripts; a 10 s anchor ~130), VoiceDesign
#: prompts carry the description (up to ``MAX_INSTRUCTIONS_CHARS``, rarely over 200 tokens).
TOKEN_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512)


class Prefill:
    """Start new segments in slots ``[start, start + n)``.

    Args:
        talker: the loaded talker (its layers already wrapped by ``step.talker_layers``).
        state, step: the pool's slot tensors and frame step.
        decoder: the pool's codec decoder.
        token_buckets: prompt lengths (positions) captured; clipped to the cache length.
        max_rows: most rows per replay (also capped by the pool size).
        graph_rows: prefills of up to this many rows replay a captured graph; more rows
            (up to ``max_rows``) run the same forward eagerly. None: all of ``max_rows``
            (8 x 8 = 64 graphs, 3-10 s to capture on the H200). A model taking turns on the
            card captures only ``sizing.TURNS_GRAPH_ROWS`` at each swap.
    """

    def __init__(
        self, talker: Any, state: SlotState, step: FrameStep, decoder: StreamingDecoder,
        token_buckets: tuple[int, ...] = TOKEN_BUCKETS, max_rows: int = MAX_JOIN,
        graph_rows: int | None = None,
    ) -> None:
        self.talker = talker
        self.state = state
        self.step = step
        self.decoder = decoder
        self.device = state.token.device
        self._scratch = StreamingDecoder(decoder.decoder, 1)
        self._scratch_lock = threading.Lock()  # the scratch decoder: one reference at a time
        self._prefixes: OrderedDict[str, list[torch.Tensor]] = OrderedDict()
        self._prefixes_lock = threading.Lock()
        self.max_rows = max(1, min(max_rows, state.slots))
        self.token_buckets = sorted({min(t, state.max_len) for t in token_buckets})
        self.eager_fallbacks = 0
        model = talker.model
        dtype = state.keys[0].dtype
        hidden = int(talker.config.hidden_size)
        longest = self.token_buckets[-1]
        #: Static inputs: right-padded prompt embeddings, lengths, and each row's slot.
        self._embeds = torch.zeros(self.max_rows, longest, hidden, dtype=dtype, device=self.device)
        self._lengths = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        self._slots = torch.arange(self.max_rows, dtype=torch.int64, device=self.device)
        #: Static outputs: each row's last hidden state (after the final norm) and its logits.
        self._hidden = torch.zeros(self.max_rows, hidden, dtype=dtype, device=self.device)
        self._logits = torch.zeros(self.max_rows, int(talker.config.vocab_size), dtype=torch.float32, device=self.device)
        # Rotary tables of positions [0, longest), the same for every row (text prompts: the
        # three mrope sections share the position, as ``get_rope_index`` gives for text).
        with torch.inference_mode():
            ids = torch.arange(longest, device=self.device).view(1, 1, -1).expand(3, 1, -1)
            cos, sin = model.rotary_emb(self._embeds[:1], ids)
            self._cos, self._sin = rope_tables(cos[0], sin[0])  # [1, longest, head_dim]
        self._layers: list[FusedLayer] = step.talker_layers
        self.graph_rows = self.max_rows if graph_rows is None else max(1, min(graph_rows, self.max_rows))
        self.graphs = StepGraphs(
            self._body, lambda: [], list(range(1, self.graph_rows + 1)), self.token_buckets
        )

    # --- the captured forward ---------------------------------------------------------------

    def _body(self, rows: int, length: int) -> None:
        """The talker over ``_embeds[:rows, :length]`` (graph-captured per (rows, length)):
        writes each row's keys/values of its own positions into its slot, and its last hidden
        state and logits into ``_hidden`` / ``_logits``."""
        s, model = self.state, self.talker.model
        h = self._embeds[:rows, :length]
        lengths, slots = self._lengths[:rows], self._slots[:rows]
        at = torch.arange(length, device=self.device)
        valid = at[None, :] < lengths[:, None]  # [rows, length]
        allowed = (at[None, :, None] >= at[None, None, :]) & valid[:, None, :]  # query, key
        mask = attention_mask(allowed, self._layers[0].group, h.dtype)
        keep = valid[:, None, :, None]
        cos, sin = self._cos[:, :length], self._sin[:, :length]
        for i, layer in enumerate(self._layers):

            def kv(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                for store, new in ((s.keys[i], k), (s.values[i], v)):
                    region = store[:, :, :length]
                    region[slots] = torch.where(keep, new, region[slots])
                return k, v

            h = layer(h, cos, sin, kv, mask)
        last = h[torch.arange(rows, device=self.device), (lengths - 1).clamp(min=0)]
        last = F.rms_norm(last, (last.shape[-1],), model.norm.weight, model.norm.variance_epsilon)
        self._hidden[:rows].copy_(last)
        self._logits[:rows].copy_(self.talker.codec_head(last).float())

    def capture(self) -> float:
        """Capture every (rows, token bucket) graph (CUDA only); returns the seconds it took.
        The capture runs the body with zero lengths, so no slot is written."""
        self._lengths.zero_()
        return self.graphs.capture()

    # --- admission --------------------------------------------------------------------------

    def bucket(self, longest: int) -> int | None:
        """The token bucket for a longest prompt of ``longest`` positions; None: too long."""
        return next((t for t in self.token_buckets if t >= longest), None)

    @torch.inference_mode()
    def run(
        self, start: int, batch: list[tuple[Segment, Prompt]],
        on_decoder: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> list[int]:
        """Prefill ``batch`` (at most ``max_rows``) into slots ``start, start + 1, ...``;
        returns each prompt's length (positions). The codec decoder's state of the new rows is
        set inside ``on_decoder()`` (the engine's: on CUDA, on the stream that decodes, after
        the decode in flight, so that the running streams never wait for that decode).

        Raises:
            ValueError: more rows than ``max_rows``.
            RuntimeError: from the model (e.g. out of memory); no slot is then in use.
        """
        if len(batch) > self.max_rows:
            raise ValueError(f"{len(batch)} rows in one prefill; at most {self.max_rows}")
        lengths = [p.embeds.shape[0] for _, p in batch]
        rows = len(batch)
        length = self.bucket(max(lengths))
        if length is None:
            self.eager_fallbacks += 1
            _LOGGER.debug("Prefill of %s positions is over the largest bucket %d: eager", lengths, self.token_buckets[-1])
            hidden, logits = self._eager(start, batch, lengths)
        else:
            for i, (_, prompt) in enumerate(batch):
                self._embeds[i, : lengths[i]].copy_(prompt.embeds)
            lengths_slots = self._to_device(lengths, list(range(start, start + rows)))
            self._lengths[:rows].copy_(lengths_slots[0])
            self._slots[:rows].copy_(lengths_slots[1])
            self.graphs.run(rows, length)
            hidden, logits = self._hidden[:rows], self._logits[:rows]
        self._start_rows(start, batch, lengths, hidden, logits, on_decoder)
        return lengths

    def _start_rows(
        self, start: int, batch: list[tuple[Segment, Prompt]], lengths: list[int],
        hidden: torch.Tensor, logits: torch.Tensor,
        on_decoder: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        """Each new row's slot state (position, seed, sampling...), decoder state and first
        token. The new rows are the contiguous slots ``[start, start + n)``, so each setting
        is one slice copy for all of them, not one kernel a row: running streams wait for
        every kernel of a join."""
        s = self.state
        n = len(batch)
        rows = slice(start, start + n)
        segments = [segment for segment, _ in batch]
        position, seed, min_new = self._to_device(
            lengths,
            [seg.seed if seg.seed is not None else random.randrange(2**62) for seg in segments],
            [max(1, seg.min_new_tokens) for seg in segments],  # a segment has >= 1 frame
        )
        s.position[rows].copy_(position)
        s.seed[rows].copy_(seed)
        s.min_new_tokens[rows].copy_(min_new)
        s.frame[rows].zero_()
        s.set_sampling_rows(start, [segment.sampling for segment in segments])
        s.seen[rows].zero_()
        s.past_hidden[rows].copy_(hidden)
        saved = [self.prefix(prompt) for _, prompt in batch]
        with on_decoder() if on_decoder is not None else contextlib.nullcontext():
            if any(x is None for x in saved):
                self.decoder.reset(start, n)  # then the ICL rows get their reference's state
            for i, state in enumerate(saved):
                if state is not None:
                    self.decoder.load_row(start + i, state)
                    if self.device.type == "cuda":  # made on the prompt worker's stream; may be evicted
                        here = torch.cuda.current_stream(self.device)
                        for value in state:
                            value.record_stream(here)
        s.token[rows].copy_(self.step.first_token(logits, rows))

    def _to_device(self, *values: list[int]) -> torch.Tensor:
        """Integer lists as one int64 [len(values), n] tensor on the device, copied from pinned
        memory without waiting for the GPU (a pageable copy would wait for the step in flight);
        the caching host allocator keeps the pinned block until the copy has run."""
        host = torch.tensor(values, dtype=torch.int64)
        if self.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    def _eager(
        self, start: int, batch: list[tuple[Segment, Prompt]], lengths: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker's own forward, left-padded (for prompts over the largest bucket): copies
        each row's keys/values into its slot; returns (last hidden [n, hidden], logits f32)."""
        s = self.state
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
        for i, length in enumerate(lengths):
            for layer, cache in enumerate(out.past_key_values.layers):
                s.keys[layer][start + i, :, :length] = cache.keys[i, :, longest - length :]
                s.values[layer][start + i, :, :length] = cache.values[i, :, longest - length :]
        return out.past_hidden[:, -1], out.logits[:, -1].float()

    @torch.inference_mode()
    def prefix(self, prompt: Prompt) -> list[torch.Tensor] | None:
        """The codec decoder's state after an ICL prompt's reference codes (one row of each
        state buffer), computed once per reference and kept (LRU of ``PREFIX_CACHE_SIZE``);
        None for a prompt without reference codes. Thread-safe: the prompt worker calls it
        ahead of admission (on its own CUDA stream), so that a new reference costs the running
        streams nothing; it runs on the caller's current stream.
        """
        if prompt.ref_codes is None or prompt.ref_key is None:
            return None
        with self._prefixes_lock:
            saved = self._prefixes.get(prompt.ref_key)
            if saved is not None:
                self._prefixes.move_to_end(prompt.ref_key)
                return saved
        with self._scratch_lock:
            self._scratch.reset(0)
            self._scratch.step(prompt.ref_codes.to(self.device).T[None])
            saved = [t[0].clone() for t in self._scratch.state()]
        with self._prefixes_lock:
            self._prefixes[prompt.ref_key] = saved
            if len(self._prefixes) > PREFIX_CACHE_SIZE:
                self._prefixes.popitem(last=False)
        return saved

