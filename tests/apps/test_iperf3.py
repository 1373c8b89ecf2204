"""iperf3 server and client, both unmodified, under `sdp run`.

Each case moves a fixed byte count (-n); iperf3's -J report is parsed and the
byte counts of sender and receiver are compared, and the SDP counters of both
processes must show that the streams really went over SDP.

Reverse mode (-R) is exact: the client receives and ends the test only when it
has all -n bytes, so received == sent.

Forward mode is not exact in iperf3 itself (3.12): the server stops reading
its data sockets as soon as TEST_END arrives on the control connection, so
whatever is still queued is sent but never counted (tens of MB over plain
loopback TCP when the sender runs flat out). The forward cases therefore pace
the sender (-b) well below what the receiver can drain, which leaves only the
final block of each stream at risk; the check allows exactly that and nothing
more, and requires received == sent per stream otherwise.
"""

import json

import pytest

NBYTES = 64 * 1024 * 1024
BLKSIZE = 128 * 1024

CASES = {
    "1-stream": dict(args=["-b", "600M"], streams=1, reverse=False),
    "4-streams": dict(args=["-P", "4", "-b", "150M"], streams=4, reverse=False),
    "reverse": dict(args=["-R"], streams=1, reverse=True),
    "4-streams-reverse": dict(args=["-R", "-P", "4"], streams=4, reverse=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_iperf3(case, sdp, procs, kit, tmp_path):
    c = CASES[case]
    kit.require_bins("iperf3")
    port = kit.free_port()
    server = procs.start(sdp.wrap(["iperf3", "-s", "-B", "127.0.0.1", "-p", port]),
                         name="iperf3-server", env=sdp.env())
    kit.wait_port(port, server)
    if sdp.enabled:
        before = sdp.server_stats(server)

    stats_dir = sdp.new_stats_dir("iperf3")
    res = kit.run_cmd(sdp.wrap(["iperf3", "-c", "127.0.0.1", "-p", port, "-n", NBYTES,
                                "-l", BLKSIZE, "-J", "--connect-timeout", "10000",
                                *c["args"]]),
                      timeout=120, env=sdp.env(stats_dir), check=False)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"iperf3 -J output is not JSON\n{res.describe()}", pytrace=False)
    assert "error" not in report, f"iperf3 reported an error: {report.get('error')}\n" \
                                  f"{server.log_tail()}"
    assert res.returncode == 0, res.describe()

    start = report["start"]["test_start"]
    assert start["num_streams"] == c["streams"]
    assert start["reverse"] == int(c["reverse"])
    end = report["end"]
    sent = end["sum_sent"]["bytes"]
    received = end["sum_received"]["bytes"]
    assert sent > 0
    assert sent == NBYTES, f"iperf3 sent {sent} bytes, asked for -n {NBYTES}"
    assert len(end["streams"]) == c["streams"]
    assert sum(s["sender"]["bytes"] for s in end["streams"]) == sent
    assert sum(s["receiver"]["bytes"] for s in end["streams"]) == received
    for s in end["streams"]:
        snd, rcv = s["sender"]["bytes"], s["receiver"]["bytes"]
        assert snd > 0, s
        if c["reverse"]:
            assert rcv == snd, f"stream {s['sender'].get('socket')}: received {rcv} of {snd}"
        else:
            assert snd - rcv in (0, BLKSIZE), \
                f"stream {s['sender'].get('socket')}: received {rcv} of {snd} " \
                f"(only the final {BLKSIZE}-byte block may be left uncounted)"
    if c["reverse"]:
        assert received == sent, f"iperf3 receiver got {received} bytes of {sent} sent"

    if not sdp.enabled:
        return
    nconns = c["streams"] + 1  # the control connection plus the data streams
    cl = sdp.client_stats(stats_dir, "iperf3")
    assert cl["sdp_conns"] >= nconns, f"iperf3 client: {cl}"
    assert cl["tcp_conns"] == 0, f"iperf3 client fell back to TCP: {cl}"
    data_dir, other = ("rx_bytes", "tx_bytes") if c["reverse"] else ("tx_bytes", "rx_bytes")
    kit.assert_bytes_between(f"iperf3 client SDP {data_dir}", cl[data_dir], sent, kit.slack(sent))
    kit.assert_bytes_between(f"iperf3 client SDP {other}", cl[other], 1)

    after = sdp.server_stats(server)
    d = kit.delta(after, before)
    assert d["sdp_conns"] >= nconns, f"iperf3 server took {d['sdp_conns']} SDP conns: {after}"
    srv_data = "tx_bytes" if c["reverse"] else "rx_bytes"
    # the server's SDP layer must have delivered at least what iperf3 counted
    kit.assert_bytes_between(f"iperf3 server SDP {srv_data} delta", d[srv_data],
                             sent if c["reverse"] else received, kit.slack(sent))
