"""The journal's schema history: Alembic revisions in ``versions/``, applied by ``checkfu.core.migrate``.

A schema change is a new revision file in ``versions/`` (``NNNN_what.py`` with ``revision``,
``down_revision``, ``upgrade()`` and ``downgrade()``), never an edit of an applied one, and the
tables in ``checkfu.core.journal`` change with it: ``tests/runner/test_runner_migrations.py``
holds the two to the same schema on SQLite and PostgreSQL.
"""
