"""Forge connection pools as another user would, for tests/tools/test_stat.py.

    forge_pools.py INODE...

Reads the bytes of a real pool on stdin (INODE...: the sockets its
connection records name), makes memfds named "sdp-pool" from it - each
with one lie in its header or records - prints "ready <pid> <n> <fd>" (n:
the pools that are bad, fd: the one socket the good forged pool's records
name) and holds them until killed. Run it as an unprivileged user
(setpriv): `sdp stat` run by root must survive every one.

Header (sdp/pool.h): magic, version, nprocs, nconns, conn_size, procs_off,
conns_off, hint - eight little-endian u32. A process record starts with
its pid (i32) and comm (20 bytes).
"""
import os
import signal
import socket
import struct
import sys

HDR = struct.Struct("<8I")
COMM = b'a"b\\c\n\x01\x7fz'            # quotes, backslash, control bytes


def main():
    real = sys.stdin.buffer.read()
    magic, ver, nprocs, nconns, csize, poff, coff, hint = HDR.unpack_from(real)
    size = len(real)

    def pool(data, length=None, **lie):
        f = dict(magic=magic, ver=ver, nprocs=nprocs, nconns=nconns, csize=csize,
                 poff=poff, coff=coff, hint=hint)
        f.update(lie)
        data = bytearray(data)
        HDR.pack_into(data, 0, f["magic"], f["ver"], f["nprocs"], f["nconns"], f["csize"],
                      f["poff"], f["coff"], f["hint"])
        fd = os.memfd_create("sdp-pool", 0)
        os.write(fd, bytes(data))
        if length is not None:
            os.ftruncate(fd, length)
        return fd

    fds = [
        pool(real, nconns=0xFFFFFFFF),                    # counts beyond the mapping
        pool(real, nconns=nconns * 4),
        pool(real, nprocs=0xFFFFFFFF),
        pool(real, nprocs=nprocs * 1000),
        pool(real, coff=0xFFFFF000),                      # offsets beyond it
        pool(real, poff=0xFFFFFF00),
        pool(real, coff=0x80000000),                      # "negative" as int32
        pool(real, poff=0x80000008),
        pool(real, coff=size - 64),                       # tables running off the end
        pool(real, poff=size - 8),
        pool(real, coff=poff),                            # overlapping tables
        pool(real, poff=0, coff=0),                       # over the header
        pool(real, coff=coff + 1),                        # misaligned
        pool(real, length=4096),                          # truncated file
        pool(real, length=16),                            # shorter than a header
        pool(real, length=8 << 30),                       # huge (sparse) file
    ]
    bad = len(fds)
    # A well-formed pool whose records lie: one process record claims to be
    # this process with a hostile name (listed: we hold the pool); the
    # connection records are root's (they name sockets we do not hold),
    # and a thousand more name one socket of ours (listed once).
    forged = bytearray(real)
    struct.pack_into("<i20s", forged, poff, os.getpid(), COMM)
    inos = {int(x) for x in sys.argv[1:]}
    rec = at = None
    for i in range(nconns):
        r = real[coff + i * csize:coff + (i + 1) * csize]
        for o in range(0, csize - 7, 8):
            if struct.unpack_from("<Q", r, o)[0] in inos:
                rec, at = bytearray(r), o
                break
        if rec:
            break
    if rec is None:
        sys.exit("no connection record names the sockets given")
    mine, _peer = socket.socketpair()
    struct.pack_into("<Q", rec, at, os.fstat(mine.fileno()).st_ino)
    free = [i for i in range(nconns)
            if struct.unpack_from("<Q", real, coff + i * csize + at)[0] not in inos]
    for i in free[:1000]:
        forged[coff + i * csize:coff + (i + 1) * csize] = rec
    fds.append(pool(forged))
    print(f"ready {os.getpid()} {bad} {mine.fileno()}", flush=True)
    signal.pause()


if __name__ == "__main__":
    main()
