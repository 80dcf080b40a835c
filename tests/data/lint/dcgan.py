import torch
import torch.nn as nn
import torch.optim as optim
import torchvision.utils as vutils


def train(netG, netD, dataloader, device, nz=100, niter=25, outf="out"):
    criterion = nn.BCELoss()
    fixed_noise = torch.randn(64, nz, 1, 1, device=device)
    real_label, fake_label = 1.0, 0.0
    optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    for epoch in range(niter):
        for i, data in enumerate(dataloader, 0):
            netD.zero_grad()
            real_cpu = data[0].to(device)  # expect: GB009
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)
            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()  # expect: GB002
            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()  # expect: GB002
            errD = errD_real + errD_fake
            optimizerD.step()
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()  # expect: GB002
            optimizerG.step()
            print("[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"
                  % (epoch, niter, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))  # expect: GB002
            if i % 100 == 0:
                vutils.save_image(real_cpu, f"{outf}/real_samples.png", normalize=True)
                fake = netG(fixed_noise)
                vutils.save_image(fake.detach(), f"{outf}/fake_samples_epoch_{epoch:03d}.png", normalize=True)
        torch.save(netG.state_dict(), f"{outf}/netG_epoch_{epoch}.pth")


def train_with_samples(netG, netD, loader, optimizerD, criterion, device, epochs, nz=100):
    fixed_noise = torch.randn(64, nz, 1, 1, device=device)
    for epoch in range(epochs):
        for real, _ in loader:
            real = real.to(device, non_blocking=True)
            errD = criterion(netD(real), torch.ones(real.size(0), device=device))
            errD.backward()
            optimizerD.step()
        if epoch % 5 == 0:
            fake = netG(fixed_noise)
            vutils.save_image(fake.detach(), f"samples_{epoch}.png")
        print(f"epoch {epoch}: loss_D {errD.item():.4f}")
