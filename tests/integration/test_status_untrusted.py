#!/usr/bin/env python3
"""`fedwan status` against nodes whose /status answers are hostile or broken.

usage: test_status_untrusted.py FEDWAN_BINARY WORKDIR

Starts one tiny HTTP server per node of a seven-node topology, each
answering /status with a canned body: terminal escape sequences (clear
screen, window title, colour, 8-bit CSI, bidi override) in strings,
ill-typed fields ("round": "one"), a JSON array, bytes that are not UTF-8,
a node id of a megabyte. Runs the real `fedwan status` (text and --json)
and checks that nothing raw reaches the terminal, that every broken node is
marked malformed with its reason escaped, that every other node is still
shown, and that the exit code is 3. Then the same against servers that
require a bearer token: without --token-file the nodes are unreachable
(401), with it they answer. Exits 0 when all of that holds.
"""
import http.server
import json
import os
import re
import subprocess
import sys
import threading

TOKEN = "0123456789abcdef0123456789abcdef"
EVIL = "\u001b[2J\u001b]0;pwned\u0007\u009b31m\u202eevil\u007f"


def status(node, **fields):
    return json.dumps(dict({"node": node, "round": 2, "rounds": 5, "members": 3,
                            "bytes_sent": 1000, "bytes_received": 2000}, **fields)).encode()


def child(cid, membership="member"):
    return {"id": cid, "healthy": True, "membership": membership, "round": 2,
            "last_seen_s": 0.5}


