"""A fake NVML with pynvml's interface, for testing the GPU checks on machines without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15


class FakeNvmlError(Exception):
    """Mirrors ``pynvml.NVMLError``: ``value`` is the NVML return code."""

    _names: ClassVar[dict[int, str]] = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_TIMEOUT: "Timeout",
              NVML_ERROR_GPU_IS_LOST: "GPU is lost", 12: "NVML Shared Library Not Found"}

    def __init__(self, value: int) -> None:
        super().__init__(self._names.get(value, f"NVML error {value}"))
        self.value = value


@dataclass
class FakeGpu:
    """One simulated GPU; ``None`` for a value makes its query raise Not Supported."""

    uncorrected_ecc: int | None = 0
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """(correctable rows, uncorrectable rows, pending, failure occurred)."""
    nvlink: list[int] | None = field(default_factory=lambda: [1] * 18)
    temperature_c: int | None = 45
    clocks_event_reasons: int | None = 0
    pcie_width: tuple[int, int] | None = (16, 16)
    """(current, max)."""
    xids: list[int] = field(default_factory=list)
    """Critical XID events delivered once a check registers for events."""
    lost: bool = False
    """The GPU fell off the bus: getting its handle fails."""
    sm_clock_mhz: int | None = 1980
    """Current SM clock (telemetry)."""
    max_sm_clock_mhz: int | None = 1980
    power_mw: int | None = 650_000
    """Board power draw in milliwatts (telemetry)."""
    nvlink_errors: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    """Link -> (replay, recovery, CRC flit, CRC data) error counters; links not listed count none."""


@dataclass
class _Event:
    device: Any
    eventData: int


class FakeNvml:
    """Drop-in for the ``pynvml`` module in `trainguard.health.HealthConfig.nvml`."""

    NVMLError = FakeNvmlError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[FakeGpu] | None = None, *, available: bool = True) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu() for _ in range(8)]
        self.available = available
        self.initialized = 0
        self._events: list[_Event] = []

    def _gpu(self, handle: Any) -> FakeGpu:
        if not self.initialized:
            raise FakeNvmlError(1)  # Uninitialized
        return self.gpus[int(handle)]

    @staticmethod
    def _need(value: Any) -> Any:
        if value is None:
            raise FakeNvmlError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        if not self.available:
            raise FakeNvmlError(12)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if self.gpus[index].lost:
            raise FakeNvmlError(NVML_ERROR_GPU_IS_LOST)
        return index

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        return int(self._need(self._gpu(handle).uncorrected_ecc))

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        rows: tuple[int, int, int, int] = self._need(self._gpu(handle).remapped_rows)
        return rows

    def nvmlEventSetCreate(self) -> Any:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self._events.extend(_Event(handle, x) for x in self._gpu(handle).xids)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        if not self._events:
            raise FakeNvmlError(NVML_ERROR_TIMEOUT)
        return self._events.pop(0)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._events.clear()

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        links = self._need(self._gpu(handle).nvlink)
        if link >= len(links):
            raise FakeNvmlError(NVML_ERROR_NOT_SUPPORTED)
        return int(links[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        gpu = self._gpu(handle)
        links = self._need(gpu.nvlink)
        if link >= len(links) or not 0 <= counter <= 4:
            raise FakeNvmlError(NVML_ERROR_NOT_SUPPORTED)
        return int((gpu.nvlink_errors.get(link) or (0, 0, 0, 0, 0))[counter]) if counter < 4 else 0

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._need(self._gpu(handle).temperature_c))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._need(self._gpu(handle).clocks_event_reasons))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return int(self._need(self._gpu(handle).pcie_width)[0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return int(self._need(self._gpu(handle).pcie_width)[1])

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        return int(self._need(self._gpu(handle).sm_clock_mhz))

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        return int(self._need(self._gpu(handle).max_sm_clock_mhz))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._need(self._gpu(handle).power_mw))
