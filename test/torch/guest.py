"""tsnet as a guest of PyTorch: torch.distributed and DDP over NCCL with the plugin loaded.

Run by test/torch/run.sh under torchrun (one process per GPU), once per variant (tsnet over
TCP, over libfabric, NCCL's Socket). Three modes:

  check     collectives of several sizes and dtypes checked element by element against
            values computed locally (small integers, so every sum is exact in every dtype);
            communicators created and destroyed in a loop; a DDP model trained for --steps
            steps with the ranks' parameters compared bit for bit; an all_reduce captured in
            a CUDA graph and replayed; timings (reported, not checked). Exits 0 only when
            every check passed, after destroy_process_group() and a normal interpreter exit.
            Between the phases it forks: a data loader's workers (fork context), a helper run
            through subprocess, and a child that ends through C's exit(); the collectives
            around them must go on.
  killpeer  the last rank exits abruptly (os._exit) while the others sit in all_reduces:
            they must end with an NCCL error well before the process group's timeout, not
            hang. Exits 3 when the error came, 4 when the loop ran out without one.
  exitlive  collectives, then the interpreter exits without destroy_process_group(), the
            communicators and the plugin still live (as many scripts end): it must exit 0.
  many      --groups communicators of every rank held at once (as a job with many process
            groups holds them; with NCCL_MIN_NCHANNELS each has that many channels, each
            channel its net connections), each connected by a checked all_reduce; then rounds
            of an all_reduce on every one of them posted before any is waited for, one after
            a --quiet pause in which no communicator moves a byte, and one all_to_all on every
            one (NCCL's point-to-point connections, made on first use); every result checked.
            Then every communicator is destroyed. The process's descriptors, sockets, threads
            and resident memory are printed before, with all communicators up, and after.

--device cpu runs the same checks over gloo (no tsnet: gloo never loads a net plugin), so
that the script itself can be tried on a machine without GPUs.

Each rank prints lines starting with "guest r<rank>:"; rank 0 writes --json with the figures.
--one-gpu puts every rank on GPU 0 as different hosts (NCCL_HOSTID) for a machine with one GPU.
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

P = argparse.ArgumentParser()
P.add_argument("--mode", choices=["check", "killpeer", "exitlive", "many"], default="check")
P.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
P.add_argument("--steps", type=int, default=60, help="DDP training steps")
P.add_argument("--max-elems", type=int, default=1 << 24, help="largest collective checked, in elements")
P.add_argument("--json", default="", help="rank 0 writes its figures here")
P.add_argument("--timeout", type=float, default=180, help="process group timeout, seconds")
P.add_argument("--churn", type=int, default=3, help="communicators created and destroyed")
P.add_argument("--groups", type=int, default=32, help="many: communicators held at once")
P.add_argument("--quiet", type=float, default=3.0, help="many: seconds every communicator stays idle before a round")
P.add_argument("--round2-elems", type=int, default=1 << 18,
               help="many: elements of the second round's all_reduce (with every rank on one GPU, 48 "
                    "communicators' 1 MiB all_reduces posted at once hung under Socket too: their kernels "
                    "do not all fit on the GPU at once)")
P.add_argument("--one-gpu", action="store_true",
               help="every rank on GPU 0, each with an NCCL_HOSTID of its own, so that NCCL takes the ranks for "
                    "different hosts and connects them through the net plugin (a machine with one GPU; start an "
                    "MPS daemon first, or the ranks' kernels time-slice the GPU)")
ARGS = P.parse_args()

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
CUDA = ARGS.device == "cuda"
BACKEND = "nccl" if CUDA else "gloo"
DEV = torch.device("cuda", 0 if ARGS.one_gpu else LOCAL) if CUDA else torch.device("cpu")
if ARGS.one_gpu:
    os.environ["NCCL_HOSTID"] = f"tsnet-guest-rank-{RANK}"  # read by NCCL at its first communicator
FAILED = []
FIGURES = {}


def say(msg):
    # One write per line: the ranks share torchrun's output, and print() writes the newline apart.
    sys.stdout.write(f"guest r{RANK}: {msg}\n")
    sys.stdout.flush()


def fail(what):
    FAILED.append(what)
    say(f"FAIL {what}")


def sync():
    if CUDA:
        torch.cuda.synchronize(DEV)


def values(n, dtype, rank, salt):
    """Small integers in [-8, 8], different per rank, element and salt: exact in every dtype."""
    i = torch.arange(n, dtype=torch.int64)
    v = (i * 7 + rank * 13 + salt * 5) % 17 - 8
    return v.to(dtype).to(DEV)


def expect_equal(what, got, want):
    if got.shape != want.shape:
        return fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    bad = (got.to(torch.float64) != want.to(torch.float64)).nonzero()
    if bad.numel():
        k = bad[0].tolist()
        return fail(f"{what}: {bad.shape[0]} of {got.numel()} elements wrong, first at {k}: {got[tuple(k)].item()} expected {want[tuple(k)].item()}")


def all_gather_flat(out, t):
    if BACKEND == "nccl":
        return dist.all_gather_into_tensor(out, t)
    dist.all_gather(list(out.chunk(WORLD)), t)  # gloo (torch 1.13) has no all_gather_into_tensor


def sizes():
    out = [1, 3, 1024, 65537, 1 << 20, ARGS.max_elems]
    return sorted({s for s in out if s <= ARGS.max_elems})


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64]
GLOO_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]  # gloo refuses half types


def expect_close(what, got, want):
    tol = 1e-2 if got.dtype in (torch.bfloat16, torch.float16) else 1e-6
    if not torch.allclose(got.to(torch.float64), want.to(torch.float64), rtol=tol, atol=tol):
        fail(f"{what}: largest difference {(got.to(torch.float64) - want.to(torch.float64)).abs().max().item()}")


def check_collectives():
    w, r = WORLD, RANK
    salt = 0
    for n in sizes():
        for dt in (DTYPES if n <= (1 << 20) else [torch.float32, torch.bfloat16]) if CUDA else GLOO_DTYPES:
            salt += 1
            name = f"n={n} {str(dt).replace('torch.', '')}"
            everyone = [values(n, dt, k, salt) for k in range(w)]
            t = everyone[r].clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            expect_equal(f"all_reduce sum {name}", t, sum(x.to(torch.float64) for x in everyone).to(dt))
            t = everyone[r].clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            expect_equal(f"all_reduce max {name}", t, torch.stack(everyone).max(dim=0).values)
            if BACKEND == "nccl" and dt.is_floating_point:  # gloo has no AVG
                t = everyone[r].clone()
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                expect_close(f"all_reduce avg {name}", t, sum(x.to(torch.float64) for x in everyone) / w)
            for root in range(w):
                t = everyone[r].clone() if r == root else torch.zeros(n, dtype=dt, device=DEV)
                dist.broadcast(t, src=root)
                expect_equal(f"broadcast from {root} {name}", t, everyone[root])
            out = torch.empty(n * w, dtype=dt, device=DEV)
            all_gather_flat(out, everyone[r])
            expect_equal(f"all_gather {name}", out, torch.cat(everyone))
            if BACKEND == "nccl":  # gloo has no reduce_scatter
                big = [values(n * w, dt, k, salt) for k in range(w)]
                out = torch.empty(n, dtype=dt, device=DEV)
                dist.reduce_scatter_tensor(out, big[r])
                want = sum(x.to(torch.float64) for x in big).to(dt)[r * n:(r + 1) * n]
                expect_equal(f"reduce_scatter {name}", out, want)
        # all_to_all with uneven splits: rank a sends s(a, b) elements to rank b.
        def s(a, b):
            return (n // w) + a * 3 + b
        src = values(sum(s(r, b) for b in range(w)), torch.float32, r, salt)
        out = torch.empty(sum(s(a, r) for a in range(w)), dtype=torch.float32, device=DEV)
        dist.all_to_all_single(out, src, [s(a, r) for a in range(w)], [s(r, b) for b in range(w)])
        want = []
        for a in range(w):
            theirs = values(sum(s(a, b) for b in range(w)), torch.float32, a, salt)
            at = sum(s(a, b) for b in range(r))
            want.append(theirs[at:at + s(a, r)])
        expect_equal(f"all_to_all uneven n~{n}", out, torch.cat(want))
        # point to point: a ring, several tensors in one batch
        if w > 1:
            nxt, prv = (r + 1) % w, (r - 1) % w
            sends = [values(n + j, torch.float32, r, salt + j) for j in range(3)]
            recvs = [torch.empty(n + j, dtype=torch.float32, device=DEV) for j in range(3)]
            ops = [dist.P2POp(dist.isend, x, nxt) for x in sends]
            ops += [dist.P2POp(dist.irecv, x, prv) for x in recvs]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            for j in range(3):
                expect_equal(f"send/recv ring n={n + j}", recvs[j], values(n + j, torch.float32, prv, salt + j))
    sync()


def check_churn():
    for i in range(ARGS.churn):
        g = dist.new_group(list(range(WORLD)))
        t = values(4099, torch.float32, RANK, 100 + i)
        dist.all_reduce(t, group=g)
        expect_equal(f"new group {i}: all_reduce", t, sum(values(4099, torch.float32, k, 100 + i).double() for k in range(WORLD)).float())
        sync()
        dist.destroy_process_group(g)
    say(f"created, used and destroyed {ARGS.churn} communicators")


def check_ddp():
    torch.manual_seed(1234)  # the same initial weights everywhere (DDP also broadcasts them)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                          nn.Linear(1024, 512), nn.GELU(), nn.Linear(512, 10)).to(DEV)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[DEV.index] if CUDA else None, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(256, 10, generator=torch.Generator().manual_seed(5))  # labels to learn
    gen = torch.Generator().manual_seed(77 + RANK)  # each rank its own data
    losses, times = [], []
    for step in range(ARGS.steps):
        xc = torch.randn(64, 256, generator=gen)
        x, y = xc.to(DEV), (xc @ teacher).argmax(dim=1).to(DEV)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    gathered = torch.empty(flat.numel() * WORLD, dtype=torch.float64, device=DEV)
    all_gather_flat(gathered, flat)
    for k in range(WORLD):
        other = gathered[k * flat.numel():(k + 1) * flat.numel()]
        if not torch.equal(other, flat):
            fail(f"ddp: rank {k}'s parameters differ from rank {RANK}'s after {ARGS.steps} steps ({(other != flat).sum().item()} of {flat.numel()})")
    buckets = (sum(p.numel() for p in model.parameters()) * 4 + (1 << 20) - 1) >> 20
    FIGURES["ddp"] = {
        "steps": ARGS.steps,
        "params": int(flat.numel()),
        "buckets_at_least": int(buckets),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "param_sum": float(flat.sum().item()),
        "step_ms_median": 1000 * statistics.median(times[len(times) // 4:]),
    }
    say(f"ddp: {ARGS.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, parameter sum {flat.sum().item():.9e}, "
        f"step median {FIGURES['ddp']['step_ms_median']:.2f} ms")
    if not losses[-1] < losses[0]:
        fail(f"ddp: the loss did not fall ({losses[0]} -> {losses[-1]})")


class Rows(torch.utils.data.Dataset):
    """Row i is 16 copies of i: a batch's sum is exact in float32."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((16,), float(i))


