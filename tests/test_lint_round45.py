"""gobrrr lint, issue 29's round on heldout43's misses (LightningDiT, FairMOT, LLaVA, SLM-Lab), and where a project
sits: each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

from pathlib import Path

from gobrrr.lint import lint_paths
from tests.lintcase import project_rules


def _lint(tmp_path: Path, files: dict[str, str], root: str = "proj") -> set[tuple[str, int, str]]:
    return set(project_rules(tmp_path, files, root))


_TIMED_STEP = """
    import torch

    def train(model, loader, opt):
        model.cuda()
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
    """


def test_a_project_folder_named_like_a_benchmark_is_not_one(tmp_path):
    """Whether a file is a benchmark (where synchronize() times the step) is read from its own name and the
    folders inside the project, not from the folders the project sits in: a user's `~/speedrun/train.py`."""
    assert ("train.py", 10, "GB004") in _lint(tmp_path, {"train.py": _TIMED_STEP}, root="speedrun")
    assert ("bench_step.py", 10, "GB004") not in _lint(tmp_path, {"bench_step.py": _TIMED_STEP}, root="other")


def test_the_project_root_is_the_folder_with_its_marker(tmp_path):
    """A checkout with `.git` (or pyproject.toml / setup.py) is the project: its benchmarks folder still makes a
    benchmark, and linting only that folder does not lose it; the folders above the checkout say nothing."""
    (tmp_path / "speedrun" / ".git").mkdir(parents=True)
    files = {"train.py": _TIMED_STEP, "benchmarks/step.py": _TIMED_STEP}
    found = _lint(tmp_path, files, root="speedrun")
    assert ("train.py", 10, "GB004") in found
    assert ("step.py", 10, "GB004") not in found
    assert not {f.line for f in lint_paths([tmp_path / "speedrun" / "benchmarks"]) if f.rule == "GB004"}


def test_a_copy_per_prompt_is_a_per_step_copy(tmp_path):
    """heldout43's readers (LLaVA's per-question evaluation, as trlx's and MOSS-RLHF's before) record the upload of
    each prompt in a generate() loop as a per-step blocking copy: it is reported like any other."""
    found = _lint(tmp_path, {"gen.py": """
        import torch

        def answer(model, tokenizer, questions):
            model.cuda()
            ids0 = torch.tensor([1, 2], device="cuda")
            for q in questions:
                ids = torch.tensor(tokenizer.encode(q), device="cuda")
                enc = tokenizer(q, return_tensors="pt").to("cuda")
                out = model.generate(ids, **enc)
                print(len(out))
        """})
    assert {("gen.py", 8, "GB010"), ("gen.py", 9, "GB009")} <= found
    assert not {f for f in found if f[1] == 6}   # once, before the loop


_LLAVA_LIKE = {
    "utils.py": """
        import torch

        def tokenize(prompt, tokenizer, return_tensors=None):
            chunks = [tokenizer(c).input_ids for c in prompt.split("<image>")]
            ids = []
            if len(chunks) > 0 and chunks[0][0] == tokenizer.bos_token_id:
                ids.append(chunks[0][0])
            if return_tensors is not None:
                if return_tensors == "pt":
                    return torch.tensor(ids, dtype=torch.long)
                raise ValueError(return_tensors)
            return ids

        def best_fit(size, options):
            w0, h0 = size
            for w, h in options:
                scale = min(w / w0, h / h0)
                if int(w0 * scale) > 3:
                    return w, h
            return options[0]
        """,
    "model.py": """
        from typing import List, Optional

        import torch
        from transformers import LlamaForCausalLM

        from utils import best_fit

        IMAGE = -200

        class Llava(LlamaForCausalLM):
            def prepare(self, input_ids, attention_mask, images, image_sizes=None):
                attention_mask = attention_mask.bool()
                input_ids = [ids[m] for ids, m in zip(input_ids, attention_mask)]
                feats = self.encode(images)
                out = []
                for i, ids in enumerate(input_ids):
                    grid = best_fit(image_sizes[i], self.config.grids)
                    n = (ids == IMAGE).sum()
                    for j in range(n + 1):
                        out.append(self.embed(ids[j:]) + feats[i].view(*grid, -1).mean())
                return out

            def forward(self, input_ids: torch.LongTensor = None, attention_mask: Optional[torch.Tensor] = None,
                        images: Optional[torch.FloatTensor] = None, image_sizes: Optional[List[List[int]]] = None):
                return super().forward(inputs_embeds=self.prepare(input_ids, attention_mask, images, image_sizes))

            @torch.no_grad()
            def generate(self, inputs: Optional[torch.Tensor] = None, images: Optional[torch.Tensor] = None,
                         image_sizes: Optional[torch.Tensor] = None, **kwargs):
                embeds = self.prepare(inputs, torch.ones_like(inputs), images, image_sizes=image_sizes)
                return super().generate(inputs_embeds=embeds, **kwargs)
        """,
    "eval.py": """
        import torch

        from utils import tokenize

        def evaluate(model, tokenizer, processor, questions, images):
            model.cuda()
            for q, image in zip(questions, images):
                ids = tokenize(q, tokenizer, return_tensors="pt").unsqueeze(0).cuda()
                pixels = processor(image, return_tensors="pt")["pixel_values"]
                out = model.generate(ids, images=pixels.half().cuda(), image_sizes=[image.size])
                print(tokenizer.decode(out[0]))
        """,
}


