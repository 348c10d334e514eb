"""The front doors: the protocols clients speak.

``wyoming`` (the Wyoming protocol on TCP, with its zeroconf announcement) and ``http``
(the OpenAI-compatible speech API, its WebSocket, the voice studio and the OpenAPI
document); ``limits`` bounds what a connection of either may hold.

A door reaches the engine only through the service: it imports ``service``, ``catalogue``,
``text`` and ``common``, never ``engine``.
"""