def check_fork():
    # A child forked after NCCL started has the plugin's memory but none of its threads; it
    # must not disturb the parent, and its exit (through every library's destructor when it
    # ends by C's exit()) must leave the parent's communicators working.
    import ctypes
    import multiprocessing
    import subprocess
    loader = torch.utils.data.DataLoader(Rows(), batch_size=8, num_workers=2,
                                         multiprocessing_context=multiprocessing.get_context("fork"))
    batches = 0
    for epoch in range(2):  # each epoch forks its workers again
        for batch in loader:
            t = batch.sum().reshape(1).to(DEV) * (RANK + 1)
            dist.all_reduce(t)
            want = batch.sum().item() * WORLD * (WORLD + 1) / 2
            if t.item() != want:
                fail(f"fork: all_reduce between data loader batches gave {t.item()}, expected {want}")
            batches += 1
    out = subprocess.run([sys.executable, "-c", "print('helper')"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or out.stdout.strip() != "helper":
        fail(f"fork: a helper through subprocess ended {out.returncode}: {out.stdout!r} {out.stderr[-300:]!r}")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).exit(0)  # C's exit(): atexit handlers and destructors run, Python's do not
    end = time.time() + 60
    status = None
    while time.time() < end:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.05)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        fail("fork: a child ending through C's exit() was still running after 60 s")
    elif not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        fail(f"fork: a child ending through C's exit() ended with status {status}")
    n = 1 << 16
    t = values(n, torch.float32, RANK, 300)
    dist.all_reduce(t)
    expect_equal("fork: all_reduce after the forked children", t, sum(values(n, torch.float32, k, 300).double() for k in range(WORLD)).float())
    sync()
    say(f"fork: {batches} batches from forked data loader workers, each all_reduced; a helper through subprocess; "
        f"a child ended through exit(); collectives go on")


