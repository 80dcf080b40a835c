"""gobrrr lint, issue 29's round on heldout32's PaLM-rlhf-pytorch: a Dataset whose `__getitem__` moves each sample
to the GPU (`return full_seq.cuda()`, `t[ind].to(self.device)`), which only a loader without workers can call, once
per sample. From a minimal example, beside the datasets that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

DATASET = """
import torch
from torch.utils.data import DataLoader, Dataset


class TextSamplerDataset(Dataset):
    def __init__(self, data, seq_len):
        self.data = data
        self.seq_len = seq_len

    def __getitem__(self, index):
        start = torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,))
        label = self.data[start].item()          # a host tensor: no sync
        full_seq = self.data[start: start + self.seq_len + 1].long()
        return full_seq.cuda()

    def __len__(self):
        return self.data.size(0) // self.seq_len
"""




def test_a_dataset_that_moves_its_sample_to_the_gpu_copies_per_sample():
    assert rules(DATASET) == [(line_of(DATASET, "full_seq.cuda()"), "GB010")]


def test_a_dataset_that_returns_host_samples_is_quiet():
    assert rules(DATASET.replace("return full_seq.cuda()", "return full_seq")) == []


def test_getitem_of_a_class_that_is_no_dataset_is_not_per_sample_code():
    assert rules(DATASET.replace("class TextSamplerDataset(Dataset):", "class TextSampler:")) == []
