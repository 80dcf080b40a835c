"""gobrrr lint, issue 29's round 81 on heldout193-200's first sights: detectors whose forward ends in a CPU
post-process and hands back numpy arrays (FreeYOLO, yolov2-yolov3: 65 false findings at first sight); loaders through a
generator, a None placeholder and a helper called per epoch (CoDi, PytorchSSD, Pyraformer); a host window two helpers
down (2DGS); a script reaching CUDA through its agent's networks (Actor-Critic-Methods-Paper-To-Code); a device element
as a slice bound (LoFTR); a distribution of numbers sampled in place (MaskGIT); a rasterizer as a module (3DGS); an
object handing itself to its evaluator (caser, SGL); with the neighbours each rule must keep quiet or keep reporting,
some of them from the corpus runs (SAC-Extensions, on-policy, quip-sharp, deep-text-recognition, XMem)."""
from __future__ import annotations

from textwrap import dedent

from tests.lintcase import line_of, project_rules, rules

EVAL_NUMPY = dedent("""
    import numpy as np
    import torch


    def evaluate(model, dataset, device):
        model.eval()
        for index in range(len(dataset)):
            img = dataset.pull_image(index)
            x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).to(device)
            bboxes, scores, labels = model(x)
            bboxes *= max(img.shape[0], img.shape[1])
            bboxes[..., [0, 2]] = np.clip(bboxes[..., [0, 2]], a_min=0., a_max=img.shape[1])
            for i, box in enumerate(bboxes):
                x1 = float(box[0])
                score = float(scores[i])
                label = int(labels[i])
""")


def test_outputs_handed_to_numpy_are_numpy_arrays():
    """FreeYOLO's evaluators and demo: `bboxes, scores, labels = model(x)`, then `np.clip(bboxes[..., [0, 2]], ...)`:
    numpy raises on a CUDA tensor, so the model's outputs are numpy arrays (its forward ends in `.cpu().numpy()` and
    a numpy NMS); `float(box[0])`, `int(labels[i])` read host values. The image's upload still counts."""
    found = rules(EVAL_NUMPY)
    for text in ("x1 = float(box[0])", "score = float(scores[i])", "label = int(labels[i])", "np.clip("):
        assert not [f for f in found if f[0] == line_of(EVAL_NUMPY, text)], (text, found)


def test_outputs_never_handed_to_numpy_stay_tensors():
    """The same loop without the numpy clip: a model's outputs are device tensors, and `float(scores[i])` reads
    one back per box."""
    src = "\n".join(t for t in EVAL_NUMPY.splitlines() if "np.clip" not in t)
    found = rules(src)
    assert (line_of(src, "score = float(scores[i])"), "GB002") in found, found


def test_a_name_rebound_from_a_readback_is_not_taken_for_numpy_before_it():
    """`out = model(x)`, then `out = out.cpu().numpy()` and `np.clip(out, ...)`: the name is bound twice from two
    different values, so the first binding keeps its tensor and the `.cpu()` stays a per-step readback."""
    src = dedent("""
        import numpy as np
        import torch


        def evaluate(model, loader):
            for x in loader:
                out = model(x.cuda())
                out = out.cpu().numpy()
                out = np.clip(out, 0, 1)
    """)
    found = rules(src)
    assert (line_of(src, "out = out.cpu().numpy()"), "GB002") in found, found


