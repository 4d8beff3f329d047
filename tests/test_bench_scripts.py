"""bench/train_step.py and bench/capacity.py in their --tiny CPU modes (the GPU runs are manual).

Both scripts run here as a user runs them (a subprocess, JSON written to a temporary folder); the
search logic of capacity.py is also checked on its own against brute force.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # on sys.path behind site-packages (conftest.py)

from bench import capacity, train_step  # noqa: E402

pytestmark = pytest.mark.slow


def _run(script, *args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_train_step_tiny(tmp_path):
    out = tmp_path / "train_step.json"
    proc = _run("train_step.py", "--tiny", "--checkpointing", "on",
                "--methods", "forge,forge_bf16sr,forge_8bit,torch_adamw,torch_hooks,bnb_adamw8bit,ao_adamw8bit,flashoptim",
                "--out", str(out), env_extra={"BENCH_HIDE_MODULES": "bitsandbytes"})
    data = json.loads(out.read_text())
    meta = data["meta"]
    for key in ("date", "gpu", "torch", "triton", "transformers", "device", "floor_bytes_per_param"):
        assert key in meta
    assert meta["device"] == "cpu" and meta["gpu"] is None
    assert meta["floor_bytes_per_param"]["torch_adamw"] == 16 and meta["floor_bytes_per_param"]["forge"] == 12
    rows = {r["method"]: r for r in data["rows"]}
    assert list(rows) == ["forge", "forge_bf16sr", "forge_8bit", "torch_adamw", "torch_hooks", "bnb_adamw8bit",
                          "ao_adamw8bit", "flashoptim"]
    for r in data["rows"]:
        for key in ("model", "batch", "seq", "tokens", "checkpointing", "status", "reason", "n_params",
                    "predicted_peak_gib"):
            assert key in r, (r["method"], key)
        assert r["checkpointing"] is True and r["tokens"] == r["batch"] * r["seq"]
    for m in ("forge", "forge_bf16sr", "forge_8bit", "torch_adamw", "torch_hooks"):
        r = rows[m]
        assert r["status"] == "ok", r
        assert r["peak_gib"] is None  # no allocator peak on the CPU: n/a, not a made-up number
        assert r["tokens_per_s"] > 0 and len(r["step_s"]) >= 1
        # forward+backward issued before the step ends (on the CPU the step is synchronous)
        assert 0 < r["host_issue_s_median"] <= max(r["step_s"])
        # per timed step, what may stall the host: garbage collections by generation (no CUDA here,
        # so no allocator counters), each a count >= 0
        assert len(r["step_host_events"]) == len(r["step_s"])
        assert all(set(e) == {"gc_gen0", "gc_gen1", "gc_gen2"} and min(e.values()) >= 0 for e in r["step_host_events"])
        assert all(math.isfinite(x) for x in r["losses"])
        assert r["n_params"] == train_step.count_params(train_step.MODELS["tiny"])["total"]
        assert r["model_tflops_per_s"] > 0 and r["tokens_per_s_vs_torch_adamw"] > 0
    assert rows["torch_adamw"]["tokens_per_s_vs_torch_adamw"] == 1.0
    # same seed, same init, same data: the first loss is the same for every method
    assert rows["forge"]["losses"][0] == pytest.approx(rows["torch_adamw"]["losses"][0], rel=1e-6)
    # a missing baseline is reported with its reason, never dropped
    assert rows["bnb_adamw8bit"]["status"] == "unavailable"
    assert "not installed" in rows["bnb_adamw8bit"]["reason"]
    for m in ("ao_adamw8bit", "flashoptim"):  # installed or not: on the CPU either ok or a reason
        assert rows[m]["status"] == "ok" or rows[m]["reason"], rows[m]
    assert "UNAVAILABLE" in proc.stdout and "tok/s" in proc.stdout


def test_train_step_chunked_loss_rows(tmp_path):
    """"+cl" runs a method with forge_num.linear_cross_entropy as its loss: the rows run, carry their
    own ratios to torch_adamw+cl, and the memory model gives them 2 bytes a logit plus one chunk's
    temporaries instead of 12 bytes a logit."""
    out = tmp_path / "train_step.json"
    _run("train_step.py", "--tiny", "--checkpointing", "on", "--methods", "forge,forge+cl,torch_adamw,torch_adamw+cl",
         "--out", str(out))
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    for m in ("forge+cl", "torch_adamw+cl"):
        assert rows[m]["status"] == "ok" and all(math.isfinite(x) for x in rows[m]["losses"]), rows[m]
        assert rows[m]["tokens_per_s_vs_torch_adamw_cl"] > 0
    assert rows["torch_adamw+cl"]["tokens_per_s_vs_torch_adamw_cl"] == 1.0
    assert "tokens_per_s_vs_torch_adamw_cl" not in rows["forge"]
    from forge_num.loss import DEFAULT_CHUNK_BYTES

    cfg = train_step.MODELS["llama-8b"]
    T, V = 4096, cfg["vocab_size"]
    diffs = {m: train_step.predict_peak_bytes(cfg, m, 4, 1024, True)
             - train_step.predict_peak_bytes(cfg, m + "+cl", 4, 1024, True) for m in ("forge", "torch_adamw", "forge_8bit")}
    # all of it where the forward's end is the peak (forge's), nothing where the backward's end is (AMP's
    # 16 bytes a parameter at 8B)
    saved = 10 * T * V - DEFAULT_CHUNK_BYTES
    assert diffs == {"forge": saved, "torch_adamw": 0, "forge_8bit": saved}
    assert train_step.unavailable_reason("forge+cl", cuda=False) is None
    assert "unknown method" in train_step.unavailable_reason("forge+xx", cuda=False)


def test_host_time_refuses_without_cuda():
    """bench/host_time.py measures CUDA launches: on the CPU it says so and fails, not a fake number."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_time.py"), "--part", "launch"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr + proc.stdout


