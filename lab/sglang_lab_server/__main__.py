"""Entry point: ``python -m sglang_lab_server`` (LAB STAND-IN for ``python -m sglang.launch_server``).

After ``main`` returns (the HTTP server is shut down and its socket closed), the process ends with ``os._exit``
once the logs are flushed: the interpreter's own teardown with torch loaded took about 1 s on the lab's 2-CPU
machine, time in which systemd still counted the old server as stopping (the pivot's downtime). Nothing of the
stand-in runs at exit (no atexit handlers, no files left to write).
"""

from __future__ import annotations

import logging
import os
import sys

from sglang_lab_server.server import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
