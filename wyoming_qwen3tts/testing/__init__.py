"""Test helpers: offline, randomly initialised Qwen3-TTS checkpoints (see ``checkpoint``)."""