def test_ncu_probe_refuses_without_cuda_and_resolves_tile_labels():
    """bench/ncu_probe.py only launches for Nsight Compute: without CUDA it says so and fails; its tile
    labels ('_' for a space, as gpu_session.sh passes them) name the launcher's tiles, and an unknown
    label is an error that lists the known ones."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ncu_probe.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert proc.returncode != 0 and "needs CUDA" in proc.stderr + proc.stdout
    import torch

    from bench import ncu_probe
    from forge_num import kernels

    tile = ncu_probe.tile_by_label("64x128x64_w4_s4_e4_tma".replace("_", " "), 4096, 4096, 256)
    assert tile.label == "64x128x64 w4 s4 e4 tma" and tile in kernels.BF16_CONFIGS
    assert ncu_probe.tile_by_label("default", 4096, 4096, 256) == kernels.default_config(4096, 4096, 256, torch.bfloat16)
    with pytest.raises(SystemExit, match="unknown tile label"):
        ncu_probe.tile_by_label("64x128x64 w4 s4 e4 l2", 4096, 4096, 256)
    # the 8bit regime resolves among its own tiles, by shape and K as the launcher does (512x2048 has
    # fewer than Q8_TMA_MIN_TILES of the TMA tile's: the pointer 32x128 below Q8_LARGE_K)
    for M, N, K in ((4096, 4096, 256), (512, 2048, 256), (512, 2048, 4096)):
        assert ncu_probe.tile_by_label("default", M, N, K, "8bit") == kernels.default_q8_config(M, N, K, torch.bfloat16)
    assert ncu_probe.tile_by_label("default", 512, 2048, 256, "8bit") != ncu_probe.tile_by_label("default", 512, 2048,
                                                                                                  4096, "8bit")
    assert ncu_probe.tile_by_label("64x128x64 w8 s4 e2", 4096, 4096, 256, "8bit") in kernels.Q8_CONFIGS[torch.bfloat16]
    with pytest.raises(SystemExit, match="unknown tile label"):
        ncu_probe.tile_by_label("64x128x64 w4 s4 e4 tma", 4096, 4096, 256, "8bit")  # an fp32/bf16-sr tile


def test_host_time_python_part_runs_on_the_cpu(tmp_path):
    """--part python: forge's per-linear Python against nn.Linear + torch AdamW, kernels stubbed;
    on the CPU it runs and reports both step times and the difference per linear."""
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_time.py"), "--part", "python",
                           "--python-layers", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())["python"]
    assert r["device"] == "cpu" and r["linears"] == 14
    assert r["plain_step_ms"] > 0 and r["forge_step_ms"] > 0
    assert r["forge_extra_us_per_linear"] == pytest.approx((r["forge_step_ms"] - r["plain_step_ms"]) / 14 * 1e3)
    # the stubbed backend ran: forge's own functions are in the profile, the kernels' are not
    functions = " ".join(row["function"] for row in r["cprofile_tottime"])
    assert "forge_num" in functions and "fused_linear_update_kernel" not in functions
    assert "us more per linear" in proc.stdout


def test_host_time_cpu_step_part_runs_forges_launcher_with_launches_stubbed(tmp_path):
    """--part cpu-step: forge's whole host path (its kernels' launcher included, the launches returning at
    once) against free gradient release (and FlashOptim where its wheel is installed), on the CPU."""
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_time.py"), "--part", "cpu-step",
                           "--cpu-layers", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                          # the compiled launcher's path, not the interpreter's
                          env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
                               "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())["cpu_step"]
    assert r["linears"] == 14 and r["precision"] == "8bit"
    assert r["step_ms"]["forge"] > 0 and r["step_ms"]["free release"] > 0
    # the launcher's Python ran, once a fused linear (14) and once each for the head's and the norms'
    # element-wise row updates, and reached the (stubbed) launch
    functions = r["functions"]
    assert functions["      kernels.fused_linear_update"]["calls_per_step"] >= 14
    assert functions["          CachedLaunch.launch (Triton, Gluon)"]["calls_per_step"] >= 14
    assert "us more a linear" in proc.stdout
    assert 0 < r["replay_bookkeeping_ms"] < r["step_ms"]["forge"]  # a captured step's host work: part of the eager step's


def _brute(method, limit, vary, upper, seq=32):
    best = 0
    for n in range(1, upper + 1):
        cfg = dict(train_step.MODELS["tiny"])
        batch = 1
        if vary == "layers":
            cfg["num_hidden_layers"] = n
        else:
            batch = n
        if train_step.predict_peak_bytes(cfg, method, batch, seq, True) <= limit:
            best = n
    return best


def test_train_step_profile_tiny(tmp_path):
    """--profile adds one profiled step: time by kind of kernel (aten ops' CPU time here), with the
    GEMMs and forge's casts found where they are."""
    out = tmp_path / "train_step.json"
    _run("train_step.py", "--tiny", "--checkpointing", "on", "--methods", "forge,torch_adamw", "--profile",
         "--out", str(out))
    for r in json.loads(out.read_text())["rows"]:
        assert r["status"] == "ok", r
        assert r["profile_ms"]["GEMM"] > 0 and r["profile_ms"]["casts and copies"] > 0, r["profile_ms"]
        assert sum(r["profile_ms"].values()) >= sum(t["ms"] for t in r["profile_top"]) > 0
        assert r["profile_device_ms"] == pytest.approx(sum(r["profile_ms"].values()))
        assert r["profile_wall_ms"] > 0


@pytest.mark.parametrize("name,category", [
    ("fused_linear_update_kernel", "forge fused dW + update"),
    ("elementwise_update_kernel", "forge element-wise update"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
     "optimizer step"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "GEMM"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "GEMM"),
    ("aten::mm", "GEMM"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>", "attention"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
     "casts and copies"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
     "reductions and norms"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other element-wise"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_categories(name, category):
    assert train_step.kernel_category(name) == category


def test_capacity_tiny_finds_known_answer(tmp_path):
    out = tmp_path / "capacity.json"
    limit_gib = 0.005
    _run("capacity.py", "--tiny", "--memory-limit-gib", str(limit_gib), "--methods",
         "forge,torch_adamw,flashoptim", "--start-layers", "1", "--start-batch", "3", "--out", str(out),
         env_extra={"BENCH_HIDE_MODULES": "flashoptim"})
    data = json.loads(out.read_text())
    res = data["results"]
    limit = limit_gib * train_step.GIB
    for m in ("forge", "torch_adamw"):
        r = res[m]
        assert r["status"] == "ok", r
        assert r["max_layers"] == _brute(m, limit, "layers", 64)
        assert r["max_batch"] == _brute(m, limit, "batch", 64)
        statuses = {p["status"] for p in r["probes"]}
        assert statuses == {"ok", "oom"}
        # the floor alone (bytes/param x parameters) is within the limit at the answer
        cfg = dict(train_step.MODELS["tiny"], num_hidden_layers=r["max_layers"])
        assert train_step.floor_bytes_per_param(m) * train_step.count_params(cfg)["total"] <= limit
    # the known answer, by hand: 12 vs 16 B/param over 36,992 parameters per layer + 32,832
    assert res["forge"]["max_layers"] == 10 and res["torch_adamw"]["max_layers"] == 8
    assert res["forge"]["max_layers_vs_torch_adamw"] == pytest.approx(10 / 8)
    assert res["torch_adamw"]["max_layers_vs_torch_adamw"] == 1.0
    assert res["flashoptim"]["status"] == "unavailable" and res["flashoptim"]["reason"]


@pytest.mark.parametrize("upper", [1, 2, 7, 64])
def test_search_max_against_brute_force(upper):
    for answer in range(upper + 1):
        for start in sorted({1, 2, answer, answer + 1, upper}):
            if not 1 <= start <= upper:
                continue
            got, probes = capacity.search_max(lambda n, a=answer: n <= a, start, upper)
            assert got == answer, (answer, start, upper, probes)
            assert len(probes) <= 4 * max(1, math.ceil(math.log2(upper + 1))) + 2


@pytest.mark.parametrize("resolution", [2, 4])
def test_search_max_with_a_resolution_brackets_the_answer(resolution):
    """With a resolution r the search returns an n that fits and is at most r - 1 below the answer."""
    upper = 64
    for answer in range(upper + 1):
        for start in (1, 9, 40, upper):
            got, probes = capacity.search_max(lambda n, a=answer: n <= a, start, upper, resolution)
            assert got <= answer < got + resolution, (answer, start, resolution, probes)
            assert len(probes) <= 4 * math.ceil(math.log2(upper + 1)) + 2, probes


def test_param_count_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    for name in ("tiny", "llama-1b", "llama-8b"):
        cfg = train_step.MODELS[name]
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**cfg))
        assert sum(p.numel() for p in model.parameters()) == train_step.count_params(cfg)["total"], name


def test_tp_train_tiny(tmp_path):
    """bench/tp_train.py on 2 CPU ranks (gloo): a transformers Llama with its projections Colwise /
    Rowwise, forge_num (autocast, fused shards) and torch AdamW from one init and batch: the same
    first loss (the weights are equal before the first update), both trained."""
    rows = {}
    for method in ("forge", "torch_adamw"):
        out = tmp_path / f"{method}.json"
        _run("tp_train.py", "--spawn", "2", "--model", "tiny", "--method", method, "--batch", "2", "--seq", "16",
             "--warmup", "1", "--steps", "1", "--out", str(out))
        rows[method] = json.loads(out.read_text())["rows"][0]
    for r in rows.values():
        assert r["status"] == "ok" and r["ranks"] == 2, r
        assert all(math.isfinite(x) for x in r["losses"]) and r["losses"][-1] < r["losses"][0]
    assert rows["forge"]["losses"][0] == rows["torch_adamw"]["losses"][0]


def test_tp_find_batch_search():
    """The micro-batch search (doubling, then bisection) against a fake probe that fits up to 5."""
    import argparse

    from bench import tp_train

    seen = []

    def probe(args, method, batch):
        seen.append(batch)
        return {"status": "ok" if batch <= 5 else "oom", "batch": batch}

    args = argparse.Namespace(methods="forge", seq=8, out=None, nproc=2)
    rows = tp_train.find_batch(args, probe=probe)
    assert rows[0]["largest_batch"] == 5 and seen == [1, 2, 4, 8, 6, 5]


def test_host_time_split_part_runs_on_the_cpu(tmp_path):
    """--part split on the CPU (--split-model tiny): both methods' phases, forge's two launch modes,
    and forge's own functions timed inside the step (the wrappers were installed and counted calls);
    with --split-methods, an 8bit forge on the chunked loss against another reference."""
    out = tmp_path / "split.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_time.py"), "--part", "split",
                           "--split-model", "tiny", "--split-steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())["split"]
    assert r["variants"] == ["forge", "forge (FORGE_NUM_FAST_LAUNCH=0)", "torch_adamw"]
    for name in r["variants"]:
        assert r[name]["wall"] > 0 and len(r[name]["wall_all"]) == 2, name
    functions = r["forge"]["functions"]
    backward = next(v for k, v in functions.items() if "fused_linear_backward" in k)
    assert backward["calls_per_step"] > 0 and backward["us_per_call"] > 0
    assert not r["torch_adamw"]["functions"]  # torch's step has no forge functions to time
    assert r["interleaved"] and r["reference"] == "torch_adamw" and r["torch_adamw"]["speed_vs_reference"] == 1.0
    assert r["forge"]["speed_vs_reference"] > 0

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_time.py"), "--part", "split",
                           "--split-model", "tiny", "--split-steps", "2", "--split-methods",
                           "forge_8bit+cl,torch_hooks", "--split-env", "FORGE_NUM_Q8_TILE=64x128x64_w8_s4_e4_tma_r128",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())["split"]
    assert r["variants"] == ["forge_8bit+cl", "forge_8bit+cl (FORGE_NUM_FAST_LAUNCH=0)",
                             "forge_8bit+cl (FORGE_NUM_Q8_TILE=64x128x64_w8_s4_e4_tma_r128)", "torch_hooks"]
    assert r["reference"] == "torch_hooks"
    calls = r["forge_8bit+cl"]["functions"]
    assert any("fused_linear_backward" in k and v["calls_per_step"] > 0 for k, v in calls.items())
    assert "x torch_hooks" in proc.stdout


