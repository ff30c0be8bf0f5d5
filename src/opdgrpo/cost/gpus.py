"""How much memory a GPU model reports to CUDA, which is what vLLM and the allocator plan against.

A GPU sold as "80 GB" is not 80 GiB to CUDA: ``cudaMemGetInfo``'s total (``torch.cuda.mem_get_info``, the
figure in PyTorch's out-of-memory message "GPU 0 has a total capacity of ..." and the ``total_memory`` vLLM's
``gpu_memory_utilization`` is a fraction of) leaves out what the driver keeps back. Planning against the nominal
figure overstates every share: vLLM's reservation is ``gpu_memory_utilization`` x the reported total, not x 80 GiB.

Figures (public logs, not measured here; ``benchmarks/gpu_pilot.py`` records the device's own figure):
- H100 80GB (SXM5 HBM3, and the PCIe card): 79.19 GiB. ``nvidia-smi`` shows 81,559 MiB (79.6 GiB; Modal's table,
  https://github.com/modal-labs/modal-client/pull/2797); PyTorch's out-of-memory messages on "NVIDIA H100 80GB HBM3"
  read "total capacity of 79.19 GiB".
- H200 (141 GB HBM3e): 139.80 GiB, as PyTorch's out-of-memory messages on H200 nodes read it (139.81 on some).
"""

from __future__ import annotations

from typing import Any, Mapping

#: GiB CUDA reports per GPU model, by the names ``hardware.name`` may take (case and spaces ignored).
REPORTED_GIB = {"h10080gb": 79.19, "h100": 79.19, "h100sxm": 79.19, "h100pcie": 79.19,
                "h200": 139.80, "h200141gb": 139.80}


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def reported_gib(block: Mapping[str, Any]) -> float:
    """The memory a job may plan against per GPU, in GiB: ``hardware.reported_gib`` where set (a device's own
    ``torch.cuda.mem_get_info()[1]``), else the table's figure for ``hardware.name``, never above the block's
    ``memory_gib`` (which a pilot sets to what its device reported), else ``memory_gib``."""
    if block.get("reported_gib"):
        return float(block["reported_gib"])
    nominal = float(block["memory_gib"])
    known = REPORTED_GIB.get(_key(str(block.get("name", ""))))
    return min(nominal, known) if known else nominal