def test_the_same_unpacking_elsewhere_in_the_project_holds_numpy_too(tmp_path):
    """FreeYOLO's four other evaluators unpack `bboxes, scores, cls_inds = outputs` and only call float() on them;
    the COCO evaluator's np.clip says what that model call hands back, project-wide. yolov2-yolov3's evaluator
    scales them in place by a numpy array (`bboxes *= scale`), which a CUDA tensor would refuse."""
    coco = """
        import numpy as np


        def evaluate(model, dataset):
            for index in range(len(dataset)):
                x, w = dataset[index]
                outputs = model(x.cuda())
                bboxes, scores, cls_inds = outputs
                bboxes = np.clip(bboxes, 0., w)
    """
    mot = """
        import numpy as np


        def evaluate(model, dataset):
            for index in range(len(dataset)):
                x, w = dataset[index]
                outputs = model(x.cuda())
                bboxes, scores, cls_inds = outputs
                for i, box in enumerate(bboxes):
                    score = float(scores[i])
    """
    voc = """
        import numpy as np


        def evaluate(net, dataset):
            for index in range(len(dataset)):
                x, w, h = dataset[index]
                scale = np.array([[w, h, w, h]])
                boxes, probs, classes = net(x.cuda())
                boxes *= scale
                for i, box in enumerate(boxes):
                    p = float(probs[i])
    """
    found = project_rules(tmp_path, {"coco_eval.py": coco, "mot_eval.py": mot, "voc_eval.py": voc})
    assert not [f for f in found if f[0] == "mot_eval.py" and f[1] == line_of(dedent(mot), "float(scores[i])")], found
    assert not [f for f in found if f[0] == "voc_eval.py" and f[1] == line_of(dedent(voc), "float(probs[i])")], found


def test_a_generator_that_enumerates_a_loader_yields_its_batches(tmp_path):
    """CoDi: `def infiniteloop(dataloader): while True: for _, y in enumerate(dataloader): yield y`, then
    `next(datalooper).to(device)` every step: the batch of a loader made without pin_memory, a blocking copy."""
    utils = """
        def infiniteloop(dataloader):
            while True:
                for _, y in enumerate(dataloader):
                    yield y
    """
    main = """
        import torch
        from torch.utils.data import DataLoader
        from utils import infiniteloop


        def train(flags, data, model, optim, device):
            if flags.eval == False:
                looper = infiniteloop(DataLoader(data, batch_size=flags.batch_size))
                for step in range(flags.total_steps):
                    x_0 = next(looper).to(device).float()
                    loss = model(x_0).mean()
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
    """
    found = project_rules(tmp_path, {"utils.py": utils, "main.py": main})
    assert ("main.py", line_of(dedent(main), "next(looper).to(device)"), "GB009") in found, found


SSD_LOOP = dedent("""
    import torch
    from torch.utils import data


    def train(net, train_dataset, optimizer, criterion, args, max_iter, epoch_size):
        net.train()
        batch_iterator = None
        for iteration in range(max_iter):
            if iteration % epoch_size == 0:
                batch_iterator = iter(data.DataLoader(train_dataset, 32, shuffle=True, num_workers=4))
            images, targets = next(batch_iterator)
            if args.cuda:
                images = images.cuda()
                targets = [anno.cuda() for anno in targets]
            out = net(images)
            optimizer.zero_grad()
            loss = criterion(out, targets)
            loss.backward()
            optimizer.step()
""")


def test_a_name_that_starts_as_none_takes_what_the_branch_binds():
    """PytorchSSD: `batch_iterator = None` before the loop, `iter(DataLoader(...))` at each epoch's first iteration:
    None is a placeholder, so after the branch the name holds the loader, and the batches it gives are copied up
    from pageable memory every step."""
    found = rules(SSD_LOOP)
    assert (line_of(SSD_LOOP, "images = images.cuda()"), "GB009") in found, found
    assert (line_of(SSD_LOOP, "targets = [anno.cuda()"), "GB009") in found, found


def test_a_none_placeholder_filled_with_a_number_stays_a_number():
    """`best = None`, then `best = loss.item()` in a branch: after it the name is a number either way, and comparing
    it is no sync (the `.item()` itself is the one finding)."""
    src = dedent("""
        import torch


        def train(model, loader, optimizer):
            best = None
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if best is None or loss.item() < best:
                    best = loss.item()
                if best < 0.1:
                    break
    """)
    found = rules(src)
    assert not [f for f in found if f[0] == line_of(src, "if best < 0.1")], found


