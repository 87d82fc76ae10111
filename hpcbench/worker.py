"""`python -m hpcbench.worker RUN_FILE`: what every rank of a point runs.

Reads its rank from the launcher's environment, sets up the framework, creates the shared
point file with its peers, runs the phase-timed loop, and writes its rows in blocks. An
exception on any rank ends the whole job (MPI_Abort, or exit under torchrun, whose agent
then stops the other ranks), so a failing point never hangs. Told to stop (SIGTERM, SIGINT,
SIGUSR1/2), the ranks finish the iteration in progress, agree on a common one to stop at
(rank/stop.py), write every row, mark the file `stopped` and exit with stop.EXIT_CODE. A rank
that runs out of memory (past the point's `memory_limit_gb`, or the machine's) says where and
how much it reached (rank/memory.py) and ends the job with memory.EXIT_CODE: the executor
records the point `out_of_memory`, a result.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import hpcbench
from hpcbench.errors import HpcbenchError
from hpcbench.frameworks import FRAMEWORKS, Framework, workload
from hpcbench.launchers import LAUNCHERS, detect
from hpcbench.rank import env as rankenv
from hpcbench.rank import linkage, memory, provenance
from hpcbench.rank.collectives import Comm, MPIComm, SelfComm
from hpcbench.rank.failures import describe, write_account, write_out_of_memory
from hpcbench.rank.stop import EXIT_CODE, Stop, StopSignals, reason_for
from hpcbench.rank.watchdog import Watchdog, watched
from hpcbench.store import schema
from hpcbench.store.status import final, result_status
from hpcbench.store.traits import Traits
from hpcbench.store.writer import FileMeta, choose_writer, open_writer
from hpcbench.sweepdir.layout import SweepDir, keep_aside
from hpcbench.sweepdir.runfile import RunFile
from hpcbench.trace.energy.meter import EnergyMeter
from hpcbench.trace.recorder import clock_offset_ns
from hpcbench.trace.sampler import Sampler

LOOP_BEGINS = "timed loop begins"  # said by rank 0 once every rank is in the loop


def _rank_row(renv: rankenv.RankEnv, offset: int) -> np.ndarray:
    host = renv.hostname.encode()[: schema.HOSTNAME_BYTES]
    return np.array((renv.rank, renv.local_rank, renv.node_rank, os.getpid(), offset, host), dtype=schema.RANK_DTYPE)


def _most(counts: list[int | None]) -> int | None:
    """The largest of the ranks' counts; None where no rank knew its own."""
    known = [c for c in counts if c is not None]
    return max(known) if known else None


def _meta(run: RunFile, renv: rankenv.RankEnv, hosts: list[str], extra: dict[str, Any], epoch_ns: int) -> FileMeta:
    """The file's metadata, built on rank 0 and broadcast: parallel HDF5 wants it identical."""
    point = run.point
    root = {
        "hpcbench_version": hpcbench.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sweep": run.sweep,
        "spec": run.spec_text,
        "epoch_ns": epoch_ns,
    }
    point_attrs = {k: v for k, v in point.as_dict().items() if v is not None and v != {}}
    point_attrs.update(id=point.id, json=point.to_json(), ranks=point.ranks)
    prov = provenance.collect()
    prov.update(extra)
    prov.update(hostnames=hosts, launcher_source=renv.source, slurm_job_id=os.environ.get("SLURM_JOB_ID", ""))
    prov["site_profile"] = run.profile
    return FileMeta(root=root, point=point_attrs, provenance=prov)


class Evaluations:
    """Rows of the eval table: the framework tested on this rank's held-out shard, timed here."""

    def __init__(self, framework: Framework, rank: int) -> None:
        self._framework = framework
        self._rank = rank
        self._rows: list[tuple[Any, ...]] = []
        self._t0 = 0
        self._testing_ns = 0  # time spent testing, left out of the training time

    def begin(self) -> None:
        self._t0 = time.perf_counter_ns()

    def run(self, epoch: int, iteration: int) -> None:
        start = time.perf_counter_ns()
        result = self._framework.evaluate()
        end = time.perf_counter_ns()
        if result is None:
            return
        train_s = (start - self._t0 - self._testing_ns) / 1e9
        self._testing_ns += end - start
        checksum = self._framework.parameter_checksum()
        row = (self._rank, epoch, iteration, train_s, (end - start) / 1e9, result.correct, result.total)
        device = self._framework.peak_device_memory()
        host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        self._rows.append((*row, result.loss, checksum, -1 if device is None else device, host))

    def drain(self) -> np.ndarray:
        rows, self._rows = self._rows, []
        return np.array(rows, dtype=schema.EVAL_DTYPE)


