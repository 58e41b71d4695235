#!/usr/bin/env python3
"""The benchmark harness's command line (build, run, check, table,
calibrate, predict, frontier, overlap); the code is the package
bench/qwenbench/, whose docstring describes each step."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from qwenbench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
