# The compiled BizTalk context reader (biztalk_native.pyx): what mypy sees of it.
from collections.abc import Callable
from typing import Any

from bridge.codecs.biztalk_values import ContextProperty

def decode_context(blob: bytes) -> tuple[str, list[ContextProperty]] | None: ...
def context_fields(blob: bytes, names: dict[str, dict[str, str]], name_of: Callable[[str, str], str],
                   text_of: Callable[[Any], str], memo: list[Any] | None = None) -> tuple[dict[str, str], Any, Any, Any] | None: ...
def decode_blocks(blob: bytes) -> bytes | None: ...
