"""gobrrr lint, issue 29's round 72 on heldout134-137's first sights (pix2pixHD, RAFT, monodepth2,
deep-text-recognition-benchmark; RepDistiller, SupContrast, swav, audioset_tagging_cnn; Federated-Learning-PyTorch,
MAML-Pytorch, continual-learning, voxceleb_trainer; DomainBed, DiffDock, st-gcn, tabnet), and the neighbours each
rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_device_scalar_indexing_a_python_list_is_read_with_index():
    """deep-text-recognition-benchmark's CTC decoding (`self.character[t[i]]`, `[self.character[i] for i in row]`)
    and st-gcn's demo (`self.label_name[label]` with `label = output.argmax(dim=0)`): a Python list takes the CUDA
    scalar through `__index__`, an `.item()`, once per character or per person. A dict keyed by a tensor hashes it
    (no read), a list indexed by a Python int reads nothing, and an item of an attribute of a tensor-like argument
    (trl's `for s, e in enc.offsets`, a tokenizer's offsets) is no evidence of a device scalar: quiet."""
    src = textwrap.dedent("""
        import torch


        class Converter:
            def __init__(self, character, label_file):
                dict_character = list(character)
                self.character = ['[blank]'] + dict_character
                with open(label_file) as f:
                    names = f.readlines()
                    names = [n.rstrip() for n in names]
                self.label_name = names
                self.colors = {"a": 1}

            def decode(self, text_index, encs):
                texts = []
                spans = [self.character[s] for s, e in encs.offsets]
                for t in text_index:
                    chars = [self.character[t[i]] for i in range(4)]
                    texts.append(''.join([self.character[i] for i in t]))
                return texts

            def label(self, output):
                label = output.sum(dim=1).argmax(dim=0)
                first = self.label_name[0]
                color = self.colors[label]
                return self.label_name[label], first, color


        def evaluate(model, loader, converter):
            model = model.cuda()
            for x, y in loader:
                preds = model(x.cuda(non_blocking=True))
                words = converter.decode(preds.argmax(2), preds)
                name = converter.label(preds)
    """)
    found = rules(src)
    for text in ("chars = [self.character[t[i]]", "texts.append(''.join([self.character[i]",
                 "return self.label_name[label]"):
        assert (line_of(src, text), "GB002") in found, text
    for text in ("first = self.label_name[0]", "color = self.colors[label]", "spans = [self.character[s]"):
        assert not [r for r in found if r[0] == line_of(src, text)], text


def test_a_list_of_class_lists_handed_to_a_method_indexes_from_the_host():
    """continual-learning's Task-IL heads: `active_classes = [list(range(k * i, k * (i + 1))) for i in range(n)]`,
    then `model.classify(x, allowed_classes=active_classes[-1])` and `scores[:, allowed_classes]` inside: one list of
    ints copied to the device per step. Handed a device tensor of classes instead, the index stays there: quiet."""
    src = textwrap.dedent("""
        import torch


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 10)

            def classify(self, x, allowed_classes=None):
                scores = self.fc(x)
                return scores if (allowed_classes is None) else scores[:, allowed_classes]


        def train(loader, opt, k, n):
            model = Net().cuda()
            active_classes = [list(range(k * i, k * (i + 1))) for i in range(n)]
            on_device = torch.arange(k, device="cuda")
            for x, y in loader:
                x = x.cuda(non_blocking=True)
                s = model.classify(x, allowed_classes=active_classes[-1])
                u = model.classify(x, allowed_classes=on_device)
                loss = s.sum() + u.sum()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "return scores if (allowed_classes is None)"), "GB011") in found
    on_device = src.replace("allowed_classes=active_classes[-1]", "allowed_classes=on_device")
    assert not [r for r in rules(on_device) if r[1] == "GB011"]


