"""Text cleanup and segmentation shared by both front doors.

Incoming text (an LLM's reply, streamed in arbitrary deltas) becomes a sequence of
*segments*: cleaned sentences, each short enough that one generation fits the model's
static KV cache. Sentence boundaries come from the ``sentence-stream`` package; this
module only adds markdown/emoji cleanup, the split of over-long sentences and the
per-segment frame budget.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from sentence_stream import SentenceBoundaryDetector

#: Codec frames per second of audio (Qwen3-TTS-Tokenizer-12Hz: 1920 samples at 24 kHz = 80 ms).
FRAMES_PER_SECOND = 12.5

#: Speaking rates used to bound generation (characters per second of speech). Slow ends of
#: ordinary speech, so real speech ends well inside the budget.
_LATIN_CHARS_PER_SECOND = 12.0
_CJK_CHARS_PER_SECOND = 3.5

#: Longest speech one segment may be estimated to need, in seconds. With the budget below
#: (2x the estimate + 1 s) a segment generates at most ~640 frames, which leaves >1400 of
#: faster-qwen3-tts's default 2048-token static KV cache for the prompt.
MAX_SEGMENT_SECONDS = 25.0

_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_LINK_RE = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_URL_RE = re.compile(r"https?://\S+")
_CODE_FENCE_RE = re.compile(r"```[^\n]*\n?")
_MARKDOWN_RE = re.compile(
    r"(^|\s)#{1,6}(?=\s|$)|[*`~]{1,3}|__|^\s*[-+>]\s+|^\s*\|?(?:\s*:?-{3,}:?\s*\|?)+\s*$|\|", re.M
)
#: Emoji and pictographs (not other symbols: "°", "©" and "€" are spoken).
_EMOJI_RE = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F\u200D\U000E0020-\U000E007F]")
_SPACE_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:…。！？，])(?=\s|$)")
_CLAUSE_BREAK_RE = re.compile(r"(?<=[,;:，；：、])\s*")


def clean_text(text: str) -> str:
    """Make text speakable: drop markdown markup, links' targets, bare URLs and emoji.

    Returns the cleaned text with whitespace collapsed; may be "" (e.g. for "🎉").
    """
    text = _CODE_FENCE_RE.sub(" ", text)
    text = _LINK_RE.sub(r"\1", text)
    text = _URL_RE.sub(" ", text)
    text = _MARKDOWN_RE.sub(lambda m: m.group(1) or " ", text)
    text = _EMOJI_RE.sub(" ", text)
    text = _SPACE_RE.sub(" ", text).strip()
    return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", text)


def estimated_seconds(text: str) -> float:
    """Rough upper estimate of the speech duration of ``text``, in seconds."""
    cjk = len(_CJK_RE.findall(text))
    return cjk / _CJK_CHARS_PER_SECOND + (len(text) - cjk) / _LATIN_CHARS_PER_SECOND


def frame_budget(text: str) -> int:
    """Most codec frames one segment may generate: twice its estimated length plus 1 s.

    The model sometimes never emits EOS (random weights almost never do), so every
    generation is capped by this ``max_new_tokens``. Units: codec frames (80 ms each).
    """
    return int(2 * FRAMES_PER_SECOND * estimated_seconds(text) + FRAMES_PER_SECOND)


def split_long(sentence: str, max_seconds: float = MAX_SEGMENT_SECONDS) -> list[str]:
    """Split a sentence whose estimated speech exceeds ``max_seconds`` into pieces.

    Breaks at clause punctuation first, then at spaces, then (for unspaced scripts) at
    characters. Every piece is non-empty and no text is lost (pieces joined with single
    spaces equal the input up to whitespace).
    """
    if estimated_seconds(sentence) <= max_seconds:
        return [sentence]
    pieces: list[str] = []
    current = ""
    for unit in _units(sentence, max_seconds):
        candidate = f"{current} {unit}".strip() if current else unit
        if current and estimated_seconds(candidate) > max_seconds:
            pieces.append(current)
            current = unit
        else:
            current = candidate
    if current:
        pieces.append(current)
    return pieces


def _units(sentence: str, max_seconds: float) -> Iterator[str]:
    """Yield the smallest pieces ``split_long`` packs: clauses, else words, else characters."""
    for clause in filter(None, (c.strip() for c in _CLAUSE_BREAK_RE.split(sentence))):
        if estimated_seconds(clause) <= max_seconds:
            yield clause
            continue
        for word in clause.split():
            if estimated_seconds(word) <= max_seconds:
                yield word
                continue
            step = max(1, int(len(word) * max_seconds / estimated_seconds(word)))
            for start in range(0, len(word), step):
                yield word[start : start + step]


class Segmenter:
    """Turn streamed text deltas into speakable segments, as soon as each is complete.

    Deltas may split anywhere, even inside words. ``add`` returns the segments completed
    by a delta; ``finish`` returns the rest. Each segment is cleaned (``clean_text``) and
    at most ``MAX_SEGMENT_SECONDS`` of estimated speech; segments that clean to "" are
    dropped.
    """

    def __init__(self) -> None:
        self._detector = SentenceBoundaryDetector()

    def add(self, delta: str) -> list[str]:
        """Feed one delta; return the segments it completed (possibly none)."""
        return self._segments(self._detector.add_chunk(delta))

    def finish(self) -> list[str]:
        """End the stream; return the segments of the text still buffered."""
        return self._segments([self._detector.finish()])

    @staticmethod
    def _segments(sentences: Iterable[str]) -> list[str]:
        out: list[str] = []
        for sentence in sentences:
            cleaned = clean_text(sentence)
            if cleaned:
                out.extend(split_long(cleaned))
        return out
