"""gobrrr lint, issue 29's round 60 on the corpus's largest remaining misses (DN-DETR): each firing test beside
the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_an_empty_placeholder_an_if_fills_holds_what_the_if_bound():
    """DN-DETR's denoising queries: `map_known_indice = torch.tensor([]).to('cuda')`, then `if len(known_num):`
    rebinds it to a CPU index built with `torch.cat([torch.tensor(range(num)) ...])`, and the next lines index
    device queries with it. After the if the name was taken for the placeholder's device tensor, so the host index
    copied up every step went unreported. An empty placeholder is no value: after an if that fills it, the name
    holds what the if bound. A name whose earlier value is real keeps the usual merge (the device way)."""
    src = textwrap.dedent("""
        import torch

        def prepare_for_dn(known_num, known_bid, queries, embed, scalar, pad):
            map_known_indice = torch.tensor([]).to('cuda')
            if len(known_num):
                map_known_indice = torch.cat([torch.tensor(range(num)) for num in known_num])
                map_known_indice = torch.cat([map_known_indice + pad * i for i in range(scalar)]).long()
            if len(known_bid):
                queries[(known_bid.long(), map_known_indice)] = embed
            order = torch.arange(4, device='cuda')
            if scalar > 1:
                order = torch.arange(4)
            queries[order] = embed
            return queries

        def train(model, loader, opt):
            model.cuda()
            for x, y in loader:
                x = x.cuda(non_blocking=True)
                out = model(x)
                q = torch.zeros(4, 8, device='cuda')
                prepare_for_dn([2, 2], torch.arange(4, device='cuda'), q, out, 2, 3)
                loss = (model(x) - q.sum()).pow(2).mean()
                loss.backward()
                opt.step()
        """)
    found = rules(src, "dn_components.py")
    assert (line_of(src, "queries[(known_bid.long(), map_known_indice)]"), "GB011") in found, found
    assert (line_of(src, "queries[order] = embed"), "GB011") not in found, found
    assert (line_of(src, "map_known_indice = torch.tensor([])"), "GB001") not in found, found


def test_a_file_whose_coding_cookie_names_a_codec_python_lacks_is_still_checked(tmp_path):
    """pomdp-baselines starts each file with `# -*- coding: future_fstrings -*-` (a codec the future-fstrings
    package registers on Python 2 and 3.5 to allow f-strings). tokenize.open refuses the unknown codec, so the
    lint checked none of those files and reported each as unreadable: its learner and policies went unread. Such a
    file is UTF-8 text; it is read as that and checked."""
    from gobrrr.lint.check import lint_paths

    f = tmp_path / "learner.py"
    f.write_text(textwrap.dedent("""\
        # -*- coding: future_fstrings -*-
        import torch

        def train(model, loader, opt):
            model.cuda()
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).sum()
                loss.backward()
                opt.step()
                print(f"loss {loss.item()}")
        """))
    errors: list[str] = []
    found = [(x.line, x.rule) for x in lint_paths([f], errors=errors)]
    assert errors == [], errors
    assert (10, "GB002") in found, found


def test_a_factory_handed_only_splatted_arguments_then_moved_is_built_on_the_host():
    """pomdp-baselines' (and rlkit's) `ptu` helpers: `def zeros(*sizes, **kwargs): return torch.zeros(*sizes,
    **kwargs).to(device)`, called per update to pad every sequence batch. A device could hide in kwargs, so the
    factory was given no kind and the host build and copy went unreported. With no device= of its own and a move
    right after, it is built on the host: the move would be pointless otherwise. A factory given its device stays
    quiet."""
    src = textwrap.dedent("""
        import torch

        device = torch.device("cuda")

        def zeros(*sizes, **kwargs):
            return torch.zeros(*sizes, **kwargs).to(device)

        def ones(*sizes, **kwargs):
            return torch.ones(*sizes, device=device, **kwargs)

        def update(model, batches, opt):
            model.to(device)
            for obs, act in batches:
                pad = zeros((1, act.shape[1], 1))
                one = ones((1, act.shape[1], 1))
                loss = (model(obs.to(device, non_blocking=True)) + pad.sum() + one.sum()).mean()
                loss.backward()
                opt.step()
        """)
    found = rules(src, "pytorch_utils.py")
    assert (line_of(src, "return torch.zeros(*sizes"), "GB001") in found, found
    assert not any(line == line_of(src, "return torch.ones(*sizes") for line, _ in found), found


def test_a_branch_every_batch_size_samples_runs_the_batch_it_gathered():
    """LMFlow's RAFT aligner walks the prompts one by one and, `if (i + 1) % infer_batch_size == 0`, tokenizes the
    gathered prompts, copies them up and generates. A modulo test read as a logging interval made that branch
    rare; a modulo by a batch size is the batch's own step. A branch every `log_every` samples stays rare."""
    src = textwrap.dedent("""
        import torch

        def collect(model, tokenizer, querys, training_args, infer_batch_size, log_every):
            model.to(training_args.device)
            input_texts = []
            for i, query in enumerate(querys):
                input_texts.append(query)
                if (i + 1) % infer_batch_size == 0 or i + 1 == len(querys):
                    inputs = tokenizer(input_texts, return_tensors="pt", padding=True).to(training_args.device)
                    with torch.no_grad():
                        outputs = model.generate(**inputs)
                    input_texts = []
                if (i + 1) % log_every == 0:
                    print(outputs.float().mean().item())
        """)
    found = rules(src, "raft_aligner.py")
    assert (line_of(src, "inputs = tokenizer(input_texts"), "GB009") in found, found
    assert not any(line == line_of(src, "print(outputs.float()") for line, _ in found), found


