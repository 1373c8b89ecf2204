"""Where the build is: the one place every test module learns it.

The build directory is <repo>/build, or $SDP_BUILD_DIR. Test modules
import this (tests/ is on sys.path through tests/conftest.py); conftest.py
uses it too.
"""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SDP_BUILD_DIR", str(REPO / "build"))).resolve()
SDP_BIN = BUILD / "bin" / "sdp"                 # the sdp tool
LIBSDP = BUILD / "lib" / "libsdp.so"
PERF_BIN = BUILD / "bin" / "sdp-perf"
TESTS_C = BUILD / "tests" / "c"                 # the C feature programs
TESTS_UNIT = BUILD / "tests" / "unit"           # the C unit programs
