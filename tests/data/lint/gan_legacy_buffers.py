"""An old-style GAN script: preallocated device buffers refilled from each batch, Variable wrappers,
and a progress line printed with %-formatting on every iteration."""
import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.utils.data import DataLoader

use_cuda = torch.cuda.is_available()
loader = DataLoader(images, batch_size=64, shuffle=True, num_workers=2)  # expect: GB006
gen = Generator(100)
disc = Critic()
bce = nn.BCELoss()
real_buf = torch.FloatTensor(64, 3, 32, 32)
z_buf = torch.FloatTensor(64, 100, 1, 1)
target = torch.FloatTensor(64)
if use_cuda:
    gen.cuda()
    disc.cuda()
    real_buf, target, z_buf = real_buf.cuda(), target.cuda(), z_buf.cuda()
real_buf = Variable(real_buf)
target = Variable(target)
z_buf = Variable(z_buf)
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)

for epoch in range(25):
    for it, (imgs, _) in enumerate(loader):
        disc.zero_grad()
        n = imgs.size(0)
        real_buf.data.resize_(imgs.size()).copy_(imgs)  # expect: GB009
        target.data.resize_(n).fill_(1.0)
        score_real = disc(real_buf)
        loss_real = bce(score_real, target)
        loss_real.backward()
        z_buf.data.normal_(0, 1)
        fake = gen(z_buf)
        target.data.fill_(0.0)
        score_fake = disc(fake.detach())
        loss_fake = bce(score_fake, target)
        loss_fake.backward()
        opt_d.step()

        gen.zero_grad()
        target.data.fill_(1.0)
        loss_gen = bce(disc(fake), target)
        loss_gen.backward()
        opt_g.step()
        mean_real = score_real.data.mean()
        print("[%d][%d] d=%.3f g=%.3f D(x)=%.3f" % (epoch, it, (loss_real + loss_fake).data, loss_gen.data, mean_real))  # expect: GB003
        if it % 200 == 0:
            print("sample %d: %.3f" % (it, gen(z_buf).data.mean()))
    torch.save(gen.state_dict(), "gen_%d.pt" % epoch)
