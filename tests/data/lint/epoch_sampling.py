"""An autoencoder script: train() and test() hold the batch loops; the epoch loop at the bottom
calls them and then decodes one batch of noise for a picture, once per epoch."""
import torch
from torch.nn import functional as F
from torchvision.utils import save_image

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = AutoEncoder().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def train(epoch, loader):
    model.train()
    total = 0.0
    for i, (x, _) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        optimizer.zero_grad()
        recon, mu, logvar = model(x)
        loss = F.mse_loss(recon, x) - 0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
        loss.backward()
        optimizer.step()
        total += loss.item()  # expect: GB002
    return total / len(loader)


if __name__ == "__main__":
    for epoch in range(1, 11):
        avg = train(epoch, train_loader)
        with torch.no_grad():
            z = torch.randn(64, 16).to(device)
            pictures = model.decode(z).cpu()
        save_image(pictures.view(64, 1, 28, 28), f"sample_{epoch}.png")
        print(f"epoch {epoch}: {avg:.4f}")
