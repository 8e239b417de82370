"""Entry point: ``python -m sglang_lab_server`` (LAB STAND-IN for ``python -m sglang.launch_server``)."""

from __future__ import annotations

import sys

from sglang_lab_server.server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
