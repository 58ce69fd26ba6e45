"""OpenJMS 0.7.6+ tables: as its own scripts create them, and as qbridge reads them.

Column names are declared lower-case: the PostgreSQL script creates them unquoted (so they
fold to lower case), and MySQL, SQL Server and SQLite match names case-insensitively.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mssql, mysql

SCHEMA_VERSION = "V0.7.6"  # RDBMSAdapter.SCHEMA_VERSION, unchanged through 0.7.7-beta-1

_BLOB = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb").with_variant(mssql.IMAGE(), "mssql")


def tables(schema: str | None = None) -> dict[str, sa.Table]:
    md = sa.MetaData(schema=schema)
    return {
        "system_data": sa.Table("system_data", md, sa.Column("id", sa.BigInteger), sa.Column("version", sa.String(20)),
                                sa.Column("creationdate", sa.Date)),
        "destinations": sa.Table("destinations", md, sa.Column("name", sa.String(255)), sa.Column("isqueue", sa.String(5)),
                                 sa.Column("destinationid", sa.BigInteger)),
        "messages": sa.Table("messages", md, sa.Column("messageid", sa.String(64)), sa.Column("destinationid", sa.BigInteger),
                             sa.Column("priority", sa.Integer), sa.Column("createtime", sa.BigInteger),
                             sa.Column("expirytime", sa.BigInteger), sa.Column("processed", sa.Integer),
                             sa.Column("messageblob", _BLOB)),
        "message_handles": sa.Table("message_handles", md, sa.Column("messageid", sa.String(64)),
                                    sa.Column("destinationid", sa.BigInteger), sa.Column("consumerid", sa.BigInteger),
                                    sa.Column("priority", sa.Integer), sa.Column("acceptedtime", sa.BigInteger),
                                    sa.Column("sequencenumber", sa.BigInteger), sa.Column("expirytime", sa.BigInteger),
                                    sa.Column("delivered", sa.Integer)),
        "consumers": sa.Table("consumers", md, sa.Column("name", sa.String(255)), sa.Column("destinationid", sa.BigInteger),
                              sa.Column("consumerid", sa.BigInteger), sa.Column("created", sa.BigInteger)),
    }


# The CREATE statements of OpenJMS's config/db/create_<db>.sql (0.7.6.1 = 0.7.7-beta-1), without the DROPs.
_POSTGRESQL = """
create table system_data (id int not null, version varchar(20) not null, creationDate DATE not null);
create unique index system_data_pk on system_data(id);
create table seeds (name varchar(20) not null, seed int not null);
create unique index seeds_pk on seeds(name);
create table destinations (name varchar(255) not null, isQueue char, destinationId int not null);
create unique index destinations_pk on destinations(destinationId);
create table messages (messageId varchar(64) not null, destinationId int8 not null, priority int, createTime int8,
  expiryTime int8, processed int, messageBlob bytea not null);
create index messages_pk on messages(messageId);
CREATE TABLE message_handles (messageId varchar(64) not null, destinationId int8 NOT NULL, consumerId int8 NOT NULL,
  priority int, acceptedTime int8, sequenceNumber int8, expiryTime int8, delivered int);
CREATE INDEX message_handles_pk ON message_handles(destinationId, consumerId, messageId);
create table consumers (name varchar(255) not null, destinationId int8 not null, consumerId int8 not NULL, created int8 NOT NULL);
create unique index consumers_pk on consumers(name, destinationId);
create table users (username varchar(50) not null, password varchar(50) not null);
create unique index users_pk on users(username)
"""
_MYSQL = """
create table system_data (id bigint not null, version varchar(20) not null, creationDate DATE not null);
create unique index system_data_pk on system_data(id);
create table seeds (name varchar(20) not null, seed bigint not null);
create unique index seeds_pk on seeds(name);
create table destinations (name varchar(255) not null, isQueue int not null, destinationId bigint not null);
create unique index destinations_pk on destinations(name);
create table messages (messageId varchar(64) not null, destinationId bigint not null, priority int, createTime bigint not null,
  expiryTime bigint, processed int, messageBlob longblob not null);
create index messages_pk on messages(messageId);
CREATE TABLE message_handles (messageId varchar(64) not null, destinationId bigint NOT NULL, consumerId bigint NOT NULL,
  priority int, acceptedTime bigint, sequenceNumber bigInt, expiryTime bigint, delivered int);
CREATE INDEX message_handles_pk ON message_handles(destinationId, consumerId, messageId);
create table consumers (name varchar(255) not null, destinationId bigint not null, consumerId bigint not NULL, created bigint NOT NULL);
create unique index consumers_pk on consumers(name, destinationId);
create table users (username varchar(50) not null, password varchar(50) not null);
create unique index users_pk on users(username)
"""
_SQLSERVER = _MYSQL.replace("longblob", "image")
SCRIPTS = {"postgresql": _POSTGRESQL, "mysql": _MYSQL, "mariadb": _MYSQL, "mssql": _SQLSERVER, "sqlite": _MYSQL}


def create(conn: sa.Connection) -> None:
    """Runs the OpenJMS create script of the connection's database (for tests and the demo)."""
    for statement in SCRIPTS[conn.dialect.name].split(";"):
        if statement.strip():
            conn.exec_driver_sql(statement.strip())
    t = tables()
    conn.execute(sa.insert(t["system_data"]).values(id=1, version=SCHEMA_VERSION, creationdate=sa.func.current_date()))


def is_queue(value: object) -> bool:
    """`destinations.isQueue`: an int on MySQL/SQL Server, a char (setBoolean) on PostgreSQL."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "t", "true", "y")
    return bool(value)
