"""A worker that floods its stdout: ``flood.py MARKER MB MODE``.

MODE ``line``: MB MiB without a newline; ``cr``: a progress bar of MB MiB (``\\r`` then 1023 bytes, no
newline); ``lines``: MB MiB of 128-byte lines. It writes MARKER, waits a second, floods, then ends with
``\\ndone``.
"""

import sys
import time
from pathlib import Path

marker, mb, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
marker.write_text("started")
time.sleep(1)
if mode == "line":
    chunk = b"x" * (1 << 20)
elif mode == "cr":
    chunk = (b"\r" + b"#" * 1023) * 1024
else:
    chunk = (b"y" * 127 + b"\n") * 8192
out = sys.stdout.buffer
for _ in range(mb):
    out.write(chunk)
out.write(b"\ndone\n")
out.flush()
