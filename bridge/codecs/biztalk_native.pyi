# The compiled BizTalk context reader (biztalk_native.pyx): what mypy sees of it.
from bridge.codecs.biztalk_values import ContextProperty

def decode_context(blob: bytes) -> tuple[str, list[ContextProperty]] | None: ...
