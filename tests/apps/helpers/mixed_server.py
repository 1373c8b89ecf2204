"""Thread-per-connection echo server for the mixed SDP/TCP tests.

usage: mixed_server.py PORT ORDER     (ORDER: client-first | server-first)

server-first: a fixed banner is sent as soon as a connection is accepted,
before anything is read (like SMTP or MySQL servers do). Then everything
received is echoed until the peer half-closes. For every connection one JSON
line is printed: its number, the byte count and SHA-256 of what was received.
"""
import hashlib
import json
import socket
import socketserver
import sys
import threading

BANNER = b"220 mixed-server ready, speaking first\r\n" * 4
lock = threading.Lock()
counter = [0]


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        with lock:
            counter[0] += 1
            n = counter[0]
        s = self.request
        s.settimeout(60)
        h = hashlib.sha256()
        rx = 0
        err = None
        try:
            if self.server.order == "server-first":
                s.sendall(BANNER)
            while True:
                data = s.recv(65536)
                if not data:
                    break
                rx += len(data)
                h.update(data)
                s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            err = repr(e)
        with lock:
            print(json.dumps({"conn": n, "rx": rx, "sha": h.hexdigest(), "error": err}),
                  flush=True)


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128


if __name__ == "__main__":
    srv = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    srv.order = sys.argv[2]
    srv.serve_forever()
