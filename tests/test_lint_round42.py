"""gobrrr lint, issue 29's round on what heldout40 and heldout41 missed at first sight: a detector's dict of device
tensors handed from module to module (OpenPCDet), host lists padded by a helper typed `list[torch.Tensor]` and then
moved (trl), and legacy typed CUDA constructors of host lists (gpt-neox). From minimal examples, beside the
neighbours that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

# a point-cloud head: its forward gets the detector's dict of device tensors (moved in place before the model ran)
HEAD = """
import torch


class PointHead(torch.nn.Module):
    def assign(self, points, gt_boxes, batch_size):
        bs_idx = points[:, 0]
        labels = points.new_zeros(points.shape[0])
        for k in range(batch_size):
            bs_mask = (bs_idx == k)
            points_single = points[bs_mask][:, 1:4]
            labels_single = labels.new_zeros(bs_mask.sum())
            labels[bs_mask] = labels_single
        return labels

    def voxel_rows(self, batch_dict):
        x = batch_dict['encoded_spconv_tensor']
        rows = []
        n = x.batch_size
        for bs_idx in range(n):
            rows.append(x.indices[:, 0] == bs_idx)
        return rows

    def forward(self, batch_dict):
        rows = self.voxel_rows(batch_dict)
        batch_size = batch_dict['batch_size']
        points = batch_dict['point_coords']
        batch_dict['labels'] = self.assign(points, batch_dict['gt_boxes'], batch_size)
        return batch_dict


head = PointHead().cuda()
"""


def test_a_forwards_dict_holds_device_tensors():
    """`forward(self, batch_dict)`: the dict the detector passes through its modules holds device tensors; the
    per-sample boolean mask made from one, and its `.sum()` as a size, wait for the GPU."""
    found = rules(HEAD)
    assert (line_of(HEAD, "points_single = points[bs_mask]"), "GB008") in found
    assert (line_of(HEAD, "labels.new_zeros(bs_mask.sum())"), "GB002") in found
    assert (line_of(HEAD, "labels[bs_mask] = labels_single"), "GB008") in found


def test_a_count_the_dict_carries_is_a_number():
    """`batch_dict['batch_size']`, or a sparse tensor's `x.batch_size`: a count beside the tensors, so `range(...)`
    of it reads nothing."""
    found = rules(HEAD)
    assert (line_of(HEAD, "for k in range(batch_size):"), "GB002") not in found
    assert (line_of(HEAD, "for bs_idx in range(n):"), "GB002") not in found


PAD = """
import numpy as np
import torch


def pad(tensors: list[torch.Tensor], padding_value: int = 0) -> torch.Tensor:
    shape = np.max([t.shape for t in tensors], 0).tolist()
    output = torch.full((len(tensors), *shape), padding_value, dtype=tensors[0].dtype, device=tensors[0].device)
    for i, t in enumerate(tensors):
        output[i, : t.shape[0]] = t
    return output


class Trainer:
    def generate_and_score(self, model, batch):
        device = self.accelerator.device
        ids_list = self.generate(batch)
        prompt_ids = [torch.tensor(ids) for ids in ids_list]
        prompt_ids = pad(prompt_ids, padding_value=0).to(device=device)
        return prompt_ids

    def train(self, model, loader, opt):
        for batch in loader:
            ids = self.generate_and_score(model, batch)
            loss = model(ids).mean()
            loss.backward()
            opt.step()
"""


def test_a_helper_pads_host_lists_on_the_host():
    """`pad(tensors: list[torch.Tensor])` handed CPU tensors builds its output on `tensors[0].device`, the host: moving
    the result is a blocking copy per step, and its own writes copy nothing to the GPU."""
    found = rules(PAD)
    assert (line_of(PAD, "prompt_ids = pad(prompt_ids"), "GB010") in found
    assert (line_of(PAD, "output[i, : t.shape[0]] = t"), "GB010") not in found


LEGACY = """
import torch


def train(model, loader, opt, n):
    for batch in loader:
        sizes = [len(x) for x in batch]
        sizes_cuda = torch.cuda.LongTensor(sizes)
        flag = torch.cuda.ByteTensor([1])
        scratch = torch.cuda.FloatTensor(n)
        grid = torch.cuda.FloatTensor(4, 3)
        loss = model(batch.cuda(non_blocking=True), sizes_cuda, flag, scratch, grid).mean()
        loss.backward()
        opt.step()
"""


def test_a_typed_cuda_constructor_copies_a_host_list():
    """`torch.cuda.LongTensor(sizes)`: the list is copied up, blocking; `torch.cuda.FloatTensor(n)` or `(4, 3)`
    only allocates."""
    found = rules(LEGACY)
    assert (line_of(LEGACY, "torch.cuda.LongTensor(sizes)"), "GB010") in found
    assert (line_of(LEGACY, "torch.cuda.ByteTensor([1])"), "GB010") in found
    assert (line_of(LEGACY, "torch.cuda.FloatTensor(n)"), "GB010") not in found
    assert (line_of(LEGACY, "torch.cuda.FloatTensor(4, 3)"), "GB010") not in found
