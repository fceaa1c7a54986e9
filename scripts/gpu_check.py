#!/usr/bin/env python3
"""Runs every GPU test and benchmark of fedwan in one go and writes the results to files.

    scripts/gpu_check.py --bundle .gpu-bundle --out DIR --require-gpu   # on a GPU machine
    scripts/gpu_check.py --build-dir build --out DIR                    # anywhere else

Steps, in this order (each with its own time limit, all within --budget-s):

  kernels     fedwan_cuda_tests: the codec kernels against the CPU codecs bit for bit,
              the device update encoder, the NCCL engine and its router
  training    fedwan_torch_tests, GPU cases: DataParallel on the GPU, a site training on
              the GPU inside a federation (fp32 and int8)
  codec       fedwan_gpu_bench_device_codec: encoding kernels against the device's memcpy
  allreduce   fedwan_gpu_bench_allreduce: the NCCL engine and DataParallel against a
              plain ncclAllReduce of the same bytes
  demo        `fedwan demo --device cuda`: a federation whose sites train Fashion-MNIST on
              the GPU, its report checked (needs the dataset: bundled, or --data)
  cores       benchmarks/python/crypto_threads.py on a machine of CORES_FROM cores or
              more: the data path at 100M parameters (a root and two sites, mutual TLS,
              the audit log) with its crypto threads off and at their default, each of
              the root's threads' CPU a round and the round time, set against the 0.32 s
              a 10 Gbit/s link (the bench harness's `lan` profile) takes to carry a
              site's update up and its anchor down

A step is `passed`, `failed` or `skipped` with the reason (no GPU, no LibTorch with CUDA,
a bundle built for another LibTorch, out of time). Without a GPU every step still runs as
far as it can: the tests that need none pass, the rest report why they skipped. The exit
status is 1 when a step failed (or, with --require-gpu, when no GPU was found), else 0.

Files written to --out (at most 8, flat, so that they come back from a remote machine):
summary.md, summary.json, environment.log, tests.log, bench.log, demo.log.
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The test filter of the GPU cases of the torch-facing suite.
TRAINING_FILTER = "CudaTraining.*:*GpuSiteCodec*"

# The least time a step is started with.
MIN_STEP_S = 15

# The cores step measures a machine with a core for each node's busy threads.
CORES_FROM = 8

# name -> (seconds it may take at most, what it is), in the order they run
STEPS = {
    "kernels": (150, "codec kernels vs CPU codecs, device update encoder, NCCL engine"),
    "training": (200, "DataParallel and a federated site training on the GPU"),
    "codec": (100, "device codec benchmark"),
    "allreduce": (120, "bucketed allreduce benchmark"),
    "demo": (200, "fedwan demo --device cuda (Fashion-MNIST)"),
    "cores": (240, "the data path at 100M on this machine's cores, crypto threads off and on"),
}


class Layout:
    """Where the programs are: a bundle (bin/, lib/, MANIFEST) or a build tree."""

    def __init__(self, bundle, build_dir):
        self.bundle = bundle
        self.manifest = {}
        if bundle:
            self.bin = {
                "cuda_tests": os.path.join(bundle, "bin", "fedwan_cuda_tests"),
                "torch_tests": os.path.join(bundle, "bin", "fedwan_torch_tests"),
                "bench_codec": os.path.join(bundle, "bin", "fedwan_gpu_bench_device_codec"),
                "bench_allreduce": os.path.join(bundle, "bin", "fedwan_gpu_bench_allreduce"),
                "fedwan": os.path.join(bundle, "bin", "fedwan"),
            }
            path = os.path.join(bundle, "MANIFEST")
            if os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        if "=" in line:
                            k, v = line.rstrip("\n").split("=", 1)
                            self.manifest[k] = v
            self.data = os.path.join(bundle, "data", "fashion-mnist")
        else:
            self.bin = {
                "cuda_tests": os.path.join(build_dir, "tests", "fedwan_cuda_tests"),
                "torch_tests": os.path.join(build_dir, "tests", "fedwan_torch_tests"),
                "bench_codec": os.path.join(build_dir, "benchmarks", "fedwan_gpu_bench_device_codec"),
                "bench_allreduce": os.path.join(build_dir, "benchmarks", "fedwan_gpu_bench_allreduce"),
                "fedwan": os.path.join(build_dir, "bin", "fedwan"),
            }
            self.data = "/usr/share/datasets/fashion-mnist"

    def have(self, key):
        return os.access(self.bin[key], os.X_OK)


def run(cmd, timeout, env, log, cwd=None):
    """Runs cmd, appending its output to log; returns (exit status or None on timeout, output)."""
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           timeout=timeout, cwd=cwd)
        out = p.stdout.decode(errors="replace")
        code = p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        code = None
    except OSError as e:
        out = f"cannot run: {e}\n"
        code = 127
    log.write(out)
    log.write(f"[exit {code if code is not None else f'timeout after {timeout:.0f} s'}]\n")
    log.flush()
    return code, out


def version_tuple(text):
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def python_torch(env):
    """The python3 on PATH's torch: (version, its lib dir, CUDA devices it sees), or Nones."""
    code = ("import os, torch; print(torch.__version__); "
            "print(os.path.join(os.path.dirname(torch.__file__), 'lib')); "
            "print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    try:
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None, None, 0
    lines = p.stdout.decode().split()
    if p.returncode != 0 or len(lines) != 3:
        return None, None, 0
    return lines[0], lines[1], int(lines[2])


def nvidia_smi(log):
    exe = shutil.which("nvidia-smi")
    if not exe:
        log.write("nvidia-smi: not on PATH\n")
        return []
    code, out = run([exe, "--query-gpu=name,driver_version,memory.total",
                     "--format=csv,noheader"], 30, os.environ, log)
    if code != 0:
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def library_path(layout, torch_lib):
    """LD_LIBRARY_PATH for a bundle: its own libraries, then LibTorch's and the CUDA wheels'."""
    dirs = [os.path.join(layout.bundle, "lib")]
    if torch_lib:
        dirs.append(torch_lib)
        site = os.path.dirname(os.path.dirname(torch_lib))
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib")))
    for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib"):
        if os.path.isdir(d):
            dirs.append(d)
    old = os.environ.get("LD_LIBRARY_PATH")
    return ":".join(dirs + ([old] if old else []))


def missing_libraries(exe, env):
    try:
        p = subprocess.run(["ldd", exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=env, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.split()[0] for line in p.stdout.decode(errors="replace").splitlines()
                   if "not found" in line})


def skip_messages(output):
    """GTEST_SKIP() messages in a gtest program's output, in order (the JSON report of older
    GoogleTest releases leaves them out): the line after "<file>:<line>: Skipped"."""
    lines = output.splitlines()
    return [lines[i + 1].strip() for i, line in enumerate(lines[:-1])
            if line.endswith(": Skipped") and not lines[i + 1].startswith("[")]


def gtest_counts(json_path, output):
    """(passed, failed, skipped, names of failed, skip reasons) from a gtest JSON report."""
    printed = iter(skip_messages(output))
    try:
        with open(json_path) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    passed = failed = skipped = 0
    failed_names, reasons = [], {}
    for suite in r.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite.get('name')}.{t.get('name')}"
            if t.get("failures"):
                failed += 1
                failed_names.append(name)
            elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                skipped += 1
                msg = " ".join(x.get("message", "") for x in t.get("skipped", []) or [])
                # gtest puts the GTEST_SKIP() message after the location line.
                msg = msg.strip().splitlines()[-1] if msg.strip() else next(printed, "")
                msg = msg or "skipped without a message"
                reasons[msg] = reasons.get(msg, 0) + 1
            else:
                passed += 1
    return passed, failed, skipped, failed_names, reasons


