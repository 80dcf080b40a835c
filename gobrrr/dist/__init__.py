"""gobrrr.dist: ranks (one process per device) and the communication between them.

    rank = gobrrr.dist.init()                  # torchrun env -> process group, device, seeds
    comm.all_reduce(grad, op="avg")            # readable wrappers over torch.distributed
    gobrrr.dist.shutdown()

Modules: ranks (init, Rank, session, print0, RankSampler), comm (p2p and collectives),
debug (GOBRRR_DIST_DEBUG: matching checks and named-rank diagnostics), ring (ring all-reduce from
send/recv), testing (spawn N ranks in a test).
"""
from gobrrr.dist.debug import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError
from gobrrr.dist.ranks import (DEFAULT_TIMEOUT_S, Rank, RankSampler, init, log0, print0, session, shard_indices,
                               shutdown)

__all__ = ["Rank", "init", "shutdown", "session", "print0", "log0", "RankSampler", "shard_indices",
           "DEFAULT_TIMEOUT_S", "CollectiveError", "CollectiveMismatchError", "CollectiveTimeoutError"]