def test_a_wrapper_call_with_return_tensors_pt_gives_a_host_batch():
    """LMFlow's pipelines tokenize through the model wrapper: `model.encode(input, return_tensors="pt")
    .to(device=self.local_rank)` per evaluation batch. Only a receiver named like a tokenizer made a host batch, so
    a `model` receiver was taken for the device model and the copy went unreported. Only a tokenizer or a wrapper of
    one takes `return_tensors="pt"`: its result is a fresh host batch."""
    src = textwrap.dedent("""
        import torch

        class Evaluator:
            def evaluate(self, model, dataloader):
                model.get_backend_model().to(self.local_rank)
                for batch in dataloader:
                    inputs = model.encode(batch["input"], return_tensors="pt", padding=True).to(device=self.local_rank)
                    out = model.inference(inputs)
                    self.scores.append(out)
        """)
    found = rules(src, "evaluator.py")
    assert (line_of(src, "inputs = model.encode("), "GB009") in found, found


def test_a_loop_that_copies_up_a_prompt_and_generates_is_a_step_loop_though_it_calls_a_looping_def():
    """RAFT's local collection: per prompt, tokenize K copies, copy them up, `model.generate(**inputs)`, then score
    the texts with `reward_model.inference(dataset)`, a def that loops over its own batches. Calling a looping def
    made the prompt loop an outer loop and its copy went unreported. A loop that copies up a prompt and generates
    from it runs the model per iteration: a step loop. An epoch loop that holds the batch loop itself and samples
    once at its end stays an outer loop."""
    src = textwrap.dedent("""
        import torch

        class RewardModel:
            def inference(self, texts):
                scores = []
                for batch in self.batches(texts):
                    scores.append(self.model(batch.to(self.device, non_blocking=True)))
                return scores

        def collect(model, reward_model, tokenizer, querys, K, training_args):
            model.to(training_args.device)
            for query in querys:
                input_texts = [query for _ in range(K)]
                inputs = tokenizer(input_texts, return_tensors="pt", padding=True).to(training_args.device)
                with torch.no_grad():
                    outputs = model.generate(**inputs)
                texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
                rewards = reward_model.inference(texts)

        def train(model, loader, opt, tokenizer, prompt):
            model.cuda()
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))
                    loss.backward()
                    opt.step()
                ids = tokenizer(prompt, return_tensors="pt").input_ids.cuda()
                print(tokenizer.decode(model.generate(ids)[0].tolist()))
        """)
    found = rules(src, "raft_aligner.py")
    assert (line_of(src, "inputs = tokenizer(input_texts"), "GB009") in found, found
    assert not any(line in (line_of(src, "ids = tokenizer(prompt"), line_of(src, "print(tokenizer.decode("))
                   for line, _ in found), found
