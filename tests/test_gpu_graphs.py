"""On the GPU: a step captured in a CUDA graph and replayed (forge_num.capture_step) trains exactly as
the eager step: losses, weights, optimizer states and telemetry bit for bit over several steps, with the
gradient scale changing (clipping by the previous step's norm), in the fp32 and 8bit regimes, on a
narrow model (the Triton tiles) and a wide one (the Gluon routes); and a step that cannot be captured
(a host read inside it) is refused with the optimizer's state as before, eager training going on.
The host side is tested on the CPU by tests/test_graphs.py.

The models attend with SDPA's math backend on fp32 copies of q, k and v (_fp32_attention), and one test
with the model's own bf16 attention. Sessions 27-28 found bf16 attention's captured gradients differing
from the eager ones with no forge_num at all (bench/results/2026-12-06-s27/diag3.py), and session 29 the
cause: transformers 5.x build an explicit causal mask and repeat the key/value heads while a CUDA stream
captures (forge_num.hf.one_sequence_per_row's docstring). The bf16 test runs the forward inside that
context, with and without gradient checkpointing (no KV cache: the packed-sequence check), and checks the
whole step, the model's attention included. Hugging Face's "eager" attention cannot be captured (its mask
is a host-to-device copy of a 0-d tensor)."""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import forge_num as fn
from forge_num.hf import causal_lm_loss, one_sequence_per_row
from tests.test_training_semantics import tiny_llama, training_bits

pytestmark = [pytest.mark.gpu, pytest.mark.exactness]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
CUDA = torch.device("cuda")
HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
STEPS = 5


