"""The refusals and failures of a speech request, as every door reports them.

A ``RequestError`` is a request the server will not run; each kind has a stable
machine-readable ``code`` (Wyoming's ``error`` event, the HTTP error object, the metrics'
``tts_errors_total``). A ``GenerationError`` is a model that failed on a segment after the
request was taken. The doors' protocol parsers raise and catch these without importing the
service itself.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the server will not run. ``code`` is a stable machine-readable id."""

    code = "bad-request"


class EmptyTextError(RequestError):
    """The text is empty, whitespace, or nothing speakable once cleaned."""

    code = "empty-text"


class TextTooLongError(RequestError):
    """The text is longer than the server's limit."""

    code = "text-too-long"


def text_too_long(chars: int, max_chars: int, streamed: bool = False) -> TextTooLongError:
    """The refusal of a text of ``chars`` characters over ``max_chars`` (``--max-chars``), in
    the same words on every door and path: a whole text (``check_text``) and a streamed one
    (``SpeechStream.add_text``, ``streamed``: ``chars`` counts what came so far, up to the
    delta that passed the limit, so the message says "at least")."""
    size = f"at least {chars} characters (so far)" if streamed else f"{chars} characters"
    return TextTooLongError(f"Text is {size}, over the limit of {max_chars} (--max-chars)")


class VoiceNotFoundError(RequestError):
    """No available voice of that name."""

    code = "unknown-voice"


class NoVoicesError(VoiceNotFoundError):
    """The server has no voice at all yet (the clone model alone, and no usable clip in the
    voices folder): every request is refused with how to add one, until one is added.
    A ``VoiceNotFoundError``, so every door answers it where it answers an unknown voice
    (HTTP 404, param ``voice``), with its own code."""

    code = "no-voices"


class DefaultVoiceGoneError(VoiceNotFoundError):
    """A request named no voice, and the server's explicit default voice (``--voice``) is
    no longer served (its clip was removed or broken by hand): what to do about it. A
    ``VoiceNotFoundError``, so every door answers it where it answers an unknown voice
    (HTTP 404, param ``voice``), with its own code."""

    code = "default-voice-gone"


class ModelUnservableError(RequestError):
    """The request needs a model the GPU cannot hold even alone (``TtsService.unservable``):
    refused before it is queued, as a model the server has not loaded is (HTTP 404, OpenAI's
    code ``model_not_found``). The message says why (the start-up plan's reason) and what
    to ask for instead.

    Attributes:
        param: the request field at fault: ``voice`` (its voice, or the default voice, is
            spoken by that model) or ``instructions`` (they design a voice with it).
    """

    code = "model_not_found"

    def __init__(self, message: str, param: str = "voice") -> None:
        super().__init__(message)
        self.param = param


class LanguageError(RequestError):
    """The language is not one Qwen3-TTS speaks."""

    code = "unsupported-language"


class OverloadedError(RequestError):
    """The server already has ``max_queue`` requests open: refused at once, never queued.

    Attributes:
        retry_after_s: seconds after which a retry is worth trying (HTTP ``Retry-After``).
    """

    code = "overloaded"
    retry_after_s = 2


class ServerStoppingError(RequestError):
    """The server is shutting down: new requests are refused and open streams end with it."""

    code = "server-stopping"


class GenerationError(RuntimeError):
    """The model failed on a segment; the message says why."""
