import torch


@torch.inference_mode()
def predict(model, texts, tokenizer, device, batch_size=32):
    model.eval()
    results, scores = [], []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True).to(device)  # expect: GB009 (a pageable copy per batch of prompts)
        logits = model(**enc).logits
        probs = logits.softmax(-1)
        results.extend(probs.argmax(-1).tolist())  # expect: GB002
        scores.append(probs.max(-1).values)
    return results, torch.cat(scores).cpu()


@torch.inference_mode()
def embed(encoder, loader, device):
    out = []
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        emb = encoder(**batch).last_hidden_state[:, 0]
        out.append(emb.float().cpu())  # expect: GB002
    return torch.cat(out)
