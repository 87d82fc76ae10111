"""The collective micro-benchmark on every rank (`hpcbench commbench`; the command, its
options, table and file, is `hpcbench.cli.commbench`).

backends.py opens the group the buffers are all-reduced in: MPI (mpi4py's `Allreduce` on
numpy float32 buffers, through `hpcbench.rank.collectives.MPIComm`), torch.distributed over
gloo (host buffers, under torchrun) or over NCCL (buffers in GPU memory). loop.py times
`iters` back-to-back all-reduces of each size on each rank and gathers every rank's time.
"""

from hpcbench.rank.commbench.backends import ELEMENT, Collectives, open_collectives
from hpcbench.rank.commbench.loop import Timing, measure

__all__ = ["ELEMENT", "Collectives", "Timing", "measure", "open_collectives"]
