"""Session 29, call 3: is SDPA's attention slower replayed from a CUDA graph than run eagerly? The 3B 4x1024
captured steps' profile gave attention 22.4 ms against 9.4 in the eager baselines, the same cuDNN kernel
names 2.5x longer, with transformers 5.17 and 5.18 alike. One layer's attention at Llama-3B's shape
(4 x 1024 tokens, 24 heads, 8 k/v heads, head 128, bf16, causal), q, k, v transposed views of projections
as the model feeds them: forward and backward, timed by CUDA events over a loop of eager calls against
replays of one captured call, and each form's kernels summed by torch.profiler, per backend."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

B, S, H, KV, D = 4, 1024, 24, 8, 128
dev, dt = "cuda", torch.bfloat16
g = torch.Generator(dev).manual_seed(0)
x = torch.randn(B, S, (H + 2 * KV) * D, device=dev, dtype=dt, generator=g).requires_grad_()
gout = torch.randn(B, H, S, D, device=dev, dtype=dt, generator=g)


def attend(backend, gqa):
    q, k, v = x.split([H * D, KV * D, KV * D], dim=-1)
    q = q.view(B, S, H, D).transpose(1, 2)
    k = k.view(B, S, KV, D).transpose(1, 2)
    v = v.view(B, S, KV, D).transpose(1, 2)
    if not gqa:
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    out.backward(gout)


def events_ms(fn, n=20):
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def kernels(fn):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(e.name[:70], [0, 0.0])
            per[e.name[:70]][0] += 1
            per[e.name[:70]][1] += e.device_time_total / 1e3
    return per


for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    for gqa in (True, False):
        tag = f"{backend.name:20s} {'enable_gqa' if gqa else 'repeat   '}"
        try:
            def eager():
                x.grad = None
                attend(backend, gqa)
            eager_ms = events_ms(eager)
            side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    eager()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            x.grad = None
            with torch.cuda.graph(graph):
                attend(backend, gqa)
            replay_ms = events_ms(graph.replay)
            ke, kr = kernels(eager), kernels(graph.replay)
            print(f"{tag} eager {eager_ms:7.3f} ms  replay {replay_ms:7.3f} ms  x{replay_ms / eager_ms:.2f}", flush=True)
            for name in sorted(set(ke) | set(kr), key=lambda n: -max(ke.get(n, [0, 0])[1], kr.get(n, [0, 0])[1]))[:4]:
                e, r = ke.get(name, [0, 0.0]), kr.get(name, [0, 0.0])
                print(f"    eager {e[0]:2d} x {e[1]:7.3f} ms  replay {r[0]:2d} x {r[1]:7.3f} ms  {name}", flush=True)
        except Exception as err:  # a backend that refuses the shape or GQA
            print(f"{tag} n/a: {type(err).__name__}: {str(err)[:150]}", flush=True)
