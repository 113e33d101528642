"""Episode vectors for recall by meaning (pgvector), where the server has pgvector.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

``worker.db.vectors`` says what the table holds and why its ``vector`` column has no fixed
dimension (one partial HNSW index per dimension). Where the server has no pgvector this
revision changes nothing but says so in one line; ``memworker migrate`` tries again every time
it runs, so installing pgvector later and migrating again adds the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

from worker.db.vectors import create_vector_schema
from worker.settings import LOCAL_EMBEDDING_DIMENSION

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if context.is_offline_mode():
        return
    create_vector_schema(op.get_bind(), LOCAL_EMBEDDING_DIMENSION)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS episode_embeddings")
