#!/usr/bin/env python3
"""`fedwan costs` against a dishonest site, on a copy of a real demo's records.

run(fedwan, run_dir) -> list of failures. Each attack edits a copy of the
cost records the demo's nodes wrote (run_dir/checkpoints/<node>/costs.jsonl)
the way site-0 could, holding its own key (run_dir/pki/site-0/key.pem) and
nothing else:

1. it appends records naming site-1 (rounds site-1 never ran, 36000 s x 8
   GPUs, 1 TB sent, and one contradicting a real round of site-1's), signed
   with its own key: each is refused, and every node bills as before;
2. it rewrites its own records to 0 s and 0 bytes and signs them again: it
   is billed its parent's byte count, and the mismatch is reported;
3. it claims 1e9 s of training in a round, and 1000 devices in another:
   both records are refused (its bytes still bill at its parent's count).
"""
import base64
import copy
import json
import os
import shutil
import subprocess
import tempfile

DOMAIN = b"fedwan-cost-record-v1"


def signed(record, key_pem):
    """The record as its node would write it, signed with `key_pem`."""
    body = {k: v for k, v in record.items() if k not in ("sig", "cert")}
    # What costs/cost_schema.hpp signs: compact JSON, keys in byte order.
    text = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key_pem],
                         input=DOMAIN + b"\0" + text.encode(), capture_output=True,
                         check=True).stdout
    out = dict(record)
    out["sig"] = base64.b64encode(sig).decode()
    return json.dumps(out)


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_lines(path, records, raw=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in raw:
            f.write(line + "\n")


def bill(fedwan, run_dir, records):
    pki = os.path.join(run_dir, "pki", "ca")
    p = subprocess.run([fedwan, "costs", "--ca", os.path.join(pki, "ca.pem"), "--crl",
                        os.path.join(pki, "crl.pem"), "--topology",
                        os.path.join(run_dir, "topology.yaml"), "--json", records],
                       capture_output=True, text=True, timeout=120)
    try:
        return p.returncode, json.loads(p.stdout), p.stderr
    except json.JSONDecodeError:
        return p.returncode, None, p.stderr


def rows(b):
    return {n["node"]: (n["rounds"], n["device_microseconds"], n["egress_bytes"],
                        n["received_bytes"]) for n in b["nodes"]}


def run(fedwan, run_dir):
    failures = []
    source = os.path.join(run_dir, "checkpoints")
    key = os.path.join(run_dir, "pki", "site-0", "key.pem")
    work = tempfile.mkdtemp(prefix="fedwan-cost-attacks-")
    try:
        def fresh(name):
            d = os.path.join(work, name)
            shutil.copytree(source, d, ignore=shutil.ignore_patterns("*.fwck", "*.tmp*"))
            return d, os.path.join(d, "site-0", "costs.jsonl")

        code, base, err = bill(fedwan, run_dir, source)
        if code != 0 or base is None or base["refused"] or base["conflicts"]:
            return [f"the honest records do not bill cleanly (exit {code}): {err} {base}"]
        if any(link["mismatch"] for link in base["verification"]["links"]):
            return [f"the honest records' links disagree: {base['verification']['links']}"]
        before = rows(base)
        site0 = read_lines(os.path.join(source, "site-0", "costs.jsonl"))
        site1 = read_lines(os.path.join(source, "site-1", "costs.jsonl"))
        parent = next(iter(site0[0]["links"]))
        parent1 = next(iter(site1[0]["links"]))

        # 1. Records naming site-1, signed with site-0's key.
        d, path = fresh("foreign")
        forged = []
        for rnd in range(100, 105):
            r = copy.deepcopy(site1[0])
            r.update(round=rnd, train_seconds=36000.0, devices=8, device="gpu")
            r["links"] = {parent1: {"sent": 10**12, "received": 0}}
            forged.append(signed(r, key))
        contradict = copy.deepcopy(site1[1])
        contradict["links"][parent1]["sent"] += 1
        forged.append(signed(contradict, key))
        write_lines(path, site0, forged)
        code, b, err = bill(fedwan, run_dir, d)
        refused = [x for x in (b or {}).get("refused", [])
                   if "not signed by site-1" in x["reason"]]
        if code != 3 or len(refused) != 6 or rows(b) != before:
            failures.append(f"foreign records: exit {code}, {len(refused)} of 6 refused, "
                            f"rows {rows(b) if b else err} vs {before}")
        print(f"cost attack 1: {len(refused)} records naming site-1 refused; bill unchanged")

        # 2. site-0's own records, zeroed and signed again.
        d, path = fresh("zeroed")
        zeroed = []
        for r in site0:
            r = copy.deepcopy(r)
            r["train_seconds"] = 0.0
            r["links"] = {peer: {"sent": 0, "received": 0} for peer in r["links"]}
            zeroed.append(signed(r, key))
        write_lines(path, [], zeroed)
        code, b, err = bill(fedwan, run_dir, d)
        link = next((x for x in (b or {}).get("verification", {}).get("links", [])
                     if x["child"] == "site-0"), None)
        after = rows(b) if b else {}
        if (code != 3 or b["refused"] or link is None or not link["mismatch"] or
                link["child_sent"] != 0 or after["site-0"][2] != before["site-0"][2] or
                link["parent_received"] != before["site-0"][2]):
            failures.append(f"zeroed records: exit {code}, link {link}, site-0 "
                            f"{after.get('site-0')} vs {before['site-0']}: {err}")
        print(f"cost attack 2: site-0 zeroed its records; billed {after['site-0'][2]} B sent "
              f"(its parent's count), mismatch reported")

        # 3. Training time past the round's wall time, and past the topology's devices.
        d, path = fresh("inflated")
        inflated = copy.deepcopy(site0)
        lines = [json.dumps(r) for r in inflated]
        inflated[1].update(train_seconds=1e9, devices=1)
        lines[1] = signed(inflated[1], key)
        inflated[2].update(devices=1000)
        lines[2] = signed(inflated[2], key)
        write_lines(path, [], lines)
        code, b, err = bill(fedwan, run_dir, d)
        reasons = [x["reason"] for x in (b or {}).get("refused", [])]
        lasted = [x for x in reasons if "which lasted" in x]
        devices = [x for x in reasons if "the topology allows site-0 1" in x]
        kept = round(site0[0]["train_seconds"] * 1e6) * site0[0]["devices"] + sum(
            round(r["train_seconds"] * 1e6) * r["devices"] for r in site0[3:])
        after = rows(b) if b else {}
        if (code != 3 or len(lasted) != 1 or len(devices) != 1 or
                after["site-0"][1] != kept or after["site-0"][2] != before["site-0"][2]):
            failures.append(f"inflated records: exit {code}, refused {reasons}, site-0 "
                            f"{after.get('site-0')} (device us expected {kept}): {err}")
        print(f"cost attack 3: refused {len(lasted) + len(devices)} inflated records")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return failures


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3:
        sys.exit("usage: cost_attacks.py FEDWAN_BINARY DEMO_RUN_DIR")
    problems = run(sys.argv[1], sys.argv[2])
    for p in problems:
        print("FAIL:", p)
    sys.exit(1 if problems else 0)