class InjectedFault(RuntimeError):
    """Raised on purpose (HPCBENCH_FAULT) to test that a failing rank ends the whole job."""


def injected_fault(rank: int) -> tuple[int, str]:
    """(iteration, kind) at which this rank must fail, from HPCBENCH_FAULT=RANK:ITERATION[:stall].

    kind "raise" raises InjectedFault; "stall" stops making progress (for watchdog tests).
    (-1, "") when there is none for this rank.
    """
    fault_rank, _, rest = os.environ.get("HPCBENCH_FAULT", "").partition(":")
    iteration, _, kind = rest.partition(":")
    if fault_rank.isdigit() and iteration.isdigit() and int(fault_rank) == rank:
        return int(iteration), kind or "raise"
    return -1, ""


def _complete_already(result: Path, comm: Comm) -> bool:
    """True if `result` is final (complete, or out of memory); else an earlier attempt's file
    is moved aside (rank 0), so that a rerun (resume, a requeued job) neither overwrites a
    finished result nor loses a crashed one."""
    verdict = None
    if comm.rank == 0:
        verdict = final(result_status(result))
        if not verdict:
            aside = keep_aside(result)
            if aside is not None:
                print(f"hpcbench.worker: earlier attempt kept as {aside}", file=sys.stderr, flush=True)
    return bool(comm.bcast(verdict))


