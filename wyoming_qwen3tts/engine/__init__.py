"""Speech generation: load a Qwen3-TTS checkpoint and turn segments into PCM streams.

Only the service and the command line import this package; the front doors never do.
"""

from .base import Engine, ModelMismatchError, Sink, Work, WorkSource
from .loader import DTYPES, ENGINES, MAX_SEQ_LEN, load_engine, pick_engine, resolve_checkpoint
from .segment import Sampling, Segment

__all__ = [
    "DTYPES",
    "ENGINES",
    "MAX_SEQ_LEN",
    "Engine",
    "ModelMismatchError",
    "Sampling",
    "Segment",
    "Sink",
    "Work",
    "WorkSource",
    "load_engine",
    "pick_engine",
    "resolve_checkpoint",
]
