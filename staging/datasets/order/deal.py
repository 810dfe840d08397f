"""Deal: an epoch's remaining samples to nodes, their ranks, DataLoader workers and batches.

1. **Nodes.** Node ``n`` of ``N`` owns whole lanes: on the run's first node count ``N0`` the
   contiguous block ``[n*L/N0, (n+1)*L/N0)`` (its *home* lanes); after a resume onto ``N`` nodes
   with ``N`` dividing ``N0``, the lanes whose home ``h`` has ``h % N == n`` (every surviving node
   keeps what its cache holds); else, when ``N`` divides ``L``, the block ``[n*L/N, (n+1)*L/N)``.
   Otherwise locality is lost: one group of all ranks (logged). A node's sequence is its lanes'
   remaining ranges, lanes in run order from a start drawn per ``(seed, epoch)`` (so the two halves
   of a shard split between neighbouring lanes are read one right after the other), merged by
   key where they meet (:mod:`.walk`).
2. **Balance.** With ``remainder="pad"`` or ``"drop"`` every rank gets the same count ``q``
   (``ceil`` or ``floor`` of remaining / ranks). A node longer than ``q * ranks`` hands its last
   samples to nodes that are short (in node order), so only those few leave their node; what is
   still short wraps to the node's start (pad: at most ``world - 1`` repeats), what is still over is
   skipped (drop). ``"uneven"``: no moves, every sample once, ranks' counts differ.
3. **Ranks and workers.** Node position ``t*R + r`` goes to local rank ``r`` of ``R``; a rank's
   samples are cut into batches of ``batch_size``; DataLoader worker ``w`` of ``k`` yields batches
   ``w, w+k, ...`` (the order DataLoader collects them), so what the loop consumed is a prefix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from lading.core.errors import UsageError
from lading.datasets.order.lanes import visit_start
from lading.datasets.order.state import Piece, Remaining

log = logging.getLogger(__name__)

REMAINDERS = ("pad", "drop", "uneven")
_LOGGED: set[tuple[Any, ...]] = set()


def check_remainder(remainder: str) -> str:
    """Refuse an unknown ``remainder=``."""
    if remainder not in REMAINDERS:
        raise UsageError(f"remainder={remainder!r} is not one of {', '.join(REMAINDERS)}")
    return remainder


def check_slot(rank: int, world_size: int) -> None:
    """Refuse a rank outside the world."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in 0..{world_size - 1}")


