import time
from collections import OrderedDict

import torch

from . import utils


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device=torch.device("cuda"),
                    lr_scheduler=None, amp_autocast=None, loss_scaler=None, model_ema=None, mixup_fn=None):
    second_order = hasattr(optimizer, "is_second_order") and optimizer.is_second_order
    batch_time_m = utils.AverageMeter()
    data_time_m = utils.AverageMeter()
    losses_m = utils.AverageMeter()
    model.train()
    end = time.time()
    num_batches_per_epoch = len(loader)
    last_idx = num_batches_per_epoch - 1
    num_updates = epoch * num_batches_per_epoch
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        data_time_m.update(time.time() - end)
        if not args.prefetcher:
            input, target = input.to(device), target.to(device)  # expect: GB009
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        if not args.distributed:
            losses_m.update(loss.item(), input.size(0))  # expect: GB002
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters(),
                        create_graph=second_order)
        else:
            loss.backward(create_graph=second_order)
            optimizer.step()
        if model_ema is not None:
            model_ema.update(model)
        torch.cuda.synchronize()  # expect: GB004 (a stopwatch for batch_time: still a full stall every step)
        num_updates += 1
        batch_time_m.update(time.time() - end)
        if last_batch or batch_idx % args.log_interval == 0:
            lrl = [param_group["lr"] for param_group in optimizer.param_groups]
            lr = sum(lrl) / len(lrl)
            if args.distributed:
                reduced_loss = utils.reduce_tensor(loss.data, args.world_size)
                losses_m.update(reduced_loss.item(), input.size(0))
            print(f"Train: {epoch} [{batch_idx:>4d}/{len(loader)}] Loss: {losses_m.val:#.4g} LR: {lr:.3e}")
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)
        end = time.time()
    return OrderedDict([("loss", losses_m.avg)])


def validate(model, loader, loss_fn, args, device=torch.device("cuda"), amp_autocast=None):
    batch_time_m = utils.AverageMeter()
    losses_m = utils.AverageMeter()
    top1_m = utils.AverageMeter()
    model.eval()
    end = time.time()
    last_idx = len(loader) - 1
    with torch.no_grad():
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_idx
            if not args.prefetcher:
                input = input.to(device)  # expect: GB009
                target = target.to(device)  # expect: GB009
            with amp_autocast():
                output = model(input)
            loss = loss_fn(output, target)
            acc1, acc5 = utils.accuracy(output, target, topk=(1, 5))
            if args.distributed:
                reduced_loss = utils.reduce_tensor(loss.data, args.world_size)
                acc1 = utils.reduce_tensor(acc1, args.world_size)
            else:
                reduced_loss = loss.data
            torch.cuda.synchronize()  # expect: GB004
            losses_m.update(reduced_loss.item(), input.size(0))  # expect: GB002
            top1_m.update(acc1.item(), output.size(0))  # expect: GB002
            batch_time_m.update(time.time() - end)
            end = time.time()
            if last_batch or batch_idx % args.log_interval == 0:
                print(f"Test: [{batch_idx:>4d}/{last_idx}] Loss: {losses_m.val:>7.4f} Acc@1: {top1_m.val:>7.4f}")
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg)])
