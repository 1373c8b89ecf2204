"""The library's one table of tunables (src/sdp/tunables.c) and the places
that document it: every tunable is in libsdp(7) with its default, every one
with a policy name is in sdp.conf(5) with its range and default, and the
tables of README.md and docs/ARCHITECTURE.md list them all. The table is
read from `sdp check --tunables --json`, which prints it.
"""
import json
import os
import re
import subprocess

import pytest

from buildpaths import REPO, SDP_BIN

MAN7 = REPO / "docs" / "man" / "libsdp.7"
MAN5 = REPO / "docs" / "man" / "sdp.conf.5"


def _table():
    if not SDP_BIN.exists():
        pytest.fail(f"{SDP_BIN} missing: build first (make)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDP_")}
    env["SDP_CONFIG"] = "/nonexistent/sdp.conf"     # defaults only
    res = subprocess.run([str(SDP_BIN), "check", "--tunables", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["tunables"]


TABLE = None


def table():
    global TABLE
    if TABLE is None:
        TABLE = _table()
    return TABLE


def _plain(groff):
    """Man page text with the escapes that matter here undone."""
    return groff.replace("\\-", "-").replace("\\fR", "").replace("\\fB", "")


def _entries(text, section):
    """{name: paragraph} of the .TP entries `.B NAME` in one .SH/.SS section."""
    m = re.search(rf"^\.S[HS] {section}\n(.*?)(?=^\.SH |\Z)", text, re.M | re.S)
    assert m, f"no section {section}"
    out = {}
    for e in re.finditer(r"^\.TP\n\.B (\S+)\n(.*?)(?=^\.TP|^\.PP|^\.S[HS] |\Z)",
                         m.group(1), re.M | re.S):
        out[e.group(1)] = _plain(e.group(2))
    return out


def test_table_is_sane():
    t = table()
    assert len(t) >= 10
    names = [x["env"] for x in t]
    assert len(names) == len(set(names)), "a tunable is listed twice"
    for x in t:
        assert re.fullmatch(r"SDP_[A-Z_]+", x["env"]), x
        assert x["set"] is None or re.fullmatch(r"[a-z_]+", x["set"]), x
        assert x["help"] and x["unit"], x
        if x["env"] != "SDP_CONFIG":     # the one this test sets
            assert x["source"] == "default" and x["value"] == x["default"], x


def test_every_tunable_in_libsdp_7():
    entries = _entries(MAN7.read_text(), "ENVIRONMENT")
    missing = [x["env"] for x in table() if x["env"] not in entries]
    assert not missing, f"libsdp(7) ENVIRONMENT lacks {missing}"
    for x in table():
        if x["range"] == x["unit"] or not x["default"]:
            continue                     # a path or a flag: described in words
        assert re.search(rf"\b{re.escape(x['default'])}\b", entries[x["env"]]), (
            f"libsdp(7) {x['env']}: default {x['default']} not stated")


def test_every_policy_name_in_sdp_conf_5():
    entries = _entries(MAN5.read_text(), "Settings")
    for x in table():
        if x["set"] is None:
            continue
        assert x["set"] in entries, f"sdp.conf(5) Settings lacks {x['set']}"
        para = entries[x["set"]]
        assert re.search(rf"\b{re.escape(x['default'])}\b", para), (
            f"sdp.conf(5) {x['set']}: default {x['default']} not stated")
        m = re.fullmatch(r"(\d+) - (\d+)", x["range"])
        if m:
            assert f"{m.group(1)}-{m.group(2)}" in para, (
                f"sdp.conf(5) {x['set']}: range {x['range']} not stated")
    documented = set(entries)
    known = {x["set"] for x in table() if x["set"]}
    assert documented <= known, f"sdp.conf(5) documents unknown {documented - known}"


@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md"])
def test_every_tunable_in_markdown_tables(doc):
    rows = re.findall(r"^\| `(SDP_[A-Z_]+)` \|", (REPO / doc).read_text(), re.M)
    missing = [x["env"] for x in table() if x["env"] not in rows]
    assert not missing, f"{doc}: the tunables table lacks {missing}"
    known = {x["env"] for x in table()}
    assert set(rows) <= known, f"{doc} lists unknown {set(rows) - known}"


def test_check_says_where_each_value_comes_from(tmp_path):
    pol = tmp_path / "sdp.conf"
    pol.write_text("set nslots 8\nset zcopy_depth 99\nset spin_us 5\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDP_")}
    env.update(SDP_CONFIG=str(pol), SDP_SPIN_US="7", SDP_LOG='9"\\')
    res = subprocess.run([str(SDP_BIN), "check", "--tunables", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    t = {x["env"]: x for x in json.loads(res.stdout)["tunables"]}
    assert (t["SDP_SPIN_US"]["value"], t["SDP_SPIN_US"]["source"]) == ("7", "environment")
    assert (t["SDP_NSLOTS"]["value"], t["SDP_NSLOTS"]["source"]) == ("8", "policy")
    # out of range: the default, and what was given
    assert (t["SDP_ZCOPY_DEPTH"]["value"], t["SDP_ZCOPY_DEPTH"]["source"],
            t["SDP_ZCOPY_DEPTH"]["rejected"]) == ("4", "default", "99")
    assert (t["SDP_LOG"]["value"], t["SDP_LOG"]["rejected"]) == ("0", '9"\\')
    assert (t["SDP_CONFIG"]["value"], t["SDP_CONFIG"]["source"]) == (str(pol), "environment")
    # the text form says the same
    res = subprocess.run([str(SDP_BIN), "check", "--tunables"], env=env,
                         stdout=subprocess.PIPE, text=True, timeout=30)
    assert re.search(r"^SDP_NSLOTS\s+nslots\s+policy\s+8$", res.stdout, re.M), res.stdout
    assert re.search(r"^SDP_ZCOPY_DEPTH\s+zcopy_depth\s+default\s+4 \(ignored: 99\)$",
                     res.stdout, re.M), res.stdout
