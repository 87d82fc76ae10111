"""The resource sampler's "ib" source: InfiniBand (and RoCE) traffic from sysfs.

``ib_rx_bytes`` / ``ib_tx_bytes``: ``port_rcv_data`` / ``port_xmit_data`` summed over every
port of every device under ``/sys/class/infiniband``, converted to bytes. The counters are
cumulative since the HCA was reset: rates are the differences between rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcbench.trace.sources import SourceLog

IB_WORD_BYTES = 4  # port_rcv_data / port_xmit_data count 32-bit words (IB PortRcvData / PortXmitData)


def sum_counters(paths: list[str]) -> int:
    """The counters in `paths` summed, in bytes."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += int(f.read())
    # The counters are in 4-byte words (IB PortRcvData / PortXmitData count octets / 4).
    # Kernels expose the 64-bit extended counters where the HCA has them; on very old
    # HCAs they are 32-bit and saturate at 2**32 - 1 words (16 GiB).
    return total * IB_WORD_BYTES


class IbReader:
    """The "ib" source: the port counters under `ib_root`."""

    def __init__(self, log: SourceLog, ib_root: str) -> None:
        self._log = log
        root = Path(ib_root)
        # The counter files are found once: HCAs and ports do not come and go during a job.
        self._rx = [str(p) for p in sorted(root.glob("*/ports/*/counters/port_rcv_data"))]
        self._tx = [str(p) for p in sorted(root.glob("*/ports/*/counters/port_xmit_data"))]
        if not root.is_dir():
            log.set("ib", f"absent: no {ib_root}")
        elif not self._rx and not self._tx:
            log.set("ib", f"absent: no port counters under {ib_root}")
        else:
            log.set("ib", f"sysfs: {len(self._rx)} port(s) under {ib_root}")

    def read(self, row: Any) -> None:
        if not self._rx and not self._tx:
            row["ib_rx_bytes"] = row["ib_tx_bytes"] = -1
            return
        try:
            row["ib_rx_bytes"] = sum_counters(self._rx)
            row["ib_tx_bytes"] = sum_counters(self._tx)
        except Exception as exc:  # noqa: BLE001 - a vanished or unreadable counter file
            row["ib_rx_bytes"] = row["ib_tx_bytes"] = -1
            self._log.note_error("ib", exc)
