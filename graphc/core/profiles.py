"""Machine profiles to plan for: presets of published hardware, this machine, or a JSON file.
(The profile itself, ``MachineProfile``, is graphc/core/profile.py.)

    get_profile("h100-sxm")       a preset (``PRESETS``)
    get_profile("cluster.json")   a profile file: the JSON ``MachineProfile.to_json()`` writes, every
                                  key checked (``read_profile``)
    get_profile(profile)          a MachineProfile as it is

The presets hold spec-sheet peaks (``matmul_flops``, against which MFU is reported) and the rates
published measurements reach, each number with its source below: tensor-core GEMMs at
``SUSTAINED_GEMM`` of the peak, memory-bound kernels at ``HBM_EFFICIENCY`` of the datasheet's
bandwidth, and links at the bus bandwidth NCCL's own tests measure on DGX nodes (``NVLINK3_BUSBW``
...), not at their line rates. A per-GPU link is what one GPU can send one way: NVLink's total is
counted in both directions, and a DGX node has one InfiniBand port per GPU. The scale search adds
what a GPU training stack does beyond the per-op model (``ClusterFigures``: overlap, fused
attention and dropout inside it, GEMM waves, kernel launches); what it still leaves out (the causal half of attention a
kernel skips, ...) is listed in docs/scale.md.

The GPU presets fuse elementwise chains (``fuses_elementwise``), as the compilers and fused
kernels of GPU training stacks do (XLA, torch.compile, Megatron-LM's fused softmax and bias-GELU):
without that, a step's softmaxes and norms would each be priced as memory round trips.

Link latencies and the per-collective overhead are those of NCCL's own cost model (NCCL 2.x,
``src/graph/tuning.cc``: ``hwLat`` per ring step of the Simple protocol, 3.4 us over NVLink and
9.6 us over the network; ``baseLat`` per ring collective, 8.4 us).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from graphc.core.cache import private_dir, unsafe_reason, warn_cache
from graphc.core.errors import MeshError
from graphc.core.files import atomic_write, cache_dir
from graphc.core.profile import Link, MachineProfile

# --- this machine's stored profile (``graphc calibrate``) ------------------------------------------


def profile_path() -> str:
    """``$GRAPHC_PROFILE``, else ``profile.json`` in the cache folder (graphc/core/files.py ``cache_dir``)."""
    explicit = os.environ.get("GRAPHC_PROFILE")
    if explicit:
        return explicit
    return cache_dir("profile.json")


def _in_cache_folder(path: str) -> bool:
    return os.path.abspath(path) == os.path.abspath(cache_dir("profile.json"))


def save_profile(profile: MachineProfile, path: str | None = None) -> str:
    """Write ``profile`` as JSON to ``path`` (default ``profile_path()``) atomically; return the path.
    In the cache folder, that folder is created 0700 and must be the user's alone."""
    path = path or profile_path()
    private = _in_cache_folder(path)
    if private and private_dir(os.path.dirname(path)) is None:
        raise MeshError(
            f"{path}: the cache folder is not yours alone (see the warning); store the profile with -o FILE"
        )
    atomic_write(path, json.dumps(profile.to_json(), indent=1) + "\n", make_dirs=True, mode=0o600 if private else 0o666)
    return path