@dataclass(frozen=True)
class Layout:
    """``nodes`` nodes of ``per_node`` ranks; this rank is local rank ``local_rank`` of ``node``."""

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
    """The layout from explicit values, then the launcher's topology (when it describes this rank
    of this world), else one rank per node."""
    topo = env_topology
    if topo is not None and (topo.world_size != world_size or topo.rank != rank):
        topo = None  # the launcher describes another job
    if local_world_size is None:
        local_world_size = topo.local_world_size if topo is not None else 1
    if local_world_size < 1 or world_size % local_world_size:
        raise UsageError(f"local_world_size={local_world_size} does not divide world_size={world_size}")
    if (
        topo is not None
        and topo.local_world_size == local_world_size
        and topo.node_rank < world_size // local_world_size
    ):
        return Layout(rank, world_size, topo.node_rank, topo.local_rank, local_world_size)
    return Layout(rank, world_size, rank // local_world_size, rank % local_world_size, local_world_size)


def lane_owners(lanes: int, nodes: int, homes: int) -> np.ndarray | None:
    """The node owning each lane (rule 1 of the module docstring), or None: locality lost."""
    lane = np.arange(lanes)
    if homes and lanes % homes == 0 and homes % nodes == 0:
        return (lane // (lanes // homes)) % nodes
    if lanes % nodes == 0:
        return lane // (lanes // nodes)
    return None


def home_edges(lanes: int, homes: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Per lane, whether it starts / ends its node's sequence on the run's first layout (``homes``
    nodes) in an epoch whose visit starts at lane ``start``: where a lane's spread is bounded."""
    owners = lane_owners(lanes, homes, homes) if homes > 1 else None
    if owners is None:
        owners = np.zeros(lanes, dtype=np.int64)
    visit = (np.arange(lanes) + start) % lanes
    firsts = np.zeros(lanes, dtype=bool)
    lasts = np.zeros(lanes, dtype=bool)
    _, first_at = np.unique(owners[visit], return_index=True)
    _, last_at = np.unique(owners[visit][::-1], return_index=True)
    firsts[visit[first_at]] = True
    lasts[visit[lanes - 1 - last_at]] = True
    return firsts, lasts


def _warn_lost(lanes: int, nodes: int, epoch: int) -> None:
    key = (lanes, nodes, epoch)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.warning(
            "node locality lost in epoch %d: %d nodes do not divide the run's %d lanes, so every node "
            "reads from every shard (exact all the same); run on a node count that divides %d",
            epoch,
            nodes,
            lanes,
            lanes,
        )


@dataclass
class NodeSequences:
    """Every group's sequence of lane pieces after balancing, and each rank's count.

    ``groups`` is the node count, or 1 when locality is lost (then ``ranks`` is the world size)."""

    pieces: list[list[Piece]]
    ranks: int
    per_rank: int | None  # every rank's count; None with "uneven" (each group's ranks split its length)
    real: list[int]  # per group: how many of its positions are samples (the rest wraps: padding)

    def count(self, group: int, rank: int) -> int:
        """Samples local rank ``rank`` of group ``group`` yields."""
        if self.per_rank is None:
            return max(0, -(-(self.real[group] - rank) // self.ranks))
        return self.per_rank

    def consumed(self, samples_seen: int) -> list[int]:
        """Per group, the samples delivered once every rank consumed ``samples_seen``."""
        return [min(real, samples_seen * self.ranks) for real in self.real]


def node_sequences(
    remaining: Remaining, layout: Layout, homes: int, seed: int, epoch: int, shuffle: bool, remainder: str
) -> tuple[NodeSequences, bool]:
    """The epoch's (remaining) samples dealt to nodes; second: whether locality holds."""
    lanes = len(remaining.ranges)
    found = lane_owners(lanes, layout.nodes, homes) if layout.nodes > 1 else np.zeros(lanes, dtype=np.int64)
    local = found is not None
    if found is None:
        _warn_lost(lanes, layout.nodes, epoch)
    owners = found if found is not None else np.zeros(lanes, dtype=np.int64)
    groups = layout.nodes if local else 1
    ranks = layout.per_node if local else layout.world_size
    # lanes in run order from a start drawn per epoch: a shard split between lanes l and l + 1 is
    # then read at the end of one and the start of the next (once), not at two far-apart times
    visit = (np.arange(lanes) + visit_start(seed, epoch, lanes, shuffle)) % lanes
    pieces: list[list[Piece]] = [[] for _ in range(groups)]
    for lane in visit.tolist():
        pieces[int(owners[lane])].extend(remaining.pieces(lane))
    return _balance(pieces, ranks, remainder), local


def _length(pieces: Sequence[Piece]) -> int:
    return sum(end - start for _, start, end in pieces)


def _balance(pieces: list[list[Piece]], ranks: int, remainder: str) -> NodeSequences:
    lengths = [_length(group) for group in pieces]
    total, world = sum(lengths), ranks * len(pieces)
    if remainder == "uneven":
        return NodeSequences(pieces, ranks, None, lengths)
    per_rank = -(-total // world) if remainder == "pad" else total // world
    target = per_rank * ranks
    spare: list[Piece] = []
    for group in pieces:  # longer groups hand over their tails, in group order
        over = _length(group) - target
        while over > 0:
            lane, start, end = group.pop()
            if end - start > over:
                group.append((lane, start, end - over))
                spare.append((lane, end - over, end))
                break
            spare.append((lane, start, end))
            over -= end - start
    spare.reverse()
    for group in pieces:  # shorter groups take them, in group order
        short = target - _length(group)
        while short > 0 and spare:
            lane, start, end = spare.pop()
            if end - start > short:
                spare.append((lane, start + short, end))
                end = start + short
            group.append((lane, start, end))
            short -= end - start
    return NodeSequences(pieces, ranks, per_rank, [_length(group) for group in pieces])


def worker_batches(count: int, batch_size: int, worker: int, num_workers: int) -> Iterator[range]:
    """The local sample ranges of the batches worker ``worker`` of ``num_workers`` yields."""
    batch = worker
    while batch * batch_size < count:
        yield range(batch * batch_size, min((batch + 1) * batch_size, count))
        batch += num_workers


def worker_locals(count: int, batch_size: int, worker: int, num_workers: int) -> np.ndarray:
    """The rank-local sample numbers worker ``worker`` yields, in order, as one array."""
    batch_size = max(1, batch_size)
    batches = np.arange(worker, -(-count // batch_size), num_workers)
    if not len(batches):
        return np.zeros(0, dtype=np.int64)
    locals_ = (batches[:, None] * batch_size + np.arange(batch_size)[None, :]).ravel()
    return locals_[locals_ < count]
