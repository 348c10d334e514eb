"""The batched engine's stages, each owning its thread, graphs or buffers (see ``engine.py``)."""