def _profile_is_trusted(path: str) -> bool:
    """The profile in the cache folder is read only when it and its folder are the user's alone
    (graphc/core/cache.py); a warning says why not otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        return True  # no file: the default profile, below
    if private_dir(os.path.dirname(path)) is None:
        return False
    why = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else unsafe_reason(st)
    if why is not None:
        warn_cache(path, f"machine profile {why}", "not read; planning with the default profile")
        return False
    return True


def load_profile(path: str | None = None) -> MachineProfile:
    """The profile stored at ``path`` (default ``profile_path()``), or ``MachineProfile.default()``
    when there is no such file, or when the file in the cache folder is not the user's alone. Never
    measures: planning stays deterministic and fast."""
    path = path or profile_path()
    if _in_cache_folder(path) and not _profile_is_trusted(path):
        return MachineProfile.default()
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return MachineProfile.default()
    except (OSError, UnicodeDecodeError) as exc:  # a folder, not UTF-8 text
        raise MeshError(f"cannot read machine profile {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshError(
            f"{path}:{exc.lineno}:{exc.colno}: not a machine profile (bad JSON: {exc.msg}); "
            f"rerun 'graphc calibrate' or delete the file"
        ) from None
    try:
        return MachineProfile.from_json(doc)
    except MeshError as exc:
        raise MeshError(f"{path}: {exc}; rerun 'graphc calibrate' or delete the file") from None


# --- presets and profile files -------------------------------------------------------------------

NVLINK_STEP_S = 3.4e-6  # NCCL tuning.cc hwLat[NVLINK][Ring][Simple]
NETWORK_STEP_S = 9.6e-6  # NCCL tuning.cc hwLat[NET][Ring][Simple]
NCCL_CALL_S = 8.4e-6  # NCCL tuning.cc baseLat[Ring][Simple]

# Tensor-core GEMMs sustain about 80-90% of the datasheet peak: "optimized matrix-multiply (GEMM)
# operations ... can reach up to 80-90% of the theoretical maximum device throughput" (Dao,
# FlashAttention-2, 2023, section 1). The GPU presets price bfloat16/float16 matmuls of every size
# class at the lower end, 80%; their peaks (``matmul_flops``) stay the datasheet's, and MFU is
# reported against those. Measurements agree with that end on the presets' GPUs: the best bf16
# torch.mm found over a sweep of shapes, the mean of 100 runs, is 271.2 TFLOP/s on an A100 SXM
# (86.9%, at 1024x10240x5120) and 794.5 on an H100 SXM (80.3%) (S. Bekman, ml-engineering,
# compute/accelerator, "Maximum Achievable Matmul FLOPS comparison table", mamf-finder.py); XLA's
# measured H100 table gives 783 TFLOP/s (79.2%) for a 4096-cube bf16 product (openxla
# xla/service/gpu/model/matmul_interpolator_data.h, sm_90). The lower 230 TFLOP/s (74%) of an
# 8,192-cube fp16 product in mli/transformers-benchmarks is of an "A100 80GB" whose form factor it
# does not name (the same repository's copy benchmark ran on a PCIe card, whose best is 81.1% in
# the table above), so it is not taken for the SXM preset. No measurement at the 175B block's own
# shapes (2048 rows, k = 12288 or 1536-6144) was found: the rate is not made shape-dependent
# beyond the waves (``GEMM_WAVES``).
SUSTAINED_GEMM = 0.8
# float32 products run on the CUDA cores (numpy's float32 is full fp32, not TF32): cuBLAS's SGEMM
# measured 18.88 TFLOP/s against the 19.49 peak of an A100 80GB PCIe at 5120 x 4096 x 4096, 96.9%
# (Yinghan-Li/YHs_Sample issue 4, 2023; the SXM card's fp32 peak is the same 19.5). The GPU presets
# price float32 matmuls at that share of their fp32 peak (no H100 measurement was found: the same
# share, an assumption); they priced them at the whole peak before.
SUSTAINED_SGEMM = 18.88 / 19.49


# Memory-bound kernels: a copy benchmark on an A800 80GB PCIe (an A100 with the same 80 GB of
# HBM2e, 1,935 GB/s on its datasheet) measured 1,727 GB/s, 89% (mli/transformers-benchmarks issue
# 4, 2023). The GPU presets price elementwise, normalisation and optimizer kernels at that share
# of their datasheet bandwidth (no H100 measurement was found: the same share, an assumption).
HBM_EFFICIENCY = 1727 / 1935

# Links, as NCCL's all-reduce bus bandwidth (the ring's 2 (n-1)/n B per second, the form
# passes/sharding/redistribute.py prices), measured on DGX-class nodes:
# - NVLink 3 (A100 SXM, 300 GB/s line rate each way): all_reduce_perf -g 8 on one node of 8
#   A100, 232.54 GB/s (NVIDIA/nccl issue 1048 and nccl-tests issue 175, 2023).
# - NVLink 4 (H100 SXM, 450 GB/s): "450GB/s is the line rate. With the protocol overhead (~20%)
#   NCCL can get an effective NVLink bandwidth of 370GB/s" (S. Jeaugey, NCCL's maintainer,
#   nccl-tests issue 212, 2024; the ring algorithm, without NVLink SHARP).
# - InfiniBand HDR (200 Gb/s = 25 GB/s per GPU): "On an Nvidia DGX-A100 system we have 8x200Gbit/s
#   IB cards and we measure 192GB/s AllReduce BusBW" (NVIDIA, nccl issue 812, 2023): 24 GB/s a GPU.
# - InfiniBand NDR (400 Gb/s = 50 GB/s per GPU): "For NDR @ 400Gbps you should see 46-48GB/s per
#   NIC" (NVIDIA, nccl-tests issue 290, 2025): the lower end, 46 GB/s.
NVLINK3_BUSBW = 232.5e9
NVLINK4_BUSBW = 370e9
HDR_BUSBW = 24e9
NDR_BUSBW = 46e9


def _sustained_gemm(peak: float, fp32_peak: float) -> dict[str, dict[str, float]]:
    rate = SUSTAINED_GEMM * peak
    keys = [size + batched for size in ("small", "medium", "large") for batched in ("", " batched")]
    table = {dtype: dict.fromkeys(keys, rate) for dtype in ("bfloat16", "float16")}
    return {**table, "float32": dict.fromkeys(keys, SUSTAINED_SGEMM * fp32_peak)}


def h100_sxm() -> MachineProfile:
    """One H100 SXM5 80GB of a DGX/HGX H100 node (8 GPUs on NVSwitch), nodes on InfiniBand NDR.

    Rates from the NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; dense, i.e. half the
    "with sparsity" figures): BF16 and FP16 tensor core 989.4 TFLOP/s, FP64 tensor core 66.9,
    FP32 66.9 (without tensor cores: numpy's float32 matmul is full fp32; TF32 would be 494.7),
    HBM3 3.35 TB/s. NVLink 4: 900 GB/s per GPU in both directions = 450 GB/s each way.
    InfiniBand NDR: 400 Gb/s per GPU (a DGX H100 has eight ConnectX-7 ports for its 8 GPUs) = 50 GB/s.
    Achieved rates (module doc): HBM at ``HBM_EFFICIENCY``, NVLink 370 GB/s and NDR 46 GB/s of
    NCCL bus bandwidth.
    """
    return MachineProfile(
        flops=66.9e12,  # FP32, datasheet
        mem_bandwidth=3.35e12 * HBM_EFFICIENCY,  # HBM3, datasheet x the measured share
        link=Link(NVLINK_STEP_S, NVLINK4_BUSBW),  # NVLink 4: 450 GB/s line rate, NCCL's ring reaches 370
        collective_overhead_s=NCCL_CALL_S,
        source="NVIDIA H100 SXM5 datasheet (dense peaks); measured NCCL bus bandwidth (NVLink 4, InfiniBand NDR), "
        "HBM and GEMM shares of the peak; NCCL latencies",
        name="h100-sxm",
        matmul_flops={
            "float64": 66.9e12,  # FP64 tensor core, datasheet
            "float32": 66.9e12,
            "bfloat16": 989.4e12,  # BF16 tensor core, datasheet 1,979 with sparsity
            "float16": 989.4e12,  # FP16 tensor core, datasheet 1,979 with sparsity
        },
        inter_link=Link(NETWORK_STEP_S, NDR_BUSBW),  # InfiniBand NDR: 50 GB/s line rate, 46 measured
        fuses_elementwise=True,
        matmul_table=_sustained_gemm(989.4e12, 66.9e12),
    )


def a100_sxm() -> MachineProfile:
    """One A100 SXM4 80GB of a DGX/HGX A100 node (8 GPUs on NVSwitch), nodes on InfiniBand HDR.

    Rates from the NVIDIA A100 Tensor Core GPU datasheet (dense): BF16 and FP16 tensor core
    312 TFLOP/s, FP64 tensor core 19.5, FP32 19.5 (TF32 would be 156), HBM2e 2,039 GB/s (80GB
    SXM). NVLink 3: 600 GB/s per GPU in both directions = 300 GB/s each way. InfiniBand HDR:
    200 Gb/s per GPU (a DGX A100 has eight ConnectX-6 ports for its 8 GPUs) = 25 GB/s.
    Achieved rates (module doc): HBM at ``HBM_EFFICIENCY``, NVLink 232.5 GB/s and HDR 24 GB/s of
    NCCL bus bandwidth.
    """
    return MachineProfile(
        flops=19.5e12,  # FP32, datasheet
        mem_bandwidth=2.039e12 * HBM_EFFICIENCY,  # HBM2e, datasheet (80GB SXM) x the measured share
        link=Link(NVLINK_STEP_S, NVLINK3_BUSBW),  # NVLink 3: 300 GB/s line rate, all_reduce_perf 232.5
        collective_overhead_s=NCCL_CALL_S,
        source="NVIDIA A100 SXM4 80GB datasheet (dense peaks); measured NCCL bus bandwidth (NVLink 3, InfiniBand HDR), "
        "HBM and GEMM shares of the peak; NCCL latencies",
        name="a100-sxm",
        matmul_flops={
            "float64": 19.5e12,  # FP64 tensor core, datasheet
            "float32": 19.5e12,
            "bfloat16": 312e12,  # BF16 tensor core, datasheet 624 with sparsity
            "float16": 312e12,  # FP16 tensor core, datasheet 624 with sparsity
        },
        inter_link=Link(NETWORK_STEP_S, HDR_BUSBW),  # InfiniBand HDR: 25 GB/s line rate, 24 measured
        fuses_elementwise=True,
        matmul_table=_sustained_gemm(312e12, 19.5e12),
    )


def cpu_here() -> MachineProfile:
    """This machine: the profile ``graphc calibrate`` stored, else ``MachineProfile.default()``
    (what a Mesh uses when given no profile). Every device is a thread, so one link for all axes."""
    return load_profile()


PRESETS: dict[str, Callable[[], MachineProfile]] = {"h100-sxm": h100_sxm, "a100-sxm": a100_sxm, "cpu-here": cpu_here}


# --- what the scale search (passes/scale.py) adds for GPU clusters -------------------------------


@dataclass(frozen=True)
class ClusterFigures:
    """What a training stack on a GPU cluster does that the per-op cost model does not see, as the
    scale search prices it (passes/scale.py). Each figure's source is in ``CLUSTER_FIGURES``."""

    node_size: int | None  # devices per node: tensor parallelism stays inside one (None: no limit)
    fused_attention: bool  # attention scores never reach memory (FlashAttention)
    dp_overlap: float  # share of one micro-batch's backward the data-parallel gradient reduction hides
    p2p_overlap: bool  # pipeline sends run beside compute: only the fill and drain wait for them
    sources: tuple[str, ...] = ()
    # the share of the peak the fused attention kernel's matmuls reach (None: the GEMM rate)
    attention_efficiency: float | None = None
    # the GEMM library takes transposed operands and a weight gradient's batch sum inside the GEMM
    gemm_absorbs_layouts: bool = False
    # output tiles of ``GEMM_TILE`` a GEMM runs at once (one a streaming multiprocessor): a GEMM
    # of T tiles runs ceil(T / wave) waves (``wave_efficiency``; None: no wave quantization)
    gemm_wave: int | None = None
    gemm_tile: tuple[int, int] = (256, 128)  # output rows x columns of one thread block's tile
    # seconds the host takes to launch one kernel: a micro-batch's forward or backward on a stage
    # takes at least its kernels' launches (``launch_gap``; 0: launches never wait)
    launch_s: float = 0.0
    # how much slower compute runs while a collective hidden behind it runs beside it (0.189:
    # 18.9% slower; ``hidden_collective_s``): NCCL's kernels take SMs and memory bandwidth
    overlap_slowdown: float = 0.0
    # the fused attention kernel's time with dropout on its probabilities over its time without,
    # measured: (sequence length, forward, backward) rows (``attention_dropout_slowdown``;
    # ``FLASH_DROPOUT_MS``); (): dropout inside the kernel is free
    attention_dropout: tuple[tuple[int, float, float], ...] = ()


def wave_efficiency(tiles: int, wave: int | None) -> float:
    """The share of the whole-wave rate reached by a GEMM of ``tiles`` output tiles on a GPU that
    runs ``wave`` tiles at once: its last wave runs as long as a full one with some SMs idle, so
    it reaches tiles / (ceil(tiles / wave) x wave) (``GEMM_WAVES``). 1 without a wave size."""
    if not wave or tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / wave) * wave)


