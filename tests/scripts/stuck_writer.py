"""Writers caught mid-work, for tests that SIGKILL this process (used by the leftovers tests).

Usage: python stuck_writer.py MODE OUT_DIR PID_FILE [MP_CONTEXT]

- ``thread-save``: a ThreadWriter save whose serializer wrote 1 MiB into its temporary file
  and then hangs (a big snapshot being written when the kill comes);
- ``process-save``: the same in a ProcessWriter's save process;
- ``queue-idle``: a ProcessQueueWriter whose consumer finished one save and waits for more.

The process that does the save writes its pid into PID_FILE; then this one prints ``ready``
and waits to be killed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO, Any

import ppe_core as ppe


def record_pid(pid_file: Any, file_obj: IO[bytes]) -> None:
    file_obj.write(b"\0" * (1 << 20))
    file_obj.flush()
    Path(pid_file).write_text(str(os.getpid()))


def hang(pid_file: Any, file_obj: IO[bytes]) -> None:
    record_pid(pid_file, file_obj)
    time.sleep(600)


def main() -> None:
    mode, out, pid_file = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    context = sys.argv[4] if len(sys.argv) > 4 else None
    writer: ppe.writing.Writer
    if mode == "thread-save":
        writer = ppe.writing.ThreadWriter()
        writer("snapshot_iter_7", out, str(pid_file), savefun=hang)
    elif mode == "process-save":
        writer = ppe.writing.ProcessWriter(mp_context=context)
        writer("snapshot_iter_7", out, str(pid_file), savefun=hang)
    elif mode == "queue-idle":
        writer = ppe.writing.ProcessQueueWriter(mp_context=context)
        writer("log", out, str(pid_file), savefun=record_pid)
    else:
        raise SystemExit(f"unknown mode {mode}")
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.01)
    print("ready", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
