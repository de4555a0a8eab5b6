"""Host-device copies of FTorch's GPU idiom against the bus limit (issue 41): a forward whose input
is a host array copied to the GPU (`torch_tensor_from_array(x, xa, torch_kCUDA)`) and whose output
is written back into a host array (`torch_tensor_from_array(y, ya, torch_kCPU)`), 64 MiB each way,
through FTorch's C API (what the Fortran procedures call, one call each), side by side with
torch's own copies from page-locked (pinned) and pageable memory, measured in the same run.

    python bench/transfer.py                 # on a machine whose torch sees a CUDA device
    python bench/transfer.py --device cpu    # smoke run: the same calls on the CPU, values checked

Rows: FTorch's idiom with staging (the default, FTORCH_STAGING_CHUNK_MIB chunks) and without
(FTORCH_STAGING_CHUNK_MIB=0: LibTorch's copy_ from pageable memory), each in its own process;
upload and download alone; torch's pinned and pageable copies. Every FTorch row checks that the
output equals 2 * input exactly (sizes that are not a multiple of the chunk included).
Writes bench/results/transfer.{md,json} (--out DIR elsewhere). Target: the idiom's forward moves
its 128 MiB at >= 80 % of the pinned bandwidth (the mean of upload and download).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FTC_FLOAT32, FTC_CPU, FTC_CUDA = 6, 0, 1  # ftorch_c_enums.h


def library():
    import ftorch

    lib = ctypes.CDLL(str(Path(ftorch.get_libdir()) / "libftorch_c.so"))
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.ftc_tensor_from_blob.argtypes = [ctypes.POINTER(p), p, i32, ctypes.POINTER(i64), p, p, i32, i32, i32, i32]
    lib.ftc_tensor_copy_to_blob.argtypes = [p, p, i32, i32, ctypes.POINTER(i64)]
    lib.ftc_tensor_delete.argtypes = [ctypes.POINTER(p)]
    lib.ftc_model_load.argtypes = [ctypes.POINTER(p), ctypes.c_char_p, i32, i32, i32, i32]
    lib.ftc_model_forward.argtypes = [p, ctypes.POINTER(p), i32, ctypes.POINTER(p), i32, i32]
    lib.ftc_model_delete.argtypes = [ctypes.POINTER(p)]
    lib.ftc_last_error.restype = ctypes.c_char_p
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: {lib.ftc_last_error().decode()}")


def child(args) -> None:
    """One process, one staging setting: time the idiom, upload and download; print a JSON line."""
    import numpy as np
    import torch

    lib = library()
    device = FTC_CUDA if args.device == "cuda" else FTC_CPU
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    model = ctypes.c_void_p()
    check(lib, lib.ftc_model_load(ctypes.byref(model), str(args.model).encode(), device, 0, 0, 0), "load")
    out = {}
    for n in args.elements:
        x = (np.arange(n, dtype=np.float32) % 1000.0) * np.float32(0.5)
        y = np.zeros(n, dtype=np.float32)
        shape = (ctypes.c_int64 * 1)(n)

        def idiom():
            tx, ty = ctypes.c_void_p(), ctypes.c_void_p()
            check(lib, lib.ftc_tensor_from_blob(ctypes.byref(tx), x.ctypes.data, 1, shape, None, None, FTC_FLOAT32,
                                                device, 0, 0), "from_blob (input)")
            check(lib, lib.ftc_tensor_from_blob(ctypes.byref(ty), y.ctypes.data, 1, shape, None, None, FTC_FLOAT32,
                                                FTC_CPU, -1, 0), "from_blob (output)")
            check(lib, lib.ftc_model_forward(model, ctypes.byref(tx), 1, ctypes.byref(ty), 1, 0), "forward")
            lib.ftc_tensor_delete(ctypes.byref(tx))
            lib.ftc_tensor_delete(ctypes.byref(ty))

        def upload():
            tx = ctypes.c_void_p()
            check(lib, lib.ftc_tensor_from_blob(ctypes.byref(tx), x.ctypes.data, 1, shape, None, None, FTC_FLOAT32,
                                                device, 0, 0), "from_blob")
            sync()
            lib.ftc_tensor_delete(ctypes.byref(tx))

        resident = ctypes.c_void_p()  # a device tensor to download from
        check(lib, lib.ftc_tensor_from_blob(ctypes.byref(resident), x.ctypes.data, 1, shape, None, None, FTC_FLOAT32,
                                            device, 0, 0), "from_blob")

        def download():
            check(lib, lib.ftc_tensor_copy_to_blob(resident, y.ctypes.data, FTC_FLOAT32, 1, shape), "copy_to_blob")

        row = {}
        for name, fn in (("idiom", idiom), ("upload", upload), ("download", download)):
            y[:] = 0
            fn()
            sync()
            expect = 2 * x if name == "idiom" else (x if name == "download" else None)
            if expect is not None and not np.array_equal(y, expect):
                raise RuntimeError(f"{name}: wrong values for {n} elements")
            times = []
            for _ in range(args.reps):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times)
        lib.ftc_tensor_delete(ctypes.byref(resident))
        out[str(n)] = row
    lib.ftc_model_delete(ctypes.byref(model))
    print("RESULT " + json.dumps(out))


def torch_copies(n, reps):
    """torch's own copies of n float32 values: pinned and pageable, up and down (seconds)."""
    import torch

    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    rows = {}
    for kind in ("pinned", "pageable"):
        host = torch.empty(n, dtype=torch.float32, pin_memory=(kind == "pinned"))
        for direction in ("up", "down"):
            def go():
                if direction == "up":
                    dev.copy_(host, non_blocking=True)
                else:
                    host.copy_(dev, non_blocking=True)
                torch.cuda.synchronize()

            go()
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                go()
                times.append(time.perf_counter() - t0)
            rows[f"{kind}_{direction}"] = statistics.median(times)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--chunks", default="0,4,16", help="FTORCH_STAGING_CHUNK_MIB values to run (0: off)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--elements", type=lambda s: [int(v) for v in s.split(",")], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch: use --device cpu for a smoke run", file=sys.stderr)
        return 2
    mib = 1 << 20
    # 64 MiB of float32, and a size that is not a multiple of any chunk.
    elements = [64 * mib // 4, 5 * mib // 4 + 12345] if args.device == "cuda" else [mib // 4 + 7]
    work = Path(tempfile.mkdtemp(prefix="ftorch-bench-transfer-"))
    model = work / "twice.pt"

    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2.0

    torch.jit.script(Twice()).save(str(model))
    rows = {}
    for chunk in [int(c) for c in args.chunks.split(",")]:
        env = dict(os.environ, FTORCH_STAGING_CHUNK_MIB=str(chunk))
        proc = subprocess.run([sys.executable, __file__, "--child", "--device", args.device, "--reps", str(args.reps),
                               "--model", str(model), "--elements", ",".join(map(str, elements))],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"chunk {chunk} MiB failed:\n{proc.stdout}\n{proc.stderr}")
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        rows[chunk] = json.loads(line[len("RESULT "):])
    n = elements[0]
    nbytes = 4 * n
    results = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (smoke run: no copies)",
               "torch": torch.__version__, "reps": args.reps, "bytes_each_way": nbytes,
               "cpu_threads": torch.get_num_threads(), "ftorch": {}}
    for chunk, by_size in rows.items():
        r = by_size[str(n)]
        results["ftorch"][chunk] = {k: nbytes / v / 1e9 for k, v in r.items() if k != "idiom"}
        results["ftorch"][chunk]["idiom"] = 2 * nbytes / r["idiom"] / 1e9
    lines = []
    if args.device == "cuda":
        t = torch_copies(n, args.reps)
        results["torch_gbps"] = {k: nbytes / v / 1e9 for k, v in t.items()}
        pinned = (results["torch_gbps"]["pinned_up"] + results["torch_gbps"]["pinned_down"]) / 2
        results["pinned_mean_gbps"] = pinned
        for chunk in results["ftorch"]:
            results["ftorch"][chunk]["idiom_over_pinned"] = results["ftorch"][chunk]["idiom"] / pinned
        g = results["torch_gbps"]
        lines += [f"Host-device copies, {nbytes >> 20} MiB float32 each way, {results['device']}, torch "
                  f"{results['torch']}, {results['cpu_threads']} CPU threads, median of {args.reps}. GB/s (10^9 bytes "
                  "per second).", "",
                  "| copy | up (host to GPU) | down (GPU to host) | idiom's forward (both ways) | idiom / pinned mean |",
                  "|---|---|---|---|---|",
                  f"| torch, pinned memory | {g['pinned_up']:.1f} | {g['pinned_down']:.1f} | | |",
                  f"| torch, pageable memory | {g['pageable_up']:.1f} | {g['pageable_down']:.1f} | | |"]
        for chunk, f in results["ftorch"].items():
            label = "FTorch, LibTorch's copy_ (staging off)" if chunk == 0 else f"FTorch, staged in {chunk} MiB chunks"
            lines.append(f"| {label} | {f['upload']:.1f} | {f['download']:.1f} | {f['idiom']:.1f} | "
                         f"{f['idiom_over_pinned']:.2f} |")
        lines += ["", f"Written by `python bench/transfer.py` on {datetime.date.today().isoformat()}; the idiom's "
                      "forward: input copied up, x * 2 on the GPU, output copied down into the host array, "
                      "values checked."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transfer.json").write_text(json.dumps(results, indent=2) + "\n")
    if lines:
        (args.out / "transfer.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