def gemm_tiles(rows: int, cols: int, tile: tuple[int, int], matrices: int = 1) -> int:
    """Output tiles of ``matrices`` GEMMs of ``rows`` x ``cols`` results each, in tiles of
    ``tile`` (rows, columns); a partial tile is a whole one (tile quantization)."""
    return matrices * math.ceil(rows / tile[0]) * math.ceil(cols / tile[1])


def attention_dropout_slowdown(rows: tuple[tuple[int, float, float], ...], seq: int) -> tuple[float, float]:
    """(forward, backward): how many times longer the fused attention kernel runs at sequence
    length ``seq`` with dropout on its probabilities than without, from the measured ``rows``
    (``ClusterFigures.attention_dropout``): the row at ``seq``; between two measured lengths the
    slower of the two (the lower end of efficiency, as elsewhere in this file); below or above
    them all, the nearest. (1, 1) without rows."""
    if not rows:
        return (1.0, 1.0)
    below = [r for r in rows if r[0] <= seq]
    above = [r for r in rows if r[0] >= seq]
    near = [max(below) if below else min(rows), min(above) if above else max(rows)]
    return (max(r[1] for r in near), max(r[2] for r in near))


def launch_gap(gpu_s: float, kernels: int, launch_s: float) -> float:
    """The seconds a GPU waits for the host when ``kernels`` kernels that together run ``gpu_s``
    are launched one after another at ``launch_s`` each (``LAUNCH_S``): none while the host keeps
    ahead, else the launches' excess over the GPU's work."""
    return max(0.0, kernels * launch_s - gpu_s)


