#!/usr/bin/env python3
"""Timeline and logs through real launches (ringrun, 2 ranks, ringreduce-perf).

  observe.py timeline BUILD   RINGREDUCE_TIMELINE: each rank's file is valid JSON holding the
                              expected events of its allreduces (both sizes: the flat one and the
                              ring with its reduce-scatter and allgather phases, and a wait naming
                              the other rank); ringreduce-timeline merges them (rank 0 and 1 as
                              processes, sorted), --check finds no problem, --version prints
                              include/ringreduce/version.h's, --help works.
  observe.py logs BUILD       RINGREDUCE_DEBUG_SUBSYS filters INFO lines, RINGREDUCE_DEBUG_FILE's
                              %h and %p name one file per process, and an unknown RINGREDUCE_*
                              variable is warned about, with the nearest setting, once per rank.

Every process is bounded (subprocess timeouts; ringrun kills its ranks), files live in a temporary
directory removed at the end."""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

case, build = sys.argv[1], Path(sys.argv[2])
ringrun = build / "tools" / "ringrun"
perf = build / "tools" / "ringreduce-perf"
merger = build / "tools" / "ringreduce-timeline"
repo = Path(__file__).resolve().parents[2]


def fail(msg):
    print("FAILED:", msg)
    sys.exit(1)