def _stall_or_raise(rank: int, iteration: int, kind: str) -> None:
    """The injected fault (HPCBENCH_FAULT) of this rank at this iteration."""
    if kind == "stall":
        print(f"HPCBENCH_FAULT: rank {rank} stalls at iteration {iteration}", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
    raise InjectedFault(f"HPCBENCH_FAULT: rank {rank} fails at iteration {iteration}")


class PointRun:
    """One rank's run of a point, in the order it happens: `start` (framework, file, peers),
    `train` (the timed loop), `finish` (last rows, status, teardown)."""

    def __init__(self, run_file: Path) -> None:
        self.spec = RunFile.load(run_file)
        self.point = self.spec.point
        self.sweep_dir = SweepDir.of_run_file(run_file)
        self.renv = detect(launcher=self.point.launcher)
        self.signals = StopSignals()
        if self.renv.mpi or self.point.ranks == 1:  # ranks that can agree: a signal is noted, acted on at the loop
            self.signals.install()
        self.comm: Comm | None = MPIComm() if self.renv.mpi else None
        self.stage, self.iteration = "setup", -1  # where the rank is: what an out-of-memory account says

    def _framework(self) -> Framework:
        point = self.point
        framework_cls = FRAMEWORKS.load(point.framework)
        missing = framework_cls.unavailable(point.backend)
        if missing is not None:
            raise HpcbenchError(f"{point.framework} backend {point.backend!r} is not available here: {missing}")
        framework = framework_cls()
        framework.setup(point, self.renv, self.comm)
        return framework

    def out_of_memory(self, exc: BaseException) -> memory.OutOfMemory:
        """What this rank, which ran out of memory in `exc`, tells of it."""
        device = None
        with contextlib.suppress(Exception):  # the framework may be half set up
            device = self.framework.peak_device_memory()
        limit = self.point.memory_limit_gb
        return memory.OutOfMemory(
            rank=self.renv.rank,
            phase=self.stage,
            iteration=self.iteration,
            peak_rss_bytes=memory.peak_rss_bytes(),
            device_peak_bytes=-1 if device is None else int(device),
            limit_bytes=-1 if limit is None else int(limit * memory.GB),
            error=describe(exc)[:400],
        )

    def traits(self) -> Traits:
        """The traits the point's backend declares, with its launcher's: whether that launcher
        starts its ranks through MPI_Init (`Launcher.mpi`)."""
        launcher = LAUNCHERS.get(self.point.launcher)
        return self.framework.traits_of(self.point.backend).with_launcher(mpi=launcher.mpi)

    def start(self) -> bool:
        """Set up the framework and the shared point file; False if it is complete already."""
        point, options, renv = self.point, self.spec.options, self.renv
        # Before anything else: a compute node whose modules load another MPI or HDF5 than the
        # environment was built against fails here with both named, not later inside a rank.
        mismatch = linkage.mismatch()
        if mismatch is not None:
            raise HpcbenchError(mismatch)
        self.framework = framework = self._framework()
        self.comm = comm = self.comm or framework.bookkeeping_comm() or SelfComm()
        if comm.size != point.ranks:
            raise RuntimeError(f"started with {comm.size} ranks, point {point.id} asks for {point.ranks}")
        hosts = comm.allgather(renv.hostname)
        offset = clock_offset_ns()
        self.stage = "build"
        gpu = renv.local_rank if point.device == "cuda" else None
        capped = memory.apply_limit(point.memory_limit_gb, point.device, point.framework, gpu)
        framework.build(point)
        self.stage = "start"
        kind = choose_writer(comm, options.writer)
        epoch = comm.bcast(time.time_ns() if comm.rank == 0 else None)
        self.sampler = Sampler(comm.rank, options.sample_period_s, offset, epoch, gpu_index=gpu)
        # the GPU's energy counter, and the host's RAPL counters on its local rank 0: read between steps only
        self.energy = EnergyMeter(comm.rank, offset, epoch, renv.local_rank, gpu)
        extra: dict[str, Any] = {
            **framework.versions(),
            **workload.recorded(point),  # the model FLOPs and tokens per sample, the peak MFU is taken against
            "comm_end": framework.comm_end(),  # what a message's recorded end is (analysis/model/fit.py)
            # how the backend and the launcher behave, as the analysis models them (store/traits.py)
            "traits": self.traits().to_json(),
            "writer": kind,
            # how each rank reads CPU, GPU and InfiniBand ("absent: <why>" where it cannot)
            "resource_sources": comm.allgather(self.sampler.sources),
            # how each rank reads its GPU's energy and its host's RAPL ("absent: <why>", "not read: <why>")
            "energy_sources": comm.allgather(self.energy.sources),
        }
        if capped:  # how rank 0's memory_limit_gb was applied (rank/memory.py)
            extra["memory_limit"] = capped
        # the threads a rank computes on (analysis/model/contention.py): the most any rank took
        threads = _most(comm.allgather(framework.compute_threads(point)))
        if threads is not None:
            extra["compute_threads"] = threads
        meta = comm.bcast(_meta(self.spec, renv, hosts, extra, epoch) if comm.rank == 0 else None)
        self.out = out = self.sweep_dir.result(point.id)
        if _complete_already(out, comm):  # a requeued job whose first run finished
            print(f"hpcbench.worker: {out} is complete already; not run again", file=sys.stderr, flush=True)
            self.sampler.stop()
            self.energy.close()
            framework.teardown()
            return False
        self.n_iterations = point.iterations_for(framework.steps_per_epoch())
        self.writer = open_writer(out, comm, meta, self.n_iterations, _rank_row(renv, offset), kind)
        self.rec = framework.recorder(min(options.flush_every, self.n_iterations), offset, epoch)
        self.rec.comm = framework.comm_recorder(comm.rank, offset, epoch)
        self.evals = Evaluations(framework, comm.rank)
        return True

    def flush(self, read_energy: bool = True) -> None:
        """Write the rows recorded since the last flush (collective); `read_energy`: read the
        energy counters first (inside the timed loop; not after it, once the test pass ran)."""
        rec = self.rec
        assert rec.comm is not None
        first = rec.first
        rows = rec.drain()  # before the messages: on a GPU, comm_total sums their device times
        if read_energy:  # after the drain: on a GPU it waited for the block's recorded work
            self.energy.read()
        tables = {
            schema.COMM: rec.comm.drain(),
            schema.RESOURCES: self.sampler.drain(),
            schema.EVAL: self.evals.drain(),
            schema.ENERGY: self.energy.drain(),
        }
        self.writer.write_iterations(first, rows, tables)

    def _stop(self, comm: Comm) -> Stop:
        """The ranks' stop agreement (collective), started."""
        stop = Stop(self.n_iterations, comm, self.signals)
        if stop.available:
            stop.start()  # a signal noted since start-up stops the ranks before their first iteration
        else:  # no MPI between the ranks: a signal ends a rank as it always did
            self.signals.restore()
            if self.signals.signum:
                signal.raise_signal(self.signals.signum)
        return stop

    def _begin(self, comm: Comm, watchdog: Watchdog | None) -> None:
        comm.barrier()  # everyone starts the timed loop together
        self.energy.read()  # the loop begins (warm-up included)
        if comm.rank == 0:
            print(f"hpcbench.worker: point {self.point.id}: {LOOP_BEGINS}, {self.n_iterations} iterations", flush=True)
        if watchdog is not None:
            watchdog.start()
        self.evals.begin()

    def train(self) -> None:
        """The timed loop: every iteration's phases recorded, flushed in blocks, tested at
        the end of every epoch (or once at the end), watched for stalls."""
        point, comm, rec, framework = self.point, self.comm, self.rec, self.framework
        assert comm is not None
        steps = framework.steps_per_epoch() if point.epochs else 0
        self.sampler.start()
        fail_at, fault = injected_fault(comm.rank)
        stall_limit = self.spec.options.stall_timeout_s
        in_flight = rec.comm.in_flight if rec.comm is not None else None  # what a stall waits in
        watchdog = Watchdog(stall_limit, comm, point.id, in_flight) if stall_limit else None
        self.stop = stop = self._stop(comm)
        self._begin(comm, watchdog)
        self.stage = "step"
        for i in range(self.n_iterations):
            stop.current = self.iteration = i  # the stop's and the OOM account's costs: these, the check below
            if stop.pending and not stop.may_start(i):
                break
            if i == fail_at:
                _stall_or_raise(comm.rank, i, fault)
            rec.start(warmup=i < point.warmup)
            loss = framework.step(rec)
            rec.stop(point.rank_batch, loss)  # a batch per device the rank drives
            if i + 1 == point.warmup:  # the timed window opens: a sample at its start (between steps)
                self.sampler.sample_now()
                self.energy.read()
            done = i + 1 - point.warmup
            if steps and done > 0 and done % steps == 0:  # an epoch ends: test between iterations
                with watched(watchdog, f"the test pass after epoch {done // steps} (collective)"):
                    self.stage = "test pass"
                    self.evals.run(done // steps, i + 1)
            if rec.full:
                block = f"the flush of iterations {rec.first}-{i} (a collective {self.writer.kind} write)"
                with watched(watchdog, block):
                    self.stage = "flush"
                    self.flush()
            self.stage = "step"
            if watchdog is not None:
                watchdog.beat(i)
        self.sampler.sample_now()  # the timed window closes (before the final test pass)
        self.energy.read()
        self.ran = stop.finish()  # every rank ran this many: all, or up to the agreed stop
        self.stage = "test pass"
        if not steps and self.ran == self.n_iterations:
            self.evals.run(0, self.n_iterations)
        if watchdog is not None:
            watchdog.stop()

    def finish(self) -> int:
        """Write the last rows, the status and close; the exit code (0, or EXIT_CODE if stopped)."""
        self.stage = "flush"
        self.sampler.stop()
        self.flush(read_energy=False)  # the last iterations and samples (energy was read as the loop ended)
        self.energy.close()
        self.stop.close()
        p, kind, comm = self.point, self.writer.kind, self.comm
        assert comm is not None
        if self.ran == self.n_iterations:
            self.writer.close(schema.STATUS_COMPLETE)
            what, code = "complete", 0
        else:
            reason = reason_for(self.stop.signum)
            self.writer.close(schema.STATUS_STOPPED, {"stop_reason": reason})
            what, code = f"stopped after {self.ran} of {self.n_iterations} iterations ({reason})", EXIT_CODE
        self.framework.teardown()
        if comm.rank == 0:
            print(f"hpcbench.worker: point {p.id} {what}: {p.ranks} ranks, writer {kind}, {self.out}", flush=True)
        return code


def run(run_file: Path) -> int:
    """Run this rank's part of the point of `run_file`; any failure ends every rank. Returns
    the exit code: 0, or stop.EXIT_CODE when the ranks were told to stop and did."""
    this = PointRun(run_file)
    try:
        if this.start():
            this.train()
            return this.finish()
        return 0
    except BaseException as exc:  # noqa: BLE001 - any failure, even KeyboardInterrupt, must end every rank
        code = 1
        if memory.is_out_of_memory(exc):
            memory.lift_limit()  # room to write the account; the job ends now
            write_out_of_memory(this.point.id, this.out_of_memory(exc))
            code = memory.EXIT_CODE
        else:
            write_account(this.renv.rank, this.point.id, f"failed: {describe(exc)}")  # what the manifest will quote
        traceback.print_exc()
        (this.comm or SelfComm()).abort(code)  # the peers, blocked in a collective with this rank, end too
        return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m hpcbench.worker RUN_FILE  (SWEEP_DIR/points/<id>.json)", file=sys.stderr)
        return 2
    return run(Path(args[0]).resolve())


if __name__ == "__main__":
    sys.exit(main())