def test_ws_probe_refuses_without_cuda():
    """bench/ws_probe.py launches the Gluon kernel: without CUDA it says so and fails."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ws_probe.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert proc.returncode != 0 and "needs an sm_90 CUDA device" in proc.stderr


@pytest.mark.parametrize("script", ["pair_tile.py", "multicast_mainloop.py", "quad_mainloop.py"])
def test_the_two_cta_scripts_compile_on_a_cluster_triton_and_refuse_on_an_older_one(script):
    """bench/pair_tile.py, bench/multicast_mainloop.py and bench/quad_mainloop.py (the 2x2 cluster) need Triton
    3.9's Gluon (two-CTA barriers, arrivals routed across a cluster, multicast copies). On an older Triton (CI's
    3.6) they say so and fail; on one with them, --ptx compiles their variants for sm_90 without a GPU: no wgmma
    chain serialized."""
    import triton

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--ptx"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env, check=False)
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9):
        assert proc.returncode != 0 and "needs Triton 3.9" in proc.stderr, proc.stderr[-2000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "'wgmma_serialized': False" in proc.stdout and "True}" not in proc.stdout, proc.stdout


def test_cpu_peak_tiny():
    """bench/cpu_peak.py on the tiny model: it runs, and the storages it lists at the peak add up to the
    peak it reports (the listing is complete, not a sample)."""
    from bench import cpu_peak

    r = cpu_peak.run("tiny", 2, "1x16", "8bit", top=1000)
    assert r["peak_gib"] > 0 and r["phase"] in ("forward", "backward", "step")
    assert abs(sum(a["gib"] for a in r["alive"]) + r["other_gib"] - r["peak_gib"]) < 1e-12
    proc = _run("cpu_peak.py", "--model", "tiny", "--tokens", "1x16", "--precision", "fp32")
    assert "the step's peak" in proc.stdout


def test_registers_main_path_stops_at_the_first_exit():
    """bench/registers.py --sass counts the SASS a thread runs through: up to the first EXIT, opcodes
    without predicates or modifiers; the slow-path subroutine placed after it is not counted."""
    from bench.registers import main_path

    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   IMAD.WIDE.U32 R2, R9, 0x4, R2 ;
        /*0020*/               @P0 IMAD.HI.U32 R4, R5, R6, RZ ;
        /*0030*/              @!P1 BRA `(.L_x_1) ;
        /*0040*/                   EXIT ;
        /*0050*/                   FFMA R11, -R7, R8, 1 ;
        /*0060*/                   RET.REL.NODEC R2 `(kernel) ;
"""
    assert main_path(sass) == {"LDC": 1, "IMAD": 2, "BRA": 1, "EXIT": 1}


