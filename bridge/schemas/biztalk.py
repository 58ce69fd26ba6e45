"""The MessageBox tables qbridge reads, defined once for SQL Server, PostgreSQL and SQLite.

Microsoft publishes no MessageBox DDL. The columns are those seen in real queries and stored
procedure text (reference/legacy-sources.md §3.2-3.4); the per-host queue columns follow the
`<Host>Q_Suspended` query in QuickMon, and `<Host>Q` is [INFERRED] to hold the same references.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mssql

_IMAGE = sa.LargeBinary().with_variant(mssql.IMAGE(), "mssql")


def tables(schema: str | None = None, hosts: list[str] | tuple[str, ...] = ()) -> dict[str, sa.Table]:
    md = sa.MetaData(schema=schema)
    t = {
        "Spool": sa.Table(
            "Spool", md,
            sa.Column("uidMessageID", sa.Uuid, primary_key=True),
            sa.Column("UserName", sa.Unicode(256)),
            sa.Column("dtTimeStamp", sa.DateTime),
            sa.Column("dtExpiration", sa.DateTime),
            sa.Column("nNumParts", sa.Integer),
            sa.Column("uidBodyPartID", sa.Uuid),
            sa.Column("nvcBodyPartName", sa.Unicode(256)),
            sa.Column("nvcMessageType", sa.Unicode(256)),
            sa.Column("PublishingServer", sa.Unicode(256)),
            sa.Column("nCounter", sa.Integer),
            sa.Column("imgContext", _IMAGE),
        ),
        "MessageParts": sa.Table(
            "MessageParts", md,
            sa.Column("uidMessageID", sa.Uuid, primary_key=True),
            sa.Column("uidPartID", sa.Uuid, primary_key=True),
            sa.Column("nvcPartName", sa.Unicode(256)),
            sa.Column("nBodyPart", sa.Integer),
        ),
        "Parts": sa.Table(
            "Parts", md,
            sa.Column("uidPartID", sa.Uuid, primary_key=True),
            sa.Column("imgPart", _IMAGE),
            sa.Column("imgPropBag", _IMAGE),
            sa.Column("nNumFragments", sa.Integer),
            sa.Column("nPartSize", sa.Integer),
        ),
        "Fragments": sa.Table(
            "Fragments", md,
            sa.Column("uidPartID", sa.Uuid, primary_key=True),
            sa.Column("nFragmentNumber", sa.Integer, primary_key=True),
            sa.Column("nOffsetStart", sa.Integer),
            sa.Column("nOffsetEnd", sa.Integer),
            sa.Column("imgFrag", _IMAGE),
            sa.Column("nFragmentSize", sa.Integer),
        ),
        "InstancesSuspended": sa.Table(
            "InstancesSuspended", md,
            sa.Column("uidInstanceID", sa.Uuid, primary_key=True),
            sa.Column("nState", sa.Integer),
            sa.Column("dtSuspendTimeStamp", sa.DateTime),
            sa.Column("dtCreated", sa.DateTime),
            sa.Column("nvcURI", sa.Unicode(1024)),
            sa.Column("nvcAdapter", sa.Unicode(256)),
            sa.Column("nvcErrorDescription", sa.UnicodeText),
        ),
        "Subscription": sa.Table(
            "Subscription", md,
            sa.Column("uidSubID", sa.Uuid, primary_key=True),
            sa.Column("nvcName", sa.Unicode(256)),
            sa.Column("uidServiceID", sa.Uuid),
            sa.Column("uidPredicateGroupID", sa.Uuid),
        ),
        "PredicateGroup": sa.Table(
            "PredicateGroup", md,
            sa.Column("uidPredicateORGroupID", sa.Uuid),
            sa.Column("uidPredicateANDGroupID", sa.Uuid),
        ),
        "EqualsPredicates": sa.Table(
            "EqualsPredicates", md,
            sa.Column("uidPredicateGroupID", sa.Uuid),
            sa.Column("uidPropID", sa.Uuid),
            sa.Column("vtValue", sa.Unicode(512)),  # sql_variant on SQL Server; read as text
            sa.Column("nID", sa.Integer),
        ),
    }
    for host in hosts:
        for name in (f"{host}Q", f"{host}Q_Suspended"):
            t[name] = sa.Table(
                name, md,
                sa.Column("uidMessageID", sa.Uuid, primary_key=True),
                sa.Column("uidInstanceID", sa.Uuid, primary_key=True),
                sa.Column("uidServiceID", sa.Uuid),
                sa.Column("nvcAdditionalInfo", sa.Unicode(1024)),
            )
    return t


OTHER_PREDICATES = ("FirstPassPredicates", "EqualsPredicates2ndPass", "NotEqualsPredicates", "GreaterThanPredicates",
                    "GreaterThanOrEqualsPredicates", "LessThanPredicates", "LessThanOrEqualsPredicates",
                    "ExistsPredicates", "BitwiseANDPredicates")
