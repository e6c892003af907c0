"""Flask extensions, created unbound here and bound to an app with ``init_app``."""

from __future__ import annotations

from flask import Flask, current_app, g
from flask_smorest import Api
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.db import load_models, make_engine


class Database:
    """One engine per app, one session per app context (request or CLI command).

    A small replacement for Flask-SQLAlchemy (not a dependency) with the same shape:
    ``db.init_app(app)``, then ``db.session`` inside a request; the session is closed (and any
    uncommitted work rolled back) when the app context ends.
    """

    EXT_KEY = "kgrade.db"

    def init_app(self, app: Flask) -> None:
        load_models()
        engine = make_engine(app.config["DATABASE_URL"], **app.config.get("ENGINE_OPTIONS", {}))
        factory = sessionmaker(bind=engine, expire_on_commit=False)
        app.extensions[self.EXT_KEY] = (engine, factory)
        app.teardown_appcontext(self._close)

    @property
    def engine(self) -> Engine:
        return current_app.extensions[self.EXT_KEY][0]

    @property
    def session(self) -> Session:
        sess: Session | None = g.get("_kgrade_session")
        if sess is None:
            sess = current_app.extensions[self.EXT_KEY][1]()
            g._kgrade_session = sess
        return sess

    @staticmethod
    def _close(_exc: BaseException | None) -> None:
        sess: Session | None = g.pop("_kgrade_session", None)
        if sess is not None:
            sess.close()


def current_api() -> Api:
    return current_app.extensions["flask-smorest"]["apis"][""]["ext_obj"]


db = Database()
