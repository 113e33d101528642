"""A forget may be of a time range: ``erasures.since``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

A row with ``since`` covers only what occurred in ``[since, cutoff)`` (``memworker forget
--since --before``); a row without it covers all that occurred before ``cutoff``, as before.
Downgrade drops the column: a range's rows then read as covering all that is older, so
downgrade refuses while one exists (forget the range's scope whole, or delete those rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("erasures", sa.Column("since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    ranges = op.get_bind().execute(sa.text("SELECT count(*) FROM erasures WHERE since IS NOT NULL"))
    if ranges.scalar_one():
        raise RuntimeError(
            "erasures of a time range exist (erasures.since): revision 0007 would read them as "
            "covering everything older; delete those rows first"
        )
    op.drop_column("erasures", "since")
