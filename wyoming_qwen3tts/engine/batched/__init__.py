"""The batched CUDA engine: a pool of slots, every active stream one codec frame per step.

``engine.BatchedEngine`` runs it; the rest are its parts, planner → stages → kernels:
``planner`` (what runs next), ``pool`` (slots), ``stages`` (prompts prepared off the
engine thread), ``prefill`` (admission), ``step`` (the frame step), ``codec`` (the
incremental decoder, also used by the CPU reference engine), ``layers``, ``sampling``,
``graphs`` and ``kernels`` (Triton).
"""