def test_a_transformers_model_forward_is_per_step_code(tmp_path):
    """A class built on a transformers model (`LlamaForCausalLM`) is a module: the Trainer runs its forward every
    step, and `torch.LongTensor` annotations are tensors. Its boolean-mask gathers and `range()` of a device count
    are found (LLaVA's multimodal input preparation)."""
    found = _lint(tmp_path, _LLAVA_LIKE)
    assert {("model.py", 14, "GB008"), ("model.py", 20, "GB002")} <= found


def test_sizes_the_callers_pass_as_python_numbers_stay_numbers(tmp_path):
    """generate() annotates `image_sizes` as a tensor, and every caller passes PIL sizes (`[image.size]`): the
    annotation is a guess that a call's list of numbers overrides, and a guess seeds no other def's walk. So the
    size arithmetic of `best_fit` is not taken for device reads; a tokenizer's ids are host data."""
    found = _lint(tmp_path, _LLAVA_LIKE)
    assert not {f for f in found if f[0] == "utils.py"}


def test_a_project_helper_returning_host_ids_or_a_list_returns_host_data(tmp_path):
    """`tokenize(q, tok, return_tensors="pt")` returns `torch.tensor(ids)` on the branch this call takes and the
    list on the one it never reaches: host data either way, so its `.cuda()` per question is a blocking copy; a
    `raise` in a branch the call never takes does not end the def."""
    found = _lint(tmp_path, _LLAVA_LIKE)
    assert ("eval.py", 11, "GB009") in found, found   # the image
    assert found & {("eval.py", 9, "GB010"), ("eval.py", 9, "GB009")}, found   # the prompt: host data, or (since
    # round 60) the host batch any call with return_tensors="pt" gives


def test_a_raise_in_a_branch_the_call_never_takes_does_not_end_the_def(tmp_path):
    """trl's `pad(tensors, side="left")`: the `else: raise` after `elif side == "right"` is dead for this call, so
    the def still returns its host tensor, and the `.to(device)` of it every step is a blocking copy."""
    found = _lint(tmp_path, {"pad.py": """
        import torch

        def pad(tensors, side="right"):
            out = torch.full((len(tensors), 8), 0, dtype=tensors[0].dtype, device=tensors[0].device)
            for i, t in enumerate(tensors):
                if side == "left":
                    start = 8 - t.shape[0]
                elif side == "right":
                    start = 0
                else:
                    raise ValueError(side)
                out[i, start:start + t.shape[0]] = t
            return out

        def train(model, opt, batches):
            model.cuda()
            for b in batches:
                ids = pad([torch.tensor(x) for x in b], side="left").to("cuda")
                model(ids).sum().backward()
                opt.step()
        """})
    assert ("pad.py", 19, "GB010") in found


def test_a_numpy_argument_overrides_a_tensor_annotation(tmp_path):
    """`_convert_to_karras(self, in_sigmas: torch.FloatTensor)` copied from diffusers is handed a numpy array:
    its `in_sigmas[-1].item()` reads numpy, not the device. Handed a device tensor, the same helper syncs."""
    source = """
        import numpy as np
        import torch

        def karras(in_sigmas: torch.FloatTensor, n) -> torch.FloatTensor:
            lo = in_sigmas[-1].item()
            hi = in_sigmas[0].item()
            return torch.linspace(hi, lo, n)

        def sample(model, x, n):
            model.cuda()
            for i in range(n):
                sigmas = SIGMAS
                s = karras(sigmas, n)
                x = model(x.cuda(), s.cuda())
            return x
        """
    quiet = _lint(tmp_path, {"k.py": source.replace("SIGMAS", "np.linspace(1.0, 0.01, n)")}, root="a")
    loud = _lint(tmp_path, {"k.py": source.replace("SIGMAS", "torch.linspace(1.0, 0.01, n, device='cuda')")}, root="b")
    assert not {f for f in quiet if f[1] in (6, 7)}
    assert {("k.py", 6, "GB002"), ("k.py", 7, "GB002")} <= loud
