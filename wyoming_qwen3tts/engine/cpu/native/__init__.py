"""Generation graphs of our own on the ggml the qwentts.cpp wheel bundles: each codec frame's
16 codes come out to Python (the wheel's own call decodes audio inside, with a slow codec).

The entry point is ``generator.GgmlFrameSource``: built from one model's GGUF folder and a
thread count, its ``frames(segment, cancelled)`` yields int64 [16] codes per 80 ms codec
frame. Modules, bottom up:

* ``api``: the ctypes declarations of the ggml functions used, loaded from the wheel's
  ``libggml-base`` / ``libggml-cpu`` and checked at load (``GgmlApiError``, one log line);
* ``weights``: a talker GGUF's metadata (ggml's own reader) and its weights in backend buffers;
* ``runtime``: the CPU backend with its thread pool, graphs, key/value caches;
* ``blocks``: the Qwen3 decoder layers as graph pieces;
* ``graphs``: the talker, the code predictor's 15 passes, the text projection;
* ``tokenizer``, ``prompt``, ``voice_refs``: a segment's talker input embeddings from the
  GGUF file (clone clips through the wheel's own extraction);
* ``sampling``: the batched engine's sampler in numpy;
* ``generator``: the frame loop.

Nothing here imports torch.
"""