def test_loaders_a_helper_returns_in_the_epoch_loop_of_a_looping_def(tmp_path):
    """Pyraformer's single_step_main: `training_data, validation_data = prepare_dataloader(opt)` inside the epoch
    loop of train(), which calls the step loop's def: what the helper returns (loaders made without pin_memory) is
    learnt there as it is in set-up code, so `map(lambda x: x.to(opt.device).squeeze(0), batch)` copies a batch."""
    src = """
        import torch
        from torch.utils.data import DataLoader


        def prepare_dataloader(opt):
            train_set, test_set = opt.sets
            return DataLoader(train_set, batch_size=1), DataLoader(test_set, batch_size=1)


        def train_epoch(model, training_data, optimizer, opt):
            for batch in training_data:
                sequence, label = map(lambda x: x.to(opt.device).squeeze(0), batch)
                loss = model(sequence, label)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        def train(model, optimizer, opt):
            for epoch in range(opt.epoch):
                training_data, validation_data = prepare_dataloader(opt)
                train_epoch(model, training_data, optimizer, opt)
    """
    found = project_rules(tmp_path, {"single_step_main.py": src})
    assert ("single_step_main.py", line_of(dedent(src), "map(lambda x"), "GB009") in found, found


def test_a_host_table_made_two_helpers_down_is_known_in_hot_code(tmp_path):
    """2DGS's ssim: `window = create_window(11, c)` -> `gaussian(11, 1.5)` -> `torch.Tensor([...])`, then
    `window.cuda(img1.get_device())` every step. A summary of create_window made while summarising ssim stops one
    call short (depth 2) and is not reused when the hot walk of ssim asks at depth 1."""
    loss_utils = """
        import torch
        from torch.autograd import Variable
        from math import exp


        def gaussian(window_size, sigma):
            gauss = torch.Tensor([exp(-(x - window_size // 2) ** 2 / float(2 * sigma ** 2)) for x in range(window_size)])
            return gauss / gauss.sum()


        def create_window(window_size, channel):
            w1 = gaussian(window_size, 1.5).unsqueeze(1)
            w2 = w1.mm(w1.t()).float().unsqueeze(0).unsqueeze(0)
            return Variable(w2.expand(channel, 1, window_size, window_size).contiguous())


        def ssim(img1, img2, window_size=11):
            window = create_window(window_size, img1.size(-3))
            if img1.is_cuda:
                window = window.cuda(img1.get_device())
            return (img1 * window.sum() - img2).mean()
    """
    train = """
        import torch
        from loss_utils import ssim


        def train(model, loader, opt):
            for x, y in loader:
                out = model(x.cuda(non_blocking=True))
                loss = 1.0 - ssim(out, y.cuda(non_blocking=True))
                opt.zero_grad()
                loss.backward()
                opt.step()
    """
    found = project_rules(tmp_path, {"loss_utils.py": loss_utils, "train.py": train})
    assert ("loss_utils.py", line_of(dedent(loss_utils), "window = window.cuda("), "GB010") in found, found


def test_a_script_that_imports_an_agent_whose_networks_pick_cuda_runs_on_the_gpu(tmp_path):
    """Actor-Critic-Methods-Paper-To-Code's DDPG: main_ddpg.py names no device and imports ddpg_torch.py, which
    names none either (`self.actor.device`); its networks.py picks CUDA. The script's env loop is a GPU policy's
    round trip with a CPU environment (GB014), no longer held back as CPU-only code."""
    networks = """
        import torch as T
        import torch.nn as nn


        class ActorNetwork(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.fc = nn.Linear(n, 2)
                self.device = T.device('cuda:0' if T.cuda.is_available() else 'cpu')
                self.to(self.device)

            def forward(self, x):
                return T.tanh(self.fc(x))
    """
    agent = """
        import torch as T
        from networks import ActorNetwork


        class Agent:
            def __init__(self, n):
                self.actor = ActorNetwork(n)

            def choose_action(self, observation):
                state = T.tensor([observation], dtype=T.float).to(self.actor.device)
                mu = self.actor.forward(state)
                return mu.cpu().detach().numpy()[0]
    """
    main = """
        import gym
        from ddpg_torch import Agent

        if __name__ == '__main__':
            env = gym.make('LunarLanderContinuous-v2')
            agent = Agent(8)
            for i in range(1000):
                observation = env.reset()
                done = False
                while not done:
                    action = agent.choose_action(observation)
                    observation_, reward, done, info = env.step(action)
                    observation = observation_
    """
    found = project_rules(tmp_path, {"networks.py": networks, "ddpg_torch.py": agent, "main_ddpg.py": main})
    assert ("main_ddpg.py", line_of(dedent(main), "env.step(action)"), "GB014") in found, found