def check_graph():
    n = 1 << 18
    x = torch.zeros(n, device=DEV)
    side = torch.cuda.Stream(device=DEV)
    side.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream(DEV).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
    for i in range(20):
        x.copy_(values(n, torch.float32, RANK, 200 + i))
        graph.replay()
        expect_equal(f"cuda graph replay {i}", x, sum(values(n, torch.float32, k, 200 + i).double() for k in range(WORLD)).float())
    sync()
    say("cuda graph: an all_reduce captured once, replayed 20 times")


def timings():
    out = {}
    for n, iters in ((2, 500), (256, 500), (1 << 14, 200), (1 << 26, 10)):
        t = torch.ones(n, device=DEV)
        for _ in range(min(iters, 100)):
            dist.all_reduce(t)
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        us = (time.perf_counter() - t0) / iters * 1e6
        algbw = n * 4 / (us * 1e-6) / 1e9
        out[str(n * 4)] = {"us": us, "busbw_GBps": algbw * 2 * (WORLD - 1) / WORLD}
        say(f"timing: all_reduce {n * 4} B: {us:.1f} us per op, busbw {out[str(n * 4)]['busbw_GBps']:.2f} GB/s")
    FIGURES["all_reduce"] = out


def killpeer():
    t = torch.ones(1 << 24, device=DEV)
    dist.all_reduce(t)
    sync()
    victim = WORLD - 1
    if RANK == victim:
        time.sleep(2.0)
        say(f"exits now without a word (os._exit), at {time.time():.3f}")
        os._exit(0)
    say(f"runs all_reduces while rank {victim} goes away, from {time.time():.3f}")
    start = time.time()
    limit = ARGS.timeout * 0.8
    while time.time() - start < limit:
        # Polled, not waited for: is_completed() asks NCCL for its asynchronous error itself, so
        # the failure is seen here when NCCL reports it, on this process's clock.
        work = dist.all_reduce(t, async_op=True)
        while not work.is_completed() and time.time() - start < limit:
            time.sleep(0.002)
        seen = time.time()
        try:
            work.wait()
            sync()
        except Exception as e:  # what PyTorch raises when NCCL reports the error
            first = str(e).splitlines()[0] if str(e) else ""
            say(f"the all_reduce failed, seen at {seen:.3f}, {seen - start:.1f} s into the loop: {type(e).__name__}: {first}")
            os._exit(3)
    say(f"no error in {time.time() - start:.1f} s: the dead peer was not noticed")
    os._exit(4)


