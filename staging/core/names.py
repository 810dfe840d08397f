"""Names of lading's hidden files beside a file: temporaries, markers, locks. Always a valid name.

A file name may be up to ``NAME_MAX`` (255) bytes on Linux; ``.{name}.lading-part`` would be
longer than that for names of 243 bytes and more, and the write would fail with
``ENAMETOOLONG``. :func:`hidden_sibling` keeps the readable form when it fits and otherwise
shortens the name, keeping its start and adding a hash of the whole name, so the result is
unique per name, stable across runs (a killed download resumes from its parts) and never over
``NAME_MAX`` bytes. Every temporary or marker name derived from a file name goes through it.
"""

from __future__ import annotations

import os

#: The longest file name (bytes) Linux file systems accept.
NAME_MAX = 255
_DIGEST_CHARS = 16


def hidden_sibling(name: str, suffix: str, reserve: int = 0) -> str:
    """``.{name}{suffix}``, or, when that exceeds NAME_MAX bytes, ``.{start of name}~{hash}{suffix}``.

    ``suffix`` (``.lading-part``, ``.lading-link-1234``...) is kept whole, so code that
    recognises lading's files by their suffix keeps working. ``reserve`` bytes are left free
    for a caller that appends to the result (``.tmp``).
    """
    limit = NAME_MAX - reserve
    full = f".{name}{suffix}"
    if len(os.fsencode(full)) <= limit:
        return full
    import hashlib  # only for a name too long to keep whole: not at start-up

    raw = os.fsencode(name)
    digest = hashlib.sha256(raw).hexdigest()[:_DIGEST_CHARS]
    room = limit - len(os.fsencode(f".~{digest}{suffix}"))
    if room < 0:
        raise ValueError(f"suffix too long for a file name: {suffix!r}")
    head = raw[:room].decode("utf-8", "ignore")  # a character cut in half is dropped; the hash identifies
    return f".{head}~{digest}{suffix}"


#: The files ``lading sync`` keeps at the top of a destination (its state, journal and lock).
SYNC_STATE_NAME, SYNC_JOURNAL_NAME, SYNC_LOCK_NAME = ".lading-sync.json", ".lading-sync.journal", ".lading-sync.lock"
SYNC_BOOKKEEPING = frozenset((SYNC_STATE_NAME, SYNC_JOURNAL_NAME, SYNC_LOCK_NAME))


def is_sync_bookkeeping(key: str) -> bool:
    """Whether ``key`` (relative to a synced destination) is one of lading sync's own files."""
    return key in SYNC_BOOKKEEPING