def run(cmd, env, timeout=120):
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run([str(c) for c in cmd], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def perf_job(env, *args):
    rc, out = run([ringrun, "-n", "2", "--timeout", "90", "--", perf, "allreduce", *args], env)
    if rc != 0 or "Out of bounds values : 0 OK" not in out:
        fail(f"the allreduce job failed (rc {rc}):\n{out[-3000:]}")
    return out


def case_timeline(tmp):
    # 4 B (the flat allreduce) and 4 MiB (the ring, forced: its phases are what is checked).
    perf_job({"RINGREDUCE_TIMELINE": f"{tmp}/tl", "RINGREDUCE_ALGO": "allreduce:ring"},
             "-b", "4", "-e", "4M", "-f", "1048576", "-n", "3", "-w", "1")
    files = sorted(Path(tmp).glob("tl.*.json"))
    if [f.name for f in files] != ["tl.0.json", "tl.1.json"]:
        fail(f"expected tl.0.json and tl.1.json, found {[f.name for f in files]}")
    for r, f in enumerate(files):
        events = json.loads(f.read_text())  # strict JSON: the communicator closed it
        meta = [e for e in events if e.get("name") == "process_name"]
        if len(meta) != 1 or meta[0]["args"]["name"] != f"rank {r}" or meta[0]["pid"] != r:
            fail(f"{f.name}: process_name {meta}")
        ops = [e for e in events if e.get("cat") == "op" and e["name"] == "allreduce"]
        big = [e for e in ops if e["args"]["bytes"] == 4 << 20]
        small = [e for e in ops if e["args"]["bytes"] == 4]
        if not big or not small:
            fail(f"{f.name}: no 4 B or 4 MiB allreduce among {len(ops)} ops")
        a = big[-1]["args"]
        if not (a["algorithm"].startswith("ring seg=") and " ch=1" in a["algorithm"]
                and a["count"] == 1 << 20 and a["dtype"] == "float" and a["op"] == "sum"):
            fail(f"{f.name}: 4 MiB allreduce args {a}")
        seqs = [e["args"]["seq"] for e in ops]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            fail(f"{f.name}: sequence numbers not increasing: {seqs[:20]}")
        # Phases of the last 4 MiB op, inside it, reduce-scatter before allgather.
        op = big[-1]
        phases = [e for e in events if e.get("cat") == "phase"
                  and e["args"]["seq"] == op["args"]["seq"]]
        names = [p["name"] for p in sorted(phases, key=lambda p: p["ts"])]
        if names != ["reduce-scatter", "allgather"]:
            fail(f"{f.name}: phases of op {op['args']['seq']}: {names}")
        for p in phases:
            if p["ts"] < op["ts"] - 0.002 or p["ts"] + p["dur"] > op["ts"] + op["dur"] + 0.002:
                fail(f"{f.name}: phase {p} outside its op {op}")
        waits = [e for e in events if e.get("cat") == "wait"]
        if not any(w["name"] == f"wait rank {1 - r}" and w["args"]["peer"] == 1 - r
                   for w in waits):
            fail(f"{f.name}: no wait naming rank {1 - r} among {len(waits)} waits")
    merged = Path(tmp) / "merged.json"
    rc, out = run([merger, "--check", "-o", merged, *files], {})
    if rc != 0:
        fail(f"ringreduce-timeline --check: rc {rc}\n{out[-3000:]}")
    m = json.loads(merged.read_text())
    events = m["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    if names != {0: "rank 0", 1: "rank 1"}:
        fail(f"merged process names {names}")
    sort = {e["pid"]: e["args"]["sort_index"] for e in events
            if e.get("name") == "process_sort_index"}
    if sort != {0: 0, 1: 1}:
        fail(f"merged sort indices {sort}")
    ts = [e["ts"] for e in events if e.get("ph") != "M"]
    if ts != sorted(ts):
        fail("merged events not in time order")
    # Ranks of one host share CLOCK_MONOTONIC: matching ops overlap in time.
    ops = {}
    for e in events:
        if e.get("cat") == "op" and e["args"]["bytes"] == 4 << 20:
            ops.setdefault(e["args"]["seq"], []).append(e)
    seq, pair = max(ops.items())
    if len(pair) != 2 or not (pair[0]["ts"] < pair[1]["ts"] + pair[1]["dur"]
                              and pair[1]["ts"] < pair[0]["ts"] + pair[0]["dur"]):
        fail(f"op {seq} on the two ranks does not overlap in time: {pair}")
    want = re.search(r'RINGREDUCE_VERSION_STRING "([^"]+)"',
                     (repo / "include/ringreduce/version.h").read_text()).group(1)
    rc, out = run([merger, "--version"], {})
    if rc != 0 or out.strip() != f"ringreduce-timeline {want}":
        fail(f"--version printed {out!r}")
    rc, out = run([merger, "--help"], {})
    if rc != 0 or "usage: ringreduce-timeline" not in out or "--clock" not in out:
        fail(f"--help printed {out!r}")
    # A bad file: a clear error, exit 1.
    bad = Path(tmp) / "bad.json"
    bad.write_text("not json")
    rc, out = run([merger, bad], {})
    if rc != 1 or "ringreduce-timeline:" not in out:
        fail(f"a bad file: rc {rc}, {out!r}")
    print(f"ok: timeline ({len(events)} merged events)")


def case_logs(tmp):
    pattern = f"{tmp}/log.%h.%p.txt"
    out = perf_job({"RINGREDUCE_DEBUG": "INFO", "RINGREDUCE_DEBUG_SUBSYS": "init",
                    "RINGREDUCE_DEBUG_FILE": pattern, "RINGREDUCE_TIMEOT": "5"},
                   "-b", "4", "-e", "4", "-n", "2", "-w", "1")
    files = sorted(Path(tmp).glob("log.*.txt"))
    host = socket.gethostname()
    if len(files) != 2 or not all(re.fullmatch(rf"log\.{re.escape(host)}\.\d+\.txt", f.name)
                                  for f in files):
        fail(f"expected log.{host}.<pid>.txt for 2 processes, found {[f.name for f in files]}")
    if "INFO" in out or "WARN" in out:
        fail(f"log lines went to the terminal, not the files:\n{out[-2000:]}")
    texts = [f.read_text() for f in files]
    ranks = set()
    for f, text in zip(files, texts):
        pid = f.name.split(".")[-2]
        lines = text.splitlines()
        if not lines or not all(re.match(rf"\[ringreduce \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{6}} "
                                         rf"{re.escape(host)}:{pid}( rank \d)?\] ", l)
                                for l in lines if l.startswith("[")):
            fail(f"{f.name}: lines without the time, host and this pid:\n{text[:2000]}")
        warns = [l for l in lines if "RINGREDUCE_TIMEOT is not a ringreduce setting; did you mean "
                 "RINGREDUCE_TIMEOUT?" in l]
        if len(warns) != 1 or "] WARN " not in warns[0]:
            fail(f"{f.name}: the unknown-variable warning {len(warns)} times:\n{text[:2000]}")
        ranks.add(re.search(r"rank (\d)\]", warns[0]).group(1))
        if "INFO launched by" not in text:
            fail(f"{f.name}: no init line:\n{text[:2000]}")
        # tune, env and store INFO lines are filtered out; only init's remain.
        if "INFO links (" in text or "settings:" in text or "TCP store listening" in text:
            fail(f"{f.name}: a line of a filtered subsystem:\n{text[:3000]}")
    if ranks != {"0", "1"}:
        fail(f"the warning came from ranks {ranks}, not both")
    # The same job with the filter excluding init shows the tuner's line and not init's.
    for f in files:
        f.unlink()
    perf_job({"RINGREDUCE_DEBUG": "INFO", "RINGREDUCE_DEBUG_SUBSYS": "^init",
              "RINGREDUCE_DEBUG_FILE": pattern}, "-b", "4", "-e", "4", "-n", "2", "-w", "1")
    text = "".join(f.read_text() for f in Path(tmp).glob("log.*.txt"))
    if "INFO launched by" in text or "INFO links (" not in text:
        fail(f"^init: init shown or tune missing:\n{text[:3000]}")
    print("ok: logs")


if not ringrun.exists() or not perf.exists():
    print(f"skipped: {build} has no ringrun or ringreduce-perf")
    sys.exit(77)
with tempfile.TemporaryDirectory(prefix="rr_observe_") as tmp:
    {"timeline": case_timeline, "logs": case_logs}[case](tmp)
