"""`fedwan bench`: run a federation under emulated WAN links, with baselines
measured in the same invocation, and write bench.json and bench.md.

    fedwan bench run --profile intercontinental --params 10M --rounds 5
    fedwan bench run --quick            # seconds: proves the harness works
    fedwan bench run --modes blocking,overlap --overlap-steps 5   # side by side
    fedwan bench run --sweep streams=1,2,4   # TCP connections per tree link
    fedwan bench profiles               # what each profile is
    fedwan bench streams --streams 1,2,4 --cc bbr,cubic   # parallel TCP streams on one link
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import federation, metrics, netem, netns, profiles, report, streams
from .host import SKIP, machine
from .host import find_tool as _tool


def parse_count(text: str) -> int:
    """'10M', '300M', '250k', '1.5M', '123456'."""
    t = text.strip().lower()
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale != 1 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: '{text}' (e.g. 10M, 250k)") from None
    if not 1 <= value <= 2**30:
        raise argparse.ArgumentTypeError(f"{text}: between 1 and 2^30 parameters")
    return int(value)


def add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="cross-region",
                   help="lan, cross-region, intercontinental, degraded (default cross-region)")
    p.add_argument("--rate-mbit", type=float, help="custom: root-tier rate")
    p.add_argument("--delay-ms", type=float, help="custom: root-tier one-way delay")
    p.add_argument("--jitter-ms", type=float, help="custom: root-tier jitter")
    p.add_argument("--loss-percent", type=float, help="custom: root-tier loss")
    p.add_argument("--site-rate-mbit", type=float, help="custom: site-tier rate")
    p.add_argument("--site-delay-ms", type=float, help="custom: site-tier one-way delay")
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--sites-per-region", type=int, default=2)
    p.add_argument("--params", type=parse_count, default=parse_count("1M"),
                   help="synthetic model size (default 1M)")
    p.add_argument("--trainer", choices=["synthetic", "fashion-cnn"], default="synthetic")
    p.add_argument("--codec", default="fp16")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--inner-steps", type=int, default=10, help="H")
    p.add_argument("--overlap-steps", type=int, default=0, metavar="N",
                   help="overlapped rounds (topology federation.overlap_steps): a site keeps "
                        "training while its update goes up and merges the next anchor N inner "
                        "steps after sending it; 0 = blocking rounds (default), at most H")
    p.add_argument("--modes", default="", metavar="MODE,...",
                   help="comma-separated: blocking, overlap: one fedwan run per mode on the same "
                        "links, side by side (blocking is named fedwan, overlap fedwan-overlap "
                        "and needs --overlap-steps N >= 1); default: one run, fedwan, in the "
                        "mode --overlap-steps sets")
    p.add_argument("--streams", type=federation.parse_streams, default=federation.AUTO_STREAMS,
                   metavar="N|auto",
                   help="TCP connections per tree link (topology federation.streams): auto "
                        "(the default: as many as pay, up to max_streams) or N, a child "
                        "striping its frames over N connections to its parent")
    p.add_argument("--unprivileged-cc", default="", metavar="CC",
                   help="emulate a host where fedwan may not set its congestion control: "
                        "only reno and CC allowed (host-wide for the run, put back after), CC "
                        "the namespaces' default, nodes without CAP_NET_ADMIN (setting BBR "
                        "fails with EPERM), e.g. cubic")
    p.add_argument("--step-time-ms", type=float, default=50.0,
                   help="synthetic: wall time of one training step (a GPU step's stand-in)")
    p.add_argument("--chunk-bytes", type=int, default=1 << 20)
    p.add_argument("--outer-optimizer", default="fedavg")
    p.add_argument("--baselines", default="flat-fp32",
                   help="comma-separated: flat-fp32, flower, none (default flat-fp32); "
                        "baselines run blocking rounds, every site connected to the root "
                        "over the fedwan run's links (behind its region's link)")
    p.add_argument("--flower-python", default=os.environ.get("FEDWAN_FLOWER_PYTHON", ""),
                   help="a Python with flwr for the Flower baseline (python3 -m venv V && "
                        "V/bin/pip install flwr numpy); default $FEDWAN_FLOWER_PYTHON")
    p.add_argument("--plaintext", action="store_true", help="no mutual TLS (default: mTLS)")
    p.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                   help="a kernel setting for every node's namespace, e.g. "
                        "net.ipv4.tcp_congestion_control=cubic (repeatable)")
    p.add_argument("--tcp-congestion", default="",
                   help="fedwan's congestion control on every link (topology "
                        "federation.tcp_congestion: bbr by default, cubic, reno, or system)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default="bench-out", help="directory for bench.json, bench.md, logs")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per federation run")
    p.add_argument("--quick", action="store_true",
                   help="a few seconds: 200k parameters, 1 region x 2 sites, 2 rounds")
    p.add_argument("--sweep", metavar="KEY=V1,V2,...",
                   help="run once per value of KEY: rate-mbit, delay-ms, tcp-congestion, codec, "
                        "inner-steps, overlap-steps (0 = blocking; not with --modes), streams, "
                        "params, sites-per-region (plots show the figures against it)")
    p.add_argument("--kernel-sample-s", type=float, default=1.0, metavar="S",
                   help="the kernel's per-socket TCP counters (ss -tin in each node's "
                        "namespace): seconds between samples of the open connections, besides "
                        "each connection's final counters as it closes (0: none; default 1)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--fedwan", help="the fedwan binary (default: next to this one, or PATH)")
    p.add_argument("--linkemu", help="the fedwan-linkemu binary")
    netem.add_shaper_flag(p)


def fedwan_runs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(name, overlap steps) of each fedwan run: without --modes one run,
    "fedwan", overlapped by --overlap-steps (0: blocking); with --modes one per
    mode listed, "fedwan" blocking and "fedwan-overlap" overlapped by
    --overlap-steps, in that order."""
    tau, h = args.overlap_steps, args.inner_steps
    if tau < 0:
        raise SystemExit(f"fedwan bench: --overlap-steps {tau}: 0 (blocking rounds) or more")
    if tau > h:
        raise SystemExit(f"fedwan bench: --overlap-steps {tau} is more than --inner-steps {h}"
                         f"{' (--quick runs H=2)' if args.quick else ''}: a site merges the next "
                         f"anchor at most H inner steps after it sent its update")
    if not args.modes:
        return [("fedwan", tau)]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in federation.MODES]
    if unknown or not modes:
        raise SystemExit(f"fedwan bench: --modes {args.modes}: a comma-separated list of "
                         f"{', '.join(federation.MODES)}")
    if "overlap" in modes and tau < 1:
        raise SystemExit("fedwan bench: --modes overlap needs --overlap-steps N, 1 <= N <= "
                         "--inner-steps (how many inner steps late a site merges the anchor)")
    if "overlap" not in modes and tau:
        raise SystemExit(f"fedwan bench: --overlap-steps {tau} with --modes {args.modes}: "
                         f"add overlap to --modes, or drop --overlap-steps")
    runs = []
    if "blocking" in modes:
        runs.append(("fedwan", 0))
    if "overlap" in modes:
        runs.append(("fedwan-overlap", tau))
    return runs


