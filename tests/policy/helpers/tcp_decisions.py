"""One process that makes the switch keep sockets on TCP in every way it
can decide to, for tests/policy/test_reasons.py. Run under
`sdp run --policy P` with SDP_LOG=2, where P says `use tcp server` for
127.0.0.1:PORT_T and `use sdp` for everything else:

    tcp_decisions.py PORT_T PORT_S

1. a listener the policy keeps on TCP, and a client of it;
2. an SDP listener and a client without libsdp;
3. a connect to an address that is not on this host (TEST-NET-1);
4. an SDP connection handed to an exec'd program (the connection leaves
   SDP on both ends; the peer keeps calling recv with a short timeout, so
   it follows without depending on a wake-up).
Prints one line per step with the transports seen (1 SDP, 0 TCP).
"""
import errno, os, socket, subprocess, sys
pt, ps = int(sys.argv[1]), int(sys.argv[2])
def listener(port):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port)); l.listen(); return l
T = lambda s: s.getsockopt(socket.SOL_TCP, 0x5D00)
# 1: the policy keeps this listener on TCP (and so its client)
lt = listener(pt)
c1 = socket.create_connection(("127.0.0.1", pt)); a1, _ = lt.accept()
print("policy", T(c1), T(a1), flush=True)
# 2: an SDP listener, a client without libsdp
ls = listener(ps)
env = dict(os.environ); env.pop("LD_PRELOAD", None)
subprocess.run([sys.executable, "-c", "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1]))).close()", str(ps)], env=env, check=True)
a2, _ = ls.accept()
print("plain-client", T(a2), flush=True)
# 3: a destination that is not on this host (TEST-NET-1)
r = socket.socket(); r.setblocking(False)
e = r.connect_ex(("192.0.2.1", 9)); r.close()
print("remote", errno.errorcode.get(e, e), flush=True)
# 4: an SDP connection handed to an exec'd program; the peer follows
FOLLOW = r'''
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("follower", s.getsockopt(socket.SOL_TCP, 0x5D00), flush=True)
s.settimeout(0.05)
got = b""
while len(got) < 5:
    try:
        b = s.recv(5 - len(got))
    except socket.timeout:
        continue
    if not b:
        sys.exit("eof")
    got += b
s.settimeout(None)
s.sendall(b"ok:" + got)
'''
f = subprocess.Popen([sys.executable, "-c", FOLLOW, str(ps)], stdout=subprocess.PIPE, text=True)
a3, _ = ls.accept()
print("exec-before", T(a3), flush=True)
subprocess.run([sys.executable, "-c", "import socket,sys; socket.socket(fileno=int(sys.argv[1])).sendall(b'hello')",
                str(a3.fileno())], pass_fds=[a3.fileno()], check=True, timeout=30)
a3.settimeout(30)
got = b""
while len(got) < 8:
    b = a3.recv(8 - len(got))
    if not b:
        break
    got += b
fout = f.communicate(timeout=30)[0]      # its own pipe: lines do not interleave
print(fout.strip(), flush=True)
print("exec-after", got.decode(), T(a3), f.returncode, flush=True)
