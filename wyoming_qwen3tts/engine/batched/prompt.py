"""A segment's prefill: the talker input embeddings, in the layout qwen_tts builds them.

faster-qwen3-tts's ``_prepare_generation`` / ``_prepare_generation_custom`` build a prompt in
about 60 small tensor operations and ten host-to-device copies, most of them the same for
every request of a voice: the role tokens, the codec's think/language/speaker prefix, the
tts bos/eos/pad embeddings, a clone reference's codes. On the H200 that was 3.2 ms (p50) and
6.9 ms (p99) of a lone request's 19.5 ms first audio (``benchmarks/results/nvidia-h200/
breakdown``). ``PromptBuilder`` computes those pieces once, with the same operations on the
same shapes as the library (so the values are the same, bit for bit), and builds each prompt
from one tokenizer call, one copy of the token ids, one text projection of the text tokens
and a few additions and concatenations. ``tests/test_prompt.py`` checks it against the
library's own builders for every voice kind.

The layout (``non_streaming_mode=True``: the whole text is in the prefill; feeding text step
by step makes long clone text drift), positions in order:

* VoiceDesign / CustomVoice with an instruct: the instruct's tokens, text-projected;
* the role: the first 3 tokens of ``<|im_start|>assistant\\n{text}...``, text-projected;
* the codec prefix: ``tts_pad`` x (C - 2), then ``tts_bos``, each plus a codec embedding of
  ``think/nothink, think_bos, [language], think_eos, [speaker]``;
* not ICL: the text tokens (``ids[3:-5]``) and ``tts_eos``, text-projected, each plus the
  codec ``pad`` embedding; then ``tts_pad`` plus the codec ``bos`` embedding;
* ICL clone: the reference transcript's and the text's tokens and ``tts_eos``,
  text-projected, plus codec ``pad``; then codec ``bos`` and the reference's codes (the sum
  of their 16 codebook embeddings a frame), each plus ``tts_pad``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from ...common.vocabulary import ModelKind, Reference
from ..prompts import ClonePrompts
from ..segment import Segment

#: Instructs and clone references whose pieces are kept (LRU each): a few hundred KB each.
PIECES_KEPT = 64


@dataclass
class Prompt:
    """What a segment starts from.

    Attributes:
        embeds: talker input embeddings [P, hidden] in the model's dtype.
        pad_embed: the ``tts_pad`` embedding [hidden] added to every generated frame.
        ref_codes: ICL reference codes int64 [T, 16] (the codec decoder's left context), or None.
        ref_key: identifies ``ref_codes`` (the reference's digest), or None.
    """

    embeds: torch.Tensor
    pad_embed: torch.Tensor
    ref_codes: torch.Tensor | None = None
    ref_key: str | None = None


@dataclass
class _Clone:
    """A clone reference's pieces: its speaker embedding [1, 1, hidden]; for ICL, its
    transcript's token ids (``ref_ids[3:-2]``, int64 [1, R] on the device), the codec part
    [1, T + 1, hidden] (codec ``bos`` and the codes' embeddings, plus ``tts_pad``) and the
    codes themselves (int64 [T, 16]); its codec prefixes by language."""

    speaker: torch.Tensor
    ref_ids: torch.Tensor | None = None
    codec: torch.Tensor | None = None
    codes: torch.Tensor | None = None
    #: Its codec prefix by language (``PromptBuilder._prefix``).
    prefixes: dict[str, torch.Tensor] = field(default_factory=dict)


class _Lru(OrderedDict[Any, Any]):
    """An ``OrderedDict`` that keeps the ``PIECES_KEPT`` most recently used entries."""

    def get_recent(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > PIECES_KEPT:
            self.popitem(last=False)


class PromptBuilder:
    """Builds a segment's prefill embeddings (see the module docstring). Thread-safe: the
    prompt worker, a clip's preparation and the warm-up may build at once.

    Args:
        kind: the model kind.
        tts: a ``faster_qwen3_tts.FasterQwen3TTS`` around the loaded model (its tokenizer,
            text embeddings, text projection and codec embeddings are used; its own CUDA
            graphs are never captured or used).
        prompts: clone-prompt cache (Base only): speaker embeddings and ICL codes.
    """

    def __init__(self, kind: ModelKind, tts: Any, prompts: ClonePrompts) -> None:
        self.kind = kind
        self._tts = tts
        self._tts._warmed_up = True  # we never use (or capture) its single-stream graphs
        self._qwen = tts.model
        self._model = tts.model.model
        self._talker = self._model.talker
        self._config = self._model.config.talker_config
        self._tokenizer = tts.model.processor.tokenizer
        self._prompts = prompts
        self._lock = threading.Lock()
        self._tts_embeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # bos, eos, pad
        self._codec_pad_bos: tuple[torch.Tensor, torch.Tensor] | None = None  # [1, 1, hidden] each
        self._roles: dict[tuple[int, ...], torch.Tensor] = {}
        self._prefixes: dict[tuple[Any, ...], torch.Tensor] = {}
        self._instructs = _Lru()
        self._clones = _Lru()

    # --- the pieces ---------------------------------------------------------------------------

    @property
    def _device(self) -> torch.device:
        return self._talker.get_input_embeddings().weight.device

    def _ids(self, text: str) -> tuple[list[int], torch.Tensor]:
        """Token ids of ``text`` as the library's ``_tokenize_texts`` makes them: as a list,
        and as int64 [1, n] on the model's device (one copy)."""
        ids = self._tokenizer(text)["input_ids"]
        return ids, torch.tensor([ids], dtype=torch.int64, device=self._device)

    def _project(self, ids: torch.Tensor) -> torch.Tensor:
        """Text embeddings of ``ids`` (int64 [1, n]) through the text projection: [1, n, hidden]."""
        return self._talker.text_projection(self._talker.get_text_embeddings()(ids))

    def _codec(self, ids: list[int]) -> torch.Tensor:
        """Codec input embeddings of ``ids``: [1, len(ids), hidden]."""
        tensor = torch.tensor([ids], dtype=torch.int64, device=self._device)
        return self._talker.get_input_embeddings()(tensor)

    @staticmethod
    def _settle(*tensors: torch.Tensor) -> None:
        """Make cached pieces safe to read from any thread's CUDA stream: wait until the
        stream that computed them has finished (once per piece)."""
        if tensors and tensors[0].is_cuda:
            torch.cuda.current_stream(tensors[0].device).synchronize()

    def _use(self, piece: torch.Tensor) -> torch.Tensor:
        """A cached piece read on the current stream: its memory is not reused (should it
        leave the cache) before the current stream's work on it is done."""
        if piece.is_cuda:
            piece.record_stream(torch.cuda.current_stream(piece.device))
        return piece

    def _tts_special(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``tts_bos``, ``tts_eos``, ``tts_pad`` text-projected, [1, 1, hidden] each (one
        projection of the three, as the library does)."""
        if self._tts_embeds is None:
            config = self._model.config
            ids = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
                               dtype=torch.int64, device=self._device)
            bos, eos, pad = self._project(ids).chunk(3, dim=1)
            codec = self._codec([self._config.codec_pad_id, self._config.codec_bos_id])
            self._settle(bos, codec)
            self._codec_pad_bos = (codec[:, :1], codec[:, 1:])
            self._tts_embeds = (bos, eos, pad)
        return self._tts_embeds

    def _role(self, ids: torch.Tensor, key: tuple[int, ...]) -> torch.Tensor:
        """The role tokens (``ids[:, :3]``) text-projected: [1, 3, hidden], cached by ids."""
        role = self._roles.get(key)
        if role is None:
            role = self._project(ids[:, :3])
            self._settle(role)
            self._roles[key] = role
        return role

    def _prefix(self, language: str, speaker: str | None, clone: _Clone | None) -> torch.Tensor:
        """The codec prefix [1, C - 1, hidden] for a language, a CustomVoice speaker or a
        clone's speaker embedding (cached; a clone's with its other pieces).

        Raises:
            NotImplementedError: a language or speaker the model does not have.
        """
        config = self._config
        key = (language.lower(), speaker.lower() if speaker else None)
        cached = self._prefixes.get(key) if clone is None else clone.prefixes.get(language.lower())
        if cached is not None:
            return cached
        speaker_embed = clone.speaker if clone is not None else None
        if clone is None and speaker:
            if speaker.lower() not in config.spk_id:
                raise NotImplementedError(f"Speaker {speaker} not implemented")
            speaker_embed = self._codec([config.spk_id[speaker.lower()]])
        language_id = None
        if language.lower() != "auto":
            if language.lower() not in config.codec_language_id:
                raise NotImplementedError(f"Language {language} not implemented")
            language_id = config.codec_language_id[language.lower()]
        if language.lower() in ("chinese", "auto") and speaker and config.spk_is_dialect[speaker.lower()]:
            language_id = config.codec_language_id[config.spk_is_dialect[speaker.lower()]]
        if language_id is None:
            think = [config.codec_nothink_id, config.codec_think_bos_id, config.codec_think_eos_id]
        else:
            think = [config.codec_think_id, config.codec_think_bos_id, language_id, config.codec_think_eos_id]
        bos, _eos, pad = self._tts_special()
        parts = [self._codec(think)]
        if speaker_embed is not None:
            parts.append(speaker_embed.view(1, 1, -1))
        assert self._codec_pad_bos is not None
        parts.extend(self._codec_pad_bos)
        codec = torch.cat(parts, dim=1)
        prefix = torch.cat((pad.expand(-1, codec.shape[1] - 2, -1), bos), dim=1) + codec[:, :-1]
        self._settle(prefix)
        if clone is None:
            self._prefixes[key] = prefix
        else:
            clone.prefixes[language.lower()] = prefix
        return prefix

    def _instruct(self, instruct: str) -> torch.Tensor:
        """An instruct's tokens (``<|im_start|>user\\n...``) text-projected: [1, I, hidden]."""
        with self._lock:
            cached = self._instructs.get_recent(instruct)
        if cached is not None:
            return self._use(cached)
        embeds = self._project(self._ids(self._qwen._build_instruct_text(instruct))[1])
        self._settle(embeds)
        with self._lock:
            self._instructs.put(instruct, embeds)
        return embeds

    def _clone(self, reference: Reference) -> _Clone:
        """A clone reference's pieces (see ``_Clone``), cached by its digest.

        Raises:
            ValueError: an ICL reference without a transcript; whatever ``ClonePrompts.get``
                raises for a clip the model cannot encode.
        """
        with self._lock:
            cached = self._clones.get_recent(reference.digest)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        item = self._prompts.get(reference)[0]
        speaker = item.ref_spk_embedding.to(self._device).to(self._talker.dtype).view(1, 1, -1)
        clone = _Clone(speaker)
        if item.icl_mode and item.ref_code is not None:
            ref_text = item.ref_text or reference.transcript or ""
            if not ref_text:
                raise ValueError("ref_text is required when voice_clone_prompt uses ICL mode.")
            ref_ids = self._ids(self._qwen._build_ref_text(ref_text))[1][:, 3:-2]
            codes = item.ref_code.to(self._device)
            embeds = [self._talker.get_input_embeddings()(codes[:, :1])]
            predictor = self._talker.code_predictor.get_input_embeddings()
            for i in range(1, self._talker.config.num_code_groups):
                embeds.append(predictor[i - 1](codes[:, i : i + 1]))
            summed = torch.cat(embeds, dim=1).sum(1).unsqueeze(0)
            _bos, _eos, pad = self._tts_special()
            codec = torch.cat([self._codec([self._config.codec_bos_id]), summed], dim=1) + pad
            clone = _Clone(speaker, ref_ids, codec, item.ref_code)
        self._settle(*(t for t in (clone.speaker, clone.ref_ids, clone.codec) if t is not None))
        with self._lock:
            self._clones.put(reference.digest, clone)
        return clone

    # --- building -----------------------------------------------------------------------------

    def build(self, segment: Segment) -> Prompt:
        """The prompt of one segment.

        Raises:
            ValueError: unknown language or speaker (the library's checks), a Base segment
                without a clone reference.
            NotImplementedError: a language or speaker id the model's config lacks.
        """
        with torch.inference_mode():
            return self._build(segment)

    def _build(self, segment: Segment) -> Prompt:
        qwen = self._qwen
        clone: _Clone | None = None
        speaker: str | None = None
        instruct: str | None = None
        if self.kind is ModelKind.BASE:
            if segment.reference is None:
                raise ValueError("the Base model needs a clone reference")
            clone = self._clone(segment.reference)
        else:
            qwen._validate_languages([segment.language])
            instruct = segment.instruct
            if self.kind is ModelKind.CUSTOM_VOICE:
                qwen._validate_speakers([segment.speaker])
                speaker = segment.speaker
                if self._model.tts_model_size in "0b6":  # the 0.6B CustomVoice takes no instruct
                    instruct = None
        host_ids, ids = self._ids(qwen._build_assistant_text(segment.text))
        bos, eos, pad = self._tts_special()
        assert self._codec_pad_bos is not None
        codec_pad, codec_bos = self._codec_pad_bos
        with self._lock:
            role = self._role(ids, tuple(host_ids[:3]))
            prefix = self._prefix(segment.language, speaker, clone)
        parts = [] if not instruct else [self._instruct(instruct)]
        parts += [self._use(role), self._use(prefix)]
        if clone is not None and clone.codec is not None:
            assert clone.ref_ids is not None
            text = torch.cat([self._project(torch.cat([self._use(clone.ref_ids), ids[:, 3:-5]], dim=-1)), eos], dim=1)
            parts += [text + codec_pad, self._use(clone.codec)]
        else:
            text = torch.cat((self._project(ids[:, 3:-5]), eos), dim=1)
            parts += [text + codec_pad, pad + codec_bos]
        embeds = torch.cat(parts, dim=1)
        if clone is not None and clone.codes is not None:
            assert segment.reference is not None
            return Prompt(embeds[0], pad.reshape(-1), clone.codes, segment.reference.digest)
        return Prompt(embeds[0], pad.reshape(-1))