def _fp32_attention(module, query, key, value, attention_mask, **kwargs):
    """Hugging Face's SDPA attention on fp32 copies of q, k, v, outside autocast (its output cast back
    to q's dtype): an attention whose backward a capture did not change (the module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast("cuda", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                              attention_mask, **kwargs)
    return out.to(query.dtype), weights


def _register_fp32_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("forge_num_fp32_sdpa", _fp32_attention)
    AttentionMaskInterface.register("forge_num_fp32_sdpa", sdpa_mask)
    return "forge_num_fp32_sdpa"


def _model(width: str, precision: str, tie: bool = False, attention: str = "fp32", checkpointing: bool = False):
    if width == "narrow":
        model = tiny_llama(seed=1, tie=tie)
    else:  # Llama-1B's layer widths: its MLP's dW at 1024 tokens takes the Gluon routes
        import transformers

        torch.manual_seed(1)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=tie,
            bos_token_id=None, eos_token_id=None, pad_token_id=None))
    model = model.to(CUDA, torch.float32 if precision == "fp32" else torch.bfloat16)
    # "fp32": _fp32_attention; "model": the model's own SDPA attention in its dtype. Both under the math
    # backend (_loss_fn; the module docstring)
    model.set_attn_implementation(_register_fp32_attention() if attention == "fp32" else "sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = fn.AdamW(model.parameters(), precision=precision, seed=9, max_grad_norm=0.05, clipping="previous", **HYPER)
    fn.prepare(model, opt)
    return model, opt


def _loss_fn(model, loss: str, one_sequence: bool = False):
    """The loss of ``ids``; an fp32 model's under bf16 autocast (the fp32 regime's training: bf16
    operands, so that the wide model's linears take the Gluon routes); ``one_sequence``: inside
    forge_num.hf.one_sequence_per_row()."""
    amp = next(model.parameters()).dtype == torch.float32
    rows = one_sequence_per_row if one_sequence else contextlib.nullcontext

    def loss_of(ids):
        with sdpa_kernel(SDPBackend.MATH), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp), rows():
            if loss == "chunked":
                return causal_lm_loss(model, ids)
            return model(input_ids=ids, labels=ids).loss
    return loss_of


def _batches(tokens: int):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (1, tokens), generator=g).to(CUDA) for _ in range(STEPS)]


@pytest.mark.parametrize("width,tokens,tie", [("narrow", 64, False), ("wide", 1024, False), ("narrow", 64, True)],
                         ids=["narrow", "wide", "narrow-tied"])
@pytest.mark.parametrize("loss", ["hf", "chunked"])
@pytest.mark.parametrize("precision", ["fp32", "8bit"])
def test_captured_training_equals_eager_training(precision, loss, width, tokens, tie):
    """STEPS steps eagerly, and the same STEPS through capture_step (two eager warm-up steps, the
    capture with its first replay, two replays): every loss, weight, state and telemetry entry the same.
    The eager reference takes a captured step's paths (opt._capturable): they differ from the default
    ones only for a tied head with the chunked loss, which then adds the embedding's dense gradient to
    the head's instead of sorting the tokens (the same weights; tests/test_graphs.py), and whose
    telemetry sums in another order."""
    routes = []  # the Gluon launches the capture records, with their step slots
    with _spied_gluon_launches(routes):
        step, eager_stats = _eager_then_captured(lambda: _model(width, precision, tie), loss, _batches(tokens))
    from forge_num.kernels import gluon_q8

    # the MLP's dW at 1024 tokens takes a Gluon route, reading its slot (8bit: where routed, gluon_q8.ROUTED)
    if width == "wide" and (precision == "fp32" or gluon_q8.ROUTED):
        assert routes and all(slot is not None for slot in routes[-4:]), routes
    assert any(s["clip_coef"] is not None and s["clip_coef"] < 1.0 for s in eager_stats[2:]), eager_stats
    with pytest.raises(ValueError, match="captured step's is"):
        step(_batches(tokens)[0][:, : tokens // 2])


@pytest.mark.parametrize("checkpointing", [False, True], ids=["cache", "checkpointed"])
def test_captured_training_with_the_models_bf16_attention_equals_eager_training(checkpointing):
    """A bf16 Llama with grouped key/value heads, attending with its own SDPA attention (not fp32
    copies), 8bit, its forward inside one_sequence_per_row: the captured steps' losses, weights, states and
    telemetry are the eager steps', the model's attention included; with gradient checkpointing (no KV
    cache, so transformers' packed-sequence check) and without."""
    config = tiny_llama(seed=1).config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped heads: repeat_kv or enable_gqa
    # The whole step under the math backend, not only the forward (_loss_fn): checkpointing recomputes the
    # attention in the backward, outside the forward's sdpa_kernel, and torch refuses a recomputation whose
    # saved tensors differ from the forward's (session 30: the default backends' flash kernel against math)
    with sdpa_kernel(SDPBackend.MATH):
        _eager_then_captured(lambda: _model("narrow", "8bit", attention="model", checkpointing=checkpointing),
                             "hf", _batches(64), one_sequence=True)


def _eager_then_captured(make_model, loss: str, batches, one_sequence: bool = False):
    """STEPS steps of a model from ``make_model()`` eagerly, and the same STEPS of another through
    capture_step (two eager warm-up steps, the capture with its first replay, two replays); asserts every
    loss, weight, state and telemetry entry the same. Returns the CapturedStep and the eager telemetry.
    The eager reference takes a captured step's paths (opt._capturable)."""
    model, opt = make_model()
    opt._capturable = True
    fn_e = _loss_fn(model, loss, one_sequence)
    eager = []
    for ids in batches:
        loss_t = fn_e(ids)
        opt.backward(loss_t)
        opt.step()
        eager.append(loss_t.detach().clone())
    eager_bits, eager_stats = training_bits(model, opt), opt.stats_history

    model_c, opt_c = make_model()
    step = fn.capture_step(opt_c, _loss_fn(model_c, loss, one_sequence), warmup=2)
    captured = [step(ids).clone() for ids in batches]
    assert step._graph is not None
    torch.cuda.synchronize()
    # where the runs part, named: the first differing step's loss, and which of training_bits' tensors differ
    # (session 35 saw one unexplained loss difference in six runs of 8bit-hf-wide; these say where the next is)
    steps = [i for i, (a, b) in enumerate(zip(eager, captured)) if not torch.equal(a.view(torch.int32),
                                                                                 b.view(torch.int32))]
    assert not steps, (f"losses differ from step {steps[0]} on: eager {[float(a) for a in eager]}, "
                       f"captured {[float(b) for b in captured]}")
    tensors = [i for i, (a, b) in enumerate(zip(eager_bits, training_bits(model_c, opt_c))) if not torch.equal(a, b)]
    assert not tensors, f"training_bits' tensors {tensors} differ (of {len(eager_bits)})"
    assert opt_c.stats_history == eager_stats
    return step, eager_stats


def _spied_gluon_launches(routes: list):
    """gluon_update.launch, gluon_f32.launch and gluon_q8.launch wrapped: each call's step slot appended to
    ``routes`` (None where it passed none)."""
    import inspect

    from forge_num.kernels import gluon_f32, gluon_q8, gluon_update

    stack = contextlib.ExitStack()
    for module in (gluon_update, gluon_f32, gluon_q8):
        real = module.launch
        at = list(inspect.signature(real).parameters).index("step_slot")

        def spy(*args, real=real, at=at):
            routes.append(args[at] if len(args) > at else None)
            return real(*args)
        stack.enter_context(mock.patch.object(module, "launch", spy))
    return stack


def test_what_a_capture_holds_does_not_grow_with_its_warm_ups():
    """The memory allocated after the capturing call is the same after one warm-up step and after three
    (forge_num.graphs, "Memory": the warm-ups run on one stream and torch's cuBLAS workspaces are cleared
    before the capture). Before session 33 each warm-up's own stream kept a cuBLAS and a cuBLASLt
    workspace beside the capture's (32 MiB each on Hopper): three warm-ups held 128 MiB more than one. The
    first capture is not compared: a process's first one also allocates what is made once a process (512 B
    more held after it on the H100 of session 33; torch's or forge's, not identified: a CUDA generator's
    graph state is made at its first capture)."""
    held = []
    for warmup in (1, 1, 3):
        model, opt = _model("narrow", "8bit")
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        step = fn.capture_step(opt, _loss_fn(model, "hf"), warmup=warmup)
        for ids in _batches(64)[:warmup + 1]:
            step(ids)
        torch.cuda.synchronize()
        held.append(torch.cuda.memory_allocated() - before)
        step.close()
        del step, model, opt
    assert held[1] == held[2], held


def test_replays_refuse_replaced_state_and_close_gives_eager_steps_back():
    """A replay after the optimizer's state tensors were replaced (load_state_dict) is refused; close()
    gives the optimizer back to eager steps, which train on."""
    batches = _batches(64)
    model, opt = _model("narrow", "8bit")
    step = fn.capture_step(opt, _loss_fn(model, "hf"), warmup=1)
    step(batches[0])
    step(batches[1])  # the capture and its replay
    opt.load_state_dict(opt.state_dict())
    with pytest.raises(RuntimeError, match="replaced since the capture"):
        step(batches[2])
    step.close()
    assert opt._slots is None and not opt._capturable
    opt.backward(_loss_fn(model, "hf")(batches[2]))
    opt.step()
    assert opt.stats["step"] == 3


def test_a_step_with_a_host_read_is_refused_and_training_goes_on():
    """A loss function that reads the device on the host (.item()) cannot be captured: the capture is
    refused with that reason, the step counters are as before it, and eager steps go on (equal to a run
    that never tried)."""
    batches = _batches(64)
    model, opt = _model("narrow", "8bit")
    model_loss = _loss_fn(model, "hf")

    def loss_fn(ids):
        if ids.max().item() < 0:  # never true: a host read all the same
            raise AssertionError
        return model_loss(ids)

    step = fn.capture_step(opt, loss_fn, warmup=1)
    step(batches[0])
    counters = [st["step"].item() for st in opt.state.values()]
    with pytest.raises(RuntimeError, match="could not be captured"):
        step(batches[1])
    assert [st["step"].item() for st in opt.state.values()] == counters
    assert opt._slots is None and not opt._capturable  # back to eager steps
    with pytest.raises(RuntimeError, match="closed"):
        step(batches[1])
    for ids in batches[1:3]:
        opt.backward(loss_fn(ids))
        opt.step()
    ref, ref_opt = _model("narrow", "8bit")
    ref_fn = _loss_fn(ref, "hf")
    for ids in batches[:3]:
        ref_opt.backward(ref_fn(ids))
        ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(training_bits(ref, ref_opt), training_bits(model, opt)))