def check_streams(args: argparse.Namespace) -> int:
    """--streams, checked: 1 to 16, and above 1 only over the secure channel
    (plaintext frames have no sequence numbers to reorder)."""
    n = args.streams
    if n == federation.AUTO_STREAMS:
        return n
    if not 1 <= n <= federation.MAX_STREAMS:
        raise SystemExit(f"fedwan bench: --streams {n}: 1 to {federation.MAX_STREAMS} TCP "
                         f"connections per tree link")
    if n > 1 and args.plaintext:
        raise SystemExit(f"fedwan bench: --streams {n} needs the secure channel: drop "
                         f"--plaintext, or run --streams 1")
    return n


def specs_from(args: argparse.Namespace) -> list[federation.BenchFederation]:
    from dataclasses import replace
    if args.quick:
        args.params, args.regions, args.sites_per_region = 200_000, 1, 2
        args.rounds, args.inner_steps, args.step_time_ms = 2, 2, 10.0
    for name in ("regions", "sites_per_region", "rounds", "inner_steps"):
        if getattr(args, name) < (0 if name == "regions" else 1):
            raise SystemExit(f"fedwan bench: --{name.replace('_', '-')} must be positive")
    # Baselines are built from the blocking spec: they run blocking rounds,
    # flat, on the same links (behind the regions' links when there are
    # regions), one TCP connection per link.
    ours = federation.BenchFederation(
        name="fedwan", regions=args.regions, sites_per_region=args.sites_per_region,
        sites=args.sites_per_region if args.regions == 0 else 0, codec=args.codec,
        rounds=args.rounds, inner_steps=args.inner_steps, step_time_ms=args.step_time_ms,
        params=args.params, chunk_bytes=args.chunk_bytes, trainer=args.trainer, seed=args.seed,
        secure=not args.plaintext, round_timeout_s=args.timeout,
        outer_optimizer=args.outer_optimizer,
        sysctls=tuple(tuple(kv.split("=", 1)) for kv in args.sysctl),
        tcp_congestion=args.tcp_congestion, unprivileged_cc=args.unprivileged_cc)
    n_streams = check_streams(args)
    specs = [replace(ours, name=name, overlap_steps=tau, streams=n_streams)
             for name, tau in fedwan_runs(args)]
    for b in [x.strip() for x in args.baselines.split(",") if x.strip()]:
        if b == "none":
            continue
        if b == "flat-fp32":
            specs.append(replace(ours, name="flat-fp32", regions=0, sites=ours.site_count(),
                                 via_regions=ours.regions, codec="fp32"))
        elif b == "flower":
            py = args.flower_python or sys.executable
            if subprocess.run([py, "-c", "import flwr, numpy"], capture_output=True).returncode:
                raise SystemExit(f"fedwan bench: the Flower baseline needs a Python with flwr; "
                                 f"{py} has none (python3 -m venv V && V/bin/pip install flwr "
                                 f"numpy, then --flower-python V/bin/python)")
            if args.trainer != "synthetic":
                raise SystemExit("fedwan bench: the Flower baseline trains the synthetic model")
            specs.append(replace(ours, name="flower", regions=0, sites=ours.site_count(),
                                 via_regions=ours.regions, codec="fp32", system="flower",
                                 flower_python=py, secure=False))
        else:
            raise SystemExit(f"fedwan bench: unknown baseline '{b}' (flat-fp32, flower, none)")
    return specs


