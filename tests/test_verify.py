"""forge-num verify (forge_num/verify.py): the user's own bit-for-bit check of the kernel the launcher picks,
against the unfused comparator and the emulator; kernels.launcher_tile, which names that kernel. On the CPU
the Triton kernels run in the interpreter (tests/conftest.py); the GPU test runs it where Hopper's Gluon
routes take the update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge_num import kernels, verify

CUDA = torch.cuda.is_available()


@pytest.mark.interpreter
@pytest.mark.parametrize("precision,operands", [("fp32", "fp32"), ("fp32", "bf16"), ("bf16-sr", "bf16"),
                                                ("8bit", "bf16")])
def test_verify_passes_on_its_builtin_case(precision, operands, capsys):
    assert verify.main(["--shape", "40x24x20", "--precision", precision, "--operands", operands]) == 0
    out = capsys.readouterr().out
    assert out.count("bitwise") == 8 and "DIFFERENT" not in out  # two columns, four rules
    assert "the launcher's kernel: triton" in out and (f"{operands} operands" in out)


@pytest.mark.parametrize("precision", ["bf16-sr", "8bit"])
def test_the_stochastic_cases_pin_the_random_stream(precision):
    """In the stochastic regimes verify's agreement with the emulator is agreement on the Philox stream: on
    its kind of case another key gives other weight bits."""
    from forge_num import kernels, rules
    from forge_num.emulator import emulate
    from forge_num.emulator.philox import derive_seed

    g = torch.Generator().manual_seed(0)
    M, N, K = 40, 128, 20
    w = torch.randn(M, N, generator=g).bfloat16()
    x, dy = torch.randn(K, N, generator=g).bfloat16(), (torch.randn(K, M, generator=g) * 0.1).bfloat16()
    rule = rules.get_rule("adamw")
    h = rule.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 1)
    w0, s0 = verify._as_arrays(w, [torch.zeros(M, N, dtype=torch.bfloat16)] * 2 if precision == "bf16-sr"
                               else [kernels.Q8State.zeros(M, N)] * 2)
    runs = [emulate(w0, verify._bits(x), verify._bits(dy), s0, rule=rule, h=h, tile=(16, 128, 16),
                    precision=precision, seed=derive_seed(0, 1, p)) for p in (0, 1)]
    assert not verify._same(runs[0].weight, runs[1].weight)


def test_verify_rejects_fp32_operands_in_a_stochastic_regime():
    with pytest.raises(SystemExit):
        verify.main(["--precision", "8bit", "--operands", "fp32"])


@pytest.mark.interpreter
def test_verify_fails_when_the_emulator_disagrees(monkeypatch, capsys):
    """Not vacuous: one flipped bit in the emulator's weight makes every rule's row read DIFFERENT and the
    command exit 1."""
    from forge_num import emulator

    real = emulator.emulate

    def off_by_one_ulp(*args, **kwargs):
        res = real(*args, **kwargs)
        res.weight.view(np.uint32)[0, 0] ^= 1
        return res

    monkeypatch.setattr(emulator, "emulate", off_by_one_ulp)
    assert verify.main(["--shape", "40x24x20", "--operands", "bf16"]) == 1
    out = capsys.readouterr().out
    assert out.count("DIFFERENT") == 4 and "verify: FAILED" in out


def test_the_bf16_case_tells_the_tensor_cores_from_an_fma_chain():
    """--operands bf16 checks the tensor cores' arithmetic: on verify's kind of case the emulator's Hopper model
    and an fp32 FMA chain over the same bf16 values give different weights, so agreeing with the first is not
    agreeing with any fp32 dot."""
    from forge_num import rules
    from forge_num.emulator import emulate

    g = torch.Generator().manual_seed(0)
    M, N, K = 40, 24, 20
    w = torch.randn(M, N, generator=g)
    x, dy = torch.randn(K, N, generator=g).bfloat16(), (torch.randn(K, M, generator=g) * 0.1).bfloat16()
    rule = rules.get_rule("sgd")
    h = rule.scalars({"lr": 0.01}, 1)
    tc = emulate(w.numpy(), verify._bits(x), verify._bits(dy), rule=rule, h=h, tile=(32, 32, 16))
    fma = emulate(w.numpy(), x.float().numpy(), dy.float().numpy(), rule=rule, h=h, tile=(32, 32, 16))
    assert not np.array_equal(tc.weight.view(np.uint32), fma.weight.view(np.uint32))


def test_verify_rejects_a_shape_that_is_not_three_integers():
    with pytest.raises(SystemExit):
        verify.main(["--shape", "40x24"])


@pytest.mark.interpreter
def test_launcher_tile_names_the_triton_tile_in_the_interpreter():
    if CUDA:
        pytest.skip("the interpreter's tile (CPU)")
    w, s = torch.zeros(64, 64), [torch.zeros(64, 64)]
    x, dy = torch.zeros(16, 64, dtype=torch.bfloat16), torch.zeros(16, 64, dtype=torch.bfloat16)
    assert kernels.launcher_tile(w, x, dy, s) == ("triton", kernels.INTERPRETER_CONFIG)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1024, 1152, 256), (1024, 1152, 1024), (4096, 2048, 4096), (256, 256, 256),
                                   (1024, 1152, 64)])
def test_launcher_tile_is_the_tile_launched(M, N, K):
    """kernels.launcher_tile names what fused_linear_update launches with no tile given (fp32 regime, bf16
    operands): the Gluon kernel and tile it hands the update to, or the Triton tile."""
    from unittest import mock

    from forge_num import rules
    from forge_num.kernels import gluon_f32, gluon_update

    w = torch.zeros(M, N, device="cuda")
    s = [torch.zeros_like(w), torch.zeros_like(w)]
    x, dy = torch.randn(K, N, device="cuda").bfloat16(), torch.randn(K, M, device="cuda").bfloat16()
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 1)
    kernel, tile = kernels.launcher_tile(w, x, dy, s)
    picked = []
    real_triton_tile = kernels._triton_tile
    with mock.patch.object(gluon_f32, "launch", wraps=gluon_f32.launch) as f32, \
            mock.patch.object(gluon_update, "launch", wraps=gluon_update.launch) as ws, \
            mock.patch.object(kernels, "_triton_tile", lambda *a: picked.append(real_triton_tile(*a)) or picked[-1]):
        kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, h)
    launched = ([("gluon_f32", c.args[7]) for c in f32.call_args_list] + [("gluon_update", c.args[7]) for c in
                ws.call_args_list] + [("triton", t) for t in picked])
    assert launched == [(kernel, tile)]


@pytest.mark.gpu
@pytest.mark.exactness
@pytest.mark.parametrize("precision", ["fp32", "bf16-sr", "8bit"])
def test_verify_passes_on_the_gpu_with_bf16_operands(precision, capsys):
    """On the GPU with bf16 operands at the default shape: the kernel the launcher picks (in the fp32 regime on
    Hopper a Gluon kernel), bit for bit against the unfused comparator and the emulator's tensor-core model."""
    assert verify.main(["--operands", "bf16", "--precision", precision]) == 0
    out = capsys.readouterr().out
    assert out.count("bitwise") == 8
    if precision == "fp32" and torch.cuda.get_device_capability() == (9, 0):
        assert "the launcher's kernel: gluon" in out
