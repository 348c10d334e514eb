"""The voice catalogue: which voices exist and where they come from.

``voices`` reads the voices folder, the presets and the loaded models' speakers into one
namespace of voice names (``VoiceCatalog``); ``library`` writes the folder (uploaded clips,
user presets, renames, deletes).

It imports ``text`` (languages) and ``common``; never the engine, the service or a door.
"""
