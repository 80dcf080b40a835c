import math
import time

import torch
import torch.nn as nn


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def detach_hidden(h):
    if type(h) == torch.Tensor or isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(detach_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def evaluate(model, data_source, criterion, ntokens, bptt):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(10)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = detach_hidden(hidden)
            total_loss += len(data) * criterion(output.view(-1, ntokens), targets).item()  # expect: GB002
    return total_loss / (len(data_source) - 1)


def train(model, train_data, criterion, ntokens, lr, bptt, clip, epoch, log_interval=200):
    model.train()
    total_loss = 0.0
    start_time = time.time()
    hidden = model.init_hidden(train_data.size(1))
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        data, targets = get_batch(train_data, i, bptt)
        hidden = detach_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()  # expect: GB002
        if batch % log_interval == 0 and batch > 0:
            cur_loss = total_loss / log_interval
            elapsed = time.time() - start_time
            print(f"| epoch {epoch:3d} | ms/batch {elapsed * 1000 / log_interval:5.2f} | ppl {math.exp(cur_loss):8.2f}")
            total_loss = 0.0
            start_time = time.time()


def main(corpus, model, args, device):
    train_data = batchify(corpus.train, args.batch_size, device)
    val_data = batchify(corpus.valid, 10, device)
    criterion = nn.NLLLoss()
    ntokens = len(corpus.dictionary)
    lr, best_val_loss = args.lr, None
    for epoch in range(1, args.epochs + 1):
        train(model, train_data, criterion, ntokens, lr, args.bptt, args.clip, epoch)
        val_loss = evaluate(model, val_data, criterion, ntokens, args.bptt)
        if not best_val_loss or val_loss < best_val_loss:
            torch.save(model.state_dict(), args.save)
            best_val_loss = val_loss
        else:
            lr /= 4.0
