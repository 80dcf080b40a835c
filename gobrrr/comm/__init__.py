"""gobrrr.comm: ranks (one process per device) and the communication between them (Parts 2-3).

    rank = gobrrr.comm.init()                  # torchrun env -> process group, device, seeds
    gobrrr.comm.all_reduce(grad, "avg")        # readable wrappers over torch.distributed
    gobrrr.comm.shutdown()                     # or: with gobrrr.comm.session() as rank: ...

Open ranks.py first (init, Rank, session, print0, RankSampler), then collectives.py (p2p and
collectives, one checked wrapper each). Beside them: debug (GOBRRR_DIST_DEBUG: matching checks
and named-rank diagnostics), monitor (NCCL: exit instead of hanging behind a departed rank),
lifeline (torchrun: exit when the launcher dies), agree (every rank learns the first rank's error,
in one all-reduce), ring (ring all-reduce from send/recv), testing (spawn N ranks in a test).
This package was `gobrrr.dist` before 0.2; that name still works.
"""
from gobrrr.comm import collectives
from gobrrr.comm.collectives import (
                                     P2P,
                                     all_gather,
                                     all_reduce,
                                     all_to_all,
                                     barrier,
                                     batch_p2p,
                                     broadcast,
                                     gather,
                                     irecv,
                                     isend,
                                     recv,
                                     reduce,
                                     reduce_scatter,
                                     scatter,
                                     send,
)
from gobrrr.comm.debug import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError, DistConfigError
from gobrrr.comm.ranks import (
                                     DEFAULT_TIMEOUT_S,
                                     Rank,
                                     RankSampler,
                                     RendezvousError,
                                     init,
                                     log0,
                                     print0,
                                     session,
                                     shard_indices,
                                     shutdown,
)
from gobrrr.comm.ring import ring_all_reduce

comm = collectives  # `gobrrr.dist.comm.all_reduce(...)`, the 0.1 spelling, keeps working

__all__ = ["Rank", "init", "shutdown", "session", "print0", "log0", "RankSampler", "shard_indices",
           "collectives", "send", "recv", "isend", "irecv", "batch_p2p", "P2P", "barrier", "broadcast", "all_reduce",
           "reduce", "scatter", "gather", "all_gather", "reduce_scatter", "all_to_all", "ring_all_reduce",
           "DEFAULT_TIMEOUT_S", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError",
           "DistConfigError", "RendezvousError"]
