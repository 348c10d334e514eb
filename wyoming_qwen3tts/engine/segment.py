"""The engine's request type: one segment of text and how to voice and sample it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.vocabulary import Reference


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of one generation. Defaults are faster-qwen3-tts 0.5.4's
    (``generate_*_streaming`` for the talker, ``from_pretrained``'s ``PredictorGraph`` for
    the code predictor).

    Attributes:
        temperature: talker (first codebook) temperature; 0 means greedy.
        top_k: talker top-k; 0 disables it.
        top_p: talker nucleus mass in (0, 1]; 1 disables it.
        repetition_penalty: HF-style penalty on first-codebook ids already generated; 1 = off.
        predictor_temperature: code predictor (codebooks 2..16) temperature; 0 = greedy.
        predictor_top_k: code predictor top-k; 0 disables it.
        predictor_top_p: code predictor nucleus mass.
    """

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    predictor_temperature: float = 0.9
    predictor_top_k: int = 50
    predictor_top_p: float = 1.0

    @classmethod
    def greedy(cls) -> Sampling:
        """Argmax everywhere, no repetition penalty (for parity checks)."""
        return cls(0.0, 0, 1.0, 1.0, 0.0, 0, 1.0)


@dataclass(frozen=True)
class Segment:
    """One generation: a piece of text (a sentence or less) and how to voice it.

    Attributes:
        text: cleaned text, at most ``vocabulary.MAX_SEGMENT_SECONDS`` of speech.
        language: Qwen3-TTS language name ("english", ..., or "auto").
        max_new_tokens: cap on generated codec frames (80 ms each).
        min_new_tokens: frames generated before EOS is allowed (benchmarks fix the length
            by setting it to ``max_new_tokens``).
        seed: the request's seed (0 .. 2**63-1); the batched engine's randomness is a pure
            function of it and the frame index, so it does not depend on other requests.
            None: the engine picks one.
        instruct: VoiceDesign description, or an optional style instruction for CustomVoice.
        speaker: CustomVoice speaker id.
        reference: clone reference for the Base model.
        sampling: sampling settings.
    """

    text: str
    language: str
    max_new_tokens: int
    min_new_tokens: int = 2
    seed: int | None = None
    instruct: str | None = None
    speaker: str | None = None
    reference: Reference | None = None
    sampling: Sampling = field(default_factory=Sampling)
