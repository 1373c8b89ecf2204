"""Python's own standard-library test suite under `sdp run`: test programs
the library was not written against, which check socket semantics (errno,
edge-triggered epoll, shutdown, timeouts, SSL, asyncio, servers of the
standard library) and that no descriptor leaks into the processes they
start. Each module must pass as it does without the library (`1 test OK`,
never skipped), and the modules that connect over TCP must have carried
connections over SDP (their exit-time counters).

Debian's interpreter runs the tests (its libpython3.X-testsuite package,
installed by scripts/install-deps.sh)."""

import subprocess

import pytest

PY = "/usr/bin/python3"

# module -> least number of SDP connections its processes must report
MODULES = {
    "test_socket": 100,
    "test_epoll": 4,
    "test_selectors": 0,
    "test_socketserver": 20,
    "test_httplib": 50,
    "test_httpservers": 50,
    "test_urllib2_localnet": 30,
    "test_ftplib": 100,
    "test_smtplib": 50,
    "test_wsgiref": 1,
    "test_ssl": 100,
    "test_asyncio.test_sock_lowlevel": 20,
    "test_asyncio.test_streams": 10,
    "test_asyncio.test_sendfile": 50,
    "test_asyncio.test_server": 1,
    # no TCP of its own: the descriptors its children inherit (the
    # library's must not show: fd_status.py lists them by fstat)
    "test_subprocess": 0,
}


def _testsuite_present():
    r = subprocess.run([PY, "-c", "import test.test_socket"], capture_output=True)
    return r.returncode == 0


CHILD = r"""
import subprocess, sys
from test import support
fd_status = support.findfile("fd_status.py", subdir="subprocessdata")
out = subprocess.run([sys.executable, fd_status], capture_output=True, close_fds=True).stdout
maps = open("/proc/self/maps").read()
print("libsdp" in maps, out.decode().strip())
"""


def _fds_of_a_child(sdp, kit):
    """What test_subprocess's children see, the library loaded in both
    processes (its pool descriptor exists from the start): only 0, 1, 2."""
    res = kit.run_cmd(sdp.wrap([PY, "-c", CHILD]), timeout=60, env=sdp.env())
    assert res.stdout.split() == ["True", "0,1,2"], res.describe()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_stdlib_module(module, sdp, kit):
    assert _testsuite_present(), \
        f"{PY}: no test.test_socket (libpython3.X-testsuite): run scripts/install-deps.sh"
    stats_dir = sdp.new_stats_dir(module.replace(".", "-"))
    # the network resource: servers on 127.0.0.1 only; vsock has no host here
    argv = [PY, "-m", "test", "--timeout", "120", "-u", "network",
            "-i", "*VSOCK*", module]
    # SDP_LOG=1: the library says it is loaded (not for test_subprocess,
    # whose tests compare what their children print on stderr)
    quiet = module == "test_subprocess"
    env = sdp.env(stats_dir, **({} if quiet else {"SDP_LOG": "1"}))
    res = kit.run_cmd(sdp.wrap(argv), timeout=300, env=env, check=False)
    assert res.returncode == 0 and "1 test OK." in res.stdout, res.describe(6000)
    if not sdp.enabled:
        return
    if quiet:
        _fds_of_a_child(sdp, kit)
    else:
        # the library was in the interpreter that ran the tests
        assert "libsdp loaded in python3" in res.stderr, res.describe()
    want = MODULES[module]
    if want:
        st = sdp.client_stats(stats_dir)
        assert st["sdp_conns"] >= want, f"{module}: {st}"
