"""The ``microscale`` command of a pip install, and ``python -m microscale``: both run the C++
command that the wheel ships as ``microscale/bin/microscale``, with the same arguments."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_CLI = Path(__file__).resolve().parent / "bin" / "microscale"


def main() -> None:
    if not os.access(_CLI, os.X_OK):
        sys.exit(f"microscale: error: the command-line tool {_CLI} is missing or not executable; "
                 "reinstall the package (pip install .) with MICROSCALE_BUILD_CLI=ON")
    sys.stdout.flush()
    sys.stderr.flush()
    # argv[0] "microscale" so the tool's usage and error lines name the command the user typed.
    os.execv(_CLI, ["microscale", *sys.argv[1:]])


if __name__ == "__main__":
    main()
