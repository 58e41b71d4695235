"""The training step of actplace in PyTorch terms (docs/architecture.md section 4, the
train-autodiff pass's options and the train dialect's step ops):

  * for each microbatch forward + backward; the step's loss is the sum of the
    per-token losses over all microbatches divided by the step's token count
    (labels != -100), so the gradients are those of that token mean;
  * clip the global norm of that mean gradient to max_grad_norm
    (coef = max_norm / (norm + 1e-6), at most 1; 0 disables);
  * lr: linear warmup then cosine decay, 0-based step s:
    s < warmup: max_lr (s + 1) / warmup, else
    min_lr + (max_lr - min_lr)(1 + cos(pi p)) / 2,
    p = min(1, (s - warmup) / max(1, total - warmup));
    a peak override (the binary's --lr) scales min_lr by the same ratio;
  * AdamW (decoupled decay, bias-corrected), with weight decay only on
    parameters of rank >= 2 whose name contains none of the no-decay
    patterns (default: norm, A_log, dt_bias).

The defaults are train-autodiff's. The optimizer is PyTorch's own AdamW.
"""
import math
from dataclasses import dataclass, field
from typing import Sequence, Tuple

import torch


@dataclass
class StepConfig:
    max_lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    total_steps: int = 10000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    no_decay: Tuple[str, ...] = ("norm", "A_log", "dt_bias")

    def with_peak_lr(self, peak):
        """The binary's --lr: replaces the peak, keeps min_lr / max_lr."""
        ratio = peak / self.max_lr
        return StepConfig(peak, self.min_lr * ratio, self.warmup_steps,
                          self.total_steps, self.weight_decay, self.beta1,
                          self.beta2, self.eps, self.max_grad_norm,
                          self.no_decay)

    def lr(self, step):
        if step < self.warmup_steps:
            return self.max_lr * (step + 1) / self.warmup_steps
        p = (step - self.warmup_steps) / max(1, self.total_steps -
                                             self.warmup_steps)
        p = min(1.0, p)
        return self.min_lr + (self.max_lr - self.min_lr) * \
            (1 + math.cos(math.pi * p)) / 2

    def decays(self, name, param):
        return param.dim() >= 2 and not any(p in name for p in self.no_decay)


def forward_backward(model, tokens, labels):
    """tokens, labels: [M, B, T] (M microbatches). Accumulates into .grad
    the gradient of the step's token-mean loss and returns (mean loss as a
    Python float, token count)."""
    count = int((labels != -100).sum())
    if count == 0:
        raise ValueError("the step has no labelled tokens")
    total = 0.0
    for mb in range(tokens.shape[0]):
        loss_sum, _ = model(tokens[mb], labels[mb])
        (loss_sum / count).backward()
        total += float(loss_sum)
    return total / count, count


def make_optimizer(model, cfg: StepConfig):
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if cfg.decays(name, p) else plain).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.max_lr,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             foreach=False)


def optimizer_step(model, optimizer, cfg: StepConfig, step):
    """Clip, set the step's lr, AdamW. Returns (grad norm before clipping,
    clip coefficient, lr)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))
    coef = 1.0
    if cfg.max_grad_norm > 0:
        coef = min(1.0, cfg.max_grad_norm / (norm + 1e-6))
        for p in params:
            p.grad.mul_(coef)
    lr = cfg.lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return norm, coef, lr