def test_a_script_whose_imports_never_reach_cuda_stays_on_the_cpu(tmp_path):
    """The same script beside a project whose agent module imports only a numpy helper: it trains on the CPU, and
    nothing is reported in its loop."""
    helper = """
        import numpy as np


        def noise(n):
            return np.random.normal(size=n)
    """
    agent = """
        import torch as T
        from helper import noise


        class Agent:
            def __init__(self, n):
                self.actor = T.nn.Linear(n, 2)

            def choose_action(self, observation):
                state = T.tensor([observation], dtype=T.float)
                return (self.actor(state) + T.tensor(noise(2))).detach().numpy()[0]
    """
    main = """
        import gym
        from agent import Agent

        if __name__ == '__main__':
            env = gym.make('LunarLanderContinuous-v2')
            agent = Agent(8)
            observation, done = env.reset(), False
            while not done:
                action = agent.choose_action(observation)
                observation, reward, done, info = env.step(action)
    """
    found = project_rules(tmp_path, {"helper.py": helper, "agent.py": agent, "main.py": main})
    assert not [f for f in found if f[0] == "main.py"], found


def test_an_element_of_a_device_tensor_less_a_width_as_a_slice_bound():
    """LoFTR's mask_border_with_padding: `for b_idx, (h0, w0) in enumerate(zip(h0s, w0s)): m[b_idx, h0 - bd:] = v`,
    h0s a device tensor of per-image heights: each bound is a 0-d tensor read with __index__, per image, per step.
    A product of two names (quip-sharp's `cb.codesz * (col - size)`) stays unread."""
    src = dedent("""
        import torch


        def mask_border(m, bd, v, p_m0):
            h0s, w0s = p_m0.sum(1).max(-1)[0].int(), p_m0.sum(-1).max(-1)[0].int()
            for b_idx, (h0, w0) in enumerate(zip(h0s, w0s)):
                m[b_idx, h0 - bd:] = v
                m[b_idx, :, w0 * bd:] = v


        def train(model, loader, opt):
            for x, m0 in loader:
                out = model(x.cuda(non_blocking=True))
                mask_border(out, 2, 0, m0.cuda(non_blocking=True))
                loss = out.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "m[b_idx, h0 - bd:] = v"), "GB002") in found, found
    assert not [f for f in found if f[0] == line_of(src, "m[b_idx, :, w0 * bd:] = v")], found


def test_a_render_function_that_runs_a_rasterizer_is_a_forward(tmp_path):
    """3DGS's render.py: `render(view, gaussians, pipe, bg)` builds `GaussianRasterizer(raster_settings=...)` (a
    third-party module) and runs it; a loop over the views that calls it is an inference loop, and reading each
    rendering back to the host in it repeats."""
    renderer = """
        import torch
        from diff_gaussian_rasterization import GaussianRasterizationSettings, GaussianRasterizer


        def render(view, pc, pipe, bg):
            settings = GaussianRasterizationSettings(image_height=view.h, image_width=view.w, bg=bg)
            rasterizer = GaussianRasterizer(raster_settings=settings)
            image, radii = rasterizer(means3D=pc.get_xyz, opacities=pc.get_opacity)
            return {"render": image, "radii": radii}
    """
    script = """
        import torch
        from gaussian_renderer import render


        def render_set(views, gaussians, pipeline, background):
            for idx, view in enumerate(views):
                rendering = render(view, gaussians, pipeline, background)["render"]
                image = rendering.cpu().numpy()


        def render_sets(scene, gaussians, pipeline, bg_color):
            background = torch.tensor(bg_color, dtype=torch.float32, device="cuda")
            render_set(scene.getTestCameras(), gaussians, pipeline, background)
    """
    found = project_rules(tmp_path, {"gaussian_renderer.py": renderer, "render.py": script})
    assert ("render.py", line_of(dedent(script), "image = rendering.cpu()"), "GB002") in found, found


def test_a_sample_of_a_distribution_of_numbers_made_in_place_is_drawn_on_the_host():
    """MaskGIT's mask_by_random_topk, every decoding step: `torch.distributions.gumbel.Gumbel(0, 1).sample(probs.shape)
    .to("cuda")` draws the noise on the CPU and copies it up; a distribution of device tensors samples there."""
    src = dedent("""
        import torch


        def decode(model, x, steps):
            for t in range(steps):
                probs = model(x).softmax(-1)
                noise = torch.distributions.gumbel.Gumbel(0, 1).sample(probs.shape).to("cuda")
                near = torch.distributions.Normal(probs, 1.0).sample()
                x = (torch.log(probs) + noise + near).argmax(-1)
    """)
    found = rules(src)
    assert (line_of(src, "Gumbel(0, 1)"), "GB010") in found, found
    assert not [f for f in found if f[0] == line_of(src, "near = ") and f[1] in ("GB001", "GB010")], found


def test_an_object_that_hands_itself_to_an_evaluator_is_followed_there(tmp_path):
    """caser's Recommender: `evaluate_ranking(self, test, train)` in a file that names no device; its loop calls
    `model.predict(user_id)`, whose user and item ids are copied up and whose scores are read back per user. The
    object (not a module: it holds one) moves its own work to the device, so the evaluator runs on the GPU."""
    evaluation = """
        import numpy as np


        def evaluate_ranking(model, test, k=10):
            hits = []
            for user_id, row in enumerate(test):
                predictions = -model.predict(user_id)
                hits.append(np.argsort(predictions)[:k])
            return hits
    """
    train = """
        import numpy as np
        import torch
        from evaluation import evaluate_ranking


        class Recommender:
            def __init__(self, net, device):
                self._net = net.to(device)
                self._device = device

            def fit(self, test, epochs):
                for epoch in range(epochs):
                    if (epoch + 1) % 10 == 0:
                        evaluate_ranking(self, test)

            def predict(self, user_id):
                user = torch.from_numpy(np.array([[user_id]])).long()
                out = self._net(user.to(self._device))
                return out.cpu().numpy().flatten()
    """
    found = project_rules(tmp_path, {"evaluation.py": evaluation, "train_caser.py": train})
    assert any(f[0] == "train_caser.py" and f[1] == line_of(dedent(train), "user.to(self._device)") for f in found), found
    assert ("train_caser.py", line_of(dedent(train), "out.cpu().numpy()"), "GB002") in found, found


def test_a_return_in_a_branch_the_call_never_takes_says_nothing():
    """XMem's aggregate(prob, dim, return_logits=False): `if return_logits: return logits, prob` else `return prob`.
    Called without the flag it returns one tensor, not a tuple: the mask it makes is a device tensor, and a list of
    positions indexing it copies the list up (a finding a summary that also counted the dead tuple lost)."""
    src = dedent("""
        import torch
        import torch.nn.functional as F


        def aggregate(prob, dim, return_logits=False):
            new_prob = torch.cat([torch.prod(1 - prob, dim=dim, keepdim=True), prob], dim).clamp(1e-7, 1 - 1e-7)
            logits = torch.log(new_prob / (1 - new_prob))
            prob = F.softmax(logits, dim=dim)
            if return_logits:
                return logits, prob
            else:
                return prob


        def run(model, loader, num_objects):
            for x in loader:
                prob = aggregate(model(x.cuda(non_blocking=True)), dim=0)
                others = [prob[[j for j in range(num_objects) if i != j]].sum(0) for i in range(num_objects)]
    """)
    found = rules(src)
    assert (line_of(src, "others = [prob[[j for j"), "GB011") in found, found


def test_an_element_of_a_parameter_tensor_is_no_evidence_for_a_slice_bound():
    """deep-text-recognition's decode(text_index, length): `for l in length: t = text_index[index:index + l]`, with
    `length` the CPU `torch.IntTensor` its callers pass; iterating a parameter is no device element."""
    src = dedent("""
        import torch


        def decode(text_index, length):
            texts, index = [], 0
            for l in length:
                t = text_index[index:index + l]
                texts.append(t)
                index += l
            return texts


        def evaluate(model, loader):
            for x, n in loader:
                preds = model(x.cuda(non_blocking=True)).argmax(2)
                decode(preds.view(-1), torch.IntTensor([preds.size(1)] * n).cuda())
    """)
    found = rules(src)
    assert not [f for f in found if f[0] == line_of(src, "t = text_index[index:index + l]")], found
