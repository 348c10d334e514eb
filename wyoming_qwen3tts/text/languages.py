"""Languages: the BCP-47 codes clients use, and the names Qwen3-TTS takes.

Qwen3-TTS names its ten languages in English ("english", "german", ...) plus "auto"
(the model's codec language ids, see the checkpoint's ``codec_language_id``).
Home Assistant matches voices by BCP-47 primary language codes ("en", "de"), so the
catalogue advertises those and this module converts between the two.
"""

from __future__ import annotations

AUTO = "auto"

#: BCP-47 primary subtag -> Qwen3-TTS language name (the released checkpoints' codec_language_id keys).
QWEN_LANGUAGES: dict[str, str] = {
    "zh": "chinese",
    "en": "english",
    "ja": "japanese",
    "ko": "korean",
    "de": "german",
    "fr": "french",
    "ru": "russian",
    "pt": "portuguese",
    "es": "spanish",
    "it": "italian",
}

#: Every code a voice of a multilingual model can be advertised with, in a stable order.
ALL_CODES: tuple[str, ...] = tuple(QWEN_LANGUAGES)

#: Native language of each built-in speaker of the released CustomVoice checkpoints (Qwen3-TTS
#: model card, "Available Speakers"; dylan speaks the Beijing and eric the Sichuan dialect).
#: Each speaks all ten languages, best its own.
SPEAKER_LANGUAGES: dict[str, str] = {
    "vivian": "zh",
    "serena": "zh",
    "uncle_fu": "zh",
    "dylan": "zh",
    "eric": "zh",
    "ryan": "en",
    "aiden": "en",
    "ono_anna": "ja",
    "sohee": "ko",
}


def codes_first(code: str | None) -> tuple[str, ...]:
    """Every code in ``ALL_CODES``, with ``code`` first: what a voice that speaks all ten
    languages advertises, its own language leading. ``None`` or an unknown code keeps
    ``ALL_CODES``' order."""
    if code is None or code not in ALL_CODES:
        return ALL_CODES
    return (code, *(c for c in ALL_CODES if c != code))


class UnsupportedLanguageError(ValueError):
    """The requested language is none of Qwen3-TTS's ten languages (nor "auto")."""


def to_qwen(language: str | None) -> str:
    """Map a client's language to a Qwen3-TTS language name.

    Accepts BCP-47 tags in any case and separator ("en", "en-US", "en_GB"), Qwen3-TTS
    names ("English") and "auto". ``None`` or "" gives "auto".

    Raises:
        UnsupportedLanguageError: for anything else, e.g. "xx" or "klingon".
    """
    if not language or not language.strip():
        return AUTO
    value = language.strip().lower()
    if value == AUTO or value in QWEN_LANGUAGES.values():
        return value
    primary = value.replace("_", "-").split("-", 1)[0]
    if primary in QWEN_LANGUAGES:
        return QWEN_LANGUAGES[primary]
    raise UnsupportedLanguageError(
        f"Unsupported language {language!r}; use one of {', '.join(ALL_CODES)} or 'auto'"
    )
