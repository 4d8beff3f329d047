"""Session 29, call 4: why the captured 3B 4x1024 steps spend 22.5 ms in cuDNN attention against 9.4 ms in the
eager baselines, when one layer's attention replayed alone takes its eager time (attn_capture.py). A 4-layer
model of Llama-3B's widths, bf16, checkpointing on, forge 8bit: an eager step and a replayed captured step
profiled, their attention kernels counted and summed; and the strides of every SDPA op's tensors in an
eager step with forge and without (plain autograd)."""
import collections
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import forge_num as fn  # noqa: E402

CUDA = torch.device("cuda")
TINY = not torch.cuda.is_available()
dev = torch.device("cpu") if TINY else CUDA
cfg = dict(vocab_size=32000, hidden_size=3072, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=24,
           num_key_value_heads=8, head_dim=128) if not TINY else dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16)
B, S = (4, 1024) if not TINY else (1, 32)
if os.environ.get("SDPA_NO_CUDNN"):  # PyTorch's next choice (flash), to see whether a capture slows it too
    torch.backends.cuda.enable_cudnn_sdp(False)


def build(forge: bool):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        max_position_embeddings=S, bos_token_id=None, eos_token_id=None, pad_token_id=None, **cfg))
    model = model.to(dev, torch.bfloat16)
    model.set_attn_implementation("sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = None
    if forge:
        opt = fn.AdamW(model.parameters(), lr=1e-4, precision="8bit", seed=1)
        fn.prepare(model, opt)
    return model, opt


ids = torch.randint(0, cfg["vocab_size"], (B, S), generator=torch.Generator().manual_seed(1)).to(dev)


class SdpaStrides(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "attention" in name:
            desc = [(tuple(a.shape), a.stride(), a.is_contiguous()) for a in args if isinstance(a, torch.Tensor)]
            self.seen[(name, str(desc))] += 1
        return func(*args, **(kwargs or {}))


def eager_step(model, opt):
    loss = model(input_ids=ids, labels=ids).loss
    if opt is not None:
        opt.backward(loss)
        opt.step()
    else:
        loss.backward()
        model.zero_grad(set_to_none=True)
    return loss


def attention_kernels(fn_step):
    if TINY:
        fn_step()
        return {}
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn_step()
        torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    total = 0.0
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.device_time_total / 1e3
            n = e.name
            spans.append((e.time_range.start, e.time_range.end, n))
            if "sdpa" in n or "flash" in n or "cudnn" in n or "attention" in n.lower():
                per[n[:90]][0] += 1
                per[n[:90]][1] += e.device_time_total / 1e3
    # Busy time (the union of the kernels' intervals) against their summed durations; and for the attention
    # kernels, how long each ran beside a kernel that started before it (a dependent launch's early start)
    spans.sort()
    busy, end_max, overlap_attn = 0.0, None, 0.0
    for start, end, n in spans:
        if end_max is not None and start < end_max and "sdpa" in n:
            overlap_attn += min(end, end_max) - start
        if end_max is None or start >= end_max:
            busy += end - start
        elif end > end_max:
            busy += end - end_max
        end_max = end if end_max is None else max(end_max, end)
    print(f"    kernels total {total:.1f} ms, busy (union) {busy / 1e3:.1f} ms, span {(spans[-1][1] - spans[0][0]) / 1e3:.1f} ms,"
          f" attention beside an earlier kernel {overlap_attn / 1e3:.1f} ms", flush=True)
    return per


def show(tag, per):
    print(tag, flush=True)
    for n, (c, ms) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"    {c:3d} x {ms:8.3f} ms  {n}", flush=True)


for forge in (False, True) if not os.environ.get("FORGE_ONLY") else (True,):
    model, opt = build(forge)
    for _ in range(2):
        eager_step(model, opt)
    with SdpaStrides() as mode:
        eager_step(model, opt)
    print(f"== {'forge 8bit' if forge else 'plain autograd'}: SDPA ops of an eager step", flush=True)
    for (name, desc), c in sorted(mode.seen.items()):
        print(f"    {c:2d} x {name} {desc[:400]}", flush=True)
    show(f"== {'forge 8bit' if forge else 'plain autograd'}: eager step, attention kernels",
         attention_kernels(lambda: eager_step(model, opt)))
    if forge and not TINY:
        step = fn.capture_step(opt, lambda x: model(input_ids=x, labels=x).loss)
        for k in range(3):
            if k == 2:  # the capture: which SDPA ops, on which strides
                with SdpaStrides() as mode:
                    step(ids)
                print("== forge 8bit: SDPA ops of the capture", flush=True)
                for (name, desc), c in sorted(mode.seen.items()):
                    print(f"    {c:2d} x {name} {desc[:400]}", flush=True)
            else:
                step(ids)
        show("== forge 8bit: replayed captured step, attention kernels", attention_kernels(lambda: step(ids)))
    del model, opt
