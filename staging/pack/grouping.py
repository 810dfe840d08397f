"""WebDataset sample grouping: which files form one sample, and names that would be misgrouped.

WebDataset splits a member name at the first dot of its basename: ``train/cat.0001.jpg`` is
key ``train/cat``, extension ``0001.jpg``. Readers then merge *consecutive* members with the
same key into one sample dict, lower-casing the extension. Everything that would make a reader
see something other than the files we were given is refused here, before anything is written.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple, Protocol

from lading.core.errors import ProblemFound, UsageError
from lading.core.keys import find_collisions, key_parts

#: Sample-dict fields WebDataset readers fill in themselves; an extension may not shadow them.
_RESERVED_PREFIX = "__"
#: A name that needs no further checks: ASCII, no empty, "." or ".." segments, no segment
#: starting with a dot, no backslash or NUL, and a basename STEM.EXT with non-empty dot-separated
#: extension parts, the first not starting with "__". Groups: key (dirs + stem), extension.
_PLAIN_NAME = re.compile(
    r"((?:[\x21-\x2d\x30-\x5b\x5d-\x7e][\x20-\x2e\x30-\x5b\x5d-\x7e]*/)*[\x21-\x2d\x30-\x5b\x5d-\x7e][\x20-\x2d\x30-\x5b\x5d-\x7e]*)"
    r"\.((?!__)[\x20-\x2d\x30-\x5b\x5d-\x7e]+(?:\.[\x20-\x2d\x30-\x5b\x5d-\x7e]+)*)"
).fullmatch


class ListedFile(Protocol):
    """What grouping and packing read of a listed file: a store's ObjectInfo or a LocalFile."""

    @property
    def key(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def version(self) -> str: ...


class Member(NamedTuple):
    """One file of a sample: the object and its extension (the part after the key's dot)."""

    info: ListedFile
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
        raise UsageError(
            f"cannot pack {name!r}: its name starts with a dot, so it has no sample key",
            "WebDataset readers would drop it; remove or rename it (e.g. .DS_Store files)",
        )
    stem, dot, ext = base.partition(".")
    if not dot:
        raise UsageError(
            f"cannot pack {name!r}: it has no extension",
            f"WebDataset names a sample's files KEY.EXT; rename it, e.g. to {directory + slash}{base}.bin",
        )
    if "" in ext.split("."):
        raise UsageError(
            f"cannot pack {name!r}: its extension {ext!r} has an empty part",
            "a name ending in a dot or with '..' would be misread; rename it",
        )
    if ext.startswith(_RESERVED_PREFIX):
        raise UsageError(
            f"cannot pack {name!r}: extension {ext!r} starts with '__'",
            "WebDataset reserves __key__, __url__ and other __ fields in a sample",
        )
    return directory + slash + stem, ext


def group_samples(objects: Iterable[ListedFile], directories_possible: bool = True) -> list[Sample]:
    """Group objects into samples, sorted by key, members sorted by extension.

    Raises UnsafeKey for names that would escape an extraction directory, UsageError for names
    without a usable key or extension, and ProblemFound when two files would land in the same
    sample field (extensions equal but for case: readers lower-case them) or a file's name is
    also the directory of other files (skipped when ``directories_possible`` is False: a
    filesystem cannot hold a file and a directory of the same name).
    """
    first: dict[str, Member] = {}  # each key's first member
    more: dict[str, list[Member]] = {}  # its other members, for keys with several
    new = tuple.__new__  # Member(...) and Sample(...) without their generated __new__'s frame
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
        member = new(Member, (info, ext))
        if first.setdefault(key, member) is not member:
            others = more.get(key)
            if others is None:
                more[key] = [member]
            else:
                others.append(member)
    if directories_possible:
        _refuse_file_directory_clashes(
            [member.info.key for member in first.values()] + [m.info.key for ms in more.values() for m in ms]
        )
    samples = []
    for key in sorted(first):
        others = more.get(key)
        members = (first[key],) if others is None else _fields_in_order(key, first[key], others)
        samples.append(new(Sample, (key, members)))
    return samples


def _fields_in_order(key: str, member: Member, others: list[Member]) -> tuple[Member, ...]:
    """A sample's members sorted by lower-cased extension (the field a reader files them
    under); ProblemFound when two land in the same field."""
    if len(others) == 1:  # the usual image+label pair: one comparison, not a sort
        other = others[0]
        ext_a, ext_b = member.ext.lower(), other.ext.lower()
        if ext_a != ext_b:
            return (member, other) if ext_a < ext_b else (other, member)
    fields: dict[str, Member] = {}
    for candidate in (member, *others):
        folded = candidate.ext.lower()
        if folded in fields:
            raise ProblemFound(
                f"{fields[folded].info.key!r} and {candidate.info.key!r} would be the same "
                f"field {folded!r} of sample {key!r}",
                "WebDataset lower-cases extensions; rename one of them",
            )
        fields[folded] = candidate
    return tuple(fields[ext] for ext in sorted(fields))


def _refuse_undecodable(name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise UsageError(
            f"cannot pack {shown!r}: its name is not valid UTF-8", "tar shards store names as UTF-8; rename the file"
        ) from None


def _refuse_file_directory_clashes(names: Iterable[str]) -> None:
    clashes = find_collisions(names)
    if clashes:
        file_key, other = clashes[0]
        raise ProblemFound(
            f"{file_key!r} is a file and also the directory of {other!r}",
            f"{len(clashes)} such name(s); a tar cannot hold both, rename one",
        )
