"""WebDataset sample grouping: which files form one sample, and names that would be misgrouped.

WebDataset splits a member name at the first dot of its basename: ``train/cat.0001.jpg`` is
key ``train/cat``, extension ``0001.jpg``. Readers then merge *consecutive* members with the
same key into one sample dict, lower-casing the extension. Everything that would make a reader
see something other than the files we were given is refused here, before anything is written.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from staging.errors import ProblemFound, UsageError
from staging.keys import find_collisions, key_parts
from staging.stores.base import ObjectInfo

#: Sample-dict fields WebDataset readers fill in themselves; an extension may not shadow them.
_RESERVED_PREFIX = "__"
#: A name that needs no further checks: ASCII, no empty, "." or ".." segments, no segment
#: starting with a dot, no backslash or NUL, and a basename STEM.EXT with non-empty dot-separated
#: extension parts, the first not starting with "__". Groups: key (dirs + stem), extension.
_PLAIN_NAME = re.compile(
    r"((?:[\x21-\x2d\x30-\x5b\x5d-\x7e][\x20-\x2e\x30-\x5b\x5d-\x7e]*/)*[\x21-\x2d\x30-\x5b\x5d-\x7e][\x20-\x2d\x30-\x5b\x5d-\x7e]*)"
    r"\.((?!__)[\x20-\x2d\x30-\x5b\x5d-\x7e]+(?:\.[\x20-\x2d\x30-\x5b\x5d-\x7e]+)*)"
).fullmatch


class Member(NamedTuple):
    """One file of a sample: the object and its extension (the part after the key's dot)."""

    info: ObjectInfo
    ext: str


class Sample(NamedTuple):
    """The files sharing one key, in extension order; ``nbytes`` is their total size."""

    key: str
    members: tuple[Member, ...]

    @property
    def nbytes(self) -> int:
        """Total payload bytes of the sample's files."""
        return sum(member.info.size for member in self.members)


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name by WebDataset's rule; UsageError when it has none.

    >>> split_name("train/cat.0001.jpg")
    ('train/cat', '0001.jpg')
    """
    directory, slash, base = name.rpartition("/")
    if base.startswith("."):
        raise UsageError(f"cannot pack {name!r}: its name starts with a dot, so it has no sample key",
                         "WebDataset readers would drop it; remove or rename it (e.g. .DS_Store files)")
    stem, dot, ext = base.partition(".")
    if not dot:
        raise UsageError(f"cannot pack {name!r}: it has no extension",
                         "WebDataset names a sample's files KEY.EXT; rename it, e.g. to "
                         f"{directory + slash}{base}.bin")
    if "" in ext.split("."):
        raise UsageError(f"cannot pack {name!r}: its extension {ext!r} has an empty part",
                         "a name ending in a dot or with '..' would be misread; rename it")
    if ext.startswith(_RESERVED_PREFIX):
        raise UsageError(f"cannot pack {name!r}: extension {ext!r} starts with '__'",
                         "WebDataset reserves __key__, __url__ and other __ fields in a sample")
    return directory + slash + stem, ext


def group_samples(objects: Iterable[ObjectInfo], directories_possible: bool = True) -> list[Sample]:
    """Group objects into samples, sorted by key, members sorted by extension.

    Raises UnsafeKey for names that would escape an extraction directory, UsageError for names
    without a usable key or extension, and ProblemFound when two files would land in the same
    sample field (extensions equal but for case: readers lower-case them) or a file's name is
    also the directory of other files (skipped when ``directories_possible`` is False: a
    filesystem cannot hold a file and a directory of the same name).
    """
    by_key: dict[str, dict[str, Member]] = {}
    for info in objects:
        name = info.key
        plain = _PLAIN_NAME(name)  # the common case, checked in one regular-expression match
        if plain is not None:
            key, ext = plain.groups()
        else:
            if not name.isascii():
                _refuse_undecodable(name)
            key_parts(name)  # raises UnsafeKey: a member named ../x escapes whoever extracts it
            key, ext = split_name(name)
        member = Member(info, ext)
        fields = by_key.get(key)
        if fields is None:
            by_key[key] = {ext.lower(): member}
            continue
        folded = ext.lower()
        if folded in fields:
            other = fields[folded].info.key
            raise ProblemFound(f"{other!r} and {name!r} would be the same field {folded!r} of sample {key!r}",
                               "WebDataset lower-cases extensions; rename one of them")
        fields[folded] = member
    if directories_possible:
        _refuse_file_directory_clashes(m.info.key for fields in by_key.values() for m in fields.values())
    samples = []
    for key in sorted(by_key):
        fields = by_key[key]
        if len(fields) == 1:
            members = tuple(fields.values())
        elif len(fields) == 2:  # the usual image+label pair: one comparison, not a sort
            (ext_a, member_a), (ext_b, member_b) = fields.items()
            members = (member_a, member_b) if ext_a < ext_b else (member_b, member_a)
        else:
            members = tuple(fields[ext] for ext in sorted(fields))
        samples.append(Sample(key, members))
    return samples


def _refuse_undecodable(name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise UsageError(f"cannot pack {shown!r}: its name is not valid UTF-8",
                         "tar shards store names as UTF-8; rename the file") from None


def _refuse_file_directory_clashes(names: Iterable[str]) -> None:
    clashes = find_collisions(names)
    if clashes:
        file_key, other = clashes[0]
        raise ProblemFound(f"{file_key!r} is a file and also the directory of {other!r}",
                           f"{len(clashes)} such name(s); a tar cannot hold both, rename one")