@pytest.mark.parametrize("precision", ["fp32", "8bit"])
def test_a_dropped_captured_model_gives_its_memory_back(precision):
    """A tied model trained through capture_step, then dropped with its optimizer and CapturedStep: after
    gc.collect() its parameters, optimizer state, optimizer, CapturedStep and CUDA graph are all freed
    (weak references to each are dead), so the device memory they held is back with the allocator. Before
    session 39 every prepared model stayed (tests/test_lifetime.py says why). Weak references rather than
    torch.cuda.memory_allocated(): cuBLAS keeps a workspace per stream, which a later step may create."""
    import gc
    import weakref

    def trained_then_dropped():
        model, opt = _model("narrow", precision, tie=True)
        step = fn.capture_step(opt, _loss_fn(model, "hf"), warmup=2)
        for ids in _batches(64):
            step(ids)
        torch.cuda.synchronize()
        assert step._graph is not None, "the step was captured"
        tensors = [*model.parameters()] + [t for s in opt.state.values() for v in s.values()
                                           for t in (v.values() if isinstance(v, dict) else (v,))
                                           if isinstance(t, torch.Tensor) and t.is_cuda]
        return [weakref.ref(o) for o in (*tensors, opt, step, step._graph, model)]

    refs = trained_then_dropped()
    gc.collect()
    alive = [type(r()).__name__ for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of {len(refs)} objects outlive the model: {alive[:6]}"
