"""Device ceilings: peak FLOP/s per precision and memory bandwidth, from datasheets or measured.

`DEVICE_TABLE` holds the vendors' dense (no structured sparsity) peaks, so a trace recorded
elsewhere can be put on a roofline offline. `lookup_device_spec` identifies a GPU by the name
and memory size that torch.cuda.get_device_properties / the trace's deviceProperties report.
Pure: no torch, no files.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from gpuprof_nb.errors import GpuprofError

# Which runtime a device belongs to.
DeviceKind = Literal["cuda", "rocm", "cpu"]
DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)

# Names of the compute roofs a DeviceSpec can carry, in the order they are drawn.
ROOF_NAMES = ("fp64", "fp32", "tf32", "fp16", "bf16")
_ROOF_FIELDS = {
    "fp64": "fp64_flops_per_s",
    "fp32": "fp32_flops_per_s",
    "tf32": "tf32_flops_per_s",
    "fp16": "fp16_flops_per_s",
    "bf16": "bf16_flops_per_s",
}


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """Ceilings of one device in FLOP/s and bytes/s. tf32/fp16/bf16 are tensor-core peaks
    (None where the device has none); fp32 is the vector (CUDA-core / CPU SIMD) peak; fp64 is
    the rate fp64 matmuls reach (the FP64 Tensor Core / matrix rate where the chip has one).
    `source` names the datasheet, or says when and how the numbers were measured."""

    name: str
    kind: DeviceKind
    fp32_flops_per_s: float | None
    bandwidth_bytes_per_s: float | None
    tf32_flops_per_s: float | None = None
    fp16_flops_per_s: float | None = None
    bf16_flops_per_s: float | None = None
    fp64_flops_per_s: float | None = None
    memory_bytes: int | None = None
    source: str = ""
    measured: bool = False

    def peak_flops_per_s(self, roof: str) -> float | None:
        """Return the peak of roof `roof` ('fp32', 'tf32', 'bf16', 'fp16', 'fp64') in FLOP/s,
        None where this device has no such roof."""
        field_name = _ROOF_FIELDS.get(roof)
        return None if field_name is None else getattr(self, field_name)

    def roofs(self) -> tuple[tuple[str, float], ...]:
        """Return (roof name, peak FLOP/s) for every roof this device has, low to high."""
        pairs = [(r, self.peak_flops_per_s(r)) for r in ROOF_NAMES]
        return tuple(sorted(((r, p) for r, p in pairs if p), key=lambda rp: (rp[1], rp[0])))

    def ridge_flop_per_byte(self, roof: str) -> float | None:
        """Return the intensity (FLOP/byte) where roof `roof` meets the bandwidth roof."""
        peak = self.peak_flops_per_s(roof)
        if not peak or not self.bandwidth_bytes_per_s:
            return None
        return peak / self.bandwidth_bytes_per_s

    def as_dict(self) -> dict[str, Any]:
        """Return the spec as a JSON-ready dict (the ceilings cache stores these)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "device spec") -> DeviceSpec:
        """Return the DeviceSpec stored in `data`; raise GpuprofError naming `where` when a
        field is missing or has the wrong type."""
        try:
            name = str(data["name"])
            kind = next((k for k in DEVICE_KINDS if k == data.get("kind", "cuda")), None)
            if kind is None:
                raise ValueError(f"kind is {data.get('kind')!r}, not one of {DEVICE_KINDS}")

            def num(key: str) -> float | None:
                value = data.get(key)
                if value is None:
                    return None
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(key)
                number = float(value)
                if not math.isfinite(number) or number <= 0:
                    raise ValueError(f"{key} is {number}, not a rate above 0")
                return number

            memory = data.get("memory_bytes")
            if memory is not None and (type(memory) is not int or memory < 0):
                raise TypeError("memory_bytes")
            return cls(
                name=name,
                kind=kind,
                fp32_flops_per_s=num("fp32_flops_per_s"),
                bandwidth_bytes_per_s=num("bandwidth_bytes_per_s"),
                tf32_flops_per_s=num("tf32_flops_per_s"),
                fp16_flops_per_s=num("fp16_flops_per_s"),
                bf16_flops_per_s=num("bf16_flops_per_s"),
                fp64_flops_per_s=num("fp64_flops_per_s"),
                memory_bytes=None if memory is None else int(memory),
                source=str(data.get("source", "")),
                measured=bool(data.get("measured", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GpuprofError(
                f"{where}: not a device spec (bad or missing field {exc}); delete it and "
                "run gpuprof_nb.measure_ceilings() again"
            ) from None


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """One datasheet row: which GPUs it covers and their dense peaks (TFLOP/s, GB/s).
    `pattern` is matched (case-insensitive regex) against the reported device name;
    `min_memory_gib`/`max_memory_gib` separate variants that share a name."""

    label: str
    pattern: str
    fp32_tflops: float
    bandwidth_gb_s: float
    tf32_tflops: float | None
    fp16_tflops: float | None
    bf16_tflops: float | None
    fp64_tflops: float | None
    source: str
    min_memory_gib: float = 0.0
    max_memory_gib: float = float("inf")
    kind: DeviceKind = "cuda"

    def spec(self, memory_bytes: int | None = None) -> DeviceSpec:
        """Return this row as a DeviceSpec in FLOP/s and bytes/s."""

        def tera(x: float | None) -> float | None:
            return None if x is None else x * 1e12

        return DeviceSpec(
            name=self.label,
            kind=self.kind,
            fp32_flops_per_s=self.fp32_tflops * 1e12,
            bandwidth_bytes_per_s=self.bandwidth_gb_s * 1e9,
            tf32_flops_per_s=tera(self.tf32_tflops),
            fp16_flops_per_s=tera(self.fp16_tflops),
            bf16_flops_per_s=tera(self.bf16_tflops),
            fp64_flops_per_s=tera(self.fp64_tflops),
            memory_bytes=memory_bytes,
            source=self.source,
            measured=False,
        )


_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (dense = half the sparsity figure)"
_V100 = "NVIDIA Tesla V100 GPU datasheet"
_GA102 = "NVIDIA Ampere GA102 GPU Architecture whitepaper (FP32-accumulate tensor rates)"
_ADA = "NVIDIA Ada GPU Architecture whitepaper (FP32-accumulate tensor rates)"

# Dense datasheet peaks. Tensor figures for fp16/bf16 are with FP32 accumulate (what PyTorch
# uses). fp64 is the matrix rate (FP64 Tensor Core, AMD's FP64 matrix) where the chip has one:
# fp64 matmuls run there (an H100 SXM measured 59 TFLOP/s, above its 34 TFLOP/s vector
# figure), and fp64 elementwise ops sit far left of either ridge. Order matters: the first row
# whose pattern and memory range match wins, so the more specific names (PCIe, NVL, A10G) come
# before the generic ones.
DEVICE_TABLE: tuple[DeviceRow, ...] = (
    DeviceRow(
        "Tesla T4", r"\bT4\b", 8.1, 320, None, 65, None, None, "NVIDIA T4 Tensor Core GPU datasheet"
    ),
    DeviceRow("Tesla V100 PCIe", r"\bV100\b.*PCIE", 14, 900, None, 112, None, 7, _V100),
    DeviceRow("Tesla V100 SXM2", r"\bV100\b", 15.7, 900, None, 125, None, 7.8, _V100),
    DeviceRow(
        "NVIDIA A10G",
        r"\bA10G\b",
        35,
        600,
        35,
        70,
        70,
        None,
        "AWS EC2 G5 (A10G) figures as compared in Baseten's 'NVIDIA A10 vs A10G for ML "
        "model inference' (NVIDIA publishes no A10G datasheet)",
    ),
    DeviceRow(
        "NVIDIA A10",
        r"\bA10\b",
        31.2,
        600,
        62.5,
        125,
        125,
        None,
        "NVIDIA A10 Tensor Core GPU datasheet",
    ),
    DeviceRow(
        "NVIDIA L4",
        r"\bL4\b",
        30.3,
        300,
        60,
        121,
        121,
        None,
        "NVIDIA L4 Tensor Core GPU datasheet (dense = half the sparsity figure)",
    ),
    DeviceRow(
        "NVIDIA A100 80GB PCIe",
        r"\bA100\b.*PCIE",
        19.5,
        1935,
        156,
        312,
        312,
        19.5,
        _A100,
        min_memory_gib=60,
    ),
    DeviceRow("NVIDIA A100 40GB PCIe", r"\bA100\b.*PCIE", 19.5, 1555, 156, 312, 312, 19.5, _A100),
    DeviceRow(
        "NVIDIA A100 80GB SXM",
        r"\bA100\b",
        19.5,
        2039,
        156,
        312,
        312,
        19.5,
        _A100,
        min_memory_gib=60,
    ),
    DeviceRow("NVIDIA A100 40GB SXM", r"\bA100\b", 19.5, 1555, 156, 312, 312, 19.5, _A100),
    DeviceRow("NVIDIA H100 PCIe", r"\bH100\b.*PCIE", 51, 2000, 378, 756, 756, 51, _H100),
    DeviceRow("NVIDIA H100 NVL", r"\bH100\b.*NVL", 60, 3900, 417.5, 835.5, 835.5, 60, _H100),
    DeviceRow("NVIDIA H100 SXM", r"\bH100\b", 67, 3350, 494.5, 989.5, 989.5, 67, _H100),
    DeviceRow(
        "NVIDIA H200 NVL",
        r"\bH200\b.*NVL",
        60,
        4800,
        417.5,
        835.5,
        835.5,
        60,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column (dense = half sparse)",
    ),
    DeviceRow(
        "NVIDIA H200",
        r"\bH200\b",
        67,
        4800,
        494.5,
        989.5,
        989.5,
        67,
        "NVIDIA H200 Tensor Core GPU datasheet (dense = half the sparsity figure)",
    ),
    DeviceRow("NVIDIA GeForce RTX 3090", r"RTX 3090\b", 35.6, 936, 35.6, 71, 71, None, _GA102),
    DeviceRow("NVIDIA GeForce RTX 4090", r"RTX 4090\b", 82.6, 1008, 82.6, 165.2, 165.2, None, _ADA),
    DeviceRow(
        "NVIDIA B200",
        r"\bB200\b",
        75,
        8000,
        1100,
        2250,
        2250,
        37,
        "NVIDIA HGX B200 datasheet, per GPU (8-GPU totals / 8; dense = half sparse)",
    ),
    # AMD Instinct (ROCm reports the same names; a "VF" is a virtual function of the card).
    DeviceRow(
        "AMD Instinct MI300X",
        r"\bMI300X\b",
        163.4,
        5300,
        653.7,
        1307.4,
        1307.4,
        163.4,
        "AMD Instinct MI300X data sheet (dense)",
        kind="rocm",
    ),
    DeviceRow(
        "AMD Instinct MI250X",
        r"\bMI250X\b",
        47.9,
        3276.8,
        None,
        383,
        383,
        95.7,
        "AMD Instinct MI250X data sheet",
        kind="rocm",
    ),
    DeviceRow(
        "AMD Instinct MI250",
        r"\bMI250\b",
        45.3,
        3276.8,
        None,
        362.1,
        362.1,
        90.5,
        "AMD Instinct MI250 data sheet",
        kind="rocm",
    ),
    DeviceRow(
        "AMD Instinct MI210",
        r"\bMI210\b",
        22.6,
        1638.4,
        None,
        181,
        181,
        45.3,
        "AMD Instinct MI210 data sheet",
        kind="rocm",
    ),
)


def lookup_device_spec(name: str, memory_bytes: int | None = None) -> DeviceSpec | None:
    """Return the datasheet DeviceSpec for a GPU named `name` (as torch or the trace's
    deviceProperties report it) with `memory_bytes` of memory; None when no row matches
    (an unknown GPU: never guessed)."""
    if not name:
        return None
    gib = None if memory_bytes is None else memory_bytes / 2**30
    for row in DEVICE_TABLE:
        if not re.search(row.pattern, name, flags=re.IGNORECASE):
            continue
        if gib is None:
            # Without the memory size, variants told apart by memory cannot be; the name
            # may still say it (A100-SXM4-80GB).
            size = re.search(r"(\d+)\s*GB", name, flags=re.IGNORECASE)
            gib_guess = float(size.group(1)) * 1e9 / 2**30 if size else None
            if gib_guess is None:
                if row.min_memory_gib > 0:
                    continue
            elif not row.min_memory_gib <= gib_guess <= row.max_memory_gib:
                continue
        elif not row.min_memory_gib <= gib <= row.max_memory_gib:
            continue
        return row.spec(memory_bytes)
    return None