def exitlive():
    t = values(1 << 22, torch.float32, RANK, 1)
    for _ in range(20):
        dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)  # the last one still queued when the script ends
    work.wait()
    sync()
    say("exits with the process group alive (no destroy_process_group)")
    return 0


def resources():
    """This process's open descriptors, sockets among them, threads and resident memory (MiB)."""
    fds = sockets = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{f}").startswith("socket:")
            fds += 1
        except OSError:
            pass  # the descriptor listdir itself held, closed since
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.split()
    return {"fds": fds, "sockets": sockets, "threads": int(status["Threads"][0]), "rss_mib": int(status["VmRSS"][0]) / 1024}


def show(r):
    return f"{r['fds']} descriptors ({r['sockets']} sockets), {r['threads']} threads, {r['rss_mib']:.0f} MiB resident"


def many():
    base = resources()
    say(f"many: before: {show(base)}")
    groups = []
    t0 = time.perf_counter()
    for i in range(ARGS.groups):
        g = dist.new_group(list(range(WORLD)))
        t = values(4099, torch.float32, RANK, 500 + i)
        dist.all_reduce(t, group=g)  # connects this communicator's channels
        expect_equal(f"many: communicator {i}: first all_reduce", t, sum(values(4099, torch.float32, k, 500 + i).double() for k in range(WORLD)).float())
        groups.append(g)
    sync()
    up = resources()
    FIGURES["many_up_s"] = time.perf_counter() - t0
    say(f"many: {len(groups)} communicators up in {FIGURES['many_up_s']:.1f} s: {show(up)}")

    def round_all(label, n, salt):
        t0 = time.perf_counter()
        work = []
        for i, g in enumerate(groups):
            t = values(n, torch.float32, RANK, salt + i)
            work.append((dist.all_reduce(t, group=g, async_op=True), t, i))
        for w, t, i in work:
            w.wait()
            expect_equal(f"many: {label}: communicator {i}", t, sum(values(n, torch.float32, k, salt + i).double() for k in range(WORLD)).float())
        sync()
        ms = (time.perf_counter() - t0) * 1000
        say(f"many: {label}: an all_reduce of {n * 4} B on each of {len(groups)} communicators, all posted first, in {ms:.1f} ms")
        return ms

    FIGURES["many_rounds_ms"] = [round_all("round 1", 1 << 10, 600), round_all("round 2", ARGS.round2_elems, 700)]
    time.sleep(ARGS.quiet)  # every communicator idle at once: whatever keeps connections alive fires together
    FIGURES["many_rounds_ms"].append(round_all(f"after {ARGS.quiet:g} s quiet", 1 << 10, 800))
    t0 = time.perf_counter()
    n = 4096
    for i, g in enumerate(groups):  # point to point: NCCL connects these on first use
        src = values(n * WORLD, torch.float32, RANK, 900 + i)
        out = torch.empty(n * WORLD, dtype=torch.float32, device=DEV)
        dist.all_to_all_single(out, src, group=g)
        want = torch.cat([values(n * WORLD, torch.float32, k, 900 + i)[RANK * n:(RANK + 1) * n] for k in range(WORLD)])
        expect_equal(f"many: all_to_all: communicator {i}", out, want)
    sync()
    p2p = resources()
    FIGURES["many_all_to_all_s"] = time.perf_counter() - t0
    say(f"many: an all_to_all on each communicator in {FIGURES['many_all_to_all_s']:.1f} s: {show(p2p)}")
    FIGURES["many_rounds_ms"].append(round_all("with point-to-point connections up", 1 << 10, 1000))
    t0 = time.perf_counter()
    for g in groups:
        dist.destroy_process_group(g)
    groups.clear()
    sync()
    FIGURES["many_destroy_s"] = time.perf_counter() - t0
    time.sleep(1.0)  # closes that finish on the plugin's own threads
    after = resources()
    say(f"many: destroyed in {FIGURES['many_destroy_s']:.1f} s: {show(after)}")
    FIGURES["many_resources"] = {"before": base, "up": up, "with_p2p": p2p, "after": after}
    t = values(65537, torch.float32, RANK, 1100)
    dist.all_reduce(t)
    expect_equal("many: all_reduce on the default group after the destroys", t, sum(values(65537, torch.float32, k, 1100).double() for k in range(WORLD)).float())
    sync()


