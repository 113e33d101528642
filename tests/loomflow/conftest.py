"""The LoomFlow suite runs on a PostgreSQL with pgvector: the recall tests' fixtures."""

from tests.recall.conftest import pgvector_admin_url, vector_database_url

__all__ = ["pgvector_admin_url", "vector_database_url"]
