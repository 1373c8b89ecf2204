"""Extra points after the main run (same machine, load about 8): 4 MiB
stream with and without asynchronous receive, and 1 MiB with 40 us of
computation (shorter than the copy). 5 runs of 0.3 s each, pinned.
Run under flock /work/notes/bench.lock from the repository root."""
import sys, os, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")) # bench/
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from sdpbench.core import Ctx
from sdpbench.configs import Config
from sdpbench import micro
ctx = Ctx(root=ROOT, bindir=os.path.join(ROOT, "build", "bin"), dur=0.3, pin=True, cpus=[0, 1])
cfgs = [Config("sdp-zcopy", "sdp", "", env={}),
        Config("sdp-azcopy", "sdp", "", env={"SDP_AZCOPY": "1"}),
        Config("sdp-azcopy-norecv", "sdp", "", env={"SDP_AZCOPY": "1", "SDP_AZ_RECV": "0"})]
points = [{"size": 4 << 20}, {"size": 1 << 20, "busy_us": 40}, {"size": 1 << 20, "busy_us": 0}]
for p in points:
    for c in cfgs:
        vals = []
        for _ in range(5):
            s = micro._bw_sample(ctx, c, p)
            if s.ok and s.transport_ok:
                vals.append(s.metrics["gbps"])
        print(p, c.name, "median %.1f" % statistics.median(vals) if vals else "-", ["%.1f" % v for v in vals], flush=True)
