"""gobrrr lint, issue 29's round 59 on heldout70's first sight (ASFF): the firing test beside the neighbour that
must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_a_tensor_made_by_a_name_bound_to_a_cuda_tensor_type_is_on_the_device():
    """ASFF's YOLOv3 head: `dtype = torch.cuda.FloatTensor if xin.is_cuda else torch.FloatTensor`, then
    `w_anchors = dtype(np.broadcast_to(...))` per forward. The call was read as host data, so each in-place
    `anchors[..., 2] *= w_anchors` and each write of its rows into a device tensor was reported as a host-to-device
    copy (12 false findings), while the upload itself went unreported. The upload is the copy; what it made is on
    the device."""
    src = textwrap.dedent("""
        import numpy as np
        import torch
        from torch import nn

        class Head(nn.Module):
            def __init__(self, anchors):
                super().__init__()
                self.anchors = anchors

            def forward(self, xin, out):
                dtype = torch.cuda.FloatTensor if xin.is_cuda else torch.FloatTensor
                w_anchors = dtype(np.broadcast_to(self.anchors, out.shape[:4]))
                out[..., 2] *= w_anchors
                box = out.clone()
                box[..., 3] = w_anchors
                return box
        """)
    found = rules(src, "yolov3_head.py")
    assert (line_of(src, "w_anchors = dtype("), "GB010") in found, found
    assert not any(line in (line_of(src, "out[..., 2] *="), line_of(src, "box[..., 3] = ")) for line, _ in found), found
