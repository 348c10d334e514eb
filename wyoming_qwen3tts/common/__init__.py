"""What every wing shares: audio facts (``audio``), the engine's vocabulary (``vocabulary``:
model kinds, references and their limits), a request's timeline (``timeline``), Prometheus
metrics (``metrics``) and the quieting of third-party output (``quiet``).

The ground floor: it imports nothing of the project outside itself.
"""