def profile_from(args: argparse.Namespace) -> profiles.Profile:
    base = profiles.named(args.profile) if args.profile != "custom" else None
    return profiles.custom(base, rate_mbit=args.rate_mbit, delay_ms=args.delay_ms,
                           jitter_ms=args.jitter_ms, loss_percent=args.loss_percent,
                           site_rate_mbit=args.site_rate_mbit, site_delay_ms=args.site_delay_ms)


SWEEP_KEYS = {"rate-mbit": ("rate_mbit", float), "delay-ms": ("delay_ms", float),
              "tcp-congestion": ("tcp_congestion", str),
              "codec": ("codec", str), "inner-steps": ("inner_steps", int),
              "overlap-steps": ("overlap_steps", int),
              "streams": ("streams", federation.parse_streams),
              "params": ("params", parse_count), "sites-per-region": ("sites_per_region", int)}


def sweep_from(args: argparse.Namespace) -> tuple[str, list] | None:
    if not args.sweep:
        return None
    key, _, values = args.sweep.partition("=")
    if key not in SWEEP_KEYS or not values:
        raise SystemExit(f"fedwan bench: --sweep KEY=V1,V2,...: KEY is one of "
                         f"{', '.join(SWEEP_KEYS)}")
    attr, kind = SWEEP_KEYS[key]
    if attr == "overlap_steps" and args.modes:
        raise SystemExit(f"fedwan bench: --sweep {args.sweep} sets each run's mode (0: "
                         f"blocking); drop --modes {args.modes}")
    try:
        return attr, [kind(v) for v in values.split(",")]
    except (ValueError, argparse.ArgumentTypeError) as e:
        raise SystemExit(f"fedwan bench: --sweep {args.sweep}: {e}")


def plan_from(args: argparse.Namespace) -> tuple[list, tuple[str, list] | None]:
    """Every run of the invocation, [(sweep value, spec, profile)], and the
    sweep; checks every sweep point before anything starts."""
    sweep = sweep_from(args)
    plan = []
    for value in [None] if sweep is None else sweep[1]:
        if sweep is not None:
            setattr(args, sweep[0], value)
        try:
            try:
                profile = profile_from(args)
            except ValueError as e:
                raise SystemExit(f"fedwan bench: {e}") from None
            specs = specs_from(args)
        except SystemExit as e:
            if sweep is None:
                raise
            key = args.sweep.partition("=")[0]
            raise SystemExit(f"{e} (--sweep {args.sweep}, at {key}={value})") from None
        plan += [(value, spec, profile) for spec in specs]
    return plan, sweep


