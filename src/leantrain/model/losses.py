"""Training losses: label smoothing and class weights for classifiers, exact under accumulation; a
causal LM's output head and cross-entropy in one pass over row chunks (`head_cross_entropy_sum`).

A task returns its loss summed over units (tasks/base.py). With class weights, an example's unit is its class's
weight: the summed loss is `sum_i w[y_i] * loss_i`, the sampler sums `w[y_i]` over the whole optimizer step
(micro-batches and processes), and the trainer divides one by the other: the big batch's weighted mean, which is
what `torch.nn.functional.cross_entropy(weight=w)` computes with its default mean reduction.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.errors import ConfigError


def parse_class_weights(text: str) -> list[float]:
    """'1, 2.5' -> [1.0, 2.5]; refused in one line unless every weight is a positive finite number."""
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise ConfigError(f"--class-weights '{text}': give auto or numbers in label order, e.g. 1,3") from None
    if not all(np.isfinite(w) and w > 0 for w in weights):
        raise ConfigError(f"--class-weights '{text}': every weight must be a positive number")
    return weights


def class_weights(spec: str, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The weight of each class id: `auto` is inverse class frequency over the training labels (scikit-learn's
    'balanced': n / (classes x count)); otherwise the given weights, one per class in label order."""
    if spec.strip().lower() == "auto":
        from sklearn.utils.class_weight import compute_class_weight

        present = np.unique(labels)
        weights = np.ones(num_classes)  # a class absent from the training data never weighs a training example
        weights[present] = compute_class_weight("balanced", classes=present, y=labels)
        return weights
    weights = np.asarray(parse_class_weights(spec))
    if len(weights) != num_classes:
        raise ConfigError(
            f"--class-weights gives {len(weights)} weights for {num_classes} classes; "
            "give one per class, in label order"
        )
    return weights


def weighted_cross_entropy_sum(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None, label_smoothing: float
) -> torch.Tensor:
    """The cross-entropy summed over the batch, each example weighted by its class (`weights`; None: 1 each)."""
    return F.cross_entropy(logits.float(), labels, weight=weights, label_smoothing=label_smoothing, reduction="sum")


#: rows of logits `head_cross_entropy_sum` makes at once. Against the unfused loss on a 2-core CPU
#: (benchmarks/results/head_chunks.md): 256 -> 8,192 over 1,900 rows 0.71x the time (1,024 rows 0.75x: its 32 MiB
#: buffers are mapped afresh every call; 64 rows 0.85x); 768 -> 32,000 over 2,048 rows 0.88x (1,024 rows 0.89x, 64
#: rows 1.17x).
HEAD_CHUNK_ROWS = 512


def head_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    row_losses: torch.Tensor | None = None,
) -> torch.Tensor:
    """`cross_entropy(hidden @ weight.T + bias, targets, reduction="sum")`, in fp32, without the (rows, vocabulary)
    logits or their gradient ever existing whole: `HEAD_CHUNK_ROWS` rows at a time, each chunk's gradients taken
    at once (a cross-entropy's gradient is softmax - one-hot) and kept for the backward pass. The matmuls run in
    the autocast dtype when autocast is on, as the head's own would; every target must be a class (no -100).
    `row_losses` (float32, one per row), when given, is filled with each row's cross-entropy (no gradient)."""
    return _HeadCrossEntropy.apply(hidden, weight, bias, targets, row_losses)


class _HeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, row_losses=None):  # type: ignore[override]
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            # fp16 has no range for softmax - one-hot's small entries (the head's own backward sees them scaled by
            # the loss scale): its gradients' matmuls run in fp32
            grad_dtype = torch.float32 if dtype == torch.float16 else dtype
            h_g, w_g = h.to(grad_dtype), w.to(grad_dtype)
            grad_h = torch.empty_like(h_g)
            # the weight's gradient: one chunk's product as its matmul made it (cast once, in backward), several
            # chunks' summed in fp32
            grad_w: torch.Tensor | None = None
            grad_b = torch.zeros_like(bias, dtype=torch.float32) if ctx.needs_input_grad[2] else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            # every chunk writes into the same buffers: on CPU a fresh block this large is new pages, and
            # faulting them in cost more than the log-softmax itself (benchmarks/results/head_chunks.md)
            chunk = min(HEAD_CHUNK_ROWS, h.shape[0])
            logits_buffer = h.new_empty((chunk, w.shape[0]))
            log_probs_buffer = h.new_empty((chunk, w.shape[0]), dtype=torch.float32)
            grad_buffer = None if grad_dtype == torch.float32 else h.new_empty((chunk, w.shape[0]), dtype=grad_dtype)
            for start in range(0, h.shape[0], HEAD_CHUNK_ROWS):
                rows, wanted = h[start : start + HEAD_CHUNK_ROWS], targets[start : start + HEAD_CHUNK_ROWS]
                n = rows.shape[0]
                if b is None:
                    logits = torch.mm(rows, w.t(), out=logits_buffer[:n])
                else:
                    logits = torch.addmm(b, rows, w.t(), out=logits_buffer[:n])
                # one pass a row: 1.4-1.9x logsumexp's several
                log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32, out=log_probs_buffer[:n])
                picked = log_probs.gather(1, wanted[:, None])
                total -= picked.sum()
                if row_losses is not None:
                    row_losses[start : start + n] = -picked[:, 0]
                grad = log_probs.exp_()  # the softmax, in place
                grad[torch.arange(len(wanted), device=grad.device), wanted] -= 1.0
                if grad_b is not None:  # summed in fp32 before any rounding (a bf16 sum is also slower)
                    grad_b += grad.sum(0)
                if grad_buffer is not None:
                    grad = grad_buffer[:n].copy_(grad)
                torch.mm(grad, w_g, out=grad_h[start : start + n])
                if ctx.needs_input_grad[1]:
                    h_rows = h_g[start : start + n]
                    if grad_w is None:
                        grad_w = grad.t() @ h_rows
                    elif grad_dtype == torch.float32:
                        grad_w.addmm_(grad.t(), h_rows)
                    else:  # a later low-precision chunk: the sum in fp32
                        grad_w = grad_w if grad_w.dtype == torch.float32 else grad_w.float()
                        grad_w += grad.t() @ h_rows
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = hidden.dtype, weight.dtype, None if bias is None else bias.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):  # type: ignore[override]
        grad_h, grad_w, grad_b = ctx.saved_tensors
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes

        def scaled(grad, dtype):
            if grad is None:
                return None
            # a saved fp32 gradient is left as it is (a backward may run twice); a cast one is this call's own
            grad = grad * grad_total if grad.dtype == torch.float32 else grad.float().mul_(grad_total)
            return grad.to(dtype)

        return scaled(grad_h, hidden_dtype), scaled(grad_w, weight_dtype), scaled(grad_b, bias_dtype), None, None


