"""Keep third-party start-up noise out of the server's log at the default log level.

Seen on a plain start without ``--debug`` (qwen-tts-hf 0.1.1.post1, transformers 5.16):
qwen_tts prints a flash-attn banner on import; the ``sox`` wrapper it imports runs
``sox -h`` through the shell (``/bin/sh: 1: sox: not found`` when the optional binary is
missing) and logs a SoX banner; transformers draws "Loading weights" progress bars and
warns about ``repetition_penalty`` on every CPU generation. None of it is actionable: the
SoX binary and flash-attn are optional, the warning is about the reference model's own call.
``--debug`` shows all of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator


#: Set by ``quiet_dependencies``: ``import_models`` then imports qwen_tts silenced.
_QUIET = False


def quiet_dependencies(models: bool = True) -> None:
    """Silence the noise above: import qwen_tts with stdout and stderr pointed at
    /dev/null (file descriptors, so a child shell's messages are caught too), turn off
    transformers' progress bars, and raise the chattiest loggers to WARNING.

    Call once at start-up, before other threads run (it swaps file descriptors 1 and 2).
    Hugging Face download progress stays on: a first start downloads gigabytes.

    Args:
        models: import qwen_tts now; False leaves it to ``import_models``, called where a
            PyTorch engine is loaded, so that a server on the GGML engine never imports
            qwen_tts, transformers and torch (0.8 GB resident, measured on this project's
            CPU benchmark machine).
    """
    global _QUIET
    _QUIET = True
    for noisy in ("qwen_tts", "transformers", "faster_qwen3_tts"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # faster-qwen3-tts warns that the codec has no sample-rate attribute (it is 24 kHz, as it
    # assumes), and its from_pretrained passes transformers' deprecated ``torch_dtype``.
    for name, text in (("faster_qwen3_tts.model", "Could not infer sample rate"), ("transformers.configuration_utils", "`torch_dtype` is deprecated")):
        logging.getLogger(name).addFilter(_Without(text))
    # The sox wrapper resets its logger's level on import: filter its warning instead.
    logging.getLogger("sox").addFilter(lambda record: record.levelno >= logging.ERROR)
    warnings.filterwarnings("ignore", message="Passing `repetition_penalty`", category=UserWarning)
    if models:
        import_models()


def quiet_compilers() -> None:
    """Keep numba's compiler trace out of the log, also under ``--debug``: librosa's
    functions are compiled by numba on first use, and at DEBUG numba logs every bytecode
    instruction and block of each (42 records for a one-line function; thousands for
    librosa's, burying the lines ``--debug`` is for). Its warnings still pass."""
    logging.getLogger("numba").setLevel(logging.WARNING)


def drop_default_config_notes() -> None:
    """Drop qwen_tts's "<part>_config is None. Initializing ... with default values" lines,
    also under ``--debug``: transformers builds a default config of the model's class
    whenever it compares configs (at load, and on every CPU generation), so the reference
    engine logged one or more a sentence, burying the lines ``--debug`` is for (87 of them
    against 48 of ours in one user's trial)."""
    for name in (
        "qwen_tts.core.models.configuration_qwen3_tts",
        "qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2",
    ):
        logging.getLogger(name).addFilter(_Without("Initializing", "with default values"))


def route_hub_logs() -> None:
    """Hugging Face hub messages (download retries, offline errors) once, in the server's log
    format: ``huggingface_hub`` puts a handler of its own on its logger at import and also
    propagates to the root logger, so each line came out twice, once without a timestamp.
    Call after ``logging.basicConfig``."""
    import huggingface_hub.utils.logging  # noqa: F401 - configures (and adds) its handler on import

    hub = logging.getLogger("huggingface_hub")
    for handler in list(hub.handlers):
        if type(handler) is logging.StreamHandler:
            hub.removeHandler(handler)


def import_models() -> None:
    """Import qwen_tts (and with it transformers and torch) if not yet imported: silenced,
    without transformers' progress bars, once ``quiet_dependencies`` ran; a plain import
    otherwise (``--debug`` shows everything)."""
    if "qwen_tts" in sys.modules or not _QUIET:
        return
    with _silenced_output():
        import qwen_tts  # noqa: F401 - imported here for its side effects only
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


@contextlib.contextmanager
def native_output(logger: logging.Logger) -> Iterator[None]:
    """Once ``quiet_dependencies`` ran (no ``--debug``): what native code prints to file
    descriptors 1 and 2 during the block (qwentts.cpp's loader prints about 25 lines a model,
    ``[GGUF] ...``, ``[KVCache] ...``, past its log callback) goes to ``logger`` at DEBUG, a
    line mentioning an error or a failure at WARNING. Otherwise nothing is redirected.

    Call only where no other thread writes to the console meanwhile (model loading at start):
    the descriptors are the process's.
    """
    if not _QUIET:
        yield
        return
    import tempfile

    with tempfile.TemporaryFile() as captured:
        try:
            with _output_to(captured.fileno()):
                yield
        finally:
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip():
                    bad = "error" in line.lower() or "fail" in line.lower()
                    logger.log(logging.WARNING if bad else logging.DEBUG, "%s", line.rstrip())


class _Without(logging.Filter):
    """Drops the records whose message contains every one of ``texts``."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not all(text in message for text in self.texts)


@contextlib.contextmanager
def _silenced_output() -> Iterator[None]:
    """Point file descriptors 1 and 2 at /dev/null for the block, then restore them."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        with _output_to(null):
            yield
    finally:
        os.close(null)


#: The console's descriptors (1, 2) while ``_output_to`` points them elsewhere, else None.
_SAVED: tuple[int, int] | None = None


def restore_console() -> None:
    """Point file descriptors 1 and 2 back at the console now, if a silenced or captured
    block has them (a signal handler's last log line must not go to /dev/null)."""
    if _SAVED is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(_SAVED[0], 1)
        os.dup2(_SAVED[1], 2)


@contextlib.contextmanager
def _output_to(fd: int) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``fd`` for the block (flushing Python's buffers on
    either side), then restore them."""
    global _SAVED
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        _SAVED = saved
        yield
    finally:
        _SAVED = None
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for kept in saved:
            os.close(kept)
