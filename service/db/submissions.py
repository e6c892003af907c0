"""Kernel-exercise submissions and their grading results, on the service's ``Base.metadata``.

The columns are defined once in ``workers.store`` (the lower layer), which the Celery worker uses
with plain SQLAlchemy Core on its own metadata; registering them here puts them in Alembic's
and ``create_all``'s view of the schema like every other kgrade table.
"""

from __future__ import annotations

from service.db.base import Base
from workers.store import define_tables

submissions, submission_results = define_tables(Base.metadata)

__all__ = ["submission_results", "submissions"]
