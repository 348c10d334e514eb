"""A segment's talker input embeddings, from the GGUF file alone (no torch, no second model).

The layout is qwen_tts's with ``non_streaming_mode=True`` (the whole text in the prefill),
as ``engine.batched.prompt.PromptBuilder`` builds it (see its module docstring, positions in
order): [instruct] + role + codec prefix + (text + codec pad, tts_pad + codec bos) or, for an
in-context clone, (reference transcript and text + codec pad, codec bos and the reference
codes' embeddings + tts_pad). The pieces come from the file:

* text: token ids (``tokenizer``), their rows of the text embedding table read from the
  file's mapping (a prompt touches a few dozen of its 151,936 rows), then the text
  projection run as a ggml graph on the weights in the buffer (``graphs.TextProjection``);
* codec rows (think / language / speaker / pad / bos ids, a clone's reference codes): rows of
  the talker's and the predictor's codec embedding tables, read from the mapping likewise;
* a clone's speaker embedding (x-vector) and codes: ``CloneVoice``, from ``voice_refs``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ....common.vocabulary import ModelKind
from ...segment import Segment
from .graphs import TextProjection
from .tokenizer import TextTokenizer
from .weights import TalkerFile

#: Clone references whose codec part is kept (LRU).
CLONES_KEPT = 16


@dataclass(frozen=True)
class CloneVoice:
    """What a Base clone's prompt takes from its clip.

    Attributes:
        speaker: the x-vector, float32 [talker hidden].
        codes: the clip's codec codes int64 [T, 16] for an in-context (ICL) clone, else None.
        transcript: the clip's transcript (ICL only).
        key: identifies the clip (its digest).
    """

    speaker: np.ndarray
    codes: np.ndarray | None = None
    transcript: str | None = None
    key: str = ""


@dataclass(frozen=True)
class Prompt:
    """A segment's prefill.

    Attributes:
        embeds: talker input embeddings float32 [P, hidden].
        pad: the ``tts_pad`` text embedding float32 [hidden], added to every generated frame.
    """

    embeds: np.ndarray
    pad: np.ndarray


class PromptEmbedder:
    """Builds prompts (module docstring). Not thread-safe (the projection's graph allocator).

    Args:
        file: the talker GGUF; project: its text projection on the backend.
    """

    def __init__(self, file: TalkerFile, project: TextProjection) -> None:
        self.file = file
        self.kind = ModelKind(file.model_type)
        self._project_rows = project
        self.tokenizer = TextTokenizer(file.tokens(), file.merges())
        sp = file.specials
        self.tts_bos, self.tts_eos, self.tts_pad = self._project([sp.tts_bos, sp.tts_eos, sp.tts_pad])
        self.codec_pad, self.codec_bos = self._codec([sp.codec_pad, sp.codec_bos])
        self._clones: OrderedDict[str, np.ndarray] = OrderedDict()

    # --- pieces ------------------------------------------------------------------------

    def _project(self, ids: list[int]) -> np.ndarray:
        """Text-projected embeddings of ``ids``: float32 [len(ids), hidden]."""
        return self._project_rows(self.file.rows("talker.text_embd.weight", ids))

    def _codec(self, ids: list[int]) -> np.ndarray:
        """Talker codec embedding rows: float32 [len(ids), hidden]."""
        return self.file.rows("talker.codec_embd.weight", ids)

    def _codes_embedded(self, codes: np.ndarray) -> np.ndarray:
        """A reference's codes int [T, 16] embedded, the 16 codebooks summed: float32 [T, hidden]
        (code 0 from the talker's table, code i from the predictor's table i - 1)."""
        total = self._codec(codes[:, 0].tolist())
        for i in range(1, codes.shape[1]):
            total = total + self.file.rows(f"code_pred.codec_embd.{i - 1}.weight", codes[:, i].tolist())
        return total

    def _language_id(self, language: str, speaker: str | None) -> int | None:
        """The codec language id (None for "auto"), a dialect speaker's own for Chinese/auto.

        Raises:
            ValueError: a language or speaker the model does not have.
        """
        lang = language.lower()
        language_id = None
        if lang != "auto":
            if lang not in self.file.languages:
                raise ValueError(f"unsupported language {language!r}; this model has {', '.join(sorted(self.file.languages))}, auto")
            language_id = self.file.languages[lang]
        if speaker and lang in ("chinese", "auto"):
            dialect = self.file.speakers[speaker.lower()][1]
            if dialect:
                language_id = self.file.languages[dialect]
        return language_id

    def _prefix(self, language_id: int | None, speaker: np.ndarray | None) -> np.ndarray:
        """The codec prefix float32 [C - 1, hidden]: think / language / think_eos ids, the
        speaker embedding, codec pad (the last id, bos, is the text part's)."""
        sp = self.file.specials
        think = [sp.nothink, sp.think_bos, sp.think_eos] if language_id is None else [sp.think, sp.think_bos, language_id, sp.think_eos]
        parts = [self._codec(think)]
        if speaker is not None:
            parts.append(speaker.reshape(1, -1).astype(np.float32))
        parts.append(self.codec_pad[None])
        codec = np.concatenate(parts)
        text = np.repeat(self.tts_pad[None], len(codec), axis=0)  # tts_pad x (C - 2), tts_bos
        text[-1] = self.tts_bos
        return text + codec

    # --- the prompt --------------------------------------------------------------------

    def build(self, segment: Segment, clone: CloneVoice | None = None) -> Prompt:
        """The prompt of ``segment`` (a Base model's with ``clone``, its clip's voice).

        Raises:
            ValueError: an unknown language or speaker, a Base segment without ``clone``, an
                ICL clone without a transcript.
        """
        speaker_embed: np.ndarray | None = None
        speaker: str | None = None
        instruct: str | None = None
        if self.kind is ModelKind.BASE:
            if clone is None:
                raise ValueError("the Base model needs a clone reference")
            speaker_embed = clone.speaker
        else:
            instruct = segment.instruct or None
            if self.kind is ModelKind.CUSTOM_VOICE:
                speaker = (segment.speaker or "").lower()
                if speaker not in self.file.speakers:
                    raise ValueError(f"unknown speaker {segment.speaker!r}; this model has {', '.join(self.file.speakers)}")
                speaker_embed = self._codec([self.file.speakers[speaker][0]])[0]
                # the 0.6B CustomVoice takes no instruct (qwen_tts: ``tts_model_size in "0b6"``;
                # "0.6b" in case a file spells the size so)
                if self.file.model_size in "0b6" or self.file.model_size.lower() == "0.6b":
                    instruct = None
        language_id = self._language_id(segment.language, speaker)
        ids = self.tokenizer.ids(f"<|im_start|>assistant\n{segment.text}<|im_end|>\n<|im_start|>assistant\n")
        parts = []
        if instruct:
            parts.append(self._project(self.tokenizer.ids(f"<|im_start|>user\n{instruct}<|im_end|>\n")))
        parts.append(self._project(ids[:3]))
        parts.append(self._prefix(language_id, speaker_embed))
        if clone is not None and clone.codes is not None:
            if not clone.transcript:
                raise ValueError("an in-context clone needs its clip's transcript")
            ref_ids = self.tokenizer.ids(f"<|im_start|>assistant\n{clone.transcript}<|im_end|>\n")[3:-2]
            text = np.concatenate([self._project(ref_ids + ids[3:-5]), self.tts_eos[None]])
            parts += [text + self.codec_pad, self._clone_codec(clone)]
        else:
            text = np.concatenate([self._project(ids[3:-5]), self.tts_eos[None]])
            parts += [text + self.codec_pad, (self.tts_pad + self.codec_bos)[None]]
        return Prompt(np.ascontiguousarray(np.concatenate(parts), dtype=np.float32), self.tts_pad.copy())

    def _clone_codec(self, clone: CloneVoice) -> np.ndarray:
        """An ICL clone's codec part float32 [T + 1, hidden]: codec bos and the codes'
        embeddings, each plus ``tts_pad`` (kept per clip, LRU)."""
        cached = self._clones.get(clone.key) if clone.key else None
        if cached is not None:
            self._clones.move_to_end(clone.key)
            return cached
        assert clone.codes is not None
        part = np.concatenate([self.codec_bos[None], self._codes_embedded(clone.codes)]) + self.tts_pad
        if clone.key:
            self._clones[clone.key] = part
            if len(self._clones) > CLONES_KEPT:
                self._clones.popitem(last=False)
        return part
