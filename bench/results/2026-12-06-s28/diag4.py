"""Session 28: which op of bf16 grouped-query attention (SDPA's math backend) gives different gradients when
its backward runs inside a CUDA graph capture than eagerly? (Session 27's diag3: plain PyTorch's tiny Llama,
bf16 or fp32 under autocast, math backend: 13 of 21 gradients differ captured against eager; the flash
backend, fp32 without autocast, and SDPA alone without grouped heads agree.) No forge_num here.

Each variant runs forward and backward eagerly twice and once captured (warm-up on a side stream, as
torch's whole-network capture example), and compares the gradients bit for bit. Shapes are the tiny
Llama's: q [1, 4, 64, 16], k and v [1, 2, 64, 16]. Then the tiny Llama itself, with full backward hooks
on every module of layer 0's attention, names the first module whose incoming gradient differs."""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def grads_of(run, leaves, captured, extra=lambda: ()):
    """run() does forward and backward; returns the leaves' .grad and the tensors extra() names, cloned."""
    for p in leaves:
        p.grad = None
    if not captured:
        run()
        torch.cuda.synchronize()
        return [p.grad.clone() for p in leaves] + [t.clone() for t in extra()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for p in leaves:
                p.grad = None
            run()
    torch.cuda.current_stream().wait_stream(side)
    for p in leaves:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in leaves] + [t.clone() for t in extra()]


def compare(tag, names, a, b):
    bad = [(n, float((x.float() - y.float()).abs().max())) for n, x, y in zip(names, a, b) if not torch.equal(x, y)]
    print(f"{tag}: {len(bad)} of {len(names)} differ {bad[:6]}", flush=True)
    return bad


def variant(tag, fn, leaves, names, dtype=torch.bfloat16, amp=False):
    """fn(*leaves) -> output; backward of (output.float() * weights).sum() with fixed weights."""
    out_shape = fn(*leaves).shape
    w = torch.randn(out_shape, device="cuda", generator=torch.Generator("cuda").manual_seed(3))

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = fn(*leaves)
        (out.float() * w).sum().backward()

    e1, e2 = grads_of(run, leaves, False), grads_of(run, leaves, False)
    c = grads_of(run, leaves, True)
    compare(tag + " | eager again", names, e1, e2)
    return compare(tag + " | captured", names, e1, c)


def math():
    return sdpa_kernel(SDPBackend.MATH)



def main():
    torch.manual_seed(0)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 4, 64, 16, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(1, 2, 64, 16, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        qkv, names = [q, k, v], ["q", "k", "v"]
        d = str(dtype).replace("torch.", "")

        def sdpa_gqa(q, k, v, causal=True):
            with math():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

        def sdpa_repeat_kv(q, k, v):
            k2 = k[:, :, None].expand(1, 2, 2, 64, 16).reshape(1, 4, 64, 16)
            v2 = v[:, :, None].expand(1, 2, 2, 64, 16).reshape(1, 4, 64, 16)
            with math():
                return F.scaled_dot_product_attention(q, k2, v2, is_causal=True)

        def sdpa_repeat_interleave(q, k, v):
            with math():
                return F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
                                                      is_causal=True)

        def sdpa_default_gqa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        variant(f"{d} math enable_gqa causal", sdpa_gqa, qkv, names)
        variant(f"{d} math enable_gqa not causal", lambda q, k, v: sdpa_gqa(q, k, v, False), qkv, names)
        variant(f"{d} math repeat_kv (expand+reshape)", sdpa_repeat_kv, qkv, names)
        variant(f"{d} math repeat_interleave(2)", sdpa_repeat_interleave, qkv, names)
        variant(f"{d} default backend enable_gqa", sdpa_default_gqa, qkv, names)
        variant(f"{d} repeat_interleave(2) alone", lambda k: k.repeat_interleave(2, dim=1), [k], ["k"])
        variant(f"{d} softmax alone", lambda q: torch.softmax(q * 0.25, dim=-1), [q], ["q"])
        variant(f"{d} q @ k^T (k repeat_interleave)",
                lambda q, k: q @ k.repeat_interleave(2, dim=1).transpose(-2, -1), [q, k], ["q", "k"])
        if dtype is torch.float32:
            variant("fp32 under autocast math enable_gqa causal", sdpa_gqa, qkv, names, amp=True)

    # The tiny Llama (bf16, math backend): the gradient arriving at each module of each layer's attention.
    from tests.test_training_semantics import tiny_llama  # noqa: E402

    model = tiny_llama(seed=1).cuda().to(torch.bfloat16)
    model.set_attn_implementation("sdpa")
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(5)).cuda()
    seen = {}
    order = []


    def hook(name):
        def fn(module, grad_input, grad_output):
            if name not in order:
                order.append(name)
            seen[name] = [g.clone() for g in grad_output if g is not None] + [g.clone() for g in grad_input
                                                                             if g is not None]
        return fn


    for name, module in model.named_modules():
        if name and name.count(".") <= 4:
            module.register_full_backward_hook(hook(name))
    params = list(model.parameters())


    def run_model():
        with math():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()


    def snapshot(captured):
        grads_of(run_model, params, captured)
        return {n: list(v) for n, v in seen.items()}


    e1, c = snapshot(False), snapshot(True)
    print("tiny llama bf16 math: module backward order and whether [grad_output..., grad_input...] agree:", flush=True)
    for name in order:
        same = [torch.equal(a, b) for a, b in zip(e1[name], c[name])]
        print(f"  {name}: {same}", flush=True)

    # What the eager math backward launches (for the report).
    q = torch.randn(1, 4, 64, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 2, 64, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = sdpa_gqa(q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        out.float().sum().backward()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70), flush=True)


if __name__ == "__main__":
    main()
