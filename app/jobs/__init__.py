"""Durable explanation jobs: many images, one set of /attribute parameters, answered in the
background at a lower priority than interactive requests, surviving restarts.

``store.py`` (what is stored, the :class:`~app.jobs.store.Store` protocol), ``sql.py`` (the SQL
shared by) ``sqlite.py`` (the default, one file under ``IDG_DATA_DIR``) and ``postgres.py``
(``IDG_JOBS_DB_URL``, replicas sharing jobs), ``archive.py`` (bounded tar/zip reading),
``runner.py`` (claims images, answers them through the worker, stores the answers, callbacks), ``callbacks.py`` (a
callback's URL checked, shown redacted, delivered signed) and ``sealing.py`` (its secrets sealed in the store).
The routes are in :mod:`app.api.routes.jobs`.
"""