def hidden_collective_s(comm_s: float, window_s: float, slowdown: float) -> float:
    """The seconds a collective of ``comm_s`` started beside ``window_s`` of compute adds to that
    compute: the compute runs 1 + ``slowdown`` times slower while the collective runs
    (``OVERLAP_SLOWDOWN``), and the collective's excess over the slowed compute waits. The compute
    ends after comm_s + (window_s - comm_s / (1 + slowdown)) when the collective ends first, else
    the collective ends last: max(comm_s - window_s, slowdown x comm_s / (1 + slowdown)). Without a
    slowdown, max(0, comm_s - window_s)."""
    if comm_s <= 0:
        return 0.0
    return max(comm_s - window_s, slowdown * comm_s / (1 + slowdown), 0.0)


NO_CLUSTER = ClusterFigures(node_size=None, fused_attention=False, dp_overlap=0.0, p2p_overlap=False)

# Node size: a DGX A100 and a DGX H100 each hold 8 GPUs on one NVSwitch (NVIDIA DGX A100 and DGX
# H100 datasheets).
# Fused attention: FlashAttention (Dao et al. 2022) computes softmax(QK^T)V in tiles without
# writing the scores, and recomputes them in the backward. Its matmuls run below the GEMM rate:
# FlashAttention-2 (Dao 2023, abstract) reaches "50-73% of the theoretical maximum FLOPs/s on
# A100", priced at the lower end, 50%, as ``SUSTAINED_GEMM`` takes the lower end of its range.
# On H100, FlashAttention-3 (Shah et al. 2024, abstract and section 1) measures FlashAttention-2
# at 35% of the peak and itself 1.5-2.0x faster: the lower end, 1.5 x 35% = 52.5%. (A causal
# kernel skips the masked half of the blocks, which this leaves out: the attention matmuls are
# priced on all the flops the step counts.)
# DP overlap: PyTorch DDP (Li et al., VLDB 2020, section 3.2.3) all-reduces gradient buckets
# while the backward still runs, as does Megatron-LM's --overlap-grad-reduce (Megatron Core's
# DistributedDataParallel); the backward of the last micro-batch hides the reduction up to its
# own length (1.0). Megatron-LM 2021 (the 175B measurement of Narayanan et al. 2021) did not: its
# train_step all-reduced the gradients after the pipeline's last backward (megatron/training.py,
# ``allreduce_gradients`` after ``forward_backward_func``), which docs/scale.md discusses.
# P2P overlap: none. Megatron-LM's 1F1B schedule waits for every send and receive before the next
# micro-batch (megatron/p2p_communication.py ``_communicate``: ``req.wait()`` on each isend/irecv,
# then a device synchronize), so every micro-batch's sends are on the critical path; the
# scatter/gather of the sends over the tensor-parallel ranks (Narayanan et al. 2021, section 4.1)
# is priced (a send carries 1/tp of the activation).
# GEMM operand layouts: cuBLAS takes a transposed operand as a flag (cublasGemmEx transa /
# transb), and Megatron-LM computes a weight gradient over a batch of sequences as one GEMM over
# s x b rows (tensor_parallel/layers.py: ``grad_output.view(s * b, h).t().matmul(total_input)``),
# so neither the transpose nor the sum over the batch is a kernel of its own.
# GEMM wave quantization: a GEMM computes its output in tiles, one thread block each; "an NVIDIA
# A100 GPU has 108 SMs; in the particular case of 256x128 thread block tiles, it can execute one
# thread block per SM, leading to a wave size of 108 tiles that can execute simultaneously", and
# "GPU utilization will be highest when the number of tiles is an integer multiple of 108 or just
# below" (NVIDIA, Matrix Multiplication Background User's Guide, "Wave Quantization"). The presets
# price a GEMM at ``SUSTAINED_GEMM`` (the lower end of what large GEMMs, of many whole waves,
# reach) times ``wave_efficiency`` of its 256 x 128 tiles over one wave of tiles per SM: 108 SMs
# on an A100, 132 on an H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet and architecture
# whitepaper). cuBLAS picks its tile per shape and may pick a smaller one for a GEMM a 256 x 128
# tile quantizes badly: this prices the guide's example tile, not cuBLAS's choice.
GEMM_WAVES = {"a100-sxm": 108, "h100-sxm": 132}
# Kernel launches: the host launches each kernel asynchronously, "usually, the launch time on the
# CPU side is between 5-20 microseconds" (PyTorch operators; Meta's Holistic Trace Analysis,
# docs/source/features/cuda_kernel_launch_stats.rst). The presets take the lower end, 5 us. The
# GPU waits only when its kernels run shorter than their launches: the host runs ahead of long
# kernels, and Megatron-LM's 1F1B synchronizes the host at each micro-batch's send and receive
# (p2p_communication.py: ``torch.cuda.synchronize()``), so one micro-batch's forward or backward
# on a stage takes at least its kernels' launches (``launch_gap``). The per-kernel gap between
# kernels the host has already queued (about a microsecond) is left out: no measurement of it was
# found to cite.
LAUNCH_S = 5e-6
# Overlap slowdown: a collective run beside compute takes SMs (NCCL's channels are thread blocks)
# and memory bandwidth from it: "overlapping computation and communication can result in an
# average computational slowdown of 18.9%, with a maximum of 40.0% slowdown", against the same
# compute with no communication beside it, over GPT and LLaMA training on 4 A100s, H100s, MI250s
# and MI210s (Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated
# Distributed Deep Learning: Performance and Power Implications", arXiv 2507.03114, 2025,
# abstract). The presets take the average, the one figure the source gives for its
# configurations as a whole (its 40% is the worst of them); the compute a collective hides behind
# is slowed by it for as long as the collective runs (``hidden_collective_s``). Only NCCL
# collectives: the host copies of offloading run on the copy engines, not on SMs (no figure for
# their effect on compute was found).
OVERLAP_SLOWDOWN = 0.189
# Dropout inside the fused attention kernel: the kernel draws a random number for every
# probability (FlashAttention: Philox in registers; no mask is written) and masks and rescales
# it, so the kernel runs longer than without dropout. The one published measurement on the A100
# is FlashAttention's own (Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention
# with IO-Awareness", NeurIPS 2022, appendix E.6): the attention call alone, fp16, 8 heads of
# dimension 64, batch 16, dropout 0.1, on an A100 40GB, the mean of 100 runs, in milliseconds;
# table 15 (forward, with dropout), table 18 (forward, neither dropout nor masking), table 16 and
# table 19 (the same for the backward), FlashAttention's row at each sequence length. At 2,048
# (GPT-3's) the forward is 2.81 / 2.40 = 1.171x and the backward 6.50 / 5.45 = 1.193x as long.
# That is FlashAttention (1), not the FlashAttention-2 whose rate ``attention_efficiency`` prices:
# no measurement of FlashAttention-2 with dropout against without on an A100 was found, and the
# ratio is applied to the FlashAttention-2 rate as measured for the first kernel (the draws cost
# per probability, the matmuls per probability and head dimension: at GPT-3's head dimension of
# 128 the draws' share of the kernel may be smaller, at FlashAttention-2's faster matmuls larger).
# The H100 preset prices no dropout cost: FlashAttention-3, whose rate it uses, has no dropout,
# and no H100 measurement was found (docs/scale.md).
FLASH_DROPOUT_MS = {  # sequence length: (forward with, forward without, backward with, backward without)
    128: (0.10, 0.08, 0.15, 0.11),
    256: (0.10, 0.09, 0.18, 0.16),
    512: (0.22, 0.18, 0.58, 0.52),
    1024: (0.83, 0.68, 1.86, 1.62),
    2048: (2.81, 2.40, 6.50, 5.45),
    4096: (10.38, 8.42, 26.21, 21.57),
    8192: (41.63, 33.54, 104.27, 84.75),
    16384: (167.01, 134.03, 416.10, 336.00),
    32768: (668.74, 535.95, 1661.92, 1338.56),
    65536: (2678.11, 2147.05, 6643.01, 5343.19),
}
FLASH_DROPOUT = tuple((n, fw / f0, bw / b0) for n, (fw, f0, bw, b0) in FLASH_DROPOUT_MS.items())
# Tensor-parallel collectives are exposed (the per-op model adds them to the compute): Megatron-LM
# all-reduces a layer's partial sums synchronously on the compute stream (megatron/mpu/mappings.py
# ``_reduce``: ``torch.distributed.all_reduce``), before the next layer can start.
_GPU_SOURCES = (
    "node_size: NVIDIA DGX A100 / DGX H100 datasheets (8 GPUs per node on NVSwitch)",
    "fused_attention: FlashAttention (Dao et al., NeurIPS 2022)",
    "dp_overlap: PyTorch DDP bucketed all-reduce during the backward (Li et al., VLDB 2020)",
    "p2p_overlap: none; Megatron-LM 1F1B waits for each send and receive (megatron/p2p_communication.py)",
    "gemm_absorbs_layouts: cuBLAS transa/transb; Megatron-LM tensor_parallel/layers.py weight gradient as one GEMM",
    "gemm_wave: NVIDIA Matrix Multiplication Background User's Guide, wave quantization (256x128 tiles, one per SM)",
    "launch_s: 5-20 us a kernel launch on the CPU side (Meta Holistic Trace Analysis docs), the lower end",
    "overlap_slowdown: compute 18.9% slower beside overlapped communication, on average (Lee et al. 2025)",
)
_A100_DROPOUT = (
    "attention_dropout: FlashAttention with dropout 0.1 against without on A100 (Dao et al. 2022, tables 15-19)"
)
CLUSTER_FIGURES: dict[str, ClusterFigures] = {
    "a100-sxm": ClusterFigures(
        node_size=8,
        fused_attention=True,
        dp_overlap=1.0,
        p2p_overlap=False,
        sources=(
            *_GPU_SOURCES,
            "attention_efficiency: FlashAttention-2 on A100, 50-73% of peak (Dao 2023)",
            _A100_DROPOUT,
        ),
        attention_efficiency=0.50,
        gemm_absorbs_layouts=True,
        gemm_wave=GEMM_WAVES["a100-sxm"],
        launch_s=LAUNCH_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
        attention_dropout=FLASH_DROPOUT,
    ),
    "h100-sxm": ClusterFigures(
        node_size=8,
        fused_attention=True,
        dp_overlap=1.0,
        p2p_overlap=False,
        sources=(
            *_GPU_SOURCES,
            "attention_efficiency: FlashAttention-3 on H100, 1.5x FlashAttention-2's 35% (Shah 2024)",
        ),
        attention_efficiency=0.525,
        gemm_absorbs_layouts=True,
        gemm_wave=GEMM_WAVES["h100-sxm"],
        launch_s=LAUNCH_S,
        overlap_slowdown=OVERLAP_SLOWDOWN,
    ),
}


