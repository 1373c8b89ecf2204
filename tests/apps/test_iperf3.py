"""iperf3 server and client, both unmodified, under `sdp run`.

Each case moves a fixed byte count (-n); iperf3's -J report is parsed and the
byte counts of sender and receiver are compared, and the SDP counters of both
processes must show that the streams really went over SDP.

iperf3 (3.12) does not make "received == sent" exact, even over kernel TCP:
whichever side ends the test stops reading (or counting) as soon as TEST_END
is exchanged on the control connection, so bytes still queued at that moment
are sent but never counted. Unpaced forward runs over loopback TCP leave tens
of MB uncounted; in reverse runs the sending server may write one more block
before it sees TEST_END. So:

* forward (client sends): the sender is paced (-b) well below what the
  receiver drains, and per stream 0 <= sent - received <= FWD_TAIL;
* reverse (server sends, client ends the test once it has -n bytes): the
  client must have received at least -n bytes, and per stream
  0 <= sent - received <= FWD_TAIL;
* in all cases the sender wrote at least -n bytes and at most one block per
  stream more.
"""

import json

import pytest

NBYTES = 64 * 1024 * 1024
BLKSIZE = 128 * 1024
# What may be queued between the two applications when TEST_END stops the
# count: a paced receiver on a busy host falls behind by up to what the
# connection holds - an SDP ring's payload (64 x 32 KiB buffers, ~2 MiB)
# plus a block in the sender's hands. Lost bytes are caught by the SDP
# byte counters below and by the checksummed stress tests.
FWD_TAIL = 2 * 1024 * 1024 + BLKSIZE

CASES = {
    "1-stream": dict(args=["-b", "400M"], streams=1, reverse=False),
    "4-streams": dict(args=["-P", "4", "-b", "100M"], streams=4, reverse=False),
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
                      timeout=60, env=sdp.env(stats_dir), check=False)
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
    # -n is a lower bound: with several streams the last round of writes may overshoot
    assert NBYTES <= sent <= NBYTES + c["streams"] * BLKSIZE, \
        f"iperf3 sent {sent} bytes, asked for -n {NBYTES}"
    assert len(end["streams"]) == c["streams"]
    assert sum(s["sender"]["bytes"] for s in end["streams"]) == sent
    assert sum(s["receiver"]["bytes"] for s in end["streams"]) == received
    for s in end["streams"]:
        snd, rcv = s["sender"]["bytes"], s["receiver"]["bytes"]
        assert snd > 0 and rcv > 0, s
        assert 0 <= snd - rcv <= FWD_TAIL, \
            f"stream {s['sender'].get('socket')}: received {rcv} of {snd} " \
            f"(at most the last {FWD_TAIL} bytes may be left uncounted)"
    if c["reverse"]:
        assert received >= NBYTES, f"iperf3 client received {received} bytes of -n {NBYTES}"

    if not sdp.enabled:
        return
    nconns = c["streams"] + 1  # the control connection plus the data streams
    cl = sdp.client_stats(stats_dir, "iperf3")
    assert cl["sdp_conns"] >= nconns, f"iperf3 client: {cl}"
    assert cl["tcp_conns"] == 0, f"iperf3 client fell back to TCP: {cl}"
    # the writer's SDP layer carried at least what iperf3 wrote, the reader's at
    # least what iperf3 read (the data plus the small control exchange)
    if c["reverse"]:
        kit.assert_bytes_between("iperf3 client SDP rx_bytes", cl["rx_bytes"], received,
                                 kit.slack(sent))
        kit.assert_bytes_between("iperf3 client SDP tx_bytes", cl["tx_bytes"], 1, 1 << 20)
    else:
        kit.assert_bytes_between("iperf3 client SDP tx_bytes", cl["tx_bytes"], sent,
                                 kit.slack(sent))
        kit.assert_bytes_between("iperf3 client SDP rx_bytes", cl["rx_bytes"], 1, 1 << 20)

    after = sdp.server_stats(server)
    d = kit.delta(after, before)
    assert d["sdp_conns"] >= nconns, f"iperf3 server took {d['sdp_conns']} SDP conns: {after}"
    srv_data = "tx_bytes" if c["reverse"] else "rx_bytes"
    # the server's SDP layer must have delivered at least what iperf3 counted
    kit.assert_bytes_between(f"iperf3 server SDP {srv_data} delta", d[srv_data],
                             sent if c["reverse"] else received, kit.slack(sent))
