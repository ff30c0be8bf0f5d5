"""Peak CPU memory of a piece of code, from the allocator's own record (torch.profiler with ``profile_memory``).

Why this way: every CPU tensor allocation and free goes through c10's CPU allocator, which reports each one (bytes,
sign, time) to the profiler when ``profile_memory=True``; summing them in time order gives the bytes the code held
beyond what existed before it started, and the largest such sum is its peak. It counts what torch allocated (tensors,
autograd's saved tensors, kernels' workspaces), not Python objects or the allocator's own caching (the CPU allocator
does not cache). ``tracemalloc`` does not see these allocations, and RSS moves in pages and is shared with whatever
else the process does.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.profiler import ProfilerActivity, profile


def peak_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """``(peak, result)``: the most bytes ``fn()`` held at once beyond what was allocated before it, and its result."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return peak, result
