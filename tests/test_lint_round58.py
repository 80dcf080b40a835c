"""gobrrr lint, issue 29's round 58 on heldout68-69's first sight (rl-algorithms-tdai): the firing test beside the
neighbour that must stay quiet."""
from __future__ import annotations

from tests.lintcase import project_rules


def test_a_trainer_that_names_no_device_runs_on_the_gpu_only_where_a_gpu_file_reaches_it(tmp_path):
    """rl-algorithms-tdai keeps each algorithm in its own folder: PPO's agent moves its nets with `.cuda()`, while
    DDPG's and TRPO's never name a device (`--cuda` only seeds the RNG). A file that names no device but updates
    was taken for a GPU trainer because the project uses the GPU somewhere: 12 false findings in DDPG and TRPO. It
    runs on the GPU when a file that names a device imports it (decision-transformer's script, its trainer)."""
    files = {
        "ppo/ppo_agent.py": """
            import torch
            from ppo.ppo_update import update

            class PPOAgent:
                def __init__(self, net, opt):
                    self.net, self.opt = net.cuda(), opt

                def learn(self, batches):
                    update(self.net, self.opt, batches)
            """,
        "ppo/ppo_update.py": """
            def update(net, opt, batches):
                for batch in batches:
                    loss = net(batch).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    print(loss.item())
            """,
        "ddpg/ddpg_agent.py": """
            import torch

            class DDPGAgent:
                def __init__(self, actor, opt):
                    self.actor, self.opt = actor, opt

                def learn(self, batches):
                    for batch in batches:
                        loss = self.actor(torch.tensor(batch)).mean()
                        self.opt.zero_grad()
                        loss.backward()
                        self.opt.step()
                        print(loss.item())
            """,
    }
    found = {(f, line) for f, line, _ in project_rules(tmp_path, files)}
    assert any(f == "ppo_update.py" for f, _ in found), found
    assert not any(f == "ddpg_agent.py" for f, _ in found), found
