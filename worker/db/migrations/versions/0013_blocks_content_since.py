"""A forget covers a block holding text written before it: ``memory_blocks.content_since``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27

A forget decided which blocks it covers by ``updated_at``, the block's last write: a block
appended to after a forget (while the forget was owed) moved past the forget's instant and kept
the text written before it when the owed forget was finished. ``content_since`` is when the
oldest text still in the block was written (``clock_timestamp()``): set by an insert and by a
whole replace, kept by an append. A forget covers a block whose ``content_since`` is before its
instant (``erasures.written_before``) and, with ``before``/``since``, whose text spans some of
the range (``content_since`` before ``before``, ``updated_at`` at or after ``since``). An
existing block gets its ``updated_at``: what the forgets before this migration went by.
Downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("memory_blocks", sa.Column("content_since", _WHEN, nullable=True))
    op.execute("UPDATE memory_blocks SET content_since = updated_at")
    op.alter_column(
        "memory_blocks",
        "content_since",
        nullable=False,
        server_default=sa.text("clock_timestamp()"),
    )


def downgrade() -> None:
    op.drop_column("memory_blocks", "content_since")
