"""`qbridge inspect KIND FILE...`: what qbridge reads from one legacy blob saved to a file, in
the shapes GUIDE.md gives (the fixture manifests' field names); ValueError says what is unreadable."""

from __future__ import annotations

from collections.abc import Callable


def _inspect_openjms(blobs: list[bytes]) -> dict:
    from bridge.codecs.openjms_blob import decode

    if len(blobs) != 1:
        raise ValueError("openjms-message takes exactly one file")
    return decode(blobs[0]).to_json()


def _inspect_biztalk_context(blobs: list[bytes]) -> dict:
    from bridge.codecs.biztalk import decode_context

    if len(blobs) != 1:
        raise ValueError("biztalk-context takes exactly one file")
    layout, props = decode_context(blobs[0])
    return {"layout": layout, "properties": [p.to_json() for p in props]}


def _inspect_biztalk_part(blobs: list[bytes]) -> dict:
    import hashlib

    from bridge.codecs.biztalk import decode_part

    body = decode_part(blobs)
    return {"decoded_length": len(body), "decoded_sha256": hashlib.sha256(body).hexdigest()}


INSPECTORS: dict[str, Callable[[list[bytes]], dict]] = {
    "openjms-message": _inspect_openjms,
    "biztalk-context": _inspect_biztalk_context,
    "biztalk-part": _inspect_biztalk_part,
}
