"""Language codes from clients to Qwen3-TTS names."""

import pytest

from wyoming_qwen3tts.languages import UnsupportedLanguageError, to_qwen


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
