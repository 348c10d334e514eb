"""GPU memory arithmetic: how long a slot's cache must be, and how many slots fit.

Pure functions (bytes in, counts out) so they are unit-tested without a GPU; the loader
feeds them what ``torch.cuda`` reports. Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..text import FRAMES_PER_SECOND, MAX_SEGMENT_SECONDS
from ..voices import MAX_REFERENCE_SECONDS

GB = 1024**3
#: Most slots ``--max-streams auto`` gives one model: the engine's largest batch bucket.
MAX_AUTO_STREAMS = 32
#: Fewest slots a model is loaded with (one stream always fits, or the model does not).
MIN_STREAMS = 1
#: Text tokens per second of speech, an upper bound over the ten languages (English speaks
#: about 3 BPE tokens a second, Chinese and Japanese about 5 characters, one token each).
TEXT_TOKENS_PER_SECOND = 6.0
#: Fixed prompt positions around the text: role and control tokens, the speaker/instruct
#: slot and the codec BOS/pad run (Qwen3-TTS's chat template, measured on the tiny model: 14).
PROMPT_OVERHEAD = 32
#: Generated frames per second of estimated speech: slow speakers and pauses run past
#: ``text.estimated_seconds`` by up to a half (the rest of ``frame_budget``'s 2x is a guard
#: against a model that never stops, which the cache end caps as well as the budget would).
SPEECH_SLACK = 1.5
#: What a model needs beyond its weights and slots: CUDA graphs' private pools, the
#: prefill's activations, the allocator's fragmentation (measured on the H200 with the
#: 1.7B models: 0.6 to 0.9 GB; see ``benchmarks/memory.py``).
WORKSPACE_BYTES = int(1.0 * GB)


def slot_positions(
    reference_seconds: float = MAX_REFERENCE_SECONDS,
    segment_seconds: float = MAX_SEGMENT_SECONDS,
    round_to: int = 128,
) -> int:
    """Talker KV positions one slot needs for the longest segment the service sends.

    The longest prompt is an ICL clone's: reference codes (12.5 a second) and transcript
    tokens, then the segment's text; then the generated frames, with ``SPEECH_SLACK``.

    Args:
        reference_seconds: longest reference clip (``voices.MAX_REFERENCE_SECONDS``).
        segment_seconds: longest segment's estimated speech (``text.MAX_SEGMENT_SECONDS``).
        round_to: positions are rounded up to a multiple of this.

    Returns:
        positions (1,024 for the shipped limits; faster-qwen3-tts's default is 2,048).
    """
    prompt = (
        reference_seconds * FRAMES_PER_SECOND
        + TEXT_TOKENS_PER_SECOND * (reference_seconds + segment_seconds)
        + PROMPT_OVERHEAD
    )
    frames = SPEECH_SLACK * segment_seconds * FRAMES_PER_SECOND
    return int(math.ceil((prompt + frames) / round_to) * round_to)


@dataclass(frozen=True)
class StreamPlan:
    """How many slots a model gets and why (for the log).

    Attributes:
        streams: slots to allocate (at least ``MIN_STREAMS`` when ``fits``).
        fits: False when not even ``MIN_STREAMS`` slots fit; ``streams`` is then 0.
        reason: one line for the log, with the figures in GB.
    """

    streams: int
    fits: bool
    reason: str


def plan_streams(
    free: int,
    slot_bytes: int,
    workspace: int = WORKSPACE_BYTES,
    reserve: int = 0,
    cap: int = MAX_AUTO_STREAMS,
    asked: int | None = None,
) -> StreamPlan:
    """Slots that fit in ``free`` bytes after the workspace and a reserve for other models.

    Args:
        free: device memory this process may still allocate (after this model's weights).
        slot_bytes: one slot's KV, decoder state and buffers (``BatchedEngine.slot_bytes``).
        workspace: ``WORKSPACE_BYTES`` (graphs, prefill activations, fragmentation).
        reserve: bytes kept for a model loaded later (the VoiceDesign model's return).
        cap: most slots (``MAX_AUTO_STREAMS``).
        asked: a fixed ``--max-streams``; the plan then says whether it fits.

    Raises:
        ValueError: ``slot_bytes`` is not positive.
    """
    if slot_bytes <= 0:
        raise ValueError(f"slot_bytes must be positive, got {slot_bytes}")
    room = free - workspace - reserve
    fit = max(0, room // slot_bytes)
    figures = (
        f"{free / GB:.1f} GB free after the weights, {workspace / GB:.1f} GB workspace"
        + (f", {reserve / GB:.1f} GB kept for the VoiceDesign model" if reserve else "")
        + f", {slot_bytes / 1e6:.0f} MB a stream"
    )
    if asked is not None:
        ok = fit >= asked
        return StreamPlan(asked, ok, f"{asked} stream(s) asked (--max-streams); {fit} fit ({figures})")
    if fit < MIN_STREAMS:
        return StreamPlan(0, False, f"not even {MIN_STREAMS} stream fits ({figures})")
    streams = int(min(fit, cap))
    why = f"at most {cap}" if fit > cap else "what the memory holds"
    return StreamPlan(streams, True, f"{streams} stream(s), {why} ({figures})")


def steady_streams(planned: int, last: int | None) -> int:
    """The streams a model loaded again gets: those of its last load while the plan is
    within one stream below or two above them, else the new plan.

    The driver's free memory moves by a stream's worth between loads of a model taking turns
    (the CUDA context grows as kernels load; the other model's last blocks): on the H200 with
    8 GB free the Base model got 11, 10, 10, 10, 11 streams. One stream below the plan is
    within ``WORKSPACE_BYTES``'s margin (measured need 0.6-0.9 GB of its 1.0 GB), and a real
    shortage still shrinks the plan, as does an out-of-memory at capture (``loader.load_fitting``).
    """
    if last is None or not last - 1 <= planned <= last + 2:
        return planned
    return last


def memory_budget(total: int, allocated: int, free_on_device: int, cap_gb: float | None) -> int:
    """Bytes this process may still allocate on the device.

    ``torch.cuda.mem_get_info`` reports the whole card, shared with other processes; a
    ``--gpu-memory`` cap (``torch.cuda.set_per_process_memory_fraction``) limits what this
    process's allocator may reserve, so the caller passes what it holds reserved after
    ``torch.cuda.empty_cache()``: its tensors and the private pools of captured CUDA graphs,
    which no other allocation may use (counting those pools as free made the second model
    of a 12 and 16 GB card plan more streams than fit, on the H200).

    Args:
        total: the card's memory.
        allocated: bytes this process's allocator holds (``torch.cuda.memory_reserved`` after
            ``empty_cache``).
        free_on_device: free bytes on the card (``mem_get_info()[0]``, after ``empty_cache``).
        cap_gb: ``--gpu-memory`` in GB (2**30 bytes), or None.

    Returns:
        bytes, never negative.
    """
    free = free_on_device
    if cap_gb is not None:
        free = min(free, int(cap_gb * GB) - allocated)
    return max(0, min(free, total))


def cap_fraction(cap_gb: float, total: int) -> float:
    """The fraction of the card ``--gpu-memory`` means (``set_per_process_memory_fraction``).

    Raises:
        ValueError: a cap that is not positive or exceeds the card.
    """
    if cap_gb <= 0:
        raise ValueError(f"--gpu-memory must be more than 0 GB, got {cap_gb}")
    if cap_gb * GB > total:
        raise ValueError(f"--gpu-memory {cap_gb} GB is more than the card's {total / GB:.1f} GB")
    return cap_gb * GB / total


#: Streams each model must get for two models to count as fitting on the card together.
MIN_SHARED_STREAMS = 2
#: ``--design-model-memory`` choices.
DESIGN_MEMORY = ("auto", "resident", "on-demand")


@dataclass(frozen=True)
class ModelNeed:
    """One model's memory needs, estimated before loading.

    Attributes:
        kind: the model kind's value ("base", "voice_design", "custom_voice").
        weights: bytes of its weights in the dtype they load in.
        slot: bytes of one slot (``loader.checkpoint_slot_bytes``).
    """

    kind: str
    weights: int
    slot: int

    def footprint(self, streams: int) -> int:
        """Weights, workspace and ``streams`` slots, in bytes."""
        return self.weights + WORKSPACE_BYTES + streams * self.slot


@dataclass(frozen=True)
class Residency:
    """Which models stay in GPU memory and what each one's sizing leaves for the others.

    Attributes:
        design: "resident" (loaded at start, kept), "on-demand" (loaded when needed, left
            when idle; room for it is kept), "turns" (the models do not fit together: one
            is on the card at a time, each with the whole memory) or "none" (no VoiceDesign
            model).
        reserves: per model kind, bytes its stream sizing leaves free for models loaded
            after it (load order: as given to ``plan_residency``).
        reason: one log line, with the figures in GB.
        unservable: per model kind that can never be on this card, even alone (its weights,
            workspace and one stream are more than the budget), why, with the figures; empty
            when every model fits alone, or when none does (start-up then fails loading).
    """

    design: str
    reserves: dict[str, int]
    reason: str
    unservable: dict[str, str] = field(default_factory=dict)


def plan_residency(needs: list[ModelNeed], budget: int, policy: str = "auto", design: str = "voice_design") -> Residency:
    """Decide how the VoiceDesign model uses the card, and the reserves of each model.

    Args:
        needs: the enabled models in load order (the VoiceDesign model last).
        budget: bytes this process may allocate (``memory_budget`` before loading).
        policy: ``--design-model-memory``: "auto" keeps the VoiceDesign model resident when
            every model fits with ``MIN_SHARED_STREAMS`` streams, else the models take turns;
            "resident" always keeps it (the user's choice); "on-demand" loads it when needed
            and drops it when idle (taking turns if they do not fit together).

    Raises:
        ValueError: an unknown policy.
    """
    if policy not in DESIGN_MEMORY:
        raise ValueError(f"unknown --design-model-memory {policy!r}; one of {', '.join(DESIGN_MEMORY)}")
    together = sum(n.footprint(MIN_SHARED_STREAMS) for n in needs)
    fits = together <= budget
    figures = f"{together / GB:.1f} GB needed with {MIN_SHARED_STREAMS} streams each, {budget / GB:.1f} GB available"
    has_design = any(n.kind == design for n in needs)
    if not has_design:
        mode, reason = "none", f"no VoiceDesign model ({figures})"
    elif policy == "resident" or (policy == "auto" and fits):
        mode = "resident"
        reason = f"the VoiceDesign model stays in GPU memory ({figures}{'' if fits else '; it may not fit'})"
    elif fits:
        mode, reason = "on-demand", f"the VoiceDesign model is loaded when needed and leaves when idle ({figures})"
    else:
        mode = "turns"
        reason = (
            f"the models do not fit on the GPU together ({figures}): one at a time, the VoiceDesign model "
            "only while it renders anchors or designs; --clone-model Qwen/Qwen3-TTS-12Hz-0.6B-Base lets them share it"
        )
    if mode == "turns":
        return Residency(mode, {n.kind: 0 for n in needs}, reason, unservable(needs, budget))
    room = max(0, budget - sum(n.weights + WORKSPACE_BYTES for n in needs))
    share = room // max(1, len(needs))
    reserves = {
        n.kind: sum(later.weights + WORKSPACE_BYTES + share for later in needs[i + 1 :])
        for i, n in enumerate(needs)
    }
    return Residency(mode, reserves, reason)


def unservable(needs: list[ModelNeed], budget: int) -> dict[str, str]:
    """The models that cannot be on the card even alone: weights, ``WORKSPACE_BYTES`` and
    ``MIN_STREAMS`` streams above ``budget`` (the memory each would have with the others
    gone). Empty when none or all of them are (with none fitting, start-up fails loading).

    Returns:
        per model kind, one line: why, with the figures in GB.
    """
    out = {
        n.kind: (
            f"the {n.kind} model does not fit in this GPU's {budget / GB:.1f} GB even alone: it needs "
            f"{n.footprint(MIN_STREAMS) / GB:.1f} GB ({n.weights / GB:.1f} GB weights, {WORKSPACE_BYTES / GB:.1f} GB "
            f"workspace, {n.slot / 1e6:.0f} MB for {MIN_STREAMS} stream)"
        )
        for n in needs
        if n.footprint(MIN_STREAMS) > budget
    }
    return out if len(out) < len(needs) else {}
