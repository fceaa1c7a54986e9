#!/usr/bin/env python3
"""`fedwan costs` as a user runs it, on cost records generated here.

Usage: test_costs_cli.py FEDWAN_BINARY

3 sites x 20 rounds under one region and a root, random but seeded, over two
UTC hours; site-0 restarted and wrote three rounds again. The sums the bill
must equal are computed here, independently, from what was written. These
records are unsigned, so they are billed with --unverified (the signatures,
the refusal of forged records and the parent's counts are tested on a real
demo's records by check_demo_report.py --cost-attacks, and in
tests/unit/cli/test_cost_checks.cpp).
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime, timedelta, timezone

FEDWAN = None

RATES = """currency: EUR
device_hour:
  default: {cpu: 0.04, gpu: 2.10}
  site-1: {gpu: 1.60}
egress_gb:
  default: 0.08
  site-0: 0.05
  "region-0->root": 0.02
  region-0: 0.07
"""
T0 = datetime(2026, 11, 25, 7, 0, 30, tzinfo=timezone.utc)
JOB = "costs-test"


def utc(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def egress_rate(node, peer):
    if (node, peer) == ("region-0", "root"):
        return 0.02  # the link's price over its node's
    return {"site-0": 0.05, "region-0": 0.07}.get(node, 0.08)


def device_rate(node, kind):
    return 1.60 if (node, kind) == ("site-1", "gpu") else {"cpu": 0.04, "gpu": 2.10}[kind]


def write_federation(root, seed):
    """Writes root/<node>/costs.jsonl; returns the independent sums."""
    rng = random.Random(seed)
    lines = {}
    sums = {}  # node -> {rounds, contributed, device_us, sent, received, links: peer -> sent}
    hourly = [{}, {}]  # hour -> node -> same

    def add(rec, hour):
        lines.setdefault(rec["node"], []).append(json.dumps(rec))
        for table in (sums, hourly[hour]):
            s = table.setdefault(rec["node"], {"role": rec["role"], "rounds": 0,
                                               "contributed": 0, "device_us": {}, "sent": 0,
                                               "received": 0, "links": {}})
            s["rounds"] += 1
            s["contributed"] += rec.get("contributed", False)
            if rec.get("devices", 0):
                us = round(rec["train_seconds"] * 1000) * 1000 * rec["devices"]
                s["device_us"][rec["device"]] = s["device_us"].get(rec["device"], 0) + us
            for peer, link in rec["links"].items():
                s["sent"] += link["sent"]
                s["received"] += link["received"]
                s["links"][peer] = s["links"].get(peer, 0) + link["sent"]

    for rnd in range(20):
        end = T0 + timedelta(seconds=360 * rnd + 300, milliseconds=rng.randrange(1000))
        hour = 0 if end.hour == 7 else 1
        times = {"start": utc(end - timedelta(seconds=290)), "end": utc(end)}
        up = down = 0
        per_site = {}
        for s in range(3):
            node = f"site-{s}"
            sent, received = rng.randrange(1 << 40), rng.randrange(1 << 40)
            up, down = up + sent, down + received
            per_site[node] = {"sent": received, "received": sent}  # as the region counts
            add({"v": 2, "job": JOB, "node": node, "role": "site", "round": rnd, **times,
                 "train_seconds": rng.randrange(1000, 290000) / 1000,
                 "devices": rng.randrange(1, 9), "device": "cpu" if s == 2 else "gpu",
                 "contributed": rng.randrange(10) != 0, "note": "unknown fields are ignored",
                 "links": {"region-0": {"sent": sent, "received": received}}}, hour)
        to_root, from_root = rng.randrange(1 << 32), rng.randrange(1 << 32)
        add({"v": 2, "job": JOB, "node": "region-0", "role": "region", "round": rnd, **times,
             "links": {**per_site, "root": {"sent": to_root, "received": from_root}}}, hour)
        add({"v": 2, "job": JOB, "node": "root", "role": "root", "round": rnd, **times,
             "links": {"region-0": {"sent": from_root, "received": to_root}}}, hour)
    # site-0 restarted in round 7 and wrote rounds 5 to 7 again, verbatim.
    lines["site-0"] += lines["site-0"][5:8]
    for node, node_lines in lines.items():
        os.makedirs(os.path.join(root, node))
        with open(os.path.join(root, node, "costs.jsonl"), "w") as f:
            f.write("\n".join(node_lines) + "\n")
    return sums, hourly


def run(*args, ok=True, trust=("--unverified",)):
    p = subprocess.run([FEDWAN, "costs", *trust, *args], capture_output=True, text=True,
                       timeout=60)
    if ok and p.returncode != 0:
        raise AssertionError(f"fedwan costs {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


class CostsCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fedwan-costs-")
        cls.records = os.path.join(cls.dir, "run")
        cls.sums, cls.hourly = write_federation(cls.records, seed=20261125)
        cls.rates = os.path.join(cls.dir, "rates.yaml")
        with open(cls.rates, "w") as f:
            f.write(RATES)
        cls.bill = json.loads(run("--rates", cls.rates, "--window", "1h", "--json",
                                  cls.records).stdout)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def check_row(self, row, s):
        self.assertEqual(row["rounds"], s["rounds"])
        self.assertEqual(row["contributed"], s["contributed"])
        self.assertEqual(row["device_microseconds"], sum(s["device_us"].values()))
        for kind, us in s["device_us"].items():
            self.assertEqual(row["device_by_kind"][kind]["device_microseconds"], us)
        self.assertEqual(row["egress_bytes"], s["sent"])
        self.assertEqual(row["received_bytes"], s["received"])
        # Money: the independent sums priced by hand.
        cost = sum(us / 3.6e9 * device_rate(row["node"], k) for k, us in s["device_us"].items())
        cost += sum(sent / 1e9 * egress_rate(row["node"], p) for p, sent in s["links"].items())
        self.assertAlmostEqual(row["total_cost"], cost, delta=1e-12 * cost)

    def test_totals_equal_the_per_round_sums(self):
        b = self.bill
        self.assertEqual((b["records_read"], b["records"], b["duplicates"]), (103, 100, 3))
        self.assertEqual((b["files"], b["currency"], b["window"]), (5, "EUR", "1h"))
        self.assertEqual([n["node"] for n in b["nodes"]], sorted(self.sums))
        for row in b["nodes"]:
            with self.subTest(node=row["node"]):
                self.assertEqual(row["role"], self.sums[row["node"]]["role"])
                self.check_row(row, self.sums[row["node"]])
        t = b["totals"]
        for key, field in (("rounds", "rounds"), ("contributed", "contributed"),
                           ("sent", "egress_bytes"), ("received", "received_bytes")):
            self.assertEqual(t[field], sum(s[key] for s in self.sums.values()))
        self.assertEqual(t["device_microseconds"],
                         sum(sum(s["device_us"].values()) for s in self.sums.values()))
        self.assertEqual(t["device_hours"], t["device_microseconds"] / 3.6e9)
        # The totals' money is the nodes' added in the order printed.
        total = 0.0
        for row in b["nodes"]:
            total += row["total_cost"]
        self.assertEqual(t["total_cost"], total)

    def test_windows_partition_the_totals_exactly(self):
        b = self.bill
        self.assertEqual([(w["start"], w["end"]) for w in b["windows"]],
                         [("2026-11-25T07:00:00Z", "2026-11-25T08:00:00Z"),
                          ("2026-11-25T08:00:00Z", "2026-11-25T09:00:00Z")])
        for w, hour in zip(b["windows"], self.hourly):
            self.assertEqual([n["node"] for n in w["nodes"]], sorted(hour))
            for row in w["nodes"]:
                with self.subTest(window=w["start"], node=row["node"]):
                    self.check_row(row, hour[row["node"]])
        for field in ("rounds", "contributed", "device_microseconds", "egress_bytes",
                      "received_bytes"):
            self.assertEqual(sum(w["totals"][field] for w in b["windows"]), b["totals"][field])
            for node in b["nodes"]:
                self.assertEqual(sum(r[field] for w in b["windows"] for r in w["nodes"]
                                     if r["node"] == node["node"]), node[field])
        money = sum(w["totals"]["total_cost"] for w in b["windows"])
        self.assertAlmostEqual(money, b["totals"]["total_cost"],
                               delta=1e-12 * b["totals"]["total_cost"])

    def test_table_shows_the_same_bill(self):
        out = run("--rates", self.rates, "--window", "1h", self.records).stdout
        lines = out.splitlines()
        self.assertEqual(lines[0], "100 round records billed from 5 files (3 more written twice, "
                         "counted once); prices in EUR")
        self.assertIn("signatures: NOT CHECKED (--unverified)", lines[1])
        self.assertIn("link bytes: 4 child links; rounds billed at the parent's count: 80", out)
        header = next(i for i, l in enumerate(lines) if l.startswith("node "))
        self.assertIn("total EUR", lines[header])
        t = self.bill["totals"]
        total_row = next(l for l in out.splitlines() if l.startswith("total "))
        self.assertEqual(total_row.split()[1:],
                         [str(t["rounds"]), str(t["contributed"]), f"{t['device_hours']:.3f}",
                          f"{t['device_cost']:.2f}", f"{t['egress_gb']:.3f}",
                          f"{t['egress_cost']:.2f}", f"{t['total_cost']:.2f}"])
        for row in self.bill["nodes"]:
            line = next(l for l in out.splitlines() if l.startswith(row["node"] + " "))
            self.assertEqual(line.split()[:4], [row["node"], row["role"], str(row["rounds"]),
                                                str(row["contributed"])])
            self.assertTrue(line.endswith(f"{row['total_cost']:.2f}"), line)
        self.assertIn("window 2026-11-25T07:00:00Z .. 2026-11-25T08:00:00Z", out)
        self.assertEqual(len(re.findall(r"^window total ", out, re.M)), 2)

    def test_without_rates_everything_costs_nothing(self):
        b = json.loads(run("--json", self.records).stdout)
        self.assertEqual((b["currency"], b["window"], b["windows"]), ("units", None, []))
        self.assertEqual(b["totals"]["total_cost"], 0)
        self.assertEqual(b["totals"]["egress_bytes"], self.bill["totals"]["egress_bytes"])
        self.assertEqual(b["verification"]["signatures"], "not checked (--unverified)")
        self.assertEqual((b["refused"], b["conflicts"]), ([], []))

    def test_a_ca_or_unverified_must_be_chosen(self):
        p = run(self.records, ok=False, trust=())
        self.assertEqual(p.returncode, 2)
        self.assertIn("give --ca PKI/ca/ca.pem", p.stderr)

    def test_a_conflicting_duplicate_bills_the_larger_and_is_reported(self):
        d = os.path.join(self.dir, "conflict")
        shutil.copytree(self.records, d)
        path = os.path.join(d, "site-1", "costs.jsonl")
        with open(path) as f:
            lines = f.read().splitlines()
        rec = json.loads(lines[3])
        rec["train_seconds"] += 1
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        p = run("--json", d, ok=False)
        self.assertEqual(p.returncode, 3, p.stderr)
        b = json.loads(p.stdout)
        self.assertEqual(len(b["conflicts"]), 1)
        c = b["conflicts"][0]
        self.assertEqual((c["node"], c["round"], c["billed"], c["other"]),
                         ("site-1", 3, f"{path}:21", f"{path}:4"))
        self.assertIn("train_seconds", c["difference"])
        site1 = next(n for n in b["nodes"] if n["node"] == "site-1")
        expected = sum(self.sums["site-1"]["device_us"].values())
        self.assertEqual(site1["device_microseconds"], expected + 1000000 * rec["devices"])
        out = run(d, ok=False).stdout
        self.assertIn("rounds a node recorded twice, differently (the larger is billed):", out)

    def test_bad_lines_are_refused_and_the_rest_bills(self):
        d = os.path.join(self.dir, "bad")
        os.makedirs(d)
        path = os.path.join(d, "costs.jsonl")
        with open(os.path.join(self.records, "root", "costs.jsonl")) as f:
            good = f.read().splitlines()[:2]
        for bad, why in (('{"v":2,"node":"root",', "not valid JSON"),
                         (good[0].replace('"v": 2', '"v": 3'),
                          "schema version 3 is not supported: this fedwan reads cost records "
                          "of versions 1 to 2"),
                         (good[0].replace('"role": "root"', '"role": "leaf"'),
                          '"role" must be site, region or root'),
                         ("\x1b]0;pwned\x07\x1b[2J", "not valid JSON")):
            with self.subTest(why=why):
                with open(path, "w") as f:
                    f.write("\n".join(good[:1] + [bad] + good[1:]) + "\n")
                p = run(d, ok=False)
                self.assertEqual(p.returncode, 3, p.stderr)
                self.assertIn(f"{path}:2: {why}", p.stdout)
                self.assertIn("2 round records billed", p.stdout)
                self.assertNotIn("\x1b", p.stdout)
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        p = run(empty, ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{empty}: no costs.jsonl under this directory", p.stderr)

    def test_bad_rates_say_where(self):
        rates = os.path.join(self.dir, "bad-rates.yaml")
        with open(rates, "w") as f:
            f.write(RATES.replace("site-0: 0.05", "site-0: -0.05"))
        p = run("--rates", rates, self.records, ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{rates}:7:11: egress_gb.site-0: a rate must be a non-negative number, "
                      "got '-0.05'", p.stderr)
        with open(rates, "w") as f:
            f.write(RATES + "egress_gb_typo: 1\n")
        self.assertIn("unknown top-level key 'egress_gb_typo'",
                      run("--rates", rates, self.records, ok=False).stderr)
        with open(rates, "w") as f:
            f.write(RATES.replace("site-1:", "site1:"))
        p = run("--rates", rates, "--json", self.records)
        self.assertIn("device_hour.site1 names no node or link in the records", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    FEDWAN = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[2:])