# node -> (role, parent, body of its /status)
NODES = {
    "root": ("root", None, status("root", children=[
        child("region-a"), child("site-3", EVIL), child("site-4", "paused\u202e\u2066"),
        child("site-5")])),
    # Wrong type: the old reader threw and no tree was shown at all.
    "region-a": ("region", "root", status("region-a", round="one", children=[
        child("site-1"), child("site-2")])),
    "site-1": ("site", "region-a", b"[1, 2, 3]"),
    "site-2": ("site", "region-a", status("\u001b[31mEVIL" + "A" * (1 << 20))),
    "site-3": ("site", "root", status("site-3", phase=EVIL)),
    "site-4": ("site", "root", status("site-4")),
    "site-5": ("site", "root", b'{"node": "site-5", "phase": "\xff\x1b[2J"}'),
}
MALFORMED = {"region-a", "site-1", "site-2", "site-5"}
WELL_FORMED = set(NODES) - MALFORMED


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def serve(body, token=None):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            if token and self.headers.get("Authorization") != "Bearer " + token:
                self.send_response(401)
                self.send_header("WWW-Authenticate", "Bearer")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200 if self.path == "/status" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def write_topology(path, ports):
    lines = ["job: untrusted",
             "federation: {rounds: 5, inner_steps: 2, codec: fp32, outer_optimizer: {name: fedavg}}",
             "nodes:"]
    for i, (node, (role, parent, _)) in enumerate(NODES.items()):
        metrics = f'metrics: "127.0.0.1:{ports[node]}"'
        if role == "site":
            lines.append(f"  - {{id: {node}, role: site, parent: {parent}, {metrics}}}")
        else:
            up = f", parent: {parent}" if parent else ""
            lines.append(f'  - {{id: {node}, role: {role}{up}, endpoint: "tcp://127.0.0.1:'
                         f'{17000 + i}", {metrics}}}')
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run(fedwan, topology, *extra):
    r = subprocess.run([fedwan, "status", "--topology", topology, "--timeout", "5", *extra],
                       capture_output=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def no_raw_controls(what, data):
    """No C0 control but newline, no DEL, no C1, no bidi control, valid UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{what} is not valid UTF-8 ({e}): {data[:300]!r}")
    bad = re.search("[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f"
                    "\u2028-\u202e\u2066-\u2069]", text)
    if bad:
        at = bad.start()
        fail(f"{what} holds a raw {bad.group()!r} near {text[max(0, at - 60):at + 60]!r}")
    return text


def check_text(fedwan, topology):
    code, out, err = run(fedwan, topology)
    print(out.decode("utf-8", "replace")[:4000], flush=True)
    text = no_raw_controls("the tree", out)
    no_raw_controls("stderr", err)
    if code != 3:
        fail(f"exit code {code}, expected 3 (malformed nodes are unhealthy); stderr {err!r}")
    if len(out) > 20000:
        fail(f"the tree is {len(out)} bytes: a node's huge string went through whole")
    lines = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"\s*(\S+) \(", line)
        if m:
            lines[m.group(1)] = line
    if set(lines) != set(NODES):
        fail(f"the tree shows {sorted(lines)}, expected every node {sorted(NODES)}")
    for node in MALFORMED:
        if "malformed" not in lines[node]:
            fail(f"{node} is not marked malformed: {lines[node]!r}")
    for node in WELL_FORMED:
        if "malformed" in lines[node] or "unreachable" in lines[node]:
            fail(f"{node} answered well formed but is shown {lines[node]!r}")
    if "round" not in lines["region-a"] or '"round"' not in lines["region-a"]:
        fail(f"region-a's reason does not name the ill-typed field: {lines['region-a']!r}")
    if "\\x1b[31mEVIL" not in lines["site-2"]:
        fail(f"site-2's reason does not show its id escaped: {lines['site-2']!r}")
    if "\\x1b[2J\\x1b]0;pwned\\x07\\u009b31m\\u202eevil" not in lines["site-3"]:
        fail(f"site-3's membership is not shown escaped: {lines['site-3']!r}")
    if "\\u202e\\u2066" not in lines["site-4"]:
        fail(f"site-4's membership is not shown escaped: {lines['site-4']!r}")


def check_json(fedwan, topology):
    code, out, err = run(fedwan, topology, "--json")
    if code != 3:
        fail(f"--json: exit code {code}, expected 3; stderr {err!r}")
    if any(b >= 0x80 or (b < 0x20 and b != 0x0A) for b in out):
        fail("--json output is not plain ASCII: a node's bytes went through raw")
    try:
        doc = json.loads(out)
    except json.JSONDecodeError as e:
        fail(f"--json printed no valid JSON: {e}")
    nodes = {n["node"]: n for n in doc["nodes"]}
    if set(nodes) != set(NODES) or doc["healthy"]:
        fail(f"--json: nodes {sorted(nodes)}, healthy {doc['healthy']}")
    for node in MALFORMED:
        if nodes[node]["healthy"] or "malformed" not in nodes[node]:
            fail(f"--json: {node} not marked malformed: {nodes[node]}")
    seen = nodes["site-3"]["seen_by_parent"]
    if not seen or seen.get("membership") != EVIL:
        fail(f"--json: site-3's membership not kept as the node sent it: {seen}")


def check_token(fedwan, topology, work):
    token_file = os.path.join(work, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    code, out, _ = run(fedwan, topology, "--json")
    doc = json.loads(out)
    if code != 3 or not all("HTTP 401" in n["health"] for n in doc["nodes"]):
        fail(f"without a token: exit {code}, {[n['health'] for n in doc['nodes']]}")
    code, out, err = run(fedwan, topology, "--json", "--token-file", token_file)
    doc = json.loads(out)
    if code != 0 or not doc["healthy"]:
        fail(f"with the token: exit {code}, {[n['health'] for n in doc['nodes']]} {err!r}")
    os.chmod(token_file, 0o644)
    code, _, err = run(fedwan, topology, "--token-file", token_file)
    if code == 0 or b"others may read" not in err:
        fail(f"a world-readable token file was used: exit {code}, {err!r}")


def main():
    global NODES
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    fedwan, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    servers = {node: serve(body) for node, (_, _, body) in NODES.items()}
    topology = os.path.join(work, "topology.yaml")
    write_topology(topology, {n: s.server_address[1] for n, s in servers.items()})
    check_text(fedwan, topology)
    check_json(fedwan, topology)
    for s in servers.values():
        s.shutdown()

    # Every node well formed, behind a token.
    NODES = {n: (role, parent, status(n)) for n, (role, parent, _) in NODES.items()}
    servers = {n: serve(body, TOKEN) for n, (_, _, body) in NODES.items()}
    write_topology(topology, {n: s.server_address[1] for n, s in servers.items()})
    check_token(fedwan, topology, work)
    print("ok: fedwan status showed hostile answers escaped, malformed nodes marked, the rest "
          "shown; and read token-guarded nodes with --token-file", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
