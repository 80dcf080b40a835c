"""Sampling from a trained language model: a hand-written token loop with a None check, and a
script that calls generate() per prompt and decodes each finished sequence on the host."""
import torch
import torch.nn.functional as F


class TinyLM(torch.nn.Module):
    @torch.no_grad()
    def sample(self, idx, steps, temperature=1.0, stop_id=None):
        for _ in range(steps):
            logits, _ = self(idx[:, -self.block_size:])
            logits = logits[:, -1, :] / temperature
            probs = F.softmax(logits, dim=-1) if temperature > 0 else None
            assert probs != None, "greedy decoding is not supported here"
            nxt = torch.multinomial(probs, num_samples=1)
            if stop_id is not None and nxt.item() == stop_id:  # expect: GB002
                break
            idx = torch.cat((idx, nxt), dim=1)
        return idx


def main(model, encode, decode, prompts, device="cuda", n_new=200):
    model.eval().to(device)
    with torch.no_grad():
        for prompt in prompts:
            x = torch.tensor(encode(prompt), dtype=torch.long, device=device)[None, ...]  # expect: GB010 (a host list copied up per prompt)
            out = model.generate(x, n_new, temperature=0.8)
            print(decode(out[0].tolist()))
            print("-" * 40)
