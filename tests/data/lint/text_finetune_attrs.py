"""Fine-tuning a text model from raw strings: the batch is tokenized inside the step loop, running
statistics live on `self`, and a second trainer lets accelerate place its batches."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer


class TextTrainer:
    def __init__(self, name, texts, labels, device="cuda"):
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.model = AutoModelForSequenceClassification.from_pretrained(name).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-5)
        self.texts, self.labels = texts, labels
        self.running = torch.zeros((), device=device)
        self.seen = 0

    def fit(self, batch_size=16):
        for start in range(0, len(self.texts), batch_size):
            chunk = self.texts[start:start + batch_size]
            enc = self.tokenizer(chunk, padding=True, truncation=True, return_tensors="pt").to(self.device)  # expect: GB009
            labels = torch.tensor(self.labels[start:start + batch_size], device=self.device)  # expect: GB010
            out = self.model(**enc, labels=labels)
            out.loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.running += out.loss.detach()
            self.seen += 1
            print(f"batch {self.seen}: running loss {self.running / self.seen:.4f}")  # expect: GB003

    @torch.no_grad()
    def answer(self, prompts):
        replies = []
        for p in prompts:
            enc = self.tokenizer(p, return_tensors="pt").to(self.device)  # expect: GB009 (a pageable copy per prompt)
            ids = self.model.generate(**enc, max_new_tokens=32)
            replies.append(self.tokenizer.decode(ids[0], skip_special_tokens=True))
        return replies


class AcceleratedTrainer:
    def __init__(self, model, dataset, lr=1e-4):
        self.accelerator = Accelerator()
        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def fit(self, steps):
        device = self.accelerator.device
        it = iter(self.loader)
        for _ in range(steps):
            batch = next(it).to(device)   # already on the device: accelerate moved it
            loss = self.model(batch)
            self.accelerator.backward(loss)
            self.opt.step()
            self.opt.zero_grad()
