#!/usr/bin/env python3
"""scripts/gpu_check.py against fake programs in a fake bundle, so that what it reports on a
GPU machine (passed, failed, skipped with the reason, a hang, a library that does not load, a
bundle built for another LibTorch) is checked on a machine without one.

usage: test_gpu_check.py SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

FAKE_GTEST = textwrap.dedent('''\
    #!/usr/bin/env python3
    # A gtest program: behaviour from FAKE_<NAME> = pass|fail|skip|hang|crash.
    import json, os, sys, time
    mode = os.environ.get("FAKE_" + os.path.basename(sys.argv[0]).upper(), "pass")
    out = next(a.split(":", 1)[1] for a in sys.argv if a.startswith("--gtest_output=json:"))
    if mode == "hang":
        time.sleep(600)
    if mode == "crash":
        sys.exit(-11)
    tests = []
    for i, result in enumerate(["pass", mode, "skip"]):
        t = {"name": f"T{i}", "status": "RUN", "result": "COMPLETED"}
        if result == "fail":
            t["failures"] = [{"failure": "expected equality"}]
            print(f"[  FAILED  ] Suite.T{i}")
        elif result == "skip":
            t["result"] = "SKIPPED"
            print("x.cpp:1: Skipped")
            print("needs 1 CUDA device(s), found 0")
            print(f"[  SKIPPED ] Suite.T{i}")
        tests.append(t)
    json.dump({"testsuites": [{"name": "Suite", "testsuite": tests}]}, open(out, "w"))
    sys.exit(1 if mode == "fail" else 0)
''')

FAKE_BENCH = textwrap.dedent('''\
    #!/usr/bin/env python3
    import os, sys
    mode = os.environ.get("FAKE_" + os.path.basename(sys.argv[0]).upper(), "pass")
    if mode == "skip":
        print("skipped: no CUDA device on this machine")
    elif mode == "fail":
        sys.exit(3)
    else:
        print("codec ef chunk_MiB\\nfp16 no 1 2.00")
''')


def make_bundle(root, torch_version="2.11.0+cu130"):
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "lib"))
    for name, text in (("fedwan_cuda_tests", FAKE_GTEST), ("fedwan_torch_tests", FAKE_GTEST),
                       ("fedwan_gpu_bench_device_codec", FAKE_BENCH),
                       ("fedwan_gpu_bench_allreduce", FAKE_BENCH)):
        path = os.path.join(root, "bin", name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    with open(os.path.join(root, "MANIFEST"), "w") as f:
        f.write(f"commit=abc1234\ntorch_version={torch_version}\ncuda_version=13.0\n"
                "cuda_architectures=90\n")


def run_check(source, bundle, out, env_extra, *args):
    env = dict(os.environ)
    env.update(env_extra)
    p = subprocess.run([sys.executable, os.path.join(source, "scripts", "gpu_check.py"),
                        "--bundle", bundle, "--out", out] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=300)
    text = p.stdout.decode(errors="replace")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return p.returncode, text, summary, {s["step"]: s for s in summary["steps"]}


def main():
    source, work = sys.argv[1], os.path.abspath(sys.argv[2])
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    bundle = os.path.join(work, "bundle")
    # The bundle is made for the LibTorch of the Python that runs the check, if it has one.
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    python_torch = probe.stdout.decode().strip() if probe.returncode == 0 else None

    # Everything passes (apart from a skipped case each): exit 0, counts and reasons kept.
    make_bundle(bundle, python_torch or "2.11.0+cu130")
    out = os.path.join(work, "ok")
    code, text, summary, steps = run_check(source, bundle, out, {})
    expect(code == 0, f"all passing: exit {code}\n{text}")
    expect(steps["kernels"]["status"] == "passed", f"kernels: {steps['kernels']}")
    expect(steps["kernels"]["passed"] == 2 and steps["kernels"]["skipped"] == 1,
           f"kernels counts: {steps['kernels']}")
    expect(steps["kernels"]["skip_reasons"] == {"needs 1 CUDA device(s), found 0": 1},
           f"skip reason not taken from the output: {steps['kernels']}")
    expect(steps["codec"]["status"] == "passed", f"codec: {steps['codec']}")
    expect(steps["demo"]["status"] == "skipped", f"demo without fedwan: {steps['demo']}")
    expect(sorted(os.listdir(out)) == ["bench.log", "demo.log", "environment.log", "summary.json",
                                       "summary.md", "tests.log"],
           f"result files: {sorted(os.listdir(out))}")
    with open(os.path.join(out, "summary.md")) as f:
        md = f.read()
    expect("| kernels | passed |" in md and "commit abc1234" in md, f"summary.md:\n{md}")

    # --require-gpu on a machine without one fails, whatever the steps did.
    code, text, summary, _ = run_check(source, bundle, os.path.join(work, "nogpu"), {},
                                       "--require-gpu")
    has_gpu = summary["facts"]["gpu_count"] > 0
    expect(has_gpu or (code == 1 and any("no GPU" in p for p in summary["problems"])),
           f"--require-gpu without a GPU: exit {code} {summary['problems']}")

    # A failing test, a hanging test, a failing benchmark: each named, exit 1, later steps
    # still run within the budget.
    code, text, summary, steps = run_check(
        source, bundle, os.path.join(work, "bad"),
        {"FAKE_FEDWAN_CUDA_TESTS": "fail", "FAKE_FEDWAN_TORCH_TESTS": "hang",
         "FAKE_FEDWAN_GPU_BENCH_DEVICE_CODEC": "fail"}, "--budget-s", "120")
    expect(code == 1, f"failures: exit {code}")
    expect(steps["kernels"]["status"] == "failed" and "Suite.T1" in steps["kernels"]["detail"],
           f"failed test not named: {steps['kernels']}")
    expect(steps["training"]["status"] == "failed" and "did not finish" in
           steps["training"]["detail"], f"hang: {steps['training']}")
    expect(steps["codec"]["status"] == "failed", f"bench failure: {steps['codec']}")
    expect(steps["allreduce"]["status"] in ("passed", "skipped"),
           f"the step after a hang: {steps['allreduce']}")

    # A crash (no report written) is a failure, not a pass.
    code, _, _, steps = run_check(source, bundle, os.path.join(work, "crash"),
                                  {"FAKE_FEDWAN_CUDA_TESTS": "crash"})
    expect(code == 1 and steps["kernels"]["status"] == "failed",
           f"crash: exit {code} {steps['kernels']}")

    # Only skips: the step says skipped, with why.
    code, _, _, steps = run_check(source, bundle, os.path.join(work, "skips"),
                                  {"FAKE_FEDWAN_GPU_BENCH_DEVICE_CODEC": "skip"})
    if not has_gpu:
        expect(steps["codec"]["status"] == "skipped" and "no CUDA device" in
               steps["codec"]["detail"], f"bench skip: {steps['codec']}")

    # A bundle built for another LibTorch, where this Python has torch: refused.
    if python_torch:
        make_bundle(bundle, torch_version="0.1.0")
        code, _, summary, _ = run_check(source, bundle, os.path.join(work, "abi"), {})
        expect(code == 1 and any("built against LibTorch 0.1.0" in p
                                 for p in summary["problems"]),
               f"LibTorch mismatch: exit {code} {summary['problems']}")

    # A program whose library is missing: named, failed, not run.
    make_bundle(bundle, python_torch or "2.11.0+cu130")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        build = os.path.join(work, "cc")
        os.makedirs(build, exist_ok=True)
        with open(os.path.join(build, "stub.c"), "w") as f:
            f.write("int fedwan_nowhere(void) { return 0; }\n")
        with open(os.path.join(build, "main.c"), "w") as f:
            f.write("int fedwan_nowhere(void);\nint main(void) { return fedwan_nowhere(); }\n")
        lib = os.path.join(build, "libfedwan_nowhere.so.9")
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libfedwan_nowhere.so.9", "-o", lib,
                        os.path.join(build, "stub.c")], check=True)
        exe = os.path.join(bundle, "bin", "fedwan_gpu_bench_allreduce")
        subprocess.run([cc, "-o", exe, os.path.join(build, "main.c"), lib], check=True)
        os.remove(lib)
        code, _, _, steps = run_check(source, bundle, os.path.join(work, "libs"), {})
        expect(code == 1 and steps["allreduce"]["status"] == "failed" and
               "libfedwan_nowhere.so.9" in steps["allreduce"]["detail"],
               f"missing library: exit {code} {steps['allreduce']}")

    # Not a bundle: a clear error.
    p = subprocess.run([sys.executable, os.path.join(source, "scripts", "gpu_check.py"),
                        "--bundle", os.path.join(work, "nowhere")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expect(p.returncode == 2 and b"not a bundle" in p.stdout, f"no bundle: {p.stdout!r}")

    for f in failures:
        print("FAIL:", f)
    print("gpu_check test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
