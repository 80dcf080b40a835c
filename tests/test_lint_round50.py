"""gobrrr lint, issue 29's round on heldout50's misses (PVD, CenterPoint, alpaca-lora, IQL-PyTorch): each firing test
beside the neighbour that must stay quiet."""
from __future__ import annotations

from tests.lintcase import project_rules as _lint


def test_non_blocking_passed_through_as_false_is_a_blocking_copy(tmp_path):
    """det3d's `example_to_device(example, device, non_blocking=False)` copies each batch with
    `v.to(device, non_blocking=non_blocking)`: the parameter left at False (or passed False) makes every copy a
    blocking one. A caller that passes True keeps the copy asynchronous (its pinning is another rule's)."""
    found = _lint(tmp_path, {"train.py": """
        import torch

        def example_to_device(example, device, non_blocking=False):
            return {k: v.to(device, non_blocking=non_blocking) for k, v in example.items()}

        def fast_to_device(example, device, non_blocking=False):
            return {k: v.to(device, non_blocking=non_blocking) for k, v in example.items()}

        def train(model, loader, opt):
            for data in loader:
                example = example_to_device(data, torch.device("cuda"))
                fast = fast_to_device(data, torch.device("cuda"), non_blocking=True)
                loss = model(example).sum() + model(fast).sum()
                loss.backward()
                opt.step()
        """})
    assert ("train.py", 5, "GB009") in found, found
    assert not [f for f in found if f[1] == 8 and f[2] == "GB009"], found


def test_a_request_handler_runs_once_per_request(tmp_path):
    """A web route's handler (`@app.post(...)`, FastChat's and minimind's model servers) and a ROS subscriber's
    callback (CenterPoint's inference nodes) run once per request or message, a loop the framework owns: their
    uploads and read-backs repeat. A plain helper no loop and no server calls stays quiet."""
    found = _lint(tmp_path, {"serve.py": """
        import rospy
        import torch
        from fastapi import FastAPI

        app = FastAPI()
        model = torch.nn.Linear(4, 4).cuda()

        @app.post("/generate")
        async def generate(request):
            ids = torch.tensor(request["ids"], device="cuda")
            return model(ids).tolist()

        def on_points(msg):
            pts = torch.tensor(msg.points, device="cuda")
            print(model(pts).cpu().numpy())

        def once(x):
            return model(torch.tensor(x, device="cuda")).tolist()

        if __name__ == "__main__":
            rospy.Subscriber("/points", object, on_points)
        """})
    lines = {line for file, line, rule in found if file == "serve.py"}
    assert {11, 12, 15, 16} <= lines, found
    assert not lines & {19}, found
