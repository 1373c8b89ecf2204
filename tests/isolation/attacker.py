"""The unprivileged side of the isolation test (test_isolation.py), run as
`nobody` against a root SDP connection. Argument: JSON with the pair's
pids, their fd numbers and memfd mapping ranges, and the server's port.
Prints one JSON object: check -> "denied" or a description of what was
allowed, plus the local ports of its own TCP connections to the server.
"""
import array
import ctypes
import errno
import json
import os
import socket
import struct
import sys
import time

t = json.loads(sys.argv[1])
port = t["port"]
res = {}
uid = os.geteuid()


def denied(name, fn):
    try:
        v = fn()
    except OSError as e:
        res[name] = "denied" if e.errno in (errno.EPERM, errno.EACCES, errno.ESRCH) \
            else "error: %s" % e
        return
    res[name] = "ALLOWED: %s" % str(v)[:200]


def all_denied(name, fns):
    for f in fns:
        denied(name, f)
        if res[name] != "denied":
            return


for pid in t["pids"]:
    p = "/proc/%d" % pid
    denied("list_fd_%d" % pid, lambda: os.listdir(p + "/fd"))
    all_denied("open_fd_%d" % pid, [lambda fd=fd: os.open("%s/fd/%d" % (p, fd), os.O_RDONLY)
                                    for fd in t["fds"][str(pid)]])
    all_denied("readlink_fd_%d" % pid, [lambda fd=fd: os.readlink("%s/fd/%d" % (p, fd))
                                        for fd in t["fds"][str(pid)]])
    denied("list_map_files_%d" % pid, lambda: os.listdir(p + "/map_files"))
    all_denied("open_map_files_%d" % pid,
               [lambda r=r: os.open("%s/map_files/%s" % (p, r), os.O_RDONLY)
                for r in t["maps"][str(pid)]])

    def mem_read(r=t["maps"][str(pid)][0]):
        with open(p + "/mem", "rb") as f:
            f.seek(int(r.split("-")[0], 16))
            return f.read(64)
    denied("proc_mem_%d" % pid, mem_read)

    libc = ctypes.CDLL(None, use_errno=True)

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    def vm_readv(pid=pid, r=t["maps"][str(pid)][0]):
        buf = ctypes.create_string_buffer(64)
        loc = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
        rem = iovec(int(r.split("-")[0], 16), 64)
        n = libc.process_vm_readv(pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
        if n < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return "read %d bytes" % n
    denied("process_vm_readv_%d" % pid, vm_readv)

    def ptrace_attach(pid=pid):
        r = libc.ptrace(16, pid, None, None)    # PTRACE_ATTACH
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        libc.ptrace(17, pid, None, None)        # PTRACE_DETACH
        return "attached"
    denied("ptrace_%d" % pid, ptrace_attach)

shm = [n for n in os.listdir("/dev/shm") if "sdp" in n.lower()]
res["dev_shm_names"] = "denied" if not shm else "ALLOWED: " + ",".join(shm)

# ---- forged hellos -------------------------------------------------------
RV = ("\0sdp1.%d.2.%d.7f000001" % (t["server_uid"], port)).encode()


def region(token):
    fd = os.memfd_create("sdp-conn", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 8192)
    hdr = struct.pack("=IIIIQQII", 0x53444d52, 5, 2, 256, token, 4096, 0, 1)
    os.pwrite(fd, hdr, 0)
    import fcntl
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def hello(sport, token, flags=0, secret=None):
    """A hello (proto.h, version 5) naming the shared-memory provider, its
    offer (shm_layout.h: region page 0, flag 1 = pooled) and one memfd."""
    lo = socket.inet_aton("127.0.0.1") + b"\0" * 12
    h = struct.pack("=IHH16s", 0x53445048, 5, socket.AF_INET, lo)
    h += struct.pack(">HH", port, sport)
    h += struct.pack("=iQQIBBHQ16s", os.getpid(), token, time.monotonic_ns(),
                     flags & ~1, 1, 1, 8, 0, lo)
    h += struct.pack("=II", 0, flags & 1).ljust(64, b"\0")
    assert len(h) == 144
    if secret is not None:
        h += struct.pack("=Q", secret)
    return h


def send_hello(h, memfd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(RV)
        s.sendmsg([h], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [memfd]))])
        return True
    except OSError:
        return False
    finally:
        s.close()


def forged_conn(flags=0, secret=None):
    """A TCP connection to the server preceded by a well-formed hello that
    names it exactly: the server must keep it TCP. Returns our port."""
    c = socket.socket()
    c.bind(("127.0.0.1", 0))
    sport = c.getsockname()[1]
    tok = int.from_bytes(os.urandom(8), "little")
    fd = region(tok)
    sent = send_hello(hello(sport, tok, flags, secret), fd)
    os.close(fd)
    c.connect(("127.0.0.1", port))
    c.sendall(b"ping")
    ok = c.recv(4) == b"ping"
    res.setdefault("forged_sent", 0)
    res["forged_sent"] += sent
    return c, sport, ok


conns, ports = [], []
for flags, secret in ((0, None), (1, None), (0x80000000, 0), (0x80000001, 12345)):
    c, sp, ok = forged_conn(flags, secret)
    conns.append(c)
    ports.append(sp)
    res["forged_conn_echo_%x" % flags] = "ok" if ok else "broken"
# A flood: more hellos than the rendezvous backlog holds.
flood = 0
fd = region(1)
for i in range(4097):
    flood += send_hello(hello(1 + i % 60000, 1), fd)
os.close(fd)
res["flood_sent"] = flood
res["ports"] = ports
for c in conns:
    c.close()
print(json.dumps(res))