def test_a_project_datasets_items_are_host_samples(tmp_path):
    """RAFT's validation: `image1, image2, flow_gt, _ = val_dataset[val_id]` of `datasets.KITTI(...)`, a class of
    `FlowDataset(data.Dataset)`, then `image1[None].cuda()` per sample: a blocking copy of pageable host memory. A
    Dataset whose `__getitem__` moves its sample to the GPU hands out device tensors: quiet."""
    datasets = """
        import torch
        from torch.utils import data


        class FlowDataset(data.Dataset):
            def __getitem__(self, index):
                img = torch.rand(3, 8, 8)
                return img, img, torch.rand(2, 8, 8), torch.ones(8, 8)


        class KITTI(FlowDataset):
            pass
    """
    evaluate = """
        import torch
        import datasets


        def validate_kitti(model):
            val_dataset = datasets.KITTI()
            for val_id in range(len(val_dataset)):
                image1, image2, flow_gt, valid_gt = val_dataset[val_id]
                image1 = image1[None].cuda()
                image2 = image2[None].cuda()
                flow = model(image1, image2)
                print(flow.sum().item())
    """
    found = project_rules(tmp_path, {"datasets.py": datasets, "evaluate.py": evaluate})
    ev = textwrap.dedent(evaluate)
    assert ("evaluate.py", line_of(ev, "image1 = image1[None].cuda()"), "GB009") in found
    on_gpu = datasets.replace("img = torch.rand(3, 8, 8)", "img = torch.rand(3, 8, 8).cuda()")
    found = project_rules(tmp_path / "gpu", {"datasets.py": on_gpu, "evaluate.py": evaluate})
    assert ("evaluate.py", line_of(ev, "image1 = image1[None].cuda()"), "GB009") not in found


def test_a_transform_made_and_called_on_one_line_returns_a_host_tensor():
    """monodepth2's test_simple.py: `transforms.ToTensor()(input_image).unsqueeze(0)`, then `.to(device)` per image:
    a blocking copy of pageable memory, as when the transform is bound to a name first."""
    src = textwrap.dedent("""
        import torch
        from torchvision import transforms
        import PIL.Image as pil


        def main(paths, encoder, device):
            encoder.to(device)
            for idx, image_path in enumerate(paths):
                input_image = pil.open(image_path).convert('RGB')
                input_image = transforms.ToTensor()(input_image).unsqueeze(0)
                input_image = input_image.to(device)
                features = encoder(input_image)
    """)
    assert (line_of(src, "input_image = input_image.to(device)"), "GB010") in rules(src)


def test_an_evaluation_loop_that_copies_its_squeezed_episodes_is_a_step_loop(tmp_path):
    """MAML-Pytorch's miniImageNet evaluation: `for x_spt, y_spt in db_test:` copies `x_spt.squeeze(0).to(device)`
    itself and hands the episode to `maml.finetunning`, a def with a loop of its own: the episode loop is still a
    step loop (its copies repeat per episode, and so do finetunning's reads outside its inner loop); Omniglot's
    `db_train.next('test')` takes a batch like `next(it)`."""
    meta = """
        import torch


        class Meta(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 5)

            def forward(self, x, y):
                return (self.net(x).argmax(1) == y).sum()

            def finetunning(self, x, y):
                correct = torch.eq(self.net(x).argmax(1), y).sum().item()
                for k in range(3):
                    loss = self.net(x).sum()
                    grad = torch.autograd.grad(loss, self.net.parameters())
                return correct
    """
    train = """
        import torch
        from torch.utils.data import DataLoader
        from meta import Meta


        def main(mini, mini_test, device):
            maml = Meta().to(device)
            for epoch in range(10):
                db = DataLoader(mini, 4, shuffle=True, pin_memory=True)
                for step, (x_spt, y_spt) in enumerate(db):
                    x_spt, y_spt = x_spt.to(device, non_blocking=True), y_spt.to(device, non_blocking=True)
                    accs = maml(x_spt, y_spt)
                    if step % 500 == 0:
                        db_test = DataLoader(mini_test, 1, shuffle=True, pin_memory=True)
                        for x, y in db_test:
                            x, y = x.squeeze(0).to(device), y.squeeze(0).to(device)
                            acc = maml.finetunning(x, y)
    """
    found = project_rules(tmp_path, {"meta.py": meta, "train.py": train})
    tr, me = textwrap.dedent(train), textwrap.dedent(meta)
    assert ("train.py", line_of(tr, "x, y = x.squeeze(0).to(device)"), "GB009") in found
    assert ("meta.py", line_of(me, "correct = torch.eq("), "GB002") in found
    src = textwrap.dedent("""
        import torch


        def main(db_train, maml, device):
            maml = maml.to(device)
            for step in range(100):
                x, y = db_train.next()
                x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
                loss = maml(x, y)
                if step % 500 == 0:
                    for _ in range(10):
                        xt, yt = db_train.next('test')
                        xt, yt = torch.from_numpy(xt).to(device), torch.from_numpy(yt).to(device)
                        print(maml(xt, yt))
    """)
    assert (line_of(src, "xt, yt = torch.from_numpy(xt).to(device)"), "GB001") in rules(src)


