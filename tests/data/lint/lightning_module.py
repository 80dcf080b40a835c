import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class LitClassifier(pl.LightningModule):
    def __init__(self, backbone, lr=1e-3):
        super().__init__()
        self.backbone = backbone
        self.lr = lr
        self.val_correct = 0
        self.val_total = 0

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log("train_loss", loss)
        self.log("train_acc", acc, prog_bar=True)
        if batch_idx % 50 == 0:
            print(f"batch {batch_idx}: loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        preds = logits.argmax(1)
        self.val_correct += (preds == y).sum().item()  # expect: GB002
        self.val_total += y.numel()
        self.log("val_loss", loss, sync_dist=True)

    def on_validation_epoch_end(self):
        self.log("val_acc", self.val_correct / max(self.val_total, 1))
        print(f"val acc {self.val_correct / max(self.val_total, 1):.4f}")
        self.val_correct = self.val_total = 0

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class LossSpikeCallback(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > 0 and trainer.is_global_zero:
            pl_module.log("global_step", trainer.global_step)
        if outputs["loss"] > 10:  # expect: GB007
            print(f"loss spike at step {trainer.global_step}")
