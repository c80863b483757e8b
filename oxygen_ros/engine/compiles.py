"""Counts XLA compilations through JAX's monitoring events (never by timing).

JAX records the event `/jax/core/compile/backend_compile_duration` once per jit cache miss that
reaches `compile_or_get_cached`: an XLA compilation, or (with a persistent compilation cache,
`JAX_COMPILATION_CACHE_DIR`) an executable loaded from disk, so "no recompilation" means the
same with and without that cache (`test/engine/test_compiles.py` checks both ways). One listener
per process counts them; an engine reports the difference since it was built, so "no
recompilation" is a plain integer comparison in tests and on the stats topic.

Invariants:
- The listener is registered once per process, on first use, and never removed.
- The count is process-wide: compilations triggered by other code in the process count too.
- Thread-safe (JAX may compile on several threads).
"""

from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_count = 0
_installed = False


def _on_duration_event(event: str, duration_s: float, **kwargs: object) -> None:
    del duration_s, kwargs
    if event == BACKEND_COMPILE_EVENT:
        global _count
        with _lock:
            _count += 1


def install() -> None:
    """Registers the process-wide listener (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        jax.monitoring.register_event_duration_secs_listener(_on_duration_event)
        _installed = True


def num_compiles() -> int:
    """XLA backend compilations in this process since `install` first ran."""
    install()
    with _lock:
        return _count
