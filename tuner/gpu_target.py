"""What a GPU target attribute says about the hardware: the limits the GPU search spaces obey.

IREE describes each GPU arch with an `#iree_gpu.target<arch = ..., wgp = <..., mma = [...],
subgroup_size_choices = [...], max_workgroup_sizes = [...], max_thread_count_per_workgroup = N,
max_workgroup_memory_bytes = N, ...>>` inside the executable target; the configured module
carries it, so the space comes from the same table the compiler uses.
"""

from __future__ import annotations

import re

from portkern.base.records import frozen_record
from portkern.tuner.perfconfig import attribute_lists

_PREFIX = "#iree_gpu.target<"


@frozen_record
class GpuLimits:
    """The limits of one GPU arch a search space needs."""

    arch: str
    #: Matrix intrinsics the arch has (`#iree_gpu.mma_layout` names).
    mma: tuple[str, ...]
    subgroup_sizes: tuple[int, ...]
    max_workgroup_sizes: tuple[int, ...]
    max_threads: int
    #: Shared memory (LDS) per workgroup.
    max_workgroup_memory: int


def target_info(executable_target: str) -> str:
    """The `#iree_gpu.target<...>` text inside a printed executable target ("" when there is none)."""
    start = executable_target.find(_PREFIX)
    if start < 0:
        return ""
    depth = 0
    for position in range(start + len(_PREFIX) - 1, len(executable_target)):
        char = executable_target[position]
        depth += {"<": 1, ">": -1}.get(char, 0)
        if depth == 0:
            return executable_target[start : position + 1]
    return ""


def limits(text: str) -> GpuLimits | None:
    """The limits stated by an `#iree_gpu.target<...>` text, None when it states none."""
    if not text.startswith(_PREFIX):
        return None
    lists = attribute_lists(text)
    arch = re.search(r'arch = "([\w:+-]+)"', text)
    threads = re.search(r"max_thread_count_per_workgroup = (\d+)", text)
    memory = re.search(r"max_workgroup_memory_bytes = (\d+)", text)
    if not (arch and threads and memory and "subgroup_size_choices" in lists):
        return None
    mma_list = re.search(r"mma = \[([^\]]*)\]", text)
    return GpuLimits(
        arch=arch.group(1),
        mma=tuple(re.findall(r"<(\w+)>", mma_list.group(1))) if mma_list else (),
        subgroup_sizes=lists["subgroup_size_choices"],
        max_workgroup_sizes=lists.get("max_workgroup_sizes", (1024, 1024, 1024)),
        max_threads=int(threads.group(1)),
        max_workgroup_memory=int(memory.group(1)),
    )
