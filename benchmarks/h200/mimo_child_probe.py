"""Where does a measuring process lose time that a probe does not? (MIMO N64 P128's `chunk_values_kernel`.)

`tuner verify` measured N64 P128's best at 1845–1865 µs of `chunk_values_kernel` in fresh measuring processes,
while `mimo_probe.py` (its own build, inputs and the tuner's timer, even after ``child.fresh_case``) times the
same config at 1683–1693 µs (benchmarks/h200/mamba3_mimo_bwd.md). This probe bisects the measuring path in
one process, same config, same seed, 30 samples each, per-kernel medians:

  probe      template.build, make_inputs, allocate_outputs, the backend's time_by_kernel (mimo_probe's path)
  child      tuner.measure.child.prepare (build, checks on the input sets as `tuner verify` asks them:
             VERIFY_NEAR_BOUND, up to 8 more sets near a bound) then child.time_together, in this process
  child-1    the same with no near-bound sets (one checked set)
  measurer   a real Measurer (a fresh measuring child process, as `tuner verify` starts), VERIFY_NEAR_BOUND
  spawned    this script again (steps probe, child), in a process started as the Measurer starts its worker
             (a new session, stdin a pipe, output to a file, the parent's import path); spawned-bf: the same
             with --backend-first; the steps a spawned process runs are --spawn-order's (default probe,child)
  handler    the measuring worker's own request handler (tuner.measure.child.measure) called in this process
             with the request a Measurer sends (template by its reference, shape and config through JSON,
             VERIFY_NEAR_BOUND): everything the worker does except its process and its frame loop
  ref        only the template's reference on fresh inputs (torch, autograd, cuBLAS), nothing timed; matmul: one
             bf16 matmul (cuBLAS's first use); alloc: 4 GiB allocated and freed (these three give no row)
  hold=MiB   allocate that much and keep it to the end (no row): what a cuBLAS workspace does to later addresses
  cfg        a row whose total is the context's cache config (cuCtxGetCacheConfig: 0 none, 1 shared, 2 L1,
             3 equal) and its stack size limit (cuCtxGetLimit); cache=N and stack=BYTES set them
  ctx+       start another process that opens a CUDA context on the device, holds --idle-gib GiB there and
             idles (ctx-: stop it), so that the steps after it run beside a second context, as a measuring
             child runs beside its parent

--backend-first opens the device (the timer's backend: a CUDA context and the flush buffer) before the template
is imported, in the order a measuring child process does it.

usage (GPU machine, bundle --tilelang mamba): python benchmarks/h200/mimo_child_probe.py --workload
mimo-n64-p128-r4 --config '{...}' [--order probe,child,child-1,measurer,probe] [--backend-first] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _medians(kernels: dict[str, float] | dict[str, list[float]]) -> dict[str, float]:
    return {k.split("(")[0][:32]: round(v if isinstance(v, float) else statistics.median(v), 1)
            for k, v in kernels.items()}


def _spawned(args: argparse.Namespace, step: str) -> list[dict[str, object]]:
    """This script's steps probe and child in a process started as tuner.measure.pool.WorkerProcess starts a
    measuring worker; its rows, named after ``step``."""
    from tuner.measure.measurer import _child_pythonpath

    env = dict(os.environ)
    env["PYTHONPATH"] = _child_pythonpath(env.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as log:
        out = os.path.join(tmp, "rows.json")
        argv = [sys.executable, os.path.abspath(__file__), "--workload", args.workload, "--config", args.config,
                "--order", args.spawn_order, "--samples", str(args.samples), "--seed", str(args.seed), "--json", out]
        proc = subprocess.Popen(argv + (["--backend-first"] if step == "spawned-bf" else []), stdin=subprocess.PIPE,
                                stdout=log, stderr=log, env=env, start_new_session=True)
        proc.communicate(timeout=600)
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(f"{step}: exit {proc.returncode}: {log.read()[-2000:].decode(errors='replace')}")
        with open(out) as f:
            found = json.load(f)["rows"]
    for row in found:
        row["step"] = f"{step}:{row['step']}"
        print(json.dumps(row), flush=True)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--order", default="probe,child,child-1,measurer,probe")
    ap.add_argument("--spawn-order", default="probe,child", help="the steps of spawned and spawned-bf")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--backend-first", action="store_true")
    ap.add_argument("--idle-gib", type=float, default=0.0, help="what ctx+'s process holds on the device (GiB)")
    args = ap.parse_args()

    import torch

    from tuner.measure.devices.cuda import backend_from_env

    early = backend_from_env(0) if args.backend_first else None

    from tuner import registry
    from tuner.driver.study import VERIFY_NEAR_BOUND
    from tuner.frozen import Config
    from tuner.measure import child
    from tuner.measure.devices.base import DeviceSpec
    from tuner.measure.measurer import Candidate, MeasureOptions, Measurer

    template = registry.get("mamba3_mimo_bwd")
    shape = template.workload(args.workload)
    space = template.space()
    config = Config(space.validate_config({**space.default.to_dict(), **json.loads(args.config)}).to_dict())
    backend = early if early is not None else backend_from_env(0)
    rows = []
    idle: subprocess.Popen[bytes] | None = None
    held_mib: list[torch.Tensor] = []
    for step in args.order.split(","):
        started = time.perf_counter()
        if step == "ctx+":
            idle = subprocess.Popen([sys.executable, "-c", "import sys, time, torch; x = torch.ones("
                                     f"{max(1, int(args.idle_gib * 2**28))}, device='cuda');"
                                     " torch.cuda.synchronize(); print('ready', flush=True); time.sleep(900)"],
                                    stdout=subprocess.PIPE)
            assert idle.stdout is not None and idle.stdout.readline().strip() == b"ready"
            print("another process holds a CUDA context now", flush=True)
            continue
        if step == "ctx-":
            if idle is not None:
                idle.kill()
                idle.wait()
                idle = None
            print("the other process is gone", flush=True)
            continue
        if step == "cfg" or step.startswith(("cache=", "stack=")):
            import ctypes

            libcuda = ctypes.CDLL("libcuda.so.1")
            if step.startswith("cache="):
                code = libcuda.cuCtxSetCacheConfig(ctypes.c_int(int(step.split("=")[1])))
                if code:
                    raise SystemExit(f"{step}: cuCtxSetCacheConfig returned {code}")
                continue
            if step.startswith("stack="):  # CU_LIMIT_STACK_SIZE, bytes per thread
                code = libcuda.cuCtxSetLimit(ctypes.c_int(0), ctypes.c_size_t(int(step.split("=")[1])))
                if code:
                    raise SystemExit(f"{step}: cuCtxSetLimit returned {code}")
                continue
            value, stack = ctypes.c_int(-1), ctypes.c_size_t(0)
            code = libcuda.cuCtxGetCacheConfig(ctypes.byref(value)) or libcuda.cuCtxGetLimit(ctypes.byref(stack),
                                                                                             ctypes.c_int(0))
            row = {"step": f"cfg={value.value} stack={stack.value}" if code == 0 else f"cfg error {code}",
                   "total_us": float(value.value), "kernels": {}, "wall_s": 0.0}
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        if step.startswith("hold="):  # MiB allocated and kept to the end: later allocations land elsewhere
            held_mib.append(torch.empty(int(float(step.split("=")[1]) * 2**20), dtype=torch.uint8, device="cuda"))
            continue
        if step in ("ref", "matmul", "alloc"):
            if step == "ref":
                inputs = template.make_inputs(shape, "cuda", args.seed)
                template.reference(shape, inputs)
                del inputs
            elif step == "matmul":
                a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
                (a @ a).sum().item()
                del a
            else:
                held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
                del held
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            print(f"{step} done", flush=True)
            continue
        if step in ("spawned", "spawned-bf"):
            rows += _spawned(args, step)
            continue
        if step == "probe":
            kernel = template.build(config, shape)
            inputs = template.make_inputs(shape, "cuda", args.seed)
            outputs = template.allocate_outputs(shape, inputs)
            kernel(inputs, outputs)
            torch.cuda.synchronize()
            timing = backend.time_by_kernel([lambda k=kernel, i=inputs, o=outputs: k(i, o)],
                                            n_samples=args.samples, warmup=10)
            total, kernels = statistics.median(timing.samples[0]), _medians(timing.kernels[0])
            del kernel, inputs, outputs
        elif step in ("child", "child-1"):
            options = MeasureOptions(n_samples=args.samples, check_seeds=1,
                                     near_bound=VERIFY_NEAR_BOUND if step == "child" else None)
            runnable = child.prepare(template, shape, Candidate(config=config), backend, args.seed, options)
            if not isinstance(runnable, child.Runnable):
                raise SystemExit(f"{step}: {runnable.status.value} {runnable.reason}")
            timed = child.time_together(backend, [(0, runnable)], options)
            result = timed.results[0][1]
            total, kernels = result.median_us, _medians(result.kernels)
            del runnable, timed
        elif step == "handler":
            from tuner.measure.protocol import Done, MeasureRequest, WireCandidate

            options = MeasureOptions(n_samples=args.samples, near_bound=VERIFY_NEAR_BOUND)
            request = MeasureRequest(registry.ref_of(template.name), shape.to_json(),
                                     (WireCandidate.of(Candidate(config=config)),), args.seed, options)
            done = [r for r in child.measure(backend, request) if isinstance(r, Done)]
            if not done or not done[-1].results:
                raise SystemExit(f"{step}: no result: {done}")
            result = done[-1].results[0][1]
            total, kernels = result.median_us, _medians(result.kernels)
            del request, done
        elif step == "measurer":
            options = MeasureOptions(n_samples=args.samples, timeout_s=240)
            with Measurer(DeviceSpec(kind="cuda"), options) as measurer:
                result = measurer.measure(registry.ref_of(template.name), shape, Candidate(config=config),
                                          seed=args.seed, near_bound=VERIFY_NEAR_BOUND)
            total, kernels = result.median_us, _medians(result.kernels)
        else:
            raise SystemExit(f"unknown step {step}")
        torch.cuda.empty_cache()
        beside = f" (2 contexts, {args.idle_gib:g} GiB)" if idle is not None else ""
        row = {"step": step + beside, "total_us": total, "kernels": kernels,
               "wall_s": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if idle is not None:
        idle.kill()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload, "config": config.to_dict(), "rows": rows}, f, indent=2)
    print(f"\n{'step':30} {'total µs':>10} {'chunk_values':>13} {'chunk_qk':>9} {'state_walk':>11}")
    for r in rows:
        k = r["kernels"]
        print(f"{r['step']:30} {r['total_us']:10.1f} {k.get('chunk_values_kernel', float('nan')):13.1f} "
              f"{k.get('chunk_qk_kernel', float('nan')):9.1f} {k.get('state_walk_kernel', float('nan')):11.1f}")


if __name__ == "__main__":
    main()
