"""Hardware profiles: the numbers the cost model reads (VRAM, bandwidths, latencies).

Profiles ship as JSON files in ``planning/hardware/`` (in the wheel; nowhere else in the
repository). A user passes a profile name (``rtx4090``) or the path of their own JSON file
with the same keys; see ``planner/README.md`` for where the shipped numbers come from.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import PlanError
from ..loading.regular_file import regular_file

HARDWARE_DIR = Path(__file__).resolve().parent / "hardware"

#: Profile used when no GPU is detected and none is named: the paper's PC-High card.
FALLBACK_PROFILE = "rtx4090"

_FIELDS = (
    "vram_bytes",
    "gpu_mem_bw",
    "pcie_bw",
    "cpu_mem_bw",
    "cpu_cores",
    "launch_latency_us",
    "sync_latency_us",
)
#: Optional fields (0 when absent: not measured): the storage a neuron store lives on, as
#: :func:`~powerinfer_rs.planning.storage_probe.probe_storage` measures it, for the RAM tier.
_STORAGE_FIELDS = ("storage_read_bw", "storage_iops", "storage_read_bytes")
#: Optional (0 when absent): the CPU pool's start after idle, in microseconds, as
#: ``_core.measure_dispatch`` measures it; part of the cost of a layer split between devices.
_DISPATCH_FIELD = "cpu_dispatch_us"
#: Optional (0 when absent: priced at ``cpu_mem_bw``): the rates the CPU reads an FFN's rows by
#: index, GB/s, as ``_core.measure_rows_bandwidth`` measures them: ``cpu_rows_bw`` for the rows
#: of neurons that fire (scattered gate, up and down_t rows), ``cpu_gate_bw`` for gate rows read
#: whether they fire (exact-relu's gate pass over the cold neurons). Neither is the dense rate:
#: on 2 cores Q4_0 rows by index ran at 0.4x-0.7x the interleaved dense matvec.
_ROWS_FIELDS = ("cpu_rows_bw", "cpu_gate_bw")

#: Substrings of ``nvidia-smi --query-gpu=name`` -> shipped profile, most specific first.
_GPU_NAME_TO_PROFILE = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("RTX 4090", "rtx4090"),
    ("RTX 2080 Ti", "rtx2080ti"),
)


@dataclass(frozen=True)
class HardwareProfile:
    """One machine: GPU VRAM and bandwidth, PCIe, CPU memory bandwidth, latencies.

    Bandwidths are in GB/s (10^9 bytes per second), latencies in microseconds.
    ``gpu_mem_bw == 0`` means there is no GPU (only a budget of 0 fits). The storage fields
    (0: not measured): ``storage_read_bw`` GB/s of 1 MiB reads, ``storage_iops`` random reads
    per second of ``storage_read_bytes`` each, several in flight. The rows-by-index rates (0:
    not measured, priced at ``cpu_mem_bw``): ``cpu_rows_bw`` GB/s of firing neurons' rows,
    ``cpu_gate_bw`` GB/s of gate rows streamed whether they fire.
    """

    name: str
    vram_bytes: int
    gpu_mem_bw: float
    pcie_bw: float
    cpu_mem_bw: float
    cpu_cores: int
    launch_latency_us: float
    sync_latency_us: float
    description: str = ""
    storage_read_bw: float = 0.0
    storage_iops: float = 0.0
    storage_read_bytes: int = 0
    cpu_dispatch_us: float = 0.0
    cpu_rows_bw: float = 0.0
    cpu_gate_bw: float = 0.0

    @property
    def rows_bw(self) -> float:
        """GB/s the CPU reads firing neurons' rows by index (``cpu_mem_bw`` when not measured)."""
        return self.cpu_rows_bw or self.cpu_mem_bw

    @property
    def gate_bw(self) -> float:
        """GB/s the CPU streams gate rows by index (``cpu_mem_bw`` when not measured)."""
        return self.cpu_gate_bw or self.cpu_mem_bw

    @property
    def has_storage(self) -> bool:
        """Whether the storage was measured (the RAM tier can price its reads)."""
        return self.storage_read_bw > 0 and self.storage_iops > 0

    def with_storage(self, probe) -> HardwareProfile:
        """This profile with a :class:`~powerinfer_rs.planning.storage_probe.StorageProbe`'s
        numbers."""
        import dataclasses

        return dataclasses.replace(
            self,
            storage_read_bw=float(probe.read_bw),
            storage_iops=float(probe.iops),
            storage_read_bytes=int(probe.read_bytes),
        )

    def storage_seconds(self, reads: float, nbytes: int) -> float | None:
        """Seconds for ``reads`` random reads of ``nbytes`` each (the longer of one read's
        latency and its bytes at the read bandwidth), None when the storage was not measured."""
        if not self.has_storage:
            return None
        return reads * max(1.0 / self.storage_iops, nbytes / (self.storage_read_bw * 1e9))

    @property
    def has_gpu(self) -> bool:
        """Whether the profile describes a GPU at all."""
        return self.gpu_mem_bw > 0 and self.vram_bytes > 0

    def to_dict(self) -> dict:
        """The profile as a JSON-ready dict (what the plan file records)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "profile") -> HardwareProfile:
        """Build and validate a profile; raises :class:`PlanError` naming ``source``."""
        if not isinstance(d, dict):
            raise PlanError(f"{source}: a hardware profile must be a JSON object")
        missing = [k for k in _FIELDS if k not in d]
        if missing:
            raise PlanError(f"{source}: hardware profile lacks {', '.join(missing)}")
        vals = {}
        for k in _FIELDS:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise PlanError(f"{source}: {k} must be a number, got {v!r}")
            if v < 0:
                raise PlanError(f"{source}: {k} must not be negative, got {v}")
            vals[k] = v
        for k in (*_STORAGE_FIELDS, _DISPATCH_FIELD, *_ROWS_FIELDS):
            v = d.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise PlanError(f"{source}: {k} must be a number, got {v!r}")
            if v < 0:
                raise PlanError(f"{source}: {k} must not be negative, got {v}")
            vals[k] = v
        if vals["cpu_mem_bw"] <= 0:
            raise PlanError(f"{source}: cpu_mem_bw must be positive")
        if vals["gpu_mem_bw"] > 0 and vals["pcie_bw"] <= 0:
            raise PlanError(f"{source}: a GPU profile needs a positive pcie_bw")
        return cls(
            name=str(d.get("name", Path(source).stem)),
            vram_bytes=int(vals["vram_bytes"]),
            gpu_mem_bw=float(vals["gpu_mem_bw"]),
            pcie_bw=float(vals["pcie_bw"]),
            cpu_mem_bw=float(vals["cpu_mem_bw"]),
            cpu_cores=int(vals["cpu_cores"]),
            launch_latency_us=float(vals["launch_latency_us"]),
            sync_latency_us=float(vals["sync_latency_us"]),
            description=str(d.get("description", "")),
            storage_read_bw=float(vals["storage_read_bw"]),
            storage_iops=float(vals["storage_iops"]),
            storage_read_bytes=int(vals["storage_read_bytes"]),
            cpu_dispatch_us=float(vals[_DISPATCH_FIELD]),
            cpu_rows_bw=float(vals["cpu_rows_bw"]),
            cpu_gate_bw=float(vals["cpu_gate_bw"]),
        )


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def load_hardware(name_or_file: str | os.PathLike[str]) -> HardwareProfile:
    """A shipped profile by name (``"rtx4090"``) or a JSON file with the same keys."""
    s = str(name_or_file)
    path = HARDWARE_DIR / f"{s}.json"
    if not path.is_file():
        path = Path(s)
        if not path.is_file():
            raise PlanError(
                f"unknown hardware {s!r}: not a shipped profile ({', '.join(list_profiles())}) "
                "nor a JSON file"
            )
    try:
        data = json.loads(Path(regular_file(path, PlanError)).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise PlanError(f"{path}: cannot read hardware profile: {e}") from None
    return HardwareProfile.from_dict(data, source=str(path))


def profile_for_gpu_name(gpu_name: str) -> str | None:
    """The shipped profile matching an ``nvidia-smi`` GPU name, or ``None``."""
    for key, prof in _GPU_NAME_TO_PROFILE:
        if key.lower() in gpu_name.lower():
            return prof
    return None


__all__ = [
    "FALLBACK_PROFILE",
    "HARDWARE_DIR",
    "HardwareProfile",
    "list_profiles",
    "load_hardware",
    "profile_for_gpu_name",
]