def cmd_run(args: argparse.Namespace) -> int:
    plan, sweep = plan_from(args)
    points: list = [None] if sweep is None else sweep[1]
    why = netns.unavailable_reason(tun=False)
    if why:
        print(f"fedwan bench: cannot run here: {why}", file=sys.stderr)
        return SKIP
    if args.kernel_sample_s < 0:
        raise SystemExit("fedwan bench: --kernel-sample-s: 0 (no kernel counters) or more")
    if args.kernel_sample_s and not shutil.which("ss"):
        print("fedwan bench: no kernel counters: iproute2's ss is not installed", flush=True)
        args.kernel_sample_s = 0
    shaper = netem.pick(args.shaper)
    why = shaper == "linkemu" and netns.unavailable_reason(tun=True)
    if shaper is None or why:
        if why:
            print(f"fedwan bench: cannot run here: {why}", file=sys.stderr)
        return SKIP
    fedwan = _tool("fedwan", args.fedwan)
    linkemu = _tool("fedwan-linkemu", args.linkemu) if shaper == "linkemu" else ""
    os.makedirs(args.out, exist_ok=True)
    runs: list = []
    failures: list = []
    for value, spec, profile in plan:
        tag = spec.name if value is None else f"{spec.name}-{value}"
        work = os.path.join(args.out, tag)
        print(f"fedwan bench: {tag}: {spec.site_count()} sites ({spec.tree()}), {spec.codec}, "
              f"{spec.params:,} parameters, {spec.rounds} {spec.mode} rounds of "
              f"H={spec.inner_steps}{federation.streams_suffix(spec.streams)} over "
              f"{profile.name} ({profile.root_link.describe()}) ...",
              flush=True)
        t = time.monotonic()
        try:
            raw = federation.run(spec, profile, fedwan, linkemu, work, timeout=args.timeout,
                                 kernel_period=args.kernel_sample_s, shaper=shaper)
        except (federation.NodeFailed, TimeoutError) as e:
            # The other runs still count: the failure is a result too (a
            # baseline that runs out of memory, say).
            print(f"fedwan bench: {tag}: FAILED: {e}", flush=True)
            failures.append({"name": spec.name, "mode": spec.mode, "sweep_value": value,
                             "error": str(e), "usage": getattr(e, "usage", None)})
            continue
        with open(os.path.join(work, "raw.json"), "w") as f:
            json.dump(raw, f)  # everything measured, for analysis beyond the summary
        summary = metrics.summarise(raw)
        summary["sweep_value"] = value
        runs.append(summary)
        print(f"fedwan bench: {tag}: done in {time.monotonic() - t:.1f} s; "
              f"median round {summary['round_s_median']:.3f} s", flush=True)
    if not runs:
        print("fedwan bench: no run finished", file=sys.stderr)
        return 1
    doc = {"tool": "fedwan bench", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "shaping": runs[0]["shaping"], "runs": runs,
           "failed": failures,
           "comparisons": report.comparisons([r for r in runs if r["sweep_value"] == points[0]])}
    if sweep is not None:
        doc["sweep"] = {"key": sweep[0], "values": points}
    json_path, md_path = report.write(doc, args.out)
    with open(md_path) as f:
        print(f.read())
    print(f"fedwan bench: wrote {json_path} and {md_path}")
    status = 1 if failures else 0
    if not args.no_plots:
        try:
            from . import plots
            for path in plots.write(doc, args.out):
                print(f"fedwan bench: wrote {path}")
        except ImportError:
            print("fedwan bench: no plots: matplotlib is not installed "
                  "(apt-get install python3-matplotlib)")
    return status


def cmd_profiles(_: argparse.Namespace) -> int:
    for name, p in profiles.PROFILES.items():
        print(f"{name:17} root tier: {p.root_link.describe():38} site tier: {p.site_link.describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedwan bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run federations under emulated WAN links")
    add_run_flags(run)
    run.set_defaults(func=cmd_run)
    prof = sub.add_parser("profiles", help="list the WAN profiles")
    prof.set_defaults(func=cmd_profiles)
    streams.add_parser(sub)
    clean = sub.add_parser("clean", help="delete namespaces a killed run left behind")
    clean.set_defaults(func=lambda a: print("\n".join(netns.sweep("fwb-")) or "nothing to clean") or 0)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
