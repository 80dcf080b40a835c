import torch
from tqdm import tqdm


def finetune(model, train_loader, optimizer, device, epochs=3):
    model.to(device)
    for epoch in range(epochs):
        model.train()
        pbar = tqdm(train_loader, desc=f"epoch {epoch}")
        for batch in pbar:
            input_ids = batch["input_ids"].to(device)  # expect: GB009
            labels = batch["labels"].to(device)  # expect: GB009
            out = model(input_ids=input_ids, labels=labels)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            pbar.set_postfix(loss=out.loss.item())  # expect: GB002


def finetune_iter(model, train_loader, optimizer, device, steps):
    train_iter = iter(train_loader)
    for step in range(steps):
        batch = next(train_iter)
        batch = {k: v.to(device) for k, v in batch.items()}  # expect: GB009
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