def test_registers_by_source_attributes_each_instruction_to_its_line():
    """bench/registers.py --by-source: each instruction of nvdisasm -g's text counts for the source line
    named last before it; the main path stops at the first EXIT, the whole kernel does not."""
    from bench.registers import by_source

    sass = """
	//## File "/repo/kernels/quant8.py", line 90
        /*0000*/                   SHF.L.U32 R2, R3, 0x7, RZ ;
        /*0010*/                   VIMNMX R4, R5, 0x1f, PT ;
	//## File "/repo/kernels/random.py", line 116
        /*0020*/                   IMAD.WIDE.U32 R6, R7, R8, RZ ;
        /*0030*/                   EXIT ;
	//## File "/repo/kernels/ieee.py", line 41
        /*0040*/                   FFMA R11, -R7, R8, 1 ;
"""
    assert by_source(sass) == {("quant8.py", 90): 2, ("random.py", 116): 2}
    assert by_source(sass, whole=True) == {("quant8.py", 90): 2, ("random.py", 116): 2, ("ieee.py", 41): 1}


def test_method_suffixes_pick_the_loss_and_the_captured_step():
    """bench/train_step.py's method names: "+cl" the chunked loss, "+graph" after it forge's step through
    forge_num.capture_step (forge's methods only; elsewhere reported as unavailable, with the reason)."""
    assert train_step.base_method("forge_8bit+cl+graph") == "forge_8bit"
    assert train_step.chunked_loss("forge_8bit+cl+graph") and not train_step.chunked_loss("forge_8bit+graph")
    assert train_step.unavailable_reason("forge_8bit+cl+graph", cuda=True) is None
    assert "captures forge's step only" in train_step.unavailable_reason("torch_adamw+graph", cuda=True)
    assert "unknown method" in train_step.unavailable_reason("forge_9bit+graph", cuda=True)


