"""gobrrr lint, issue 29's round on heldout51's misses and false findings (motion-diffusion-model, DeNA-YOLOv3,
ChatGLM-6B, sweetice-DRL): each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.placed import own_program
from gobrrr.lint.source import parse
from tests.lintcase import project_rules as _lint


def test_a_script_that_is_its_own_program_is_not_taken_for_the_gpu_by_its_neighbours():
    """sweetice's and Popular-RL-Algorithms' folders of scripts: a script that runs as its own program
    (`if __name__ == "__main__":`) and never names a device trains on the CPU, even though other scripts of the
    project use the GPU; before, any file of a GPU project that trains was taken for GPU code (for
    decision-transformer's trainer module, which its script hands a CUDA model), and these scripts' distribution
    checks, `.item()` reads and env steps were reported (84 false findings in the two projects). A module without
    the guard keeps the old reading."""
    script = parse(Path("dqn.py"), textwrap.dedent("""
        import torch

        def main():
            pass

        if __name__ == "__main__":
            main()
        """))
    module = parse(Path("trainer.py"), "import torch\n\nclass Trainer:\n    pass\n")
    assert own_program(script) and not own_program(module)


def test_an_element_written_into_a_cast_tensor_with_host_scalar_indices(tmp_path):
    """DeNA's YOLOv3 assigns targets one element at a time: `obj_mask[b, a, j, i] = 1` into a tensor made by
    `torch.ones(b, n, h, w).type(dtype)`, with `a`, `i`, `j` taken from host tensors. Each write copies a CPU scalar
    into the device tensor, blocking. A slice write (`tgt[b, a, j, i, :] = 1`) is a fill and stays quiet."""
    found = {line: rule for file, line, rule in _lint(tmp_path, {"yolo.py": """
        import torch

        def build(labels, fsize, best_n, truth_i):
            obj_mask = torch.ones(4, 3, fsize, fsize).type(torch.cuda.FloatTensor)
            tgt = torch.zeros(4, 3, fsize, fsize, 4).type(torch.cuda.FloatTensor)
            for b in range(4):
                for ti in range(best_n.shape[0]):
                    a = best_n[ti]
                    i = truth_i[ti]
                    obj_mask[b, a, i, i] = 1
                    tgt[b, a, i, i, :] = 1
            return obj_mask

        def train(model, loader, opt):
            for x, labels in loader:
                out = model(x.cuda(non_blocking=True))
                m = build(labels, 13, labels[:, 1].long(), labels[:, 0].long())
                loss = (out * m).sum()
                loss.backward()
                opt.step()
        """}) if file == "yolo.py"}
    assert found.get(11) == "GB010" and 12 not in found, found


def test_clip_tokenize_makes_host_token_ids(tmp_path):
    """`clip.tokenize(texts).to(device)` in a text encoder's forward (MDM's): the ids are made on the host and
    copied up, blocking, every step."""
    found = _lint(tmp_path, {"mdm.py": """
        import clip
        import torch

        class MDM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.clip_model = clip.load("ViT-B/32", device="cuda")[0]

            def forward(self, x, texts):
                ids = clip.tokenize(texts, truncate=True).to(x.device)
                return x + self.clip_model.encode_text(ids).float().mean()
        """})
    assert ("mdm.py", 11, "GB010") in found or ("mdm.py", 11, "GB001") in found, found
