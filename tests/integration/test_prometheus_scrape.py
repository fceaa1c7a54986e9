#!/usr/bin/env python3
"""Prometheus scrapes a real `fedwan demo --metrics` and sees the federation.

usage: test_prometheus_scrape.py FEDWAN_BINARY WORKDIR [--prometheus PATH]
                                 [--dashboard PATH] [--rounds N]

Runs the demo with a metrics endpoint on every node, points a real
Prometheus (the Debian package `prometheus`) at every node's address from
the demo's topology.yaml, scraping each second, and when the demo is done
asks Prometheus's HTTP API what it saw: every target up, one fedwan_info
per node, every node's rounds_total equal to the report's rounds, and so on.
While the demo runs it also reads each node's /metrics and /status itself:
every metric the Grafana dashboard (deploy/grafana/fedwan-dashboard.json)
queries must be in those expositions, and every dashboard query must be
valid PromQL that Prometheus evaluates.

Exits 77 (skipped) without a prometheus binary; 0 when everything holds.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_dashboard_metrics  # noqa: E402

SKIP = 77
TOPOLOGY_WAIT_S = 180     # the demo provisions a CA and loads the data first
PROMETHEUS_READY_S = 60
DEMO_WAIT_S = 480         # the whole demo: 4 short rounds take well under a minute
HTTP_TIMEOUT_S = 3
# How far the two ends of a link may disagree on its bytes: frames one end
# counts and the other does not (the TLS handshake), heartbeats after the
# last scrape.
LINK_SLACK_BYTES = 8192
LINK_SLACK_FRACTION = 0.02
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class Failure(Exception):
    pass


def log(*args):
    print(*args, flush=True)


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=HTTP_TIMEOUT_S):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode("utf-8", "replace")


def parse_topology(text):
    """[(id, role, metrics address or None, parent or None)] from the demo's topology.yaml:
    one `- {id: ..., role: ..., metrics: "host:port"}` per node (flow style,
    as Topology::to_yaml writes it), or block-style entries. No YAML module."""
    lines = text.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if re.match(r"^nodes:\s*$", l))
    except StopIteration:
        return []
    entries, cur = [], None
    for line in lines[start + 1:]:
        if line.strip() == "" or line.lstrip().startswith("#"):
            continue
        if not line.startswith((" ", "-")):
            break  # the next top-level key
        if re.match(r"^\s*-\s", line):
            if cur is not None:
                entries.append(cur)
            cur = line
        elif cur is not None:
            cur += "\n" + line
    if cur is not None:
        entries.append(cur)

    def field(entry, key):
        m = re.search(r"(?:^|[\s{,])" + key + r":\s*(?:\"((?:[^\"\\]|\\.)*)\"|([^,}\s]+))", entry)
        if not m:
            return None
        return m.group(1) if m.group(1) is not None else m.group(2)

    return [(field(e, "id"), field(e, "role"), field(e, "metrics"), field(e, "parent"))
            for e in entries]


def topology_job(text):
    m = re.search(r'^job:\s*"?([^"\n]*)"?\s*$', text, re.M)
    return m.group(1) if m else None


class Prometheus:
    def __init__(self, base):
        self.base = base

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            _, _, body = http_get(url, timeout=10)
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as e:
            raise Failure(f"Prometheus query failed ({e}): {expr}")
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise Failure(f"Prometheus refused '{expr}': {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def vector(self, expr, at=None):
        data = self.query(expr, at)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, expr, at=None):
        v = self.vector(expr, at)
        if len(v) != 1:
            raise Failure(f"'{expr}' returned {len(v)} series, expected 1: {v}")
        return v[0][1]


def stop_process_group(proc, name, grace_s=15):
    """SIGTERM to the process group (the demo stops its nodes), then SIGKILL."""
    if proc is None:
        return
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if proc.poll() is None:
        log(f"stopping {name} (pid {proc.pid})")
        try:
            os.killpg(pgid, signal.SIGTERM) if pgid else proc.terminate()
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left of the group (a node the demo did not reap) goes too.
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log(f"warning: {name} (pid {proc.pid}) did not exit after SIGKILL")


def demo_dir_flag(fedwan):
    h = subprocess.run([fedwan, "demo", "--help"], capture_output=True, text=True, timeout=60)
    text = h.stdout + h.stderr
    for flag in ("--metrics", "--metrics-linger"):
        if not re.search(r"(^|[\s,])" + re.escape(flag) + r"(\s|$|[ =])", text, re.M):
            raise Failure(f"`fedwan demo --help` lists no {flag}: this fedwan cannot serve "
                          f"metrics from its demo")
    if re.search(r"(^|[\s,])--work-dir\b", text, re.M):
        return "--work-dir"
    return "--dir"


def write_prometheus_config(path, nodes):
    lines = ["# Written by test_prometheus_scrape.py: every demo node, every second.",
             "global:",
             "  scrape_interval: 1s",
             "  scrape_timeout: 1s",
             "  evaluation_interval: 1s",
             "scrape_configs:",
             "  - job_name: fedwan",
             "    metrics_path: /metrics",
             "    static_configs:"]
    for node_id, _, addr, _ in nodes:
        lines += [f"      - targets: [{json.dumps(addr)}]",
                  f"        labels: {{node_id: {json.dumps(node_id)}}}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run(a):
    failures = []
    workdir = os.path.abspath(a.workdir)
    demo_dir = os.path.join(workdir, "demo")
    prom_dir = os.path.join(workdir, "prometheus")
    report_path = os.path.join(workdir, "report.json")
    topo_path = os.path.join(demo_dir, "topology.yaml")
    demo_log = os.path.join(workdir, "demo.log")
    prom_log = os.path.join(workdir, "prometheus.log")
    os.makedirs(demo_dir, exist_ok=True)
    for stale in (report_path, topo_path):
        if os.path.exists(stale):
            os.remove(stale)
    shutil.rmtree(prom_dir, ignore_errors=True)
    shutil.rmtree(os.path.join(demo_dir, "audit"), ignore_errors=True)
    os.makedirs(prom_dir)

    procs = {}
    t_start = time.time()
    try:
        cmd = [a.fedwan, "demo", "--rounds", str(a.rounds), "--inner-steps", "20",
               "--no-baseline", "--metrics", "--metrics-linger", f"{a.linger:g}",
               demo_dir_flag(a.fedwan), demo_dir, "--report", report_path]
        log("running:", " ".join(cmd), f"(output in {demo_log})")
        with open(demo_log, "w") as out:
            procs["demo"] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        demo = procs["demo"]

        # The topology, once the demo has written it in full.
        deadline = time.time() + TOPOLOGY_WAIT_S
        nodes, topo_text = [], ""
        while True:
            if demo.poll() is not None:
                raise Failure(f"the demo exited ({demo.returncode}) before writing "
                              f"{topo_path}:\n{tail(demo_log)}")
            if os.path.exists(topo_path):
                with open(topo_path) as f:
                    topo_text = f.read()
                nodes = parse_topology(topo_text)
                if nodes and all(n[0] and n[1] for n in nodes) and topo_text.endswith("\n"):
                    break
            if time.time() > deadline:
                raise Failure(f"no complete {topo_path} after {TOPOLOGY_WAIT_S} s:\n"
                              f"{tail(demo_log)}")
            time.sleep(0.2)
        log(f"topology: {len(nodes)} nodes: " +
            ", ".join(f"{i} ({r}) {m}" for i, r, m, _ in nodes))
        no_addr = [i for i, _, m, _ in nodes if not m]
        if no_addr:
            raise Failure(f"nodes without a metrics address in {topo_path} (--metrics gives "
                          f"every node one): {no_addr}")
        for i, _, m, _ in nodes:
            if not re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", m):
                failures.append(f"{i}'s metrics address {m} is not 127.0.0.1:PORT (a free port, not 0)")
        node_ids = [n[0] for n in nodes]
        roles = {n[0]: n[1] for n in nodes}
        addr = {n[0]: n[2] for n in nodes}
        parent = {n[0]: n[3] for n in nodes if n[3]}
        job = topology_job(topo_text)

        # Prometheus, scraping every node each second.
        config = os.path.join(prom_dir, "prometheus.yml")
        write_prometheus_config(config, nodes)
        port = free_port()
        prom_cmd = [a.prometheus, f"--config.file={config}",
                    f"--storage.tsdb.path={os.path.join(prom_dir, 'tsdb')}",
                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        log("running:", " ".join(prom_cmd), f"(output in {prom_log})")
        with open(prom_log, "w") as out:
            procs["prometheus"] = subprocess.Popen(prom_cmd, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL,
                                                   start_new_session=True)
        prom = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.time() + PROMETHEUS_READY_S
        while True:
            if procs["prometheus"].poll() is not None:
                raise Failure(f"prometheus exited ({procs['prometheus'].returncode}):\n"
                              f"{tail(prom_log)}")
            try:
                if http_get(prom.base + "/-/ready")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                raise Failure(f"prometheus not ready after {PROMETHEUS_READY_S} s:\n"
                              f"{tail(prom_log)}")
            time.sleep(0.2)
        log(f"prometheus ready at {prom.base}, {time.time() - t_start:.1f} s into the run")

        # Until the demo ends: each node's latest /metrics and /status, read
        # here too (the nodes linger after finishing, so the last reads carry
        # the final values).
        latest, status, errors = {}, {}, {}
        content_types = {}
        deadline = time.time() + DEMO_WAIT_S
        while demo.poll() is None:
            if time.time() > deadline:
                raise Failure(f"the demo still runs after {DEMO_WAIT_S} s:\n{tail(demo_log)}")
            for i in node_ids:
                try:
                    _, ctype, body = http_get(f"http://{addr[i]}/metrics")
                    latest[i] = body
                    content_types[i] = ctype
                    _, _, st = http_get(f"http://{addr[i]}/status")
                    status[i] = st
                except (urllib.error.URLError, OSError) as e:
                    errors[i] = str(e)
            time.sleep(0.5)
        t_end = time.time()
        log(f"demo exited ({demo.returncode}) after {t_end - t_start:.1f} s")
        if demo.returncode != 0:
            raise Failure(f"the demo failed ({demo.returncode}):\n{tail(demo_log)}")
        # One more scrape interval, then Prometheus has all it will get.
        time.sleep(1.5)

        with open(report_path) as f:
            report = json.load(f)
        rounds = len(report.get("rounds", []))
        if rounds != a.rounds or report.get("configuration", {}).get("rounds") != a.rounds:
            failures.append(f"the report has {rounds} rounds (configuration "
                            f"{report.get('configuration', {}).get('rounds')}), asked {a.rounds}")

        # What the test read itself (kept in WORKDIR/expositions to look at).
        expo_dir = os.path.join(workdir, "expositions")
        shutil.rmtree(expo_dir, ignore_errors=True)
        os.makedirs(expo_dir)
        for i, text in latest.items():
            with open(os.path.join(expo_dir, f"{i}.prom"), "w") as f:
                f.write(text)
            with open(os.path.join(expo_dir, f"{i}.status.json"), "w") as f:
                f.write(status.get(i, ""))
        for i in node_ids:
            if i not in latest:
                failures.append(f"{i}: /metrics at {addr[i]} never answered "
                                f"(last error: {errors.get(i)})")
                continue
            if not content_types[i].startswith("text/plain"):
                failures.append(f"{i}: /metrics Content-Type is '{content_types[i]}'")
            if not re.search(r'^fedwan_info\{[^}]*node="' + re.escape(i) + '"', latest[i], re.M):
                failures.append(f"{i}: its /metrics has no fedwan_info{{node=\"{i}\"}}")
            try:
                st = json.loads(status.get(i, ""))
                if not isinstance(st, dict) or st.get("node") != i:
                    failures.append(f"{i}: /status is not this node's JSON object: {st}")
            except ValueError as e:
                failures.append(f"{i}: /status is not JSON ({e}): {status.get(i, '')[:200]}")
        for p in check_dashboard_metrics.check(a.dashboard, list(latest.values())):
            failures.append("dashboard: " + p)
        used = check_dashboard_metrics.all_referenced(a.dashboard)
        sampled = check_dashboard_metrics.sampled_metrics(latest.values())
        declared = check_dashboard_metrics.exposed_metrics(latest.values())
        declared_only = sorted(n for n in used if n in declared and n not in sampled)
        log(f"dashboard: {len(used)} metrics queried, all in the expositions"
            if not any(f.startswith("dashboard:") for f in failures) else
            "dashboard: metrics missing (see FAIL lines)")
        if declared_only:
            log(f"  declared with no sample yet (no series to show): {declared_only}")

        # What Prometheus saw.
        window = f"{int(math.ceil(time.time() - t_start)) + 60}s"
        at = time.time()
        for i in node_ids:
            up = prom.vector(f'max_over_time(up{{node_id="{i}"}}[{window}])', at)
            if not up or max(v for _, v in up) != 1:
                failures.append(f"{i}: its scrape target was never up ({up})")
        n_info = prom.value(f"count(max_over_time(fedwan_info[{window}]))", at)
        if n_info != len(nodes):
            failures.append(f"count(fedwan_info) = {n_info:g}, the topology has {len(nodes)} nodes")
        for labels, _ in prom.vector(f"max_over_time(fedwan_info[{window}])", at):
            i = labels.get("node")
            if i not in roles:
                failures.append(f"fedwan_info for an unknown node: {labels}")
                continue
            if labels.get("role") != roles[i]:
                failures.append(f"{i}: fedwan_info role '{labels.get('role')}', topology "
                                f"'{roles[i]}'")
            # The topology's job is the `federation` label (Prometheus keeps
            # `job` for the scrape job).
            got_job = labels.get("federation")
            if job is not None and got_job != job:
                failures.append(f"{i}: fedwan_info federation '{got_job}', topology "
                                f"job '{job}'")
            if labels.get("node_id") != i:
                failures.append(f"{i}: fedwan_info came from the target of {labels.get('node_id')}")

        def node_max(metric, i):
            v = prom.vector(f'max_over_time({metric}{{node="{i}"}}[{window}])', at)
            return None if not v else max(x for _, x in v)

        rows = []
        for i in node_ids:
            role = roles[i]
            done = node_max("fedwan_rounds_total", i)
            cur = node_max("fedwan_round", i)
            hist = "fedwan_sync_duration_seconds" if role == "site" else \
                "fedwan_round_duration_seconds"
            count = node_max(hist + "_count", i)
            sent = prom.vector(f'sum(max_over_time(fedwan_link_bytes_total{{node="{i}",'
                               f'direction="sent"}}[{window}]))', at)
            sent = sent[0][1] if sent else None
            rows.append(f"  {i:10s} {role:7s} rounds_total={done} round={cur} "
                        f"{hist.split('_')[1]}_count={count} sent_bytes={sent}")
            if done != rounds:
                failures.append(f"{i}: max fedwan_rounds_total = {done}, the report has "
                                f"{rounds} rounds")
            if cur is None or cur not in (rounds - 1, rounds):
                failures.append(f"{i}: max fedwan_round = {cur}, expected {rounds - 1} "
                                f"(the last, 0-based) or {rounds} (past it)")
            if count != rounds:
                failures.append(f"{i}: {hist}_count = {count}, expected one per round "
                                f"({rounds})")
            if not sent:
                failures.append(f"{i}: no bytes sent on its links (fedwan_link_bytes_total)")
        log("prometheus saw:\n" + "\n".join(rows))

        # Both ends of every tree link count the same bytes: what one sent,
        # the other received (up to the handshake and the last heartbeats).
        link = {}
        for labels, v in prom.vector(f"max by (node, peer, direction) "
                                     f"(max_over_time(fedwan_link_bytes_total[{window}]))", at):
            link[(labels.get("node"), labels.get("peer"), labels.get("direction"))] = v
        rows = []
        for child, par in sorted(parent.items()):
            for src, dst in ((child, par), (par, child)):
                sent = link.get((src, dst, "sent"))
                got = link.get((dst, src, "received"))
                rows.append(f"  {src:>8s} -> {dst:8s} sent {sent}  received {got}")
                if sent is None or got is None:
                    failures.append(f"link {src} -> {dst}: no fedwan_link_bytes_total "
                                    f"(sent at {src}: {sent}, received at {dst}: {got})")
                elif abs(sent - got) > max(LINK_SLACK_BYTES, LINK_SLACK_FRACTION * max(sent, got)):
                    failures.append(f"link {src} -> {dst}: {src} counts {sent:.0f} bytes sent, "
                                    f"{dst} {got:.0f} received ({got - sent:+.0f})")
        log("links (fedwan_link_bytes_total, both ends):\n" + "\n".join(rows))

        # The root's compression ratio is the report's fp32 / wire bytes.
        ratio = prom.vector(f'last_over_time(fedwan_compression_ratio{{node="root"}}[{window}])', at)
        if report.get("wan_bytes_total") and report.get("fp32_bytes_total"):
            want = report["fp32_bytes_total"] / report["wan_bytes_total"]
            if not ratio or not math.isclose(ratio[0][1], want, rel_tol=1e-3):
                failures.append(f"root's fedwan_compression_ratio {ratio}, the report's "
                                f"fp32/wan bytes {want:.6f}")
            else:
                log(f"root's compression ratio {ratio[0][1]:.6f} = the report's {want:.6f}")

        # Every dashboard query is PromQL Prometheus evaluates, with Grafana's
        # variables as a run-long range would set them.
        subst = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": window,
                 "${node:regex}": ".*", "$node": ".*"}
        queries = check_dashboard_metrics.dashboard_queries(
            check_dashboard_metrics.load_dashboard(a.dashboard))
        empty = []
        for where, q in queries:
            if q.startswith("label_values("):
                continue  # a Grafana function, not PromQL
            expr = q
            for k, v in subst.items():
                expr = expr.replace(k, v)
            try:
                if not prom.vector(expr, t_end - 2):
                    empty.append(where)
            except Failure as e:
                failures.append(f"dashboard {where}: {e}")
        log(f"dashboard: {len(queries)} queries evaluated; no data (expected for what did not "
            f"happen, e.g. rejections, pauses): {empty}")
    except Failure as e:
        failures.append(str(e))
    finally:
        stop_process_group(procs.get("prometheus"), "prometheus")
        stop_process_group(procs.get("demo"), "the demo")
    return failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("fedwan")
    p.add_argument("workdir")
    p.add_argument("--prometheus", default="/usr/bin/prometheus")
    p.add_argument("--dashboard",
                   default=os.path.join(REPO, "deploy", "grafana", "fedwan-dashboard.json"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--linger", type=float, default=6)
    a = p.parse_args()
    if not (os.path.isfile(a.prometheus) and os.access(a.prometheus, os.X_OK)):
        print(f"skipped: no Prometheus at {a.prometheus} (Debian package `prometheus`, "
              f"installed by scripts/setup.sh)", flush=True)
        return SKIP

    # ctest (or a user) stopping the test still stops the demo and Prometheus.
    def on_signal(sig, _frame):
        print(f"FAIL: stopped by signal {sig}; stopping the demo and Prometheus", flush=True)
        raise SystemExit(128 + sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    failures = run(a)
    for f in failures:
        print("FAIL:", f, flush=True)
    if not failures:
        print("ok: Prometheus scraped every node; the federation's metrics match the report")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
