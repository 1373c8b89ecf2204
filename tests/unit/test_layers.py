"""The layers call only downwards (docs/ARCHITECTURE.md section 1).

switch (src/switch) -> engine (src/sdp) -> fabric (src/fabric): the engine
never includes the switch; neither reaches a provider but through its ops
table (no provider header, no shm_* name); and the engine and the
providers never call the libc names the switch interposes (sys.h has the
raw calls). A source scan: it fails on the line that breaks a rule.
"""
import re

from buildpaths import REPO

SRC = REPO / "src"
INTERPOSED = ("read", "write", "close", "open", "fcntl", "fcntl64", "ioctl", "socket",
              "connect", "accept", "accept4", "listen", "shutdown", "dup", "dup2", "dup3",
              "setsockopt", "getsockopt", "send", "recv", "sendto", "recvfrom", "sendmsg",
              "recvmsg", "readv", "writev", "poll", "ppoll", "select", "pselect",
              "epoll_wait", "epoll_ctl", "epoll_create", "epoll_create1", "fork",
              "close_range", "closefrom", "sendfile", "fstat", "fstat64", "fstatat",
              "fstatat64")
CALL = re.compile(r"(?<![\w.>])(%s)\s*\(" % "|".join(INTERPOSED))


def code_lines(path):
    """(number, line) of a C file with comments and string literals blanked."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text,
                  flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    for i, line in enumerate(text.split("\n"), 1):
        yield i, re.sub(r"//.*", "", line)


def files(*dirs):
    for d in dirs:
        yield from sorted((SRC / d).glob("*.[ch]"))


def offenders(paths, pattern):
    bad = []
    for p in paths:
        for i, line in code_lines(p):
            if re.search(pattern, line):
                bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    return bad


def test_engine_never_includes_the_switch():
    bad = []
    for p in files("sdp", "fabric"):
        for i, line in enumerate(p.read_text().split("\n"), 1):
            if re.match(r'\s*#\s*include\s*"switch/', line):
                bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "the engine includes the switch:\n" + "\n".join(bad)


def test_only_the_ops_table_reaches_a_provider():
    bad = []
    for p in files("sdp", "switch", "tools"):
        for i, line in enumerate(p.read_text().split("\n"), 1):
            if re.match(r'\s*#\s*include\s*"fabric/(?!fabric\.h)', line):
                bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    bad += offenders(files("sdp", "switch", "tools"), r"\bshm_\w+\s*\(|\bfab_shm_ops\b")
    assert not bad, "a provider reached around its ops table:\n" + "\n".join(bad)


def test_no_interposed_libc_call_inside_the_library():
    bad = []
    for p in files("sdp", "fabric"):
        for i, line in code_lines(p):
            m = CALL.search(line)
            if m and not re.search(r"\b(sys_|real_)\w+\s*\(", line[max(0, m.start() - 5):]):
                bad.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, ("the engine calls a libc name the switch interposes "
                     "(use sdp/sys.h):\n" + "\n".join(bad))
