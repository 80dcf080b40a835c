"""ZeRO, as a script to copy (README: "ZeRO: shard optimizer state, gradients and parameters").

    torchrun --nproc-per-node 2 examples/zero.py                  # CPU: gloo; GPUs: NCCL, one GPU per rank
    torchrun --nproc-per-node 4 examples/zero.py --stage 3 --bf16  # bf16 compute, fp32 master weights
    python examples/zero.py                                        # one process: the same losses

Each rank keeps 1/N of the optimizer state (stage 1), of the gradients (2) and of the parameters (3)
(Rajbhandari et al. 2020); the training itself is unchanged. The global batch is the same at every
world size (rank r takes its rows of it), so every line `step N loss L` is the same whether one
process or eight print it: the loss printed is the mean over ranks, which is the global batch's loss.
At the end each rank's bytes held are printed beside the stage's formula.
"""
import argparse

import torch

import gobrrr
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.parallel import memory_report, zero
from gobrrr.train.data import CharCorpus

p = argparse.ArgumentParser(description="train the reference GPT with ZeRO over the ranks torchrun starts")
p.add_argument("--stage", type=int, default=2, choices=(1, 2, 3), help="1: optimizer state, 2: + gradients, 3: + parameters")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=8, help="global batch, in sequences (split evenly over the ranks)")
p.add_argument("--model", default="tiny", help="tiny | small | 124m (gobrrr/models/gpt.py)")
p.add_argument("--bf16", action="store_true", help="bf16 parameters and gradients, fp32 master weights and Adam")
args = p.parse_args()

# -- ranks: torchrun's environment -> a process group (NCCL on GPUs, gloo on CPU), a device, the same seed everywhere
rank = gobrrr.comm.init()
if args.batch % rank.world_size:
    raise SystemExit(f"zero.py: --batch {args.batch} does not split over {rank.world_size} ranks; pass a multiple of it")

# -- the model, then ZeRO around it and its optimizer (the optimizer now steps this rank's fp32 shard)
cfg = GPTConfig.from_name(args.model)
model = GPT(cfg).to(rank.device)  # the same seed on every rank: the same initial weights
model, opt = zero(model, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1), stage=args.stage,
                  param_dtype=torch.bfloat16 if args.bf16 else None)

# -- data: tiny Shakespeare as bytes; batch i is the same global batch at every world size, rank r keeps its rows
data = CharCorpus(cfg.block_size, args.batch // rank.world_size, seed=0, rank=rank.rank, world_size=rank.world_size)
loader = gobrrr.Prefetcher(data.batches(0, args.steps), device=rank.device)  # on a CPU batches pass through

for step, (x, y) in enumerate(loader, start=1):
    _, loss = model(x, y)      # stage 3: each block's parameters are gathered just before it runs
    loss.backward()            # gradients are reduce-scattered bucket by bucket while backward runs
    opt.clip_grad_norm_(1.0)   # the global norm: each rank's shard squared, one all-reduce of a scalar
    opt.step()                 # AdamW on my shard, then the updated shards are all-gathered (stages 1-2)
    if step == args.steps:     # parameters, gradients and Adam state all exist now: count them
        report = memory_report(model)
    opt.zero_grad()
    mean = loss.detach().float()
    gobrrr.comm.all_reduce(mean, "avg")
    gobrrr.comm.print0(f"step {step} loss {mean.item():.6f}")  # sync: reading the loss to print it

# -- what each rank held after its last step, beside the stage's formula (psi = trainable parameters, N = ranks)
for r in range(rank.world_size):  # in rank order, one rank at a time
    if r == rank.rank:
        print(f"[rank {r}] " + str(report).replace("\n", f"\n[rank {r}] "), flush=True)
    gobrrr.comm.barrier()
gobrrr.comm.shutdown()
