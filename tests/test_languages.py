"""Language codes from clients to Qwen3-TTS names; which voices serve which pipeline language."""

import pytest

from wyoming_qwen3tts.text.languages import (
    ALL_CODES,
    QWEN_LANGUAGES,
    SPEAKER_LANGUAGES,
    UnsupportedLanguageError,
    codes_first,
    to_qwen,
)
from wyoming_qwen3tts.testing.checkpoint import SPEAKERS
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog


@pytest.mark.parametrize(
    ("given", "qwen"),
    [("en", "english"), ("en-US", "english"), ("de_DE", "german"), ("ZH", "chinese"),
     ("English", "english"), ("auto", "auto"), (None, "auto"), ("", "auto"), ("pt-BR", "portuguese")],
)
def test_to_qwen(given: str | None, qwen: str) -> None:
    assert to_qwen(given) == qwen


@pytest.mark.parametrize("bad", ["xx", "klingon", "nl-NL"])
def test_unsupported_languages_raise(bad: str) -> None:
    with pytest.raises(UnsupportedLanguageError, match="Unsupported language"):
        to_qwen(bad)


def test_codes_first_keeps_every_language_once() -> None:
    assert codes_first("ko")[0] == "ko" and sorted(codes_first("ko")) == sorted(ALL_CODES)
    assert codes_first(None) == codes_first("xx") == ALL_CODES


def test_shipped_presets_serve_every_pipeline_language_with_the_default_models() -> None:
    """The default models (Base and VoiceDesign) with an empty clone library: presets only."""
    catalog = VoiceCatalog(None, {ModelKind.BASE, ModelKind.VOICE_DESIGN})
    by_language = {code: [v.name for v in catalog.voices() if code in v.languages] for code in QWEN_LANGUAGES}
    assert all(by_language.values()), by_language
    for voice in catalog.voices():  # each preset speaks its own language, in the model's name for it
        assert voice.languages == (voice.languages[0],) and voice.language == QWEN_LANGUAGES[voice.languages[0]]


def test_custom_voice_speakers_list_every_language_their_own_first() -> None:
    assert set(SPEAKER_LANGUAGES) == set(SPEAKERS)  # the released checkpoints' speakers
    catalog = VoiceCatalog(None, {ModelKind.CUSTOM_VOICE}, list(SPEAKERS))
    ryan, sohee = catalog.get("ryan"), catalog.get("sohee")
    assert ryan.languages[0] == "en" and sohee.languages[0] == "ko"
    assert sorted(ryan.languages) == sorted(sohee.languages) == sorted(ALL_CODES)
