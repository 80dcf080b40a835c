"""gobrrr lint, issue 29's round 77 on heldout154-157's first sights (AGCRN, GraphSAGE, PFRL, PyTorch Tabular;
Chinese-LLaMA-Alpaca, Plenoxels, TabSurvey, RIFE; Real-Time-Voice-Cloning, GIN, Spotlight, SCINet; WaveNet vocoder,
SimGNN, ngp_pl, tabular-dl-revisiting-models), and the neighbours each rule must keep quiet."""
from __future__ import annotations

from tests.lintcase import project_rules


def test_a_per_image_loop_calling_model_inference_is_a_step_loop(tmp_path):
    """RIFE's benchmark scripts: `for index in range(0, 100, 2):` copies two frames up with `.cuda()`, runs
    `model.inference(I0, I1)` and reads the prediction back, per image. Another script of the project defines its
    own `def inference(...)` that loops, but that name, like `evaluate` or `generate`, is every model's: the call
    does not make the benchmark loop an outer one. A loop calling the project's own looping def (`run_all()`) is."""
    found = project_rules(tmp_path, {
        "model.py": """
            import torch


            class Model:
                def __init__(self):
                    self.flownet = torch.nn.Conv2d(6, 3, 3).cuda()

                def inference(self, img0, img1):
                    return self.flownet(torch.cat((img0, img1), 1))
        """,
        "multi.py": """
            import torch
            from model import Model

            model = Model()


            def inference(I0, I1, n=2):
                frames = []
                for i in range(n):
                    frames.append(model.inference(I0, I1))
                    print(frames[-1].mean().item())
                return frames
        """,
        "bench.py": """
            import numpy as np
            import torch
            from model import Model

            model = Model()
            for index in range(0, 100, 2):
                frame = np.random.rand(3, 64, 64).astype("float32")
                I0 = torch.from_numpy(frame).cuda().unsqueeze(0)
                I1 = torch.from_numpy(frame).cuda().unsqueeze(0)
                pred = model.inference(I0, I1)
                out = pred[0].detach().cpu().numpy()
        """})
    lines = {(f, line) for f, line, _ in found}
    assert ("bench.py", 9) in lines and ("bench.py", 12) in lines, found   # the frames copied up, the output read
    assert ("multi.py", 12) in lines, found   # the looping def's own loop is still a step loop


def test_a_branch_for_a_missing_argument_does_not_run_when_a_call_hands_one(tmp_path):
    """WaveNet vocoder's `sequence_mask(lengths, max_len=x.size(-1))`: `if max_len is None: max_len =
    lengths.data.max()` does not run when the call hands a number, so `torch.arange(0, max_len)` reads no device
    scalar. A call that hands nothing still takes the branch."""
    mask = """
        import torch


        def sequence_mask(sequence_length, max_len=None):
            if max_len is None:
                max_len = sequence_length.data.max()
            seq_range = torch.arange(0, max_len, device=sequence_length.device)
            return seq_range.unsqueeze(0) < sequence_length.unsqueeze(1)


        def train(model, loader, opt):
            model.cuda()
            for x, lengths in loader:
                x, lengths = x.cuda(non_blocking=True), lengths.cuda(non_blocking=True)
                loss = (model(x) * sequence_mask(lengths, ARG)).sum()
                loss.backward()
                opt.step()
    """
    handed = project_rules(tmp_path / "a", {"train.py": mask.replace("ARG", "max_len=x.size(-1)")})
    assert not [f for f in handed if f[1] == 8], handed   # torch.arange(0, max_len): a Python int
    missing = project_rules(tmp_path / "b", {"train.py": mask.replace(", ARG", "")})
    assert ("train.py", 8, "GB002") in missing, missing


def test_a_cell_of_a_module_list_runs_with_what_its_caller_hands(tmp_path):
    """AGCRN: `self.dcrnn_cells = nn.ModuleList()`, `self.dcrnn_cells.append(AGCRNCell(...))`, then
    `state = self.dcrnn_cells[i](x[:, t], state, emb)` with the encoder's host-made initial state: the cell's
    `state = state.to(x.device)` copies it up in every layer of every step."""
    found = project_rules(tmp_path, {
        "cell.py": """
            import torch


            class AGCRNCell(torch.nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.lin = torch.nn.Linear(2 * dim, dim)

                def forward(self, x, state):
                    state = state.to(x.device)
                    return torch.tanh(self.lin(torch.cat((x, state), dim=-1)))

                def init_hidden_state(self, batch_size, dim):
                    return torch.zeros(batch_size, dim)
        """,
        "model.py": """
            import torch
            from cell import AGCRNCell


            class Encoder(torch.nn.Module):
                def __init__(self, dim, num_layers):
                    super().__init__()
                    self.dim = dim
                    self.cells = torch.nn.ModuleList()
                    for _ in range(num_layers):
                        self.cells.append(AGCRNCell(dim))

                def init_hidden(self, batch_size):
                    return torch.stack([c.init_hidden_state(batch_size, self.dim) for c in self.cells])

                def forward(self, x, init_state):
                    out = x[:, 0]
                    for i in range(len(self.cells)):
                        state = init_state[i]
                        for t in range(x.shape[1]):
                            state = self.cells[i](x[:, t], state)
                        out = state
                    return out


            def train(loader, opt, dim):
                enc = Encoder(dim, 2).cuda()
                for x in loader:
                    x = x.cuda(non_blocking=True)
                    init_state = enc.init_hidden(x.shape[0])
                    loss = enc(x, init_state).sum()
                    loss.backward()
                    opt.step()
        """})
    assert ("cell.py", 11, "GB010") in found, found   # state = state.to(x.device)
