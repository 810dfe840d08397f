"""The partitioned epoch order: node locality, exact elastic resume that keeps it.

1. **Partitions fixed for the run.** Shards are taken in index order, or in an order seeded by
   ``seed`` alone (``randomize_shard_order``: the same in every epoch). Their samples,
   concatenated, are cut into ``C`` contiguous partitions: partition ``c`` holds samples
   ``[c*T//C, (c+1)*T//C)``. Only the shards at partition edges are split.
2. **Each node owns a contiguous block of partitions**: node ``n`` of ``N`` (``N`` divides ``C``)
   owns partitions ``[n*C/N, (n+1)*C/N)``, so it reads only the shards of its block (about
   ``1/N`` of the data, plus the two shards split at its edges), in every epoch. The blocks of the
   node count the run started with are its *lanes* (recorded in the state): after a resume onto
   a node count that divides it, node ``n`` takes the lanes ``l`` with ``l % N == n``, so every
   surviving node keeps the block its cache already holds (:func:`node_blocks`).
3. **Inside a partition** the samples are permuted in windows of ``shuffle_buffer`` (window
   boundaries shifted and each window permuted per ``(seed, epoch, partition)``), a pure
   function: no buffer, so no hidden state.
4. **The node's sequence interleaves its partitions in lockstep**: round ``t`` takes the ``t``-th
   remaining sample of every partition of the block (in a spread order, varied per epoch), so every
   partition advances at the same rate. Whatever prefix of the node's sequence was consumed,
   each partition's consumed samples are a prefix of that partition's own sequence, and every
   partition has consumed about as much as any other.
5. **Dealt as before** inside the node: position ``t*R + r`` to the node's local rank ``r`` of
   ``R``, whole batches to DataLoader workers, equal counts per rank by the ``remainder`` rule
   (computed over all nodes' remaining counts).
6. **The resume state** is the epoch, ``C`` and each partition's consumed count (run-length
   encoded). Resuming onto ``N'`` nodes where ``N'`` divides ``C``: node ``n'`` reads the rest of
   its own partitions (so about ``1/N'`` of the shards); the balance of step 4 keeps the nodes'
   remaining counts within a few samples of each other. Otherwise (``N'`` does not divide ``C``)
   all partitions form one group dealt to all ranks: still exact, but every node reads from
   every shard until the epoch ends, which is logged once.
"""

from __future__ import annotations

import itertools
import logging
import random
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Sequence

from lading.core.errors import UsageError

log = logging.getLogger(__name__)

#: 10080 = 2^5 * 3^2 * 5 * 7: every node count from 1 to 10, and 12, 14, 15, 16, 18, 20, 21, 24, 28,
#: 30, 32, 35, 36, 40, 42, 45, 48, 56, 60, 63, 70, 72, 80, 84, 90, 96 ... divide it.
DEFAULT_PARTITIONS = 10080
_LOGGED: set[tuple[Any, ...]] = set()


def spread_order(count: int, mask: int = 0) -> list[int]:
    """``0 .. count-1`` in bit-reversed order, each value XORed with ``mask``: the first ``2^k``
    values meet every dyadic interval of the range once, so any prefix is spread evenly over it
    (whatever the mask, which varies the order from epoch to epoch)."""
    bits = max(1, (count - 1).bit_length())
    mask &= (1 << bits) - 1
    order = (int(format(i, f"0{bits}b")[::-1], 2) ^ mask for i in range(1 << bits))
    return [value for value in order if value < count]


class Partitions:
    """The run's fixed partitioning of the concatenated samples (see the module doc)."""

    def __init__(self, counts: Sequence[int], seed: int, shuffle_shards: bool, partitions: int) -> None:
        if partitions < 1:
            raise UsageError(f"partitions={partitions} must be positive")
        order = list(range(len(counts)))
        if shuffle_shards:
            random.Random(f"lading-run-shards:{seed}").shuffle(order)
        self.counts, self.shard_order, self.count = counts, order, partitions
        self.starts = list(itertools.accumulate((counts[s] for s in order), initial=0))
        self.total = self.starts[-1]

    def bounds(self, part: int) -> tuple[int, int]:
        """``[start, end)`` of partition ``part`` in the concatenated samples."""
        return part * self.total // self.count, (part + 1) * self.total // self.count

    def size(self, part: int) -> int:
        """Samples in partition ``part``."""
        start, end = self.bounds(part)
        return end - start

    def locate(self, spot: int) -> tuple[int, int]:
        """``(shard number in the index, sample in shard)`` of concatenated sample ``spot``."""
        slot = bisect_right(self.starts, spot) - 1
        return self.shard_order[slot], spot - self.starts[slot]

    def slot(self, spot: int) -> int:
        """The slot (in the run's shard order) holding concatenated sample ``spot``."""
        return bisect_right(self.starts, spot) - 1


