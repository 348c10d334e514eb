"""What the server loads by default on the CPU (the GGML engine, or the reference engine where GGML cannot run).

On a machine without a GPU the configuration that speaks soonest is the 0.6B models at
Q8_0 (about 3x faster than 1.7B per frame) and, as the default voice, a CustomVoice speaker
(a preset would be designed live by the 1.7B VoiceDesign model, which is slow on a CPU).
Models named on the command line are kept as they are.
"""

from __future__ import annotations

from ...common.vocabulary import ModelKind

#: The 1.7B model ids the CLI defaults to -> their 0.6B counterparts (none for VoiceDesign).
SMALLER = {
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base": "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
}
#: The CustomVoice model loaded on the CPU when the user left ``--custom-voice-model`` at its default.
CPU_CUSTOM_VOICE = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
#: Default voice on the CPU when none is set, if the CustomVoice model has it.
CPU_DEFAULT_SPEAKER = "ryan"


def cpu_sources(sources: dict[ModelKind, str], given: set[ModelKind]) -> dict[ModelKind, str]:
    """``sources`` with every model not ``given`` on the command line swapped for its CPU
    default: the 0.6B Base for the 1.7B, and the 0.6B CustomVoice (so that a speaker can be
    the default voice) where none was asked for. VoiceDesign (1.7B only) stays."""
    out = dict(sources)
    for kind, source in sources.items():
        if kind in given:
            continue
        if kind is ModelKind.CUSTOM_VOICE and source.lower() == "none":
            out[kind] = CPU_CUSTOM_VOICE
        else:
            out[kind] = SMALLER.get(source, source)
    return out


def cpu_default_voice(speakers: list[str], fallback: str) -> str:
    """The default voice on the CPU: ``CPU_DEFAULT_SPEAKER`` (or the first speaker), else ``fallback``."""
    if CPU_DEFAULT_SPEAKER in speakers:
        return CPU_DEFAULT_SPEAKER
    return sorted(speakers)[0] if speakers else fallback
