"""A forget covers the facts written before it: ``facts.written_at``, and blocks stamped when
they are written.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27

A forget decided which facts it covers by ``recorded_at``, a time the caller gives: a fact
appended after a forget but recorded before it was deleted when the owed forget was finished,
and a fact recorded in the future but appended before it outlived it. ``written_at`` is the
moment of the INSERT (``clock_timestamp()``): a forget covers a fact written before it took
effect (``erasures.written_before``) whose ``recorded_at`` is in the forget's range. An existing
fact gets the earlier of its ``recorded_at`` and now: written before any forget to come, so no
later forget covers less of it than it did. A block's ``updated_at`` (its write time) defaults
to ``clock_timestamp()`` too, as ``worker.user_memory.blocks`` now writes it. Downgrade drops the
column and restores the default.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("facts", sa.Column("written_at", _WHEN, nullable=True))
    op.execute("UPDATE facts SET written_at = least(recorded_at, now())")
    op.alter_column(
        "facts", "written_at", nullable=False, server_default=sa.text("clock_timestamp()")
    )
    op.alter_column("memory_blocks", "updated_at", server_default=sa.text("clock_timestamp()"))


def downgrade() -> None:
    op.alter_column("memory_blocks", "updated_at", server_default=sa.text("now()"))
    op.drop_column("facts", "written_at")
