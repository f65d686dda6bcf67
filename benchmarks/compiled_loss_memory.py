"""What torchtitan's loss keeps per logit for backward, eager against torch.compile'd: the measurement behind
``cost_models.memory.COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT``. Not a test.

torchtitan's ``cross_entropy_loss`` (``torchtitan/components/loss.py``) is ``F.cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))``, compiled when ``training.compile`` is on. This script runs it on CPU with the installed torch
(inductor generates C++ here, Triton on a GPU; the partitioner that decides what is saved for backward is the same),
records every tensor saved for backward (``saved_tensors_hooks``) and the buffers the compiled backward allocates
(run with ``TORCH_LOGS=output_code`` to read the generated code), and prints bytes per logit.

Usage: ``.venv/bin/python benchmarks/compiled_loss_memory.py``. Recorded (torch 2.13.0+cpu, 2026-12-02): eager saves
the fp32 log-softmax output (4 bytes per logit; ``log_softmax`` and ``nll_loss`` save the same tensor, counted once),
compiled saves the bf16 input (2 bytes per logit) and per-row fp32 statistics, and its backward allocates one bf16
buffer of the logits' size (the input gradient): 4 bytes per logit at the loss's backward, against eager's 12.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan ``components/loss.py``."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def saved_bytes_per_logit(fn, batch: int = 1, seq: int = 2048, vocab: int = 32768) -> tuple[float, float, str]:
    """(bytes per logit saved apart from the input, bytes per logit of the input when it is saved, gradient dtype)."""
    pred = torch.randn(batch, seq, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    saved: dict[int, tuple[int, bool]] = {}  # storage -> (bytes, is the input): a tensor saved twice counts once

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = (t.numel() * t.element_size(), t.data_ptr() == pred.data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    loss.backward()
    n = batch * seq * vocab
    return (sum(b for b, is_in in saved.values() if not is_in) / n, sum(b for b, is_in in saved.values() if is_in) / n,
            str(pred.grad.dtype))


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    for name, fn in (("eager", cross_entropy_loss), ("compiled", torch.compile(cross_entropy_loss))):
        other, own, grad = saved_bytes_per_logit(fn)
        print(f"{name:9s} saved besides the input {other:.2f} B/logit, the bf16 input {own:.2f} B/logit, "
              f"gradient {grad}")
