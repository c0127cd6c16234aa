"""A simulated accelerator: a network wrapper whose every call takes a set time with the GIL released,
as a GPU kernel does, and returns the wrapped network's real outputs.

Timing and overlap (does the host prepare call k+1 while call k runs? is the device ever idle under
load?) can then be tested and measured on a machine without a GPU: the wrapped network computes
the real, checkable answer, and the call is stretched to ``call_ms`` (+ ``image_ms`` per image) by
sleeping, which, like waiting on a CUDA kernel, leaves the GIL to the other threads. Each call is
logged (start and end, in order, with its batch size) for tests that prove overlap by event order.
The service wraps its models in it with ``IDG_SIMULATED_CALL_MS`` (benchmarks and tests only).
"""

from __future__ import annotations

import threading
import time

from torch import Tensor, nn


class SimulatedAccelerator(nn.Module):
    """``net``, each call stretched to ``call_ms + image_ms * batch`` milliseconds of wall time.

    Calls are serialised, as on one device: a second thread's call waits for the first to end.
    :attr:`events` holds ``("start" | "end", call number, batch size)`` in the order they happened;
    :attr:`busy_s` the seconds calls took."""

    def __init__(self, net: nn.Module, call_ms: float, image_ms: float = 0.0) -> None:
        super().__init__()
        self.net = net
        self.call_ms = call_ms
        self.image_ms = image_ms
        self.events: list[tuple[str, int, int]] = []
        self.busy_s = 0.0
        self.calls = 0
        self._device = threading.Lock()
        self._log = threading.Lock()

    def note(self, what: str, number: int, size: int) -> None:
        with self._log:
            self.events.append((what, number, size))

    def forward(self, x: Tensor) -> Tensor:
        with self._device:
            self.calls += 1
            number, size = self.calls, int(x.shape[0])
            self.note("start", number, size)
            started = time.perf_counter()
            out: Tensor = self.net(x)
            left = (self.call_ms + self.image_ms * size) / 1000 - (time.perf_counter() - started)
            if left > 0:
                time.sleep(left)  # the GIL is released, as while a CUDA kernel runs
            self.busy_s += time.perf_counter() - started
            self.note("end", number, size)
        return out
