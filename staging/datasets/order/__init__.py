"""The one epoch-order engine of every dataset: *shuffle* (:mod:`.lanes`: the run's lanes and each
lane's order per epoch), *deal* (:mod:`.deal`: nodes, ranks, workers, batches, the remainder
rule), *state* (:mod:`.state`: what is left of an epoch, the resume state), and the walk of one
rank through its node's sequence (:mod:`.walk`). :class:`EpochOrder` ties them together for a
dataset; the dataset classes above it only read samples."""

from lading.datasets.order.deal import REMAINDERS, Layout, check_remainder, check_slot, layout_for, worker_batches
from lading.datasets.order.engine import STATE_FORMAT, EpochOrder
from lading.datasets.order.lanes import choose_lanes

__all__ = [
    "REMAINDERS",
    "STATE_FORMAT",
    "EpochOrder",
    "Layout",
    "check_remainder",
    "check_slot",
    "choose_lanes",
    "layout_for",
    "worker_batches",
]