def test_names_one_branch_unpacks_from_the_batch_are_that_iterations():
    """RepDistiller's loops: `if opt.distill in ['crd']: input, target, index, contrast_idx = data` and later
    `contrast_idx = contrast_idx.cuda()`: the batch's item each iteration, though the previous iteration left a
    device tensor in the name (the carried pass must not keep that)."""
    src = textwrap.dedent("""
        import torch


        def train(train_loader, model, opt, optimizer):
            model.cuda()
            for idx, data in enumerate(train_loader):
                if opt.distill in ['crd']:
                    input, target, index, contrast_idx = data
                else:
                    input, target, index = data
                contrast_idx = contrast_idx.cuda()
                input = input.cuda()
                loss = model(input, index, contrast_idx).sum()
                loss.backward()
                optimizer.step()
    """)
    assert (line_of(src, "contrast_idx = contrast_idx.cuda()"), "GB009") in rules(src)


def test_a_pinned_batch_written_into_a_device_slice_blocks():
    """SwAV's DeepCluster-v2 memory bank: `local_memory_index[start_idx : start_idx + bs] = idx` with `idx` from a
    pinned loader: a copy without non_blocking, blocking each step. A device value written there is no copy: quiet."""
    src = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader


        def train(dataset, model, optimizer, bs):
            loader = DataLoader(dataset, batch_size=bs, pin_memory=True)
            local_memory_index = torch.zeros(len(dataset)).long().cuda()
            start_idx = 0
            for it, (idx, inputs) in enumerate(loader):
                emb = model(inputs.cuda(non_blocking=True))
                emb.sum().backward()
                optimizer.step()
                local_memory_index[start_idx : start_idx + bs] = idx
                local_memory_index[start_idx : start_idx + bs] = emb.argmax(1)
                start_idx += bs
    """)
    found = rules(src)
    assert (line_of(src, "local_memory_index[start_idx : start_idx + bs] = idx"), "GB009") in found
    assert not [r for r in found if r[0] == line_of(src, "= emb.argmax(1)")]


def test_ints_unpacked_from_a_host_permutation_are_no_host_index():
    """DomainBed's ADRMX remix: `perm = torch.randperm(indices.numel())`, `idx1, idx2 = perm[:2]`, then
    `feat_combined[idx1]`: two 0-d CPU ints, which indexing takes as plain integers (a select, nothing copied up).
    A whole host permutation as the index is copied up: still flagged."""
    src = textwrap.dedent("""
        import torch


        def update(model, x, y, opt, num_classes):
            for step in range(100):
                feat = model(x)
                loss = feat.sum()
                for i in range(num_classes):
                    perm = torch.randperm(feat.shape[0])
                    idx1, idx2 = perm[:2]
                    loss = loss + feat[idx1].sum() + feat[idx2].sum()
                    rows = feat[perm]
                loss.backward()
                opt.step()
    """).replace("def update(model, x, y, opt, num_classes):", "def update(model, x, y, opt, num_classes):\n    x = x.cuda()")
    found = rules(src)
    assert not [r for r in found if r[0] == line_of(src, "loss = loss + feat[idx1]")]
    assert (line_of(src, "rows = feat[perm]"), "GB011") in found
