import logging

import torch
import torch.nn.functional as F
from transformers import Trainer

logger = logging.getLogger(__name__)


class WeightedTrainer(Trainer):
    def __init__(self, *args, class_weights=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.class_weights = class_weights

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        weight = torch.tensor(self.class_weights, device=logits.device)  # expect: GB010
        loss = F.cross_entropy(logits.view(-1, self.model.config.num_labels), labels.view(-1), weight=weight)
        if torch.isnan(loss):  # expect: GB007
            logger.warning("nan loss in this batch")
        return (loss, outputs) if return_outputs else loss