class Check:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        self.results = []
        self.logs = {name: open(os.path.join(self.out, name), "w")
                     for name in ("environment.log", "tests.log", "bench.log", "demo.log")}
        self.tmp = tempfile.mkdtemp(prefix="fedwan-gpu-check-")
        self.cores = len(os.sched_getaffinity(0))
        # The steps this machine runs, which the budget is shared among.
        self.steps = [s for s in STEPS if s != "cores" or self.cores >= CORES_FROM]

    def left(self):
        return self.deadline - time.monotonic()

    def record(self, step, status, seconds, detail, **extra):
        r = {"step": step, "what": STEPS[step][1], "status": status,
             "seconds": round(seconds, 1), "detail": detail}
        r.update(extra)
        self.results.append(r)
        print(f"gpu-check: {step:<10} {status:<8} {seconds:6.1f} s  {detail}", flush=True)

    def limit(self, step):
        """Seconds the step may take, or None when too little of the budget is left: a step
        that hangs leaves each later step MIN_STEP_S of the budget."""
        later = self.steps[self.steps.index(step) + 1:]
        limit = min(STEPS[step][0], self.left() - (MIN_STEP_S + 5) * len(later))
        return limit if limit >= MIN_STEP_S else None

    def ready(self, step, exe_key):
        """(program, seconds it may take) for a step that can run; else records why not."""
        exe = self.layout.bin[exe_key]
        if not self.layout.have(exe_key):
            self.record(step, "skipped", 0, f"{os.path.relpath(exe)} was not built")
            return None
        if self.missing.get(exe_key):
            self.record(step, "failed", 0, "libraries not found: " + ", ".join(self.missing[exe_key]))
            return None
        limit = self.limit(step)
        if limit is None:
            self.record(step, "skipped", 0, "the time budget is spent")
            return None
        return exe, limit

    def gtest_step(self, step, exe_key, extra_args):
        ready = self.ready(step, exe_key)
        if ready is None:
            return
        exe, limit = ready
        report = os.path.join(self.tmp, f"{step}.json")
        t0 = time.monotonic()
        code, out = run([exe, f"--gtest_output=json:{report}"] + extra_args, limit, self.env,
                        self.logs["tests.log"])
        took = time.monotonic() - t0
        counts = gtest_counts(report, out)
        if code is None:
            self.record(step, "failed", took, f"did not finish within {limit:.0f} s")
            return
        if counts is None:
            self.record(step, "failed", took, f"exit {code} and no test report (see tests.log)")
            return
        passed, failed, skipped, failed_names, reasons = counts
        why = "; ".join(f"{n} skipped: {m}" for m, n in sorted(reasons.items()))
        detail = f"{passed} passed, {failed} failed, {skipped} skipped" + (f" ({why})" if why else "")
        if failed or code != 0:
            status = "failed"
            if failed_names:
                detail += "; failed: " + ", ".join(failed_names)
        elif passed == 0 and skipped:
            status = "skipped"
        else:
            status = "passed"
        self.record(step, status, took, detail, passed=passed, failed=failed, skipped=skipped,
                    skip_reasons=reasons, failed_tests=failed_names)

    def bench_step(self, step, exe_key, extra_args):
        ready = self.ready(step, exe_key)
        if ready is None:
            return
        exe, limit = ready
        t0 = time.monotonic()
        code, out = run([exe] + extra_args, limit, self.env, self.logs["bench.log"])
        took = time.monotonic() - t0
        skipped = [line for line in out.splitlines() if "skipped:" in line]
        if code is None:
            self.record(step, "failed", took, f"did not finish within {limit:.0f} s")
        elif code != 0:
            self.record(step, "failed", took, f"exit {code} (see bench.log)")
        elif skipped and not self.gpus:
            self.record(step, "skipped", took, skipped[0].split("skipped:", 1)[1].strip())
        else:
            self.record(step, "passed", took, "figures in bench.log", output=out.splitlines())

    def demo_step(self):
        step = "demo"
        if not self.layout.have("fedwan"):
            self.record(step, "skipped", 0, "the fedwan program was not built")
            return
        if self.missing.get("fedwan"):
            self.record(step, "failed", 0, "libraries not found: " + ", ".join(self.missing["fedwan"]))
            return
        if not self.gpus:
            self.record(step, "skipped", 0, "no CUDA device on this machine")
            return
        data = self.args.data or self.layout.data
        if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
            self.record(step, "skipped", 0, f"no Fashion-MNIST in {data} (bundle it or pass --data)")
            return
        limit = self.limit(step)
        if limit is None:
            self.record(step, "skipped", 0, "the time budget is spent")
            return
        work = os.path.join(self.tmp, "demo")
        cmd = [sys.executable, os.path.join(ROOT, "tests", "integration", "check_demo_report.py"),
               self.layout.bin["fedwan"], work, "--require-improvement", "--",
               "--device", "cuda", "--data", data, "--rounds", "3", "--inner-steps", "20",
               "--force"]
        t0 = time.monotonic()
        code, out = run(cmd, limit, self.env, self.logs["demo.log"])
        took = time.monotonic() - t0
        report = {}
        try:
            with open(os.path.join(work, "report.json")) as f:
                report = json.load(f)
        except (OSError, ValueError):
            pass
        figures = {k: report.get(k) for k in ("final_accuracy", "baseline_accuracy",
                                              "wan_bytes_total", "federation_seconds")
                   if k in report}
        device = report.get("configuration", {}).get("device")
        if code is None:
            self.record(step, "failed", took, f"did not finish within {limit:.0f} s", **figures)
        elif code != 0:
            self.record(step, "failed", took, f"exit {code} (see demo.log)", **figures)
        elif device != "cuda":
            self.record(step, "failed", took, f"the sites trained on {device}, not cuda",
                        **figures)
        else:
            detail = ", ".join(f"{k} {v}" for k, v in figures.items())
            self.record(step, "passed", took, detail, **figures)

    def cores_step(self):
        step = "cores"
        cores = self.cores
        if step not in self.steps:
            self.record(step, "skipped", 0, f"{cores} cores here; it measures {CORES_FROM} or more")
            return
        if not self.layout.have("fedwan") or self.missing.get("fedwan"):
            self.record(step, "skipped", 0, "the fedwan program was not built, or cannot load")
            return
        limit = self.limit(step)
        if limit is None:
            self.record(step, "skipped", 0, "the time budget is spent")
            return
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "python", "crypto_threads.py"),
               "--fedwan", self.layout.bin["fedwan"], "--threads", "auto", "--audit-log",
               "--short", "3", "--long", "9", "--repeats", "3",
               "--workdir", os.path.join(self.tmp, "cores")]
        t0 = time.monotonic()
        code, out = run(cmd, limit, self.env, self.logs["bench.log"])
        took = time.monotonic() - t0
        if code is None:
            self.record(step, "failed", took, f"did not finish within {limit:.0f} s")
        elif code != 0:
            self.record(step, "failed", took, f"exit {code} (see bench.log)")
        else:
            self.record(step, "passed", took, f"{cores} cores; figures in bench.log",
                        output=out.splitlines())

    def environment(self):
        log = self.logs["environment.log"]
        self.env = dict(os.environ)
        self.env.setdefault("FEDWAN_LOG_LEVEL", "warn")
        gpus_smi = nvidia_smi(log)
        torch_version, torch_lib, torch_gpus = python_torch(self.env)
        self.layout = Layout(self.args.bundle, self.args.build_dir)
        if self.layout.bundle:
            self.env["LD_LIBRARY_PATH"] = library_path(self.layout, torch_lib)
        self.missing = {k: missing_libraries(exe, self.env)
                        for k, exe in self.layout.bin.items() if self.layout.have(k)}
        self.gpus = max(len(gpus_smi), torch_gpus)
        self.facts = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": os.uname().nodename,
            "gpus": gpus_smi,
            "gpu_count": self.gpus,
            "python_torch": torch_version,
            "layout": self.args.bundle or self.args.build_dir,
            "bundle": self.layout.manifest,
        }
        for k, v in self.facts.items():
            log.write(f"{k}: {v}\n")
        for k, libs in self.missing.items():
            if libs:
                log.write(f"{k}: libraries not found: {', '.join(libs)}\n")
        log.flush()
        self.problems_found = []
        built_glibc = self.layout.manifest.get("glibc")
        here_glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1] if hasattr(os, "confstr") \
            else None
        log.write(f"glibc here: {here_glibc}\n")
        if built_glibc and here_glibc and version_tuple(here_glibc) < version_tuple(built_glibc):
            self.problems_found.append(
                f"the bundle was built with glibc {built_glibc}, this machine has {here_glibc}: "
                "its programs need a C library at least as new as the one they were built with")
        built_for = self.layout.manifest.get("torch_version")
        if built_for and torch_version and built_for.split("+")[0] != torch_version.split("+")[0]:
            # Another LibTorch's C++ ABI: the torch-facing programs cannot load.
            self.mismatch = (f"the bundle was built against LibTorch {built_for}, this machine has "
                             f"{torch_version}: build it with FEDWAN_GPU_TORCH_SPEC=torch=="
                             f"{torch_version.split('+')[0]}")
        else:
            self.mismatch = None
        print(f"gpu-check: {self.gpus} GPU(s) {gpus_smi}; python's torch {torch_version}; "
              f"programs from {self.facts['layout']}", flush=True)

    def main(self):
        self.environment()
        if self.mismatch:
            print(f"gpu-check: warning: {self.mismatch}", flush=True)
        self.gtest_step("kernels", "cuda_tests", [])
        self.gtest_step("training", "torch_tests", [f"--gtest_filter={TRAINING_FILTER}"])
        self.bench_step("codec", "bench_codec", ["--reps", "30"])
        self.bench_step("allreduce", "bench_allreduce", ["--iters", "20", "--warmup", "5"])
        self.demo_step()
        self.cores_step()
        return self.finish()

    def finish(self):
        for f in self.logs.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        failed = [r["step"] for r in self.results if r["status"] == "failed"]
        problems = []
        if self.args.require_gpu and not self.gpus:
            problems.append("no GPU found, and --require-gpu was given")
        if self.mismatch:
            problems.append(self.mismatch)
        problems += self.problems_found
        verdict = "failed" if failed or problems else "passed"
        summary = {"verdict": verdict, "problems": problems, "facts": self.facts,
                   "steps": self.results}
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write(f"# fedwan GPU check: {verdict}\n\n")
            f.write(f"- {self.facts['date']} on {self.facts['host']}\n")
            f.write(f"- GPUs: {self.facts['gpu_count']} {'; '.join(self.facts['gpus'])}\n")
            f.write(f"- python's torch: {self.facts['python_torch']}\n")
            if self.layout.manifest:
                m = self.layout.manifest
                f.write(f"- bundle: commit {m.get('commit')}, LibTorch {m.get('torch_version')}, "
                        f"CUDA {m.get('cuda_version')}, architectures {m.get('cuda_architectures')}\n")
            for p in problems:
                f.write(f"- problem: {p}\n")
            f.write("\n| step | status | seconds | detail |\n| --- | --- | --- | --- |\n")
            for r in self.results:
                f.write(f"| {r['step']} | {r['status']} | {r['seconds']} | {r['detail']} |\n")
            for r in self.results:
                if r.get("output"):
                    f.write(f"\n## {r['step']}\n\n```\n" + "\n".join(r["output"]) + "\n```\n")
        skipped = [r["step"] for r in self.results if r["status"] == "skipped"]
        print(f"gpu-check: {verdict}; failed: {', '.join(failed) or 'none'}; "
              f"skipped: {', '.join(skipped) or 'none'}; results in {self.out}", flush=True)
        for p in problems:
            print(f"gpu-check: {p}", flush=True)
        return 1 if verdict == "failed" else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--bundle", help="a bundle made by scripts/gpu_bundle.sh")
    where.add_argument("--build-dir", help="a build tree (default: build)")
    p.add_argument("--out", default="gpu-check", help="where the result files go")
    p.add_argument("--budget-s", type=float, default=450,
                   help="seconds for all steps together (default 450)")
    p.add_argument("--require-gpu", action="store_true",
                   help="fail when no GPU is found (on the machine meant to have one)")
    p.add_argument("--data", help="Fashion-MNIST directory for the demo step")
    args = p.parse_args()
    if not args.bundle and not args.build_dir:
        args.build_dir = os.path.join(ROOT, "build")
    if args.bundle:
        args.bundle = os.path.abspath(args.bundle)
        if not os.path.isdir(os.path.join(args.bundle, "bin")):
            print(f"gpu-check: {args.bundle} is not a bundle (make one with scripts/gpu_bundle.sh)",
                  file=sys.stderr)
            return 2
    else:
        args.build_dir = os.path.abspath(args.build_dir)
        if not os.path.isdir(args.build_dir):
            print(f"gpu-check: no build tree at {args.build_dir}", file=sys.stderr)
            return 2
    return Check(args).main()


if __name__ == "__main__":
    sys.exit(main())
