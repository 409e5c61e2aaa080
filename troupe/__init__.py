"""troupe: memory and sessions for AI companions and agents, on an actor runtime on trio.

Subpackages: ``runtime`` (actor kernel and Env ports), ``storage`` (apsw engine),
``retrieval`` (hybrid recall), ``models`` (model and embedder ports), ``actors`` (domain
actors), ``http`` (one app per contract surface), ``sim`` (deterministic simulator).
"""

__version__ = "0.1.0"
