"""qbridge's PostgreSQL sessions store a long value (a BizTalk message's context headers, a body of
more than ~2 kB) compressed with lz4, which takes less than half pglz's time in a BizTalk batch's
COPY (issue 49), unless someone chose a method: the database, the role or the connection's own
options keep theirs."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from bridge.db import dispose_all, engine_for

LONG = "".join(f"header-{i}: value {i % 7}; " for i in range(400))  # compressible, past the 2 kB threshold


def _stored_as(url: str, schema: str) -> tuple[str, str]:
    """(the session's default_toast_compression, the method of a long value written through engine_for)."""
    dispose_all()
    engine = engine_for(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE TABLE "{schema}".t (v text)'))
            conn.execute(sa.text(f'INSERT INTO "{schema}".t VALUES (:v)'), {"v": LONG})
        with engine.connect() as conn:
            setting = conn.execute(sa.text("SHOW default_toast_compression")).scalar_one()
            method = conn.execute(sa.text(f'SELECT pg_column_compression(v) FROM "{schema}".t')).scalar_one()
            assert conn.execute(sa.text(f'SELECT v FROM "{schema}".t')).scalar_one() == LONG
        return setting, method
    finally:
        dispose_all()


def test_long_values_are_stored_with_lz4_where_nobody_chose(pg_schema: str, pg_server: str) -> None:
    assert _stored_as(pg_server, pg_schema) == ("lz4", "lz4")


def test_a_method_the_connection_chose_is_kept(pg_schema: str, pg_server: str) -> None:
    url = pg_server + ("&" if "?" in pg_server else "?") + "options=-c%20default_toast_compression%3Dpglz"
    assert _stored_as(url, pg_schema) == ("pglz", "pglz")


def test_a_method_the_role_chose_is_kept(pg_schema: str, pg_server: str) -> None:
    role = f"qb_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(pg_server)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN SUPERUSER"))
        conn.execute(sa.text(f"ALTER ROLE {role} SET default_toast_compression = pglz"))
    try:
        url = sa.engine.make_url(pg_server).set(username=role).render_as_string(hide_password=False)
        assert _stored_as(url, pg_schema) == ("pglz", "pglz")
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()
