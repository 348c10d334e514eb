"""Generation graphs of our own on the ggml the qwentts.cpp wheel bundles: each codec frame's
16 codes come out to Python (the wheel's own call decodes audio inside, with a slow codec).

Modules: ``api`` (the ctypes declarations, checked at load), ``weights`` (a talker GGUF in a
backend buffer), ``runtime`` (backend, thread pool, graphs, key/value caches), ``blocks``
(the transformer layers), ``graphs`` (talker, code predictor, text projection).
"""
