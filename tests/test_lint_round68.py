"""gobrrr lint, issue 29's round 68 on heldout110-111's first sights: a decoding `while` loop that runs the target
model itself is a step loop though it calls a drafting def with a loop of its own (TriForce's speculative decoding),
and the legacy CUDA type aliases of old RL code (`ByteTensor = torch.cuda.ByteTensor if cuda else ...`) make masks
and copies (the PyTorch DQN tutorial's `non_final_mask`, pytorch-maddpg)."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_a_speculative_decoding_loop_is_a_step_loop_around_its_drafting_loop():
    """TriForce's `while n < max_len:` calls `Middle_Spec(...)`, a def with a drafting loop of its own, then runs the
    target model on the drafted tokens and accepts them one by one (`if r < torch.min(...)`): each of its iterations
    is a decoding step, not an outer loop around one. A `while` loop around an epoch's def that runs no model itself
    stays an outer loop: its end-of-epoch read is not per step."""
    src = textwrap.dedent("""
        import torch

        def draft(model, tok, gamma):
            n = 0
            while n < gamma:
                tok = model(tok).argmax(-1)
                n += 1
            return tok

        def generate(draft_model, target_model, ids, max_len):
            n = 0
            while n < max_len:
                toks = draft(draft_model, ids, 4)
                logits = target_model(toks)
                r = torch.rand(1, device=logits.device)
                if r < logits[0, 0]:
                    n += 1
                ids = toks
            return ids

        def train_epoch(model, loader, opt):
            total = torch.zeros((), device="cuda")
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
                total += loss.detach()
            return total

        def fit(model, loader, opt, epochs):
            epoch = 0
            while epoch < epochs:
                total = train_epoch(model, loader, opt)
                print(total.item())
                epoch += 1
        """)
    found = rules(src, "decode.py")
    assert (line_of(src, "if r < logits[0, 0]"), "GB007") in found, found
    assert line_of(src, "print(total.item())") not in {line for line, _ in found}, found


def test_legacy_cuda_type_aliases_make_masks_and_copies():
    """`ByteTensor = torch.cuda.ByteTensor if use_cuda else torch.ByteTensor`, then `non_final_mask =
    ByteTensor(tuple(map(lambda s: s is not None, batch.next_state)))`: a host sequence of flags copied up,
    blocking, every update (GB010), and a mask, so `q[non_final_mask] = target(...)` waits for nonzero's count
    (GB008). `FloatTensor(n_actions)` of a count allocates, copies nothing."""
    src = textwrap.dedent("""
        import torch

        use_cuda = torch.cuda.is_available()
        FloatTensor = torch.cuda.FloatTensor if use_cuda else torch.FloatTensor
        ByteTensor = torch.cuda.ByteTensor if use_cuda else torch.ByteTensor

        def optimize(policy, target, memory, optimizer, steps, n_actions):
            for step in range(steps):
                batch = memory.sample(32)
                non_final_mask = ByteTensor(tuple(map(lambda s: s is not None, batch)))
                buf = FloatTensor(n_actions)
                q = torch.zeros(32).type(FloatTensor)
                q[non_final_mask] = target(q).max(1)[0]
                loss = (policy(q) - q).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        """)
    found = rules(src, "dqn.py")
    assert (line_of(src, "non_final_mask = ByteTensor("), "GB010") in found, found
    assert (line_of(src, "q[non_final_mask] ="), "GB008") in found, found
    assert line_of(src, "buf = FloatTensor(n_actions)") not in {line for line, _ in found}, found


def test_a_number_written_through_two_masks_goes_through_nonzero():
    """GPTQ's `dead = torch.diag(H) == 0; H[dead, dead] = 1`: torch sends a Python number through one mask as a
    masked_fill (index_put_'s fast path takes a single mask, any slices beside it), but two masks become indices,
    each a nonzero that reads its count back (aten's canDispatchToMaskedFill). `W[:, dead] = 0`, one mask after a
    slice, stays a masked_fill: quiet (QuaRot's and GPTQ's per-linear lines)."""
    src = textwrap.dedent("""
        import torch

        def quantize(layers, dev):
            for i in range(len(layers)):
                layer = layers[i].to(dev)
                W = layer.weight.data.clone()
                H = W.t() @ W
                dead = torch.diag(H) == 0
                H[dead, dead] = 1
                W[:, dead] = 0
                layers[i] = layer.cpu()
        """)
    found = rules(src, "gptq.py")
    assert (line_of(src, "H[dead, dead] = 1"), "GB008") in found, found
    assert line_of(src, "W[:, dead] = 0") not in {line for line, _ in found}, found


def test_a_loop_over_prompts_that_runs_a_sampler_is_a_step_loop():
    """txt2img's `for prompts in tqdm(data):` hands each batch of prompts to `sampler.sample(...)` (a def with the
    denoising loop), decodes the latents with the model and reads the images back: per batch work, though the loop
    calls a looping def. An MT-bench answer loop `for j in range(len(turns)):` picks `turns[j]` and copies its ids up
    for `model.eagenerate(...)`. A count around the same calls (`for n in trange(n_iter):`, an epoch) stays outer."""
    src = textwrap.dedent("""
        import torch
        from tqdm import tqdm, trange

        def sample(model, c, steps):
            x = torch.randn(4, 4, 8, 8, device="cuda")
            for t in range(steps):
                x = model(x, c)
            return x

        def txt2img(model, data, n_iter, steps):
            for n in trange(n_iter):
                for prompts in tqdm(data):
                    c = model.get_learned_conditioning(prompts)
                    z = sample(model, c, steps)
                    x = model.decode_first_stage(z)
                    images = x.cpu().numpy()

        def answer(model, tokenizer, question):
            turns = question["turns"]
            for j in range(len(turns)):
                ids = tokenizer([turns[j]]).input_ids
                torch.cuda.synchronize()
                out = model.eagenerate(torch.as_tensor(ids).cuda())
                torch.cuda.synchronize()

        def fit(model, loader, opt, epochs, steps):
            for epoch in range(epochs):
                for x in loader:
                    loss = model(x.cuda(non_blocking=True)).mean()
                    loss.backward()
                    opt.step()
                z = sample(model, None, steps)
                grid = model.decode_first_stage(z).cpu()
        """)
    found = {line for line, _ in rules(src, "txt2img.py")}
    assert line_of(src, "images = x.cpu().numpy()") in found, found
    assert line_of(src, "out = model.eagenerate(") in found, found
    assert line_of(src, "grid = model.decode_first_stage(z).cpu()") not in found, found


def test_a_while_loop_that_takes_next_batch_and_copies_it_up_is_a_step_loop():
    """guided-diffusion's `run_bpd_evaluation`: `while num_complete < num_samples: batch, kw = next(data); batch =
    batch.to(dev)`, then `diffusion.calc_bpd_loop(model, batch)` (a def with a loop over timesteps) and a `.item()`
    of the batch's bits per dim: each iteration takes and copies its own batch, so its reads repeat per batch."""
    src = textwrap.dedent("""
        import torch

        def calc_bpd_loop(model, x, T):
            out = []
            for t in range(T):
                out.append(model(x, t))
            return torch.stack(out)

        def run_bpd_evaluation(model, data, num_samples, dev, T):
            all_bpd = []
            num_complete = 0
            while num_complete < num_samples:
                batch, model_kwargs = next(data)
                batch = batch.to(dev)
                bpd = calc_bpd_loop(model, batch, T).mean()
                all_bpd.append(bpd.item())
                num_complete += batch.shape[0]
        """)
    found = {line for line, _ in rules(src, "image_nll.py")}
    assert line_of(src, "batch = batch.to(dev)") in found, found
    assert line_of(src, "all_bpd.append(bpd.item())") in found, found


def test_a_quantizer_pass_over_self_modules_is_layer_by_layer():
    """AutoAWQ's `for i in tqdm(range(len(self.modules))):` moves each decoder block up (`self.modules[i] =
    self.modules[i].to(best_device)`) and searches its scales: a layer-by-layer pass, the block move reported and
    the searches it calls per-layer code."""
    src = textwrap.dedent("""
        import torch
        from tqdm import tqdm

        class Quantizer:
            def quantize(self, dev):
                for i in tqdm(range(len(self.modules))):
                    self.modules[i] = self.modules[i].to(dev)
                    best = self.search(self.modules[i])
                    self.modules[i].cpu()

            def search(self, block):
                w = block.weight.data
                assert torch.isnan(w).sum() == 0
                return w.abs().amax()
        """)
    found = {line for line, _ in rules(src, "quantizer.py")}
    assert line_of(src, "self.modules[i] = self.modules[i].to(dev)") in found, found
    assert line_of(src, "assert torch.isnan(w).sum() == 0") in found, found


def test_a_bool_tensor_made_like_a_device_tensor_is_a_mask():
    """LLaDA's `transfer_index = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)`, filled per row, then
    `x[transfer_index] = x0[transfer_index]`: a device mask, so the read waits for nonzero's count every denoising
    step. One made like a host tensor stays on the host."""
    src = textwrap.dedent("""
        import torch

        def denoise(model, x, steps, host_ids):
            for i in range(steps):
                x0 = model(x).argmax(-1)
                transfer_index = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)
                x[transfer_index] = x0[transfer_index]
                keep = torch.zeros_like(host_ids, dtype=torch.bool)
                kept = host_ids[keep]
            return x
        """)
    found = {line for line, _ in rules(src, "generate.py")}
    assert line_of(src, "x[transfer_index] = x0[transfer_index]") in found, found
    assert line_of(src, "kept = host_ids[keep]") not in found, found


def test_an_item_copied_up_through_several_names_is_still_the_loops_own():
    """eval_reverse.py: `prompt, answer = prompts[index], answers[index]`, then `input_ids = tokenizer(prompt)[...]`
    and `torch.tensor(input_ids).to(device)`: the loop copies its own item up, through three names bound in
    order, and hands it to `generate` (a def with the denoising loop): a per-item step loop."""
    src = textwrap.dedent("""
        import torch
        import tqdm

        def generate(model, x, steps):
            for i in range(steps):
                x = model(x).argmax(-1)
            return x

        def main(model, tokenizer, prompts, answers, device):
            for index in tqdm.tqdm(range(len(prompts))):
                prompt, answer = prompts[index], answers[index]
                input_ids = tokenizer(prompt)["input_ids"]
                input_ids = torch.tensor(input_ids).to(device).unsqueeze(0)
                out = generate(model, input_ids, 8)
        """)
    found = {line for line, _ in rules(src, "eval_reverse.py")}
    assert line_of(src, "input_ids = torch.tensor(input_ids).to(device)") in found, found


def test_an_env_wrapper_that_returns_three_values_is_stepped_per_iteration():
    """Dreamer's and PlaNet's `Env.step` drops the info: `next_observation, reward, done = env.step(action[0].cpu())`
    inside `update_belief_and_act`, which the collection loop calls once per step with `observation.to(device)`:
    a host environment stepped every iteration (GB014 at the call), though the def also runs the planner's loop,
    and `D.append(observation, action.cpu(), ...)` in that loop reads the action back again. Three names from a
    receiver not named for an env stay quiet."""
    src = textwrap.dedent("""
        import torch

        def plan(transition_model, belief, iters):
            for i in range(iters):
                belief = transition_model(belief)
            return belief

        def update_belief_and_act(env, transition_model, observation):
            action = plan(transition_model, observation, 10)
            next_observation, reward, done = env.step(action[0].cpu())
            return action, next_observation, reward, done

        def collect(env, transition_model, D, steps, device):
            observation = env.reset()
            for t in range(steps):
                action, next_observation, reward, done = update_belief_and_act(env, transition_model,
                                                                               observation.to(device=device))
                D.append(observation, action.cpu(), reward, done)
                observation = next_observation

        def solve(solver, policy, steps):
            for t in range(steps):
                a, b, c = solver.step(t)
        """)
    found = rules(src, "main.py")
    assert (line_of(src, "action, next_observation, reward, done = update_belief_and_act("), "GB014") in found, found
    assert line_of(src, "D.append(observation, action.cpu()") in {line for line, _ in found}, found
    assert line_of(src, "a, b, c = solver.step(t)") not in {line for line, _ in found}, found


def test_a_functional_op_of_a_host_tensor_stays_on_the_host():
    """pytorch-segmentation's inference: `prediction = F.softmax(torch.from_numpy(prediction), dim=0).argmax(0)
    .cpu().numpy()` after the prediction was read back: softmax of a host tensor is a host tensor, and its `.cpu()`
    copies nothing. Softmax of the model's output is on the device."""
    src = textwrap.dedent("""
        import torch
        import torch.nn.functional as F

        def infer(model, images, device):
            for image in images:
                prediction = model(image.to(device))
                prediction = prediction.squeeze(0).cpu().numpy()
                prediction = F.softmax(torch.from_numpy(prediction), dim=0).argmax(0).cpu().numpy()
                probs = F.softmax(model(image.to(device)), dim=0).cpu()
        """)
    found = {line for line, _ in rules(src, "inference.py")}
    assert line_of(src, "F.softmax(torch.from_numpy(prediction)") not in found, found
    assert line_of(src, "probs = F.softmax(model(") in found, found


def test_a_non_blocking_read_back_is_queued_not_a_wait():
    """Megatron's router trace: `layer_indices.detach().to("cpu", torch.int32, non_blocking=True)` per layer: torch
    allocates the host copy in pinned memory and queues it (`_to_copy` pins the output of a non-blocking copy from
    the device), so the host does not wait there; a plain `.to("cpu")` does. A loop whose only copy goes to the host
    does not move its item up."""
    src = textwrap.dedent("""
        import torch

        def trace(model, loader, opt, records):
            for x in loader:
                loss, per_layer = model(x.cuda(non_blocking=True))
                loss.backward()
                opt.step()
                for i, layer_indices in enumerate(per_layer):
                    queued = layer_indices.detach().to("cpu", torch.int32, non_blocking=True)
                    records.append(queued)
                read = loss.detach().to("cpu")
        """)
    found = {line for line, _ in rules(src, "router_trace.py")}
    assert line_of(src, "queued = layer_indices") not in found, found
    assert line_of(src, 'read = loss.detach().to("cpu")') in found, found


def test_a_counter_named_i_that_picks_the_item_is_an_item_loop():
    """MAR's generation: `for i in range(num_steps):` slices `class_label_gen_world[... * i ...]`, copies the labels up
    and hands them to `sample_tokens`: the counter's name says nothing; what it indexes does. `for i in range(n):`
    around the same sampler with nothing picked stays outer."""
    src = textwrap.dedent("""
        import torch

        def sample_tokens(model, labels, steps):
            x = torch.zeros(4, 8, device="cuda")
            for t in range(steps):
                x = model(x, labels)
            return x

        def generate(model, vae, labels_all, num_steps, bsz, steps):
            for i in range(num_steps):
                labels = torch.Tensor(labels_all[bsz * i:bsz * (i + 1)]).long().cuda()
                images = vae.decode(sample_tokens(model, labels, steps))

        def warm(model, vae, labels, n, steps):
            for i in range(n):
                warm_images = vae.decode(sample_tokens(model, labels.cuda(), steps))
        """)
    found = {line for line, _ in rules(src, "engine_mar.py")}
    assert line_of(src, "labels = torch.Tensor(labels_all") in found, found
    assert line_of(src, "warm_images = vae.decode") not in found, found