def head_token_logps(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> torch.Tensor:
    """`log_softmax(hidden @ weight.T + bias)[row, targets[row]]` for every row, fp32 (rows,), differentiable, without
    the (rows, vocabulary) logits existing whole when there are more rows than one chunk (`HEAD_CHUNK_ROWS`): each
    chunk's logits are made, reduced to its rows' log-normaliser and target score, and dropped; backward makes them
    again, chunk by chunk (one more matmul per chunk than keeping them). Within one chunk the softmax is kept for
    backward instead (no second matmul: there, memory is one chunk's either way). The caller's upstream gradient is
    per row (a preference loss weighs each sequence differently), so unlike `head_cross_entropy_sum` the gradients
    cannot be formed in the forward pass. The matmuls run in the autocast dtype when autocast is on."""
    return _HeadTokenLogps.apply(hidden, weight, bias, targets)


def _chunk_logits(rows: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    n = rows.shape[0]
    return torch.mm(rows, w.t(), out=out[:n]) if b is None else torch.addmm(b, rows, w.t(), out=out[:n])


class _HeadTokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets):  # type: ignore[override]
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        keep_softmax = n <= HEAD_CHUNK_ROWS
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            buffer = h.new_empty((min(n, HEAD_CHUNK_ROWS), w.shape[0]))
            log_norm = torch.empty(n, dtype=torch.float32, device=hidden.device)
            softmax = None
            for start in range(0, n, HEAD_CHUNK_ROWS):
                logits = _chunk_logits(h[start : start + HEAD_CHUNK_ROWS], w, b, buffer).float()
                wanted = targets[start : start + HEAD_CHUNK_ROWS]
                lse = torch.logsumexp(logits, dim=-1)
                log_norm[start : start + HEAD_CHUNK_ROWS] = lse
                out[start : start + HEAD_CHUNK_ROWS] = logits.gather(1, wanted[:, None]).squeeze(1) - lse
                if keep_softmax:
                    softmax = logits.sub_(lse[:, None]).exp_()
        ctx.save_for_backward(hidden, weight, bias, targets, log_norm, softmax)
        ctx.dtype = dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, bias, targets, log_norm, softmax = ctx.saved_tensors
        dtype, device = ctx.dtype, hidden.device.type
        # fp16 has no range for the softmax's small entries: its gradient matmuls run in fp32 (as the fused loss's)
        grad_dtype = torch.float32 if dtype == torch.float16 else dtype
        need_w, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_w: torch.Tensor | None = None  # the first chunk's product as its matmul made it; later ones summed in fp32
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            w_g = w.to(grad_dtype)
            buffer = None if softmax is not None else h.new_empty((min(h.shape[0], HEAD_CHUNK_ROWS), w.shape[0]))
            for start in range(0, h.shape[0], HEAD_CHUNK_ROWS):
                end = start + HEAD_CHUNK_ROWS
                g = grad_out[start:end].float()
                # d log p[target] / d logits = one-hot - softmax, scaled by each row's upstream gradient
                if softmax is not None:
                    grad = softmax * -g[:, None]
                else:
                    logits = _chunk_logits(h[start:end], w, b, buffer).float()
                    grad = logits.sub_(log_norm[start:end, None]).exp_().mul_(-g[:, None])
                grad[torch.arange(grad.shape[0], device=grad.device), targets[start:end]] += g
                if grad_b is not None:  # summed in fp32 before any rounding (a bf16 sum is also slower)
                    grad_b += grad.sum(0)
                grad = grad.to(grad_dtype)
                grad_h[start:end] = grad @ w_g
                if need_w:
                    part = grad.t() @ h[start:end].to(grad_dtype)
                    if grad_w is None:
                        grad_w = part
                    else:
                        grad_w = grad_w if grad_w.dtype == torch.float32 else grad_w.float()
                        grad_w += part
        return (
            grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
        )
