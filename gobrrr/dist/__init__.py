"""gobrrr.dist: ranks (one process per device) and the communication between them.

    rank = gobrrr.dist.init()                  # torchrun env -> process group, device, seeds
    gobrrr.dist.comm.all_reduce(grad, "avg")   # readable wrappers over torch.distributed
    gobrrr.dist.shutdown()                     # or: with gobrrr.dist.session() as rank: ...

Modules: ranks (init, Rank, session, print0, RankSampler), comm (p2p and collectives), debug
(GOBRRR_DIST_DEBUG: matching checks and named-rank diagnostics), monitor (NCCL: exit instead of
hanging behind a departed rank), lifeline (torchrun: exit when the launcher dies), ring (ring
all-reduce from send/recv), testing (spawn N ranks).
"""
from gobrrr.dist import comm
from gobrrr.dist.debug import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError, DistConfigError
from gobrrr.dist.ranks import (DEFAULT_TIMEOUT_S, Rank, RankSampler, RendezvousError, init, log0, print0, session,
                               shard_indices, shutdown)
from gobrrr.dist.ring import ring_all_reduce

__all__ = ["Rank", "init", "shutdown", "session", "print0", "log0", "RankSampler", "shard_indices", "comm",
           "ring_all_reduce", "DEFAULT_TIMEOUT_S", "CollectiveError", "CollectiveMismatchError",
           "CollectiveTimeoutError", "DistConfigError", "RendezvousError"]
