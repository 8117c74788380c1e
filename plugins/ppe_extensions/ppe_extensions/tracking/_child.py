"""The sender process's side (``python -m ppe_extensions.tracking._child``): rebuilds the tracker
from the parent's pickle and serves its batches; the protocol is in ``_sender``, the
messages' framing in ``_channel``.

Its own module, not ``_sender``: the package imports ``_sender``, and ``python -m`` warns
about running a module that its package already imported.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import traceback
from typing import IO, TYPE_CHECKING, Any

from ppe_extensions.tracking._channel import TrackerReport, read_message, write_message

if TYPE_CHECKING:
    from ppe_extensions.tracking._tracker import BaseTracker

__all__ = ["main", "serve"]

# Seconds the child keeps sending after its parent died (stdin EOF without "close").
ORPHAN_FLUSH = 3.0


def main() -> int:
    """Runs the sender: rebuilds the tracker, then serves the parent until close or EOF."""
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group: the parent stops after
    # its iteration and flushes through us, so we keep sending; its close (or EOF, when the
    # parent dies, a second signal included) ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    protocol_in = sys.stdin.buffer
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of the backend's client must not garble the protocol
    sys.stdout = sys.stderr
    write_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with write_lock, contextlib.suppress(OSError):  # OSError: the parent is gone
            write_message(protocol_out, message)

    start = read_message(protocol_in)
    if start is None or start[0] != "start":
        return 2
    _, parent_path, payload = start
    sys.path[:0] = [path for path in parent_path if path not in sys.path]
    try:
        tracker: BaseTracker = pickle.loads(payload)
    except Exception as exc:
        traceback.print_exc()
        message = f"the sender process could not rebuild the tracker: {type(exc).__name__}: {exc}"
        send(("counts", TrackerReport(last_error=message[:300]), None))
        return 1
    return serve(tracker, protocol_in, send)


def serve(tracker: BaseTracker, protocol_in: IO[bytes], send: Any) -> int:
    """Feeds the parent's batches to the tracker's worker; reports every count change."""

    def report() -> None:
        send(("counts", tracker.report, tracker.run_id))

    # Batches arrive whole from the parent's pump, which keeps at most two unfinished here.
    feed = tracker.start_worker(on_counts=report)
    while True:
        message = read_message(protocol_in)
        if message is None:  # the parent died: a short flush, the run marked failed
            feed(None)
            tracker.stop_worker(ORPHAN_FLUSH, failed=True, grace=1.0)
            sys.stderr.flush()
            os._exit(0)
        if message[0] == "batch":
            feed(list(message[1]))
        elif message[0] == "close":
            feed(None)
            tracker.stop_worker(None, failed=bool(message[1]))
            report()
            send(("done",))
            return 0


if __name__ == "__main__":
    sys.exit(main())
