# The compiled root `$type` scanner of JSON bodies (bodytype_native.pyx): what mypy sees of it.
from typing import Any

DEFER: object

def root_types(texts: list[Any], ok: list[bool]) -> tuple[list[Any], list[int]]: ...
