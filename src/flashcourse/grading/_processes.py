"""Every process a submission starts ends before its grade is written.

A submission's code can detach a process from its worker (a double fork, ``start_new_session=True``) and let it
wait for the grader to exit, then rewrite the grades. Killing the worker's process group does not reach such a
process. Linux's *child subreaper* does: while the grader is one, an orphaned descendant is re-parented to the
grader instead of to init, so it stays in the grader's process tree, where :func:`end_strays` finds and kills it.
This works for root and for a normal user alike (no namespace or cgroup needed). Elsewhere (macOS) the grader
cannot see detached processes; docs/GRADING.md asks for a container there.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Collection
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
_PR_GET_CHILD_SUBREAPER = 37


def _prctl(option: int, value) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0)


def supported() -> bool:
    """True on Linux, where a process can adopt its orphaned descendants and read the process table."""
    return sys.platform.startswith("linux") and Path("/proc/self/stat").exists()


def adopt_orphans(enable: bool = True) -> bool:
    """Make this process the reaper of its orphaned descendants (or stop, with ``enable=False``).

    Returns whether it was one before, so the caller can restore that; False where unsupported.
    """
    if not supported():
        return False
    was = ctypes.c_int(0)
    _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was))
    if _prctl(_PR_SET_CHILD_SUBREAPER, int(enable)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    return bool(was.value)


def _process_table() -> tuple[dict[int, list[int]], dict[int, str]]:
    """(parent pid -> child pids, pid -> state letter) for every process this user can see in /proc."""
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        children.setdefault(int(ppid), []).append(int(entry.name))
        states[int(entry.name)] = state
    return children, states


def _subtree(root: int, children: dict[int, list[int]]) -> set[int]:
    """Every descendant of ``root`` (not ``root`` itself)."""
    found, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def descendants() -> set[int]:
    """Every living or zombie descendant of this process."""
    children, _ = _process_table()
    return _subtree(os.getpid(), children)


def end_strays(keep: Collection[int] = (), *, patience: float = 10.0) -> int:
    """Kill and reap every descendant of this process except the ``keep`` processes and their descendants.

    Loops until none is left, since a stray may fork between two looks at the process table, and a child of a
    killed stray moves up to us (we adopt orphans) only once its parent is gone. Returns how many ended; raises
    RuntimeError if some are still there after ``patience`` seconds.
    """
    if not supported():
        return 0
    me = os.getpid()
    ended: set[int] = set()
    deadline = time.monotonic() + patience
    while True:
        children, states = _process_table()
        kept = set(keep)
        for pid in keep:
            kept |= _subtree(pid, children)
        strays = _subtree(me, children) - kept
        if not strays:
            return len(ended)
        for pid in strays:
            if states.get(pid) != "Z":
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in set(children.get(me, [])) & strays:  # only our own children are ours to reap
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        ended |= strays
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(strays)} started by a submission survived SIGKILL for "
                               f"{patience:g} s; end them by hand before trusting the grades")
        time.sleep(0.01)
