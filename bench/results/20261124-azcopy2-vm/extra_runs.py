"""Extra points beside the main run: sdp-perf streams driven as the bench does
(micro._bw_sample, pinned, 0.2 s per run). Usage, from the repository root,
under flock /work/notes/bench.lock:
  python3 extra_runs.py ROOT CONFIGS POINTS_JSON REPS
CONFIGS: tcp, zc (sdp-zcopy), az (sdp-azcopy), aznr (sdp-azcopy with SDP_AZ_RECV=0)."""
import sys, os, statistics, json
ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "bench"))
from sdpbench.core import Ctx
from sdpbench.configs import Config
from sdpbench import micro
ctx = Ctx(root=ROOT, bindir=os.path.join(ROOT, "build", "bin"), dur=0.2, pin=True, cpus=[0, 1])
allc = {"tcp": Config("tcp", "tcp", "", env={}),
        "zc": Config("sdp-zcopy", "sdp", "", env={}),
        "az": Config("sdp-azcopy", "sdp", "", env={"SDP_AZCOPY": "1"}),
        "aznr": Config("sdp-azcopy-norecv", "sdp", "", env={"SDP_AZCOPY": "1", "SDP_AZ_RECV": "0"})}
cfgs = [allc[n] for n in sys.argv[2].split(",")]
points = json.loads(sys.argv[3])
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
for p in points:
    line = []
    for c in cfgs:
        vals = []; cpu = []; extra = {}
        for _ in range(reps):
            s = micro._bw_sample(ctx, c, p)
            if s.ok and s.transport_ok:
                vals.append(s.metrics["gbps"]); cpu.append((s.cpu_client or 0) + (s.cpu_server or 0)); extra = s.extra
            else:
                print("FAIL", c.name, s.reason, flush=True)
        m = statistics.median(vals) if vals else float('nan')
        line.append("%s %.1f [%s] cpu %.2f cow %s f %s" % (c.name, m, ",".join("%.1f" % v for v in vals), statistics.median(cpu) if cpu else 0, extra.get("az_cow_copies"), extra.get("az_faults")))
    print(p, " | ".join(line), flush=True)
