"""The LoomFlow suite runs on a PostgreSQL with pgvector: the recall tests' fixtures
(``pgvector_admin_url`` itself is shared by every suite: tests/conftest.py)."""

from tests.recall.conftest import vector_database_url

__all__ = ["vector_database_url"]