def main():
    say(f"torch {torch.__version__}, backend {BACKEND}, world {WORLD}, device {DEV}"
        + (f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if CUDA else ""))
    if CUDA:
        torch.cuda.set_device(DEV)
    kw = {"device_id": DEV} if CUDA and "device_id" in inspect.signature(dist.init_process_group).parameters else {}
    t0 = time.perf_counter()
    dist.init_process_group(BACKEND, timeout=timedelta(seconds=ARGS.timeout), **kw)
    t = torch.ones(1, device=DEV)
    dist.all_reduce(t)  # NCCL connects lazily: the first collective pays for it
    sync()
    FIGURES["init_s"] = time.perf_counter() - t0
    say(f"process group up and first all_reduce done in {FIGURES['init_s']:.2f} s")
    if ARGS.mode == "killpeer":
        return killpeer()
    if ARGS.mode == "exitlive":
        return exitlive()
    phases = [("collectives", check_collectives), ("communicator churn", check_churn), ("forked children", check_fork),
              ("ddp", check_ddp)]
    if ARGS.mode == "many":
        phases = [("many", many)]
    if CUDA and ARGS.mode == "check":
        phases += [("cuda graph", check_graph), ("timings", timings)]
    for name, fn in phases:
        before = len(FAILED)
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:
            fail(f"{name}: {type(e).__name__}: {e}")
        say(f"phase {name}: {'ok' if len(FAILED) == before else 'FAILED'} ({time.perf_counter() - t0:.1f} s)")
    # Every rank's verdict, so that rank 0's figures say whether all passed.
    verdict = torch.tensor([len(FAILED)], dtype=torch.int64, device=DEV)
    dist.all_reduce(verdict)
    sync()
    FIGURES["failed_checks_all_ranks"] = int(verdict.item())
    if RANK == 0 and ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(FIGURES, f, indent=1)
    dist.destroy_process_group()
    say(f"done: {len(FAILED)} failed check(s) here, {int(verdict.item())} on all ranks; process group destroyed")
    return 1 if verdict.item() else 0


if __name__ == "__main__":
    sys.exit(main())
