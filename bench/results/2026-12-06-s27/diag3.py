"""Session 27, after call 2 (diag2: captured forge steps first differ in the capture's own backward, at the
attention of the last layer: v_proj's and k_proj's gradients, while lm_head's, the MLP's and o_proj's agree;
fp32 without autocast agrees throughout). Is it forge? Plain PyTorch, no forge_num: a tiny Llama's forward
and backward (autograd's .grad, no optimizer) eager and captured in a CUDA graph (warm-up on a side stream,
gradients set to None before the capture, as torch's whole-network example), the gradients compared bit for
bit. Then F.scaled_dot_product_attention alone (its backward), and one torch.mm, eager against captured."""
import contextlib
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from tests.test_training_semantics import tiny_llama  # noqa: E402


def grads_of(run, params, captured):
    for p in params:
        p.grad = None
    if not captured:
        run()
        torch.cuda.synchronize()
        return [p.grad.clone() for p in params]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for p in params:
                p.grad = None
            run()
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in params]


def compare(tag, names, a, b):
    bad = [(n, float((x.float() - y.float()).abs().max())) for n, x, y in zip(names, a, b) if not torch.equal(x, y)]
    print(f"{tag}: {len(bad)} of {len(names)} gradients differ {bad[:4]}", flush=True)


ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(5)).cuda()
for dtype, amp, backend in ((torch.bfloat16, False, "math"), (torch.bfloat16, False, "default"),
                            (torch.float32, True, "math"), (torch.float32, False, "math")):
    model = tiny_llama(seed=1).cuda().to(dtype)
    model.set_attn_implementation("sdpa")
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())

    def run():
        ctx = sdpa_kernel(SDPBackend.MATH) if backend == "math" else contextlib.nullcontext()
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    e1, e2 = grads_of(run, params, False), grads_of(run, params, False)
    c = grads_of(run, params, True)
    tag = f"plain torch tiny llama {dtype} amp={int(amp)} {backend}"
    compare(tag + " eager-again", names, e1, e2)
    compare(tag + " captured", names, e1, c)

# SDPA alone: [1, 4, 64, 16] bf16, causal, GQA by expanded k/v as Hugging Face repeats them
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 64, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 4, 64, 16, device="cuda", dtype=torch.bfloat16)
for backend in ("math", "default"):
    def run_sdpa():
        ctx = sdpa_kernel(SDPBackend.MATH) if backend == "math" else contextlib.nullcontext()
        with ctx:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(do)
    compare(f"sdpa alone {backend} captured", ["q", "k", "v"], grads_of(run_sdpa, [q, k, v], False),
            grads_of(run_sdpa, [q, k, v], True))

a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
compare("mm alone captured", ["a"], grads_of(lambda: torch.mm(a, b).float().square().sum().backward(), [a], False),
        grads_of(lambda: torch.mm(a, b).float().square().sum().backward(), [a], True))