def cluster_figures(profile: MachineProfile) -> ClusterFigures:
    """The cluster figures of a preset GPU profile, by name; ``NO_CLUSTER`` for any other profile
    (this machine's threads, a profile file: nothing overlaps, nothing is fused, no node limit)."""
    return CLUSTER_FIGURES.get(profile.name, NO_CLUSTER)


# --- the host memory tier (offload: passes/scale.py) ----------------------------------------------


@dataclass(frozen=True)
class HostTier:
    """Host memory beside one GPU, as the scale search's optimizer-state offload prices it
    (passes/scale.py ``offload_costs``; docs/remat.md "Offload"). Each figure's source is in
    ``sources``."""

    link: Link  # host <-> device, one direction, per GPU (PCIe)
    memory_bytes: float  # host DRAM per GPU: the node's DRAM over its 8 GPUs
    memory_bandwidth: float  # host DRAM bandwidth per GPU: what bounds the CPU Adam update
    sources: tuple[str, ...] = ()


# PCIe: the A100 datasheet lists "PCIe Gen4: 64 GB/s" and the H100 SXM datasheet "PCIe Gen5:
# 128 GB/s", both directions together: 32 and 64 GB/s each way (x16; measured host-to-device
# copies reach about 25 GB/s on Gen4, which the nominal figure leaves out, as the presets' other
# links are line rates). Latency: 10 us a transfer, an assumed figure (a cudaMemcpyAsync call and
# its DMA set-up are a few microseconds), negligible against offload's gigabyte transfers. Host DRAM: a
# DGX A100 640GB and a DGX H100 each hold 2 TB for 8 GPUs (DGX A100 / DGX H100 datasheets). Host
# bandwidth: a DGX A100 has 2 AMD EPYC 7742 (8 channels of DDR4-3200 each, 204.8 GB/s a socket:
# AMD's specification), a DGX H100 2 Intel Xeon Platinum 8480C (8 channels of DDR5-4800, 307.2
# GB/s a socket: Intel's specification); over 8 GPUs that is 51.2 and 76.8 GB/s per GPU.
HOST_TRANSFER_S = 10e-6
_HOST_SOURCES = {
    "a100-sxm": (
        "link: NVIDIA A100 datasheet, PCIe Gen4 64 GB/s (both directions) = 32 GB/s each way; latency assumed 10 us",
        "memory: NVIDIA DGX A100 640GB datasheet, 2 TB system memory for 8 GPUs",
        "bandwidth: 2x AMD EPYC 7742, 8 channels DDR4-3200 = 204.8 GB/s per socket (AMD), over 8 GPUs",
    ),
    "h100-sxm": (
        "link: NVIDIA H100 SXM datasheet, PCIe Gen5 128 GB/s (both directions) = 64 GB/s each way; latency assumed 10 us",
        "memory: NVIDIA DGX H100 datasheet, 2 TB system memory for 8 GPUs",
        "bandwidth: 2x Intel Xeon Platinum 8480C, 8 channels DDR5-4800 = 307.2 GB/s per socket (Intel), over 8 GPUs",
    ),
}
HOST_TIERS: dict[str, HostTier] = {
    "a100-sxm": HostTier(Link(HOST_TRANSFER_S, 32e9), 2e12 / 8, 2 * 204.8e9 / 8, _HOST_SOURCES["a100-sxm"]),
    "h100-sxm": HostTier(Link(HOST_TRANSFER_S, 64e9), 2e12 / 8, 2 * 307.2e9 / 8, _HOST_SOURCES["h100-sxm"]),
}


