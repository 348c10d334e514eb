"""``python -m wyoming_qwen3tts.gguf CHECKPOINT OUT_DIR [--quant Q8_0]``: convert to GGUF."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import QUANTS, ConversionError, convert


def main(argv: list[str] | None = None) -> int:
    """Convert a checkpoint folder; prints the two written paths. Exit 2 on a bad folder, or
    on one whose codec qwentts.cpp cannot run (``engine.cpu.ggml.check_checkpoint_widths``:
    the server would refuse the files; such a checkpoint runs on ``--engine reference``)."""
    from ..engine.cpu.ggml import NativeWidthError, check_checkpoint_widths

    parser = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.gguf", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="Hugging Face Qwen3-TTS checkpoint folder")
    parser.add_argument("out_dir", type=Path, help="folder for the talker and codec GGUF files")
    parser.add_argument("--quant", default="Q8_0", choices=QUANTS, type=str.upper)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_checkpoint_widths(args.checkpoint)
        talker, codec = convert(args.checkpoint, args.out_dir, args.quant)
    except NativeWidthError as err:
        print(f"error: {args.checkpoint}: {err}; its GGUF files would not run", file=sys.stderr)
        return 2
    except (ConversionError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(talker)
    print(codec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
