import string

import torch
import torch.nn.functional as F

all_characters = string.printable


def char_tensor(s):
    tensor = torch.zeros(len(s)).long()
    for c in range(len(s)):
        tensor[c] = all_characters.index(s[c])
    return tensor


def generate(decoder, prime_str="A", predict_len=100, temperature=0.8, device="cuda"):
    hidden = decoder.init_hidden(1).to(device)
    prime_input = char_tensor(prime_str).unsqueeze(0).to(device)
    predicted = prime_str
    for p in range(len(prime_str) - 1):
        _, hidden = decoder(prime_input[:, p], hidden)
    inp = prime_input[:, -1]
    for p in range(predict_len):
        output, hidden = decoder(inp, hidden)
        output_dist = output.data.view(-1).div(temperature).exp()
        top_i = torch.multinomial(output_dist, 1)[0].item()  # expect: GB002
        predicted += all_characters[top_i]
        inp = torch.Tensor([[top_i]]).long().to(device)  # expect: GB001
    return predicted


@torch.no_grad()
def sample(model, start_ids, max_new_tokens, eos_id, device, temperature=1.0, top_k=None):
    model.eval()
    idx = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]
    for _ in range(max_new_tokens):
        logits, _ = model(idx)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")  # expect: GB011
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1)
        if idx_next.item() == eos_id:  # expect: GB002
            break
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


@torch.no_grad()
def greedy_decode(model, src, max_len, start_symbol, device):
    memory = model.encode(src.to(device))
    ys = torch.ones(1, 1).fill_(start_symbol).type(torch.long).to(device)
    for i in range(max_len - 1):
        out = model.decode(memory, ys)
        prob = model.generator(out[:, -1])
        _, next_word = torch.max(prob, dim=1)
        next_word = next_word.item()  # expect: GB002
        ys = torch.cat([ys, torch.ones(1, 1).type_as(src.data).fill_(next_word).to(device)], dim=1)  # expect: GB001
    return ys
