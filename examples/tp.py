"""Tensor parallelism, as a script to copy (README: "Tensor parallelism (Megatron-style, with sequence parallelism)").

    torchrun --nproc-per-node 2 examples/tp.py                        # tp 2 (CPU: gloo; GPUs: NCCL, one per rank)
    torchrun --nproc-per-node 4 examples/tp.py --tp 2 --sp            # dp 2 x tp 2, with sequence parallelism
    python examples/tp.py --tp 1                                      # one process: the same losses

Every block's linears are split over the tp ranks of a (dp, tp) mesh (Shoeybi et al. 2019): each rank
holds 1/tp of the heads and of the MLP, and two collectives per block each way join the halves. With
--sp the activations between blocks are split along the sequence too (Korthikanti et al. 2022). ddp
averages the gradients over the dp dimension. The global batch is the same at every layout (each dp
replica takes its rows; the tp ranks of a replica see the same rows), so every `step N loss L` line is
the same whatever the layout. At the end rank 0 prints each collective of one step, with its bytes.
"""
import argparse
import gc

import torch

import gobrrr
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN
from gobrrr.parallel import clip_grad_norm_, ddp, make_mesh, tp
from gobrrr.parallel.tp.report import comm_plan, format_plan
from gobrrr.train.data import CharCorpus

p = argparse.ArgumentParser(description="train the reference GPT with tensor parallelism over the ranks torchrun starts")
p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree; the rest of the ranks is data parallel")
p.add_argument("--sp", action="store_true", help="sequence parallelism: LayerNorms and dropouts on T/tp tokens")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=8, help="global batch, in sequences (split evenly over the dp replicas)")
p.add_argument("--model", default="tiny", help="tiny | small | 124m (gobrrr/models/gpt.py)")
args = p.parse_args()

# -- ranks and the mesh: world = dp x tp, tp ranks consecutive (one node's GPUs carry the per-block traffic)
rank = gobrrr.comm.init()
mesh = make_mesh(tp=args.tp)              # raises, on every rank, if tp does not divide the world size
dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
if args.batch % dp:
    raise SystemExit(f"tp.py: --batch {args.batch} does not split over {dp} dp replicas; pass a multiple of it")

# -- the model, sharded in place from a plan (module names -> styles), then data parallel over dp
cfg = GPTConfig.from_name(args.model)
model = GPT(cfg).to(rank.device)          # the same seed on every rank: the same weights before sharding
model = tp(model, mesh, plan=GPT_PLAN, sequence_parallel=args.sp)
model = ddp(model, group=mesh["dp"].get_group())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)  # after tp(): these are the shards

# -- data: tiny Shakespeare as bytes; replica d of dp keeps its rows of the same global batch
B = args.batch // dp
data = CharCorpus(cfg.block_size, B, seed=0, rank=dp_rank, world_size=dp)
loader = gobrrr.Prefetcher(data.batches(0, args.steps), device=rank.device)  # on a CPU batches pass through

for step, (x, y) in enumerate(loader, start=1):
    logits, loss = model(x, y)   # logits (B, T, V/tp): no rank ever holds the whole vocabulary's
    loss.backward()              # f and g (or SP's all-gather / reduce-scatter) in reverse; ddp over dp
    clip_grad_norm_(model, 1.0)  # the whole model's norm: sharded squares summed over tp, replicated once
    opt.step()
    opt.zero_grad()
    mean = loss.detach().float()  # the same on the tp ranks of a replica; averaged over the replicas
    gobrrr.comm.all_reduce(mean, "avg", group=mesh["dp"].get_group())
    gobrrr.comm.print0(f"step {step} loss {mean.item():.6f}")  # sync: reading the loss to print it

# -- what one step sends: every collective of forward and backward, its tensor, the bytes per rank
if args.tp > 1:
    gobrrr.comm.print0(format_plan(comm_plan(model.module, B, cfg.block_size), n=args.tp))
del model, opt, loader, mesh   # the groups' last references go while the interpreter is whole, not in its teardown
gc.collect()
gobrrr.comm.shutdown()