class GroupOrder:
    """One epoch's sequence of a group of partitions (a node's block, or all of them), from the
    partitions' offsets (samples already consumed): position -> concatenated sample."""

    def __init__(self, parts: Partitions, members: Sequence[int], offsets: Sequence[int], seed: int, epoch: int,
                 window: int) -> None:
        self.parts, self.seed, self.epoch, self.window = parts, seed, epoch, max(1, window)
        mask = random.Random(f"lading-rounds:{seed}:{epoch}:{members[0] if members else 0}").getrandbits(30)
        spread = spread_order(len(members), mask)
        self.members = [members[i] for i in spread]
        self.offsets = [offsets[member] for member in self.members]
        self.remaining = [max(0, parts.size(m) - o) for m, o in zip(self.members, self.offsets)]
        # segments of rounds with the same active members: (first round, first position, active)
        self._segments: list[tuple[int, int, list[int]]] = []
        round_, position = 0, 0
        for value in sorted(set(self.remaining)):
            if value <= round_:
                continue
            active = [i for i, left in enumerate(self.remaining) if left > round_]
            self._segments.append((round_, position, active))
            position += (value - round_) * len(active)
            round_ = value
        self.length = position
        self._firsts = [segment[1] for segment in self._segments]
        self._perms: dict[tuple[int, int], list[int]] = {}
        self._shifts: dict[int, int] = {}

    def _where(self, position: int) -> tuple[int, int]:
        """``(round, member)`` of ``position`` (``0 <= position < length``)."""
        first_round, first_position, active = self._segments[bisect_right(self._firsts, position) - 1]
        rounds, index = divmod(position - first_position, len(active))
        return first_round + rounds, active[index]

    def _shift(self, part: int) -> int:
        if self.window <= 1:
            return 0
        shift = self._shifts.get(part)
        if shift is None:
            shift = self._shifts[part] = random.Random(f"lading-shift:{self.seed}:{self.epoch}:{part}").randrange(
                self.window)
        return shift

    def _window(self, part: int, local: int) -> tuple[int, int, int]:
        """``(number, start, end)`` of the window holding partition-local sample ``local``."""
        shift = self._shift(part)
        number = (local + shift) // self.window
        return number, max(0, number * self.window - shift), min(self.parts.size(part),
                                                                 (number + 1) * self.window - shift)

    def _permuted(self, part: int, local: int) -> int:
        if self.window <= 1:
            return local
        number, start, end = self._window(part, local)
        perm = self._perms.get((part, number))
        if perm is None:
            perm = list(range(end - start))
            random.Random(f"lading-window:{self.seed}:{self.epoch}:{part}:{number}").shuffle(perm)
            if len(self._perms) >= 2 * len(self.members) + 8:
                self._perms.pop(next(iter(self._perms)))
            self._perms[(part, number)] = perm
        return start + perm[local - start]

    def spot(self, position: int) -> int:
        """The concatenated sample at ``position`` of this group's sequence."""
        round_, member = self._where(position)
        part = self.members[member]
        return self.parts.bounds(part)[0] + self._permuted(part, self.offsets[member] + round_)

    def locate(self, position: int) -> tuple[int, int]:
        """``(shard, sample in shard)`` at ``position``."""
        return self.parts.locate(self.spot(position))

    def consumed(self, positions: int) -> dict[int, int]:
        """Each member partition's consumed count after the first ``positions`` of this sequence
        (including what was consumed before it started)."""
        done = {m: o for m, o in zip(self.members, self.offsets)}
        if positions <= 0:
            return done
        if positions >= self.length:
            return {m: o + r for m, o, r in zip(self.members, self.offsets, self.remaining)}
        round_, member = self._where(positions)
        first_round, first_position, active = self._segments[bisect_right(self._firsts, positions) - 1]
        ahead = set(active[:(positions - first_position) % len(active)])
        for i, m in enumerate(self.members):
            done[m] += min(self.remaining[i], round_) + (1 if i in ahead else 0)
        return done

    def shards_from(self, position: int) -> list[int]:
        """The group's shards in the order its sequence needs them, from ``position`` on."""
        if position >= self.length:
            return []
        round_ = self._where(position)[0]
        needed: dict[int, tuple[int, int]] = {}
        for i, part in enumerate(self.members):
            local = self.offsets[i] + round_
            if round_ >= self.remaining[i]:
                continue
            start, end = self.parts.bounds(part)
            low = start + self._window(part, local)[1]
            for slot in range(self.parts.slot(low), self.parts.slot(end - 1) + 1):
                first = max(0, self.parts.starts[slot] - start - self._window(part, local)[1])
                key = (round_ + first, i)
                shard = self.parts.shard_order[slot]
                if shard not in needed or key < needed[shard]:
                    needed[shard] = key
        return sorted(needed, key=needed.__getitem__)

    def done_before(self, position: int) -> set[int]:
        """Shards no partition of the group needs from ``position`` on (they may be released)."""
        round_ = self._where(position)[0] if position < self.length else max(self.remaining, default=0)
        done: set[int] = set()
        busy: set[int] = set()
        slot = self.parts.slot
        for i, part in enumerate(self.members):
            start, end = self.parts.bounds(part)
            if end <= start:
                continue
            first, last = slot(start), slot(end - 1)
            if round_ >= self.remaining[i]:
                done.update(range(first, last + 1))
                continue
            needed = slot(start + self._window(part, self.offsets[i] + round_)[1])
            done.update(range(first, needed))
            busy.add(needed)
            busy.add(last)
        return {self.parts.shard_order[s] for s in done - busy}

    def keep_open(self) -> int:
        """How many shards to keep mapped: what the group's windows touch at once."""
        smallest = min((count for count in self.parts.counts if count), default=1)
        per_window = 2 + -(-self.window // smallest)
        return max(4, min(512, self.shard_count() + 2, len(self.members) * per_window + 2))

    def shard_count(self) -> int:
        """How many shards the group reads (an upper bound of what to keep open)."""
        slots = set()
        for part in self.members:
            start, end = self.parts.bounds(part)
            if end > start:
                slots.update(range(self.parts.slot(start), self.parts.slot(end - 1) + 1))
        return len(slots)


@dataclass(frozen=True)
class Layout:
    """Where this process sits: ``nodes`` nodes of ``per_node`` ranks; this rank is local rank
    ``local_rank`` of node ``node`` (global ``rank`` of ``world_size``)."""

    rank: int
    world_size: int
    node: int
    local_rank: int
    per_node: int

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return self.world_size // self.per_node


def layout_for(rank: int, world_size: int, local_world_size: int | None, env_topology: Any | None) -> Layout:
    """The layout from explicit values, then the launcher's topology (when it describes this
    rank of this world), else one rank per node."""
    topo = env_topology
    same_job = topo is not None and topo.world_size == world_size and topo.rank == rank
    if local_world_size is None:
        local_world_size = topo.local_world_size if same_job else 1
    if local_world_size < 1 or world_size % local_world_size:
        raise UsageError(f"local_world_size={local_world_size} does not divide world_size={world_size}")
    if same_job and topo.local_world_size == local_world_size and topo.node_rank < world_size // local_world_size:
        return Layout(rank, world_size, topo.node_rank, topo.local_rank, local_world_size)
    return Layout(rank, world_size, rank // local_world_size, rank % local_world_size, local_world_size)


class EpochDeal:
    """This rank's share of one epoch: ``count`` samples, ``position(i)`` in ``group``'s sequence."""

    def __init__(self, parts: Partitions, layout: Layout, offsets: Sequence[int], seed: int, epoch: int,
                 window: int, remainder: str, resumed: bool = False, lanes: int | None = None) -> None:
        self.parts, self.layout, self.offsets, self.remainder = parts, layout, list(offsets), remainder
        self.seed, self.epoch = seed, epoch
        nodes = layout.nodes
        self.local = nodes == 1 or parts.count % nodes == 0
        if not self.local:
            _log_loss(parts, nodes, epoch, resumed)
        self.groups = nodes if self.local else 1
        self._blocks = node_blocks(parts.count, self.groups, lanes)
        self.ranks = layout.per_node if self.local else layout.world_size
        self.me = layout.local_rank if self.local else layout.rank
        self.mine = self._blocks[layout.node if self.local else 0]
        self.lengths = [self._length(block) for block in self._blocks]
        self.group = GroupOrder(parts, self.mine, self.offsets, seed, epoch, window)
        self.total = self.group.length

    def _length(self, members: Sequence[int]) -> int:
        return sum(max(0, self.parts.size(c) - self.offsets[c]) for c in members)

    @property
    def count(self) -> int:
        """Samples this rank yields in this run of the epoch (the same on every rank but with
        ``remainder="uneven"``)."""
        if self.remainder == "pad":
            return -(-max(self.lengths) // self.ranks)
        if self.remainder == "drop":
            return min(self.lengths) // self.ranks
        return max(0, -(-(self.total - self.me) // self.ranks))

    def position(self, local: int) -> int:
        """The group-sequence position of this rank's ``local``-th sample (padding wraps)."""
        position = local * self.ranks + self.me
        return position if position < self.total else position % max(1, self.total)

    def consumed_after(self, samples_seen: int) -> list[int]:
        """Every partition's consumed count once every rank consumed ``samples_seen`` samples."""
        done = list(self.offsets)
        for members in self._blocks:
            order = self.group if members == self.mine else GroupOrder(self.parts, members, self.offsets, self.seed, self.epoch, 1)
            positions = min(order.length, samples_seen * self.ranks)
            for part, count in order.consumed(positions).items():
                done[part] = count
        return done


def node_blocks(partitions: int, nodes: int, lanes: int | None = None) -> list[list[int]]:
    """The partitions each of ``nodes`` nodes reads (``nodes`` divides ``partitions``).

    ``lanes`` is the node count the run started with (its blocks are the lanes). When the node
    count divides it (a resume onto half the nodes, say), node ``n`` takes the lanes ``l`` with
    ``l % nodes == n``: each surviving node keeps the block it already holds in its node cache and
    adds others'. Otherwise each node takes a contiguous block, ``[n*C/N, (n+1)*C/N)``."""
    if lanes and lanes != nodes and lanes % nodes == 0 and partitions % lanes == 0:
        width = partitions // lanes
        return [[c for lane in range(node, lanes, nodes) for c in range(lane * width, (lane + 1) * width)]
                for node in range(nodes)]
    per = partitions // nodes
    return [list(range(node * per, (node + 1) * per)) for node in range(nodes)]


def _log_loss(parts: Partitions, nodes: int, epoch: int, resumed: bool) -> None:
    key = (parts.total, parts.count, nodes, epoch, resumed)
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    until = "until epoch %d ends" % epoch if resumed else "in every epoch"
    log.warning("node locality lost %s: %d nodes do not divide partitions=%d, so every node reads from "
                "every shard (exact all the same); use a node count that divides %d, or set partitions=",
                until, nodes, parts.count, parts.count)


def encode_counts(counts: Sequence[int]) -> list[Any]:
    """Run-length encoded (``[[value, repeat], ...]``) when that is shorter, else the plain list."""
    runs = [[value, len(list(run))] for value, run in itertools.groupby(counts)]
    return runs if 2 * len(runs) < len(counts) else list(counts)


def decode_counts(encoded: Any, partitions: int) -> list[int]:
    """The inverse of :func:`encode_counts`, checked against the partition count."""
    try:
        if all(isinstance(value, int) for value in encoded):
            counts = list(encoded)
        else:
            counts = [int(value) for value, repeat in encoded for _ in range(int(repeat))]
    except (TypeError, ValueError):
        raise UsageError("the saved state's consumed counts are not readable") from None
    if len(counts) != partitions:
        raise UsageError(f"the saved state has {len(counts)} partition counts for partitions={partitions}")
    return counts
