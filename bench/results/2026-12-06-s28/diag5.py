"""Session 28, after call 3 (diag4: SDPA with grouped heads agrees captured and eager when q, k and v are
contiguous leaves; in the tiny Llama the gradient arriving at layer 1's k_proj and v_proj outputs differs,
while self_attn's and o_proj's agree). So: SDPA's math backend fed as the model feeds it, q, k and v views
of projections ([B, S, H, D] transposed to [B, H, S, D]), bf16; and the tiny Llama again. Run twice: as is,
and with CUBLAS_WORKSPACE_CONFIG=:4096:8 (does a cuBLAS workspace difference between the capture's stream
and the eager one choose another algorithm?)."""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diag4 import compare, grads_of  # noqa: E402  (diag4 runs its checks on import: skipped below)

print("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG"), flush=True)
g = torch.Generator("cuda").manual_seed(0)
x = torch.randn(1, 64, 64, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
wq, wk, wv = (torch.randn(64, n, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True) * 0.1
              for n in (64, 32, 32))
wq, wk, wv = (w.detach().requires_grad_() for w in (wq, wk, wv))
w_out = torch.randn(1, 4, 64, 16, device="cuda", generator=g)
leaves, names = [x, wq, wk, wv], ["x", "wq", "wk", "wv"]


def attend(mode):
    q = (x @ wq).view(1, 64, 4, 16).transpose(1, 2)
    k = (x @ wk).view(1, 64, 2, 16).transpose(1, 2)
    v = (x @ wv).view(1, 64, 2, 16).transpose(1, 2)
    if mode == "contiguous":
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if mode == "repeat_kv":
        k = k[:, :, None].expand(1, 2, 2, 64, 16).reshape(1, 4, 64, 16)
        v = v[:, :, None].expand(1, 2, 2, 64, 16).reshape(1, 4, 64, 16)
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


for mode in ("views", "contiguous", "repeat_kv"):
    def run():
        (attend(mode).float() * w_out).sum().backward()
    e1, e2, c = grads_of(run, leaves, False), grads_of(run, leaves, False), grads_of(run, leaves, True)
    compare(f"bf16 projections -> math sdpa, {mode} | eager again", names, e1, e2)
    compare(f"bf16 projections -> math sdpa, {mode} | captured", names, e1, c)

from tests.test_training_semantics import tiny_llama  # noqa: E402

model = tiny_llama(seed=1).cuda().to(torch.bfloat16)
model.set_attn_implementation("sdpa")
ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(5)).cuda()
params, pnames = list(model.parameters()), [n for n, _ in model.named_parameters()]


def run_model():
    with sdpa_kernel(SDPBackend.MATH):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


compare("tiny llama bf16 math | captured", pnames, grads_of(run_model, params, False),
        grads_of(run_model, params, True))