def test_alive_after_counts_a_block_freed_at_its_free_request():
    """The capture history's residue (train_step.alive_after): a block is freed where its free is requested
    (torch.cuda.memory_allocated drops there), an address reused after a free is a new block, and what
    no event frees is left, largest first."""
    trace = [{"action": "alloc", "addr": 1, "size": 10}, {"action": "alloc", "addr": 2, "size": 30},
             {"action": "free_requested", "addr": 1, "size": 10}, {"action": "alloc", "addr": 1, "size": 20},
             {"action": "alloc", "addr": 3, "size": 5}, {"action": "free_requested", "addr": 3, "size": 5},
             {"action": "free_completed", "addr": 3, "size": 5}, {"action": "segment_alloc", "addr": 9, "size": 99}]
    left = train_step.alive_after([trace])
    assert [(e["addr"], e["size"]) for e in left] == [(2, 30), (1, 20)]


@pytest.mark.parametrize("tiles_m,tiles_n,group_m", [(5, 7, 8), (20, 3, 16), (64, 112, 8), (33, 4, 32), (7, 9, 1)])
def test_tile_order_model_walks_every_tile_once(tiles_m, tiles_n, group_m):
    """bench/tile_order_model.py's order (the kernels' grouped order) is a permutation of the tiles, GROUP_M
    consecutive tile rows of a group column by column, and a last group of fewer rows where GROUP_M does not
    divide tiles_m."""
    from bench import tile_order_model

    order = [tile_order_model.tile_coords(t, tiles_m, tiles_n, group_m) for t in range(tiles_m * tiles_n)]
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    first = min(group_m, tiles_m)  # the first group's rows
    assert order[:first + 1] == [(m, 0) for m in range(first)] + [(0, 1)]


def test_tile_order_model_counts_each_operand_once_or_every_time():
    """With an L2 that holds everything, the operands are read once ((M + N) x K x 2 bytes); with one that holds
    nothing but the chunk in use, every tile reads its K blocks of both operands from DRAM."""
    from bench import tile_order_model

    M, N, K = 640, 1024, 256  # 10 x 8 tiles of 64x128, 4 K blocks of 64
    assert tile_order_model.operand_dram_bytes(M, N, K, programs=12, capacity_mb=1024) == (M + N) * K * 2
    tiles, n_k = 10 * 8, 4
    every = tiles * n_k * (64 * 64 * 2 + 128 * 64 * 2)
    assert tile_order_model.operand_dram_bytes(M, N, K, programs=12, capacity_mb=1e-6) == every
