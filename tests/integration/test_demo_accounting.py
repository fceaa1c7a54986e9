#!/usr/bin/env python3
"""What `fedwan demo` accounts for: a run without audit logs keeps none, the
CPU time of the sites' training steps is reported apart, and so is each
node's count of minor page faults, by which a steady round receives its
frames into pages already faulted in, whatever the chunk size.

Usage: test_demo_accounting.py FEDWAN_BINARY WORKDIR
"""
import json
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

FEDWAN = None
WORKDIR = None


def demo(tag, *flags, size=200000, rounds=3, inner_steps=2):
    run_dir = Path(WORKDIR) / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    report = Path(WORKDIR) / f"{tag}.json"
    out = subprocess.run(
        [FEDWAN, "demo", "--trainer", "synthetic", "--synthetic-size", str(size),
         "--regions", "0", "--sites", "2", "--rounds", str(rounds), "-H", str(inner_steps),
         "--no-baseline", "--no-checkpoints", "--dir", str(run_dir), "--report", str(report),
         *flags],
        capture_output=True, text=True, timeout=240, check=False)
    if out.returncode != 0:
        raise AssertionError(f"fedwan demo {' '.join(flags)} exited {out.returncode}:\n"
                             f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return run_dir, json.loads(report.read_text()), out.stdout


class DemoAccounting(unittest.TestCase):
    def test_no_audit_log_keeps_none_and_the_training_is_counted_apart(self):
        run_dir, report, stdout = demo("no-audit", "--no-audit-log")
        self.assertEqual(sorted((run_dir / "audit").iterdir()), [])
        cpu = report["cpu"]
        self.assertIn("training_s", cpu)
        sites = {k: v for k, v in cpu["nodes"].items() if k.startswith("site-")}
        self.assertEqual(sorted(sites), ["site-0", "site-1"])
        for node, t in sites.items():
            # Training is part of the site's time, never more than all of it.
            self.assertGreater(t["training_s"], 0, node)
            self.assertLessEqual(t["training_s"], t["user_s"] + t["system_s"], node)
        self.assertNotIn("training_s", cpu["nodes"]["root"])
        self.assertAlmostEqual(cpu["training_s"], sum(t["training_s"] for t in sites.values()))
        self.assertIn("the federation alone", stdout)
        # Each site's report has the training CPU of every round.
        for node in sites:
            r = json.loads((run_dir / "reports" / f"{node}.json").read_text())
            self.assertEqual(len(r["rounds"]), 3)
            self.assertTrue(all(x["train_cpu_s"] >= 0 for x in r["rounds"]))

    def test_a_steady_round_receives_into_pages_kept(self):
        # 16M parameters, 64 MB: a round puts 256 MB on the links (two
        # updates up, two anchors down), 62 thousand pages. When a chunk's
        # frame was above the size from which the node programs had glibc
        # map memory afresh (2 MiB, a 4 MiB chunk's fp16 frame 2 MiB and
        # 64 bytes), every page received was faulted in again: about 1.2
        # faults a page a round. Kept, the four rounds between a run of 2
        # and one of 6 add few: what the root faults in (its heap at its
        # peak, which the timing of frames sets, and what it gives back
        # when the heap swings past what it keeps) moves between -4 and
        # +34 thousand from run to run at the default chunk.
        for chunk in (1 << 20, 4 << 20):
            faults, wire = {}, {}
            for rounds in (2, 6):
                _, report, _ = demo(f"faults-{chunk}-{rounds}", "--no-audit-log",
                                    "--chunk-bytes", str(chunk), size=16_000_000,
                                    rounds=rounds, inner_steps=1)
                nodes = report["cpu"]["nodes"]
                self.assertEqual(sorted(nodes), ["root", "site-0", "site-1"])
                faults[rounds] = sum(t["minor_faults"] for t in nodes.values())
                wire[rounds] = report["wan_bytes_total"]
            pages = (wire[6] - wire[2]) / 4096
            self.assertGreater(pages, 100_000)
            self.assertLess(faults[6] - faults[2], 0.5 * pages,
                            f"chunk {chunk}: {faults[6] - faults[2]} page faults in four steady "
                            f"rounds that received {pages:.0f} pages")

    def test_the_audit_logs_are_kept_by_default(self):
        run_dir, _, _ = demo("audit")
        logs = sorted(p.name for p in (run_dir / "audit").iterdir())
        self.assertEqual(logs, ["root.jsonl", "site-0.jsonl", "site-1.jsonl"])

    def test_no_audit_log_is_refused_where_the_demo_follows_the_logs(self):
        for flags, named in ((["--chaos", "site-0@2"], "--chaos"),
                             (["--add-site", "2"], "--add-site")):
            out = subprocess.run([FEDWAN, "demo", "--no-audit-log", *flags],
                                 capture_output=True, text=True, timeout=60, check=False)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn(f"{named} needs the nodes' audit logs", out.stdout + out.stderr)


if __name__ == "__main__":
    FEDWAN, WORKDIR = sys.argv[1], sys.argv[2]
    Path(WORKDIR).mkdir(parents=True, exist_ok=True)
    unittest.main(argv=sys.argv[:1])
