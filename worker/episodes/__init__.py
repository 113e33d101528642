"""Long-term memory: one episode per finished session, stored, embedded, ranked and recalled.

Owns the ``episodes`` rows and their vectors; ``EpisodeStore`` is the way in.
"""

from worker.episodes.embedding import Embedder, LocalEmbedder, OpenAIEmbedder
from worker.episodes.store import EpisodeStore, RecallHit, SearchHit

__all__ = ["Embedder", "EpisodeStore", "LocalEmbedder", "OpenAIEmbedder", "RecallHit", "SearchHit"]
