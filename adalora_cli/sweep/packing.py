"""Which GPU a sweep's next run starts on, so that several small runs share one card.

A GLUE table is hundreds of short runs of a model that uses a fraction of an 80 GB GPU, so
``adalora sweep --jobs N`` starts up to N runs at once and packs them onto the visible GPUs
by memory. What a run needs comes from what it took before: a finished run records the peak
GPU memory its tensors held (``summary.json``'s ``peak_memory_bytes``, torch's
``max_memory_allocated``), and runs whose configs differ only in the seed
(``methods.registry.config_digest``) need the same. A run is given that peak plus
:data:`MARGIN` of it plus :data:`OVERHEAD` (what ``max_memory_allocated`` does not count:
the CUDA context, cuBLAS workspaces, the caching allocator's slack). A run whose config has
no record yet runs alone on a GPU, and no run joins it until it has finished and been
measured. A run that fits nowhere waits for runs to end; on an empty GPU it always starts.
Runs start in the plan's order: a waiting run is not overtaken, so none waits for ever.

Pure bookkeeping: :class:`GpuPacker` is told each GPU's memory and each run's peak, and
decides; ``local.py`` asks the GPUs and reads the run directories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MARGIN = 0.2
"""Added to a run's measured peak, as a share of it: another seed's batches pad to other
lengths, and the allocator's blocks fragment differently."""
OVERHEAD = 1 << 30
"""Bytes added to every measured run for what its peak does not count (1 GiB): a CUDA
context alone takes 0.3-0.6 GB."""


def need(peak: int, margin: float = MARGIN, overhead: int = OVERHEAD) -> int:
    """Bytes a run with measured ``peak`` bytes is given."""
    return math.ceil(peak * (1 + margin)) + overhead


@dataclass
class GpuPacker:
    """The runs each GPU holds now, and where the next one goes."""

    capacity: dict[str, int]
    """{GPU id as CUDA_VISIBLE_DEVICES names it: bytes free for this sweep's runs}."""
    margin: float = MARGIN
    overhead: int = OVERHEAD
    held: dict[str, dict[str, int | None]] = field(default_factory=dict)
    """{GPU: {run: bytes given, None for a run alone}}."""

    def __post_init__(self) -> None:
        self.held = {gpu: {} for gpu in self.capacity}

    def free(self, gpu: str) -> int:
        """Bytes not given to a run on ``gpu`` (0 while a run holds it alone)."""
        runs = self.held[gpu]
        if any(v is None for v in runs.values()):
            return 0
        return self.capacity[gpu] - sum(runs.values())

    def place(self, run: str, peak: int | None) -> str | None:
        """The GPU ``run`` starts on now (and is recorded as holding), or None: it waits.

        ``peak``: the measured peak of its config, None when there is none yet (it then
        needs a GPU with no run on it, and keeps it to itself). Of the GPUs it fits on,
        the one left with the least memory, so large gaps stay free for larger runs."""
        empty = [gpu for gpu, runs in self.held.items() if not runs]
        if peak is None:
            if not empty:
                return None
            self.held[empty[0]][run] = None
            return empty[0]
        given = need(peak, self.margin, self.overhead)
        fits = [gpu for gpu in self.held if self.free(gpu) >= given and self.held[gpu]]
        if fits:
            gpu = min(fits, key=lambda g: (self.free(g) - given, list(self.held).index(g)))
        elif empty:
            gpu = empty[0]  # more than a GPU has: it can still run alone
        else:
            return None
        self.held[gpu][run] = given
        return gpu

    def release(self, run: str) -> None:
        """``run`` has ended: what it held is free again."""
        for runs in self.held.values():
            runs.pop(run, None)

    def where(self, run: str) -> str | None:
        return next((gpu for gpu, runs in self.held.items() if run in runs), None)
