"""gobrrr lint, issue 29's round 65 on heldout86-87's first sights (DB): false findings kept quiet, each beside the
neighbour that must still report."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_tensor_conversion_is_not_the_projects_one_method_of_that_name(tmp_path):
    """DB's loss reads `loss.cpu().numpy()` and its data code defines one `Quad.numpy()`; the call of an object of
    unknown class was taken for that method, so Quad.numpy's body (host polygons) was reported as per-step code.
    A tensor's own conversions (`numpy`, `tolist`, `float`, `detach`, ...) pin no project method by name alone.
    The `.cpu()` itself still reports."""
    found = project_rules(tmp_path, {
        "quad.py": """
            import numpy as np
            import torch

            class Quad:
                def __init__(self, points):
                    self.points = torch.as_tensor(points)

                def to(self, device):
                    self.points = self.points.to(device)
                    return self

                def numpy(self):
                    return self.points.cpu().numpy()
            """,
        "train.py": """
            import torch
            from scipy.ndimage import gaussian_filter as blur

            def label(tensor_on_gpu):
                return tensor_on_gpu.cpu().detach().numpy()

            def train(model, loader, opt, log):
                for batch in loader:
                    out = model(batch['img'].cuda(non_blocking=True))
                    loss = out['loss'].mean()
                    loss.backward()
                    opt.step()
                    log.append(label(blur(out['maps'])))
            """})
    assert not any(name == "quad.py" for name, _, _ in found), found
    assert ("train.py", 6, "GB002") in found, found


def test_opencv_returns_host_data():
    """DB's representer scores each box with `cv2.mean(bitmap, mask)[0]` on the probability map it read back to
    numpy, then tests `if self.box_thresh > score: continue`: a Python float, no tensor. OpenCV calls return numpy
    arrays and tuples of floats. A comparison with a device tensor in the same loop still reports."""
    src = textwrap.dedent("""
        import cv2
        import numpy as np
        import torch

        class Representer:
            def box_score_fast(self, bitmap, box):
                mask = np.zeros(bitmap.shape[:2], dtype=np.uint8)
                cv2.fillPoly(mask, box.reshape(1, -1, 2).astype(np.int32), 1)
                return cv2.mean(bitmap, mask)[0]

            def represent(self, pred, boxes):
                kept = []
                for box in boxes:
                    score = self.box_score_fast(pred, box)
                    if self.box_thresh > score:
                        continue
                    if pred.max() > 0.5:
                        kept.append(box)
                return kept

        def evaluate(model, loader, rep):
            model.cuda()
            for batch in loader:
                pred = model(batch['img'].cuda(non_blocking=True))
                rep.represent(pred[0], batch['boxes'])
        """)
    found = rules(src)
    assert not any(line == line_of(src, "if self.box_thresh > score") for line, _ in found), found
    assert (line_of(src, "if pred.max() > 0.5"), "GB007") in found, found