def host_tier(profile: MachineProfile) -> HostTier | None:
    """The host tier of a preset GPU profile, by name; None for any other (this machine's threads
    share one memory, a profile file says nothing of a host): such a profile never offloads."""
    return HOST_TIERS.get(profile.name)


def read_profile(path: str) -> MachineProfile:
    """The profile in the JSON file ``path``; MeshError naming the file and the bad or missing key."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:  # missing, a folder, not UTF-8 text
        raise MeshError(f"cannot read profile file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshError(f"{path}:{exc.lineno}:{exc.colno}: not a machine profile (bad JSON: {exc.msg})") from None
    try:
        return MachineProfile.from_json(doc, strict=True)
    except MeshError as exc:
        raise MeshError(f"profile file {path}: {exc}") from None


def get_profile(profile: str | os.PathLike | MachineProfile) -> MachineProfile:
    """A preset by name, a profile file by path (a name ending in .json or naming a file), or a
    MachineProfile as it is."""
    if isinstance(profile, MachineProfile):
        return profile
    if isinstance(profile, os.PathLike):
        return read_profile(os.fspath(profile))
    if not isinstance(profile, str):
        raise MeshError(f"a profile is a preset name, a JSON file or a MachineProfile, got {type(profile).__name__}")
    if profile in PRESETS:
        return PRESETS[profile]()
    if profile.endswith(".json") or os.sep in profile or os.path.exists(profile):
        return read_profile(profile)
    raise MeshError(f"unknown profile {profile!r}: expected one of {', '.join(PRESETS)}, or a JSON profile file")
