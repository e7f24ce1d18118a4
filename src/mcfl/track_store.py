"""Faults of an MLflow sqlite store itself, before MLflow opens it: a store that does not exist
yet is created whole under a temporary name (:func:`create_sqlite_store`), a path that is a
directory is refused at once (:func:`refuse_directory`), and MLflow's own log lines stay off the
screen (:func:`quiet_mlflow`). :func:`mcfl.track._client` calls them."""

from __future__ import annotations

import logging
from pathlib import Path

from mcfl.io import atomic_path

log = logging.getLogger("mcfl")


class TrackingError(ConnectionError):
    """The tracking store cannot be used; the message is one line naming the URI and what to do."""
#: the loggers of MLflow and the libraries under it, whose messages (tracebacks of a full disk,
#: retries, migrations) stay off the user's screen: the one-line TrackingError says what failed
MLFLOW_LOGGERS = ("mlflow", "alembic", "sqlalchemy")


def quiet_mlflow() -> None:
    """Keep MLflow's own log lines off stderr: its loggers show only CRITICAL messages, unless
    ``mcfl -v`` (the ``mcfl`` logger at DEBUG) asks for everything."""
    if log.getEffectiveLevel() <= logging.DEBUG:
        return
    for name in MLFLOW_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (None for an in-memory or another store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?")[0]
    return Path(path) if path and path != ":memory:" else None


def refuse_directory(uri: str) -> None:
    """A :class:`~mcfl.track.TrackingError` at once if a ``sqlite:///`` URI names a directory."""
    path = _sqlite_file(uri)
    if path is not None and path.is_dir():
        raise TrackingError(f"MLflow tracking store {uri}: {path} is a directory, not a database file; "
                            f"point MLFLOW_TRACKING_URI at a file, e.g. sqlite:///{path / 'mlflow.db'}")


def create_sqlite_store(uri: str) -> None:
    """Before MLflow opens a sqlite store: a path that is a directory fails at once (MLflow would
    retry for minutes); a store that does not exist yet (or is an empty file) is created with its
    tables under a temporary name and renamed into place, so a kill while MLflow creates the tables
    leaves no half-migrated database behind (and the next run makes it again)."""
    path = _sqlite_file(uri)
    if path is None:
        return
    refuse_directory(uri)
    if path.exists() and path.stat().st_size > 0:
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    with atomic_path(path) as tmp:
        tmp_uri = f"sqlite:///{tmp}"
        try:
            _get_sqlalchemy_store(tmp_uri, None)            # MLflow's own defaults: tables, Default
        finally:
            engine = SqlAlchemyStore._engine_map.pop(tmp_uri, None)
            if engine is not None:
                engine.dispose()

