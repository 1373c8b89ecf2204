"""libsdp built without the ofi provider (no libfabric headers, or
-DSDP_NO_OFI=ON) links, runs SDP over shared memory, and says why ofi is
absent.

The build goes to build/noofi (library and launcher only, ~15 s); the test
programs are the normal build's. A C feature program under this build's
`sdp run` with SDP_EXPECT=sdp proves its sockets really used SDP (the
program checks the connection's transport itself).
"""
import json
import os
import subprocess

from buildpaths import BUILD, REPO, TESTS_C

NOOFI = BUILD / "noofi"


def _build():
    for cmd in (["cmake", "-S", str(REPO), "-B", str(NOOFI), "-DSDP_NO_OFI=ON",
                 "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                ["cmake", "--build", str(NOOFI), "-j", str(os.cpu_count() or 2),
                 "--target", "sdp", "sdp_tool"]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, "%s failed:\n%s%s" % (
            " ".join(cmd), res.stdout[-3000:], res.stderr[-3000:])


def test_noofi_build_runs_sdp():
    _build()
    lib = NOOFI / "lib" / "libsdp.so"
    sdp = NOOFI / "bin" / "sdp"
    # No libfabric symbol is referenced: the provider really is out.
    syms = subprocess.run(["nm", "-D", str(lib)], capture_output=True,
                          text=True, check=True).stdout
    assert "fab_ofi_ops" not in syms and " fi_" not in syms

    chk = json.loads(subprocess.run([str(sdp), "check", "--json"],
                                    capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    assert chk["ofi"]["libfabric"] is False
    assert chk["ofi"]["providers"] == []
    assert "built without" in chk["ofi"]["why"]

    for prog in ("t_hello", "t_poll", "t_epoll"):
        env = dict(os.environ, SDP_EXPECT="sdp", SDP_LIB=str(lib))
        res = subprocess.run([str(sdp), "run", "--", str(TESTS_C / prog)],
                             capture_output=True, text=True, env=env,
                             timeout=120)
        assert res.returncode == 0, "%s under the no-ofi build: rc %d\n%s%s" % (
            prog, res.returncode, res.stdout[-2000:], res.stderr[-2000:])
