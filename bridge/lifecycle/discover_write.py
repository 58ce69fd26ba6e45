"""`qbridge discover URL --write DIR`: a starter config and mapping for what discover found.

One job per legacy system found, every queue in it, each routed to a same-named NServiceBus
queue (a topic's durable subscribers to queues of their own names), every type seen listed
under `[types]` as itself with a comment to fill it in. The legacy URL's password becomes
`${QBRIDGE_LEGACY_PASSWORD}`; the target defaults to an SQLite file in DIR
(`${QBRIDGE_NSB_URL:-...}`), so `preview` and `init` work on the files as they are written.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from bridge.lifecycle.discover import NO_TYPE, Discovery

STATES = {
    "nginn": 'ready = "queue"\ndelayed = "delayed"\nfailed = "error"\nprocessed = "skip"\nexpired = "skip"\n',
    "openjms": 'ready = "queue"\nexpired = "skip"\n',
    "biztalk": 'ready = "queue"\nfailed = "error"       # suspended instances\nexpired = "skip"\n',
}


def _toml(text: str) -> str:
    """A TOML basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def legacy_url(url: sa.URL) -> str:
    """The URL as the config keeps it: its password, if any, read from the environment."""
    if url.password is None:
        return url.render_as_string(hide_password=False)
    return url.set(password="PASSWORD").render_as_string(hide_password=False).replace(
        ":PASSWORD@", ":${QBRIDGE_LEGACY_PASSWORD}@", 1)


def write_starter(found: Discovery, url: sa.URL, directory: Path) -> list[Path]:
    """Writes config.toml and a mapping per system into `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    systems = sorted({q.system for q in found.queues})
    nsb = (directory / "nservicebus.db").resolve()
    schema = f", schema = {_toml(found.schema)}" if found.schema else ""
    config = [
        f"# Written by `qbridge discover` from {found.where}. Keys: docs/configuration.md.",
        "# Point the target at your NServiceBus database with QBRIDGE_NSB_URL (and its flavor below).",
        "",
        "[connections]",
        f"legacy = {_toml(legacy_url(url))}",
        f"nsb    = {_toml('${QBRIDGE_NSB_URL:-sqlite:///' + str(nsb) + '}')}",
    ]
    written = []
    for system in systems:
        queues = [q for q in found.queues if q.system == system]
        names = ", ".join(_toml(q.name) for q in queues)
        tz = ', timezone = "UTC"' if system != "openjms" else ""
        config += [
            "",
            "[[jobs]]",
            f'name    = "{system}"',
            f'source  = {{ system = "{system}", connection = "legacy", queues = [{names}]{tz}{schema} }}',
            'target  = { connection = "nsb", flavor = "postgresql" }',
            f'mapping = "mapping-{system}.toml"',
            'mode    = "copy"',
        ]
        if tz:
            config.append("# timezone: the zone the legacy servers write local times in (NGinn, BizTalk); UTC is a guess")
        mapping = directory / f"mapping-{system}.toml"
        mapping.write_text(_mapping(system, queues))
        written.append(mapping)
    path = directory / "config.toml"
    path.write_text("\n".join(config) + "\n")
    return [path, *written]


def _mapping(system: str, queues: list) -> str:
    lines = [f"# Mapping for the {system} queues `qbridge discover` found. Keys: docs/mappings.md.", "", "[routes]"]
    for q in queues:
        lines.append(f"{_toml(q.name)} = {_toml(q.name)}")
        for consumer in q.consumers:
            lines.append(f"{_toml(consumer)} = {_toml(consumer)}  # durable subscriber of topic {q.name}")
    types = sorted({t for q in queues for t in q.types if t != NO_TYPE})
    lines += ["", "[types]", "# each type seen, as itself: fill in its NServiceBus.EnclosedMessageTypes name"]
    lines += [f"{_toml(t)} = {_toml(t)}  # TODO: the NServiceBus type" for t in types]
    lines += ["", "[states]", STATES[system]]
    return "\n".join(lines)
