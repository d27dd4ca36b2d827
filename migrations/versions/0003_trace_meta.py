"""traces.meta: what a record says about itself beyond IntentusNet's shape

A JSON object, null for most traces: the hash of the envelope as stored when redaction rewrote
it (the envelope_hash column keeps the hash of the envelope as the caller sent it, which replay
with the original envelope checks), and an imported record's header as it was written (its
createdUtcIso text and replayableReason), so that export gives the record back byte for byte.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.add_column(sa.Column("meta", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.drop_column("meta")
