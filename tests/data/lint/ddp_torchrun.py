import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(ds, Net, epochs=10):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = Net().cuda(local_rank)
    ddp_model = DDP(model, device_ids=[local_rank])
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=4)  # expect: GB006
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x = x.cuda(local_rank)  # expect: GB009
            y = y.cuda(local_rank)  # expect: GB009
            out = ddp_model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if local_rank == 0:
            print(f"epoch {epoch} loss {loss.item()}")
        dist.barrier()
    dist.destroy_process_group()
