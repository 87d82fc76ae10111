"""The collective micro-benchmark on every rank (`hpcbench commbench`; the command, its
options, table and file, is `hpcbench.cli.commbench`).

backends.py opens the group the buffers are all-reduced in: MPI (mpi4py's `Allreduce` on
numpy float32 buffers, through `hpcbench.rank.collectives.MPIComm`), torch.distributed over
gloo (host buffers, under torchrun) or over NCCL (buffers in GPU memory). loop.py times
`iters` back-to-back all-reduces of each size on each rank and gathers every rank's time.
memory.py says how much memory the host can give the buffers.
"""

from hpcbench.rank.commbench.backends import BUFFERS, ELEMENT, Collectives, open_collectives
from hpcbench.rank.commbench.loop import Timing, WrongSum, measure

__all__ = ["BUFFERS", "ELEMENT", "Collectives", "Timing", "WrongSum", "measure", "open_collectives"]
