"""The wire formats qbridge reads and writes byte for byte: Java serialization and OpenJMS
message blobs (read both ways), BizTalk context and part blobs, NGinn's header pairs, the echo
tag every written message carries, and legacy column values as JSON. Pure functions of bytes
and strings: no database, no config.

May import: core.
"""
