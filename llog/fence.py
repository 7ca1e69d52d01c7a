"""Fencing (docs/protocol.md section 7): a FENCED partition rejects every append until unfenced.

Both directions go through :func:`llog.control.update_control`, which finishes a pending append
first (with the v1.1 materialization rules), so a fence never strands a reserved-but-unindexed
append.
"""

from __future__ import annotations

from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.control import ControlState, update_control
from llog.coordination import Coordination
from llog.keys import PartitionKeys
from llog.records import FENCED, OPEN


def set_log_state(coordination: Coordination, keys: PartitionKeys, log_state: str, config: Config | None = None,
                  clock: Clock = SYSTEM) -> ControlState:
    """CAS ``log_state`` to OPEN or FENCED (a no-op if it already is)."""
    if log_state not in (OPEN, FENCED):
        raise ValueError(f"log_state must be {OPEN} or {FENCED}, got {log_state!r}")
    return update_control(
        coordination, keys,
        lambda control: None if control.log_state == log_state else control.with_changes(log_state=log_state),
        f"setting log_state={log_state}", config, clock,
    )


def fence(coordination: Coordination, keys: PartitionKeys, config: Config | None = None,
          clock: Clock = SYSTEM) -> ControlState:
    return set_log_state(coordination, keys, FENCED, config, clock)


def unfence(coordination: Coordination, keys: PartitionKeys, config: Config | None = None,
            clock: Clock = SYSTEM) -> ControlState:
    return set_log_state(coordination, keys, OPEN, config, clock)
