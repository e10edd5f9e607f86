"""4-bit float weights (quant/fp4/weights.py, kernels/cpu_fp4.c): MXFP4 against transformers' own
dequantization of gpt-oss's blocks, NVFP4 against ModelOpt's definition written out here, the GEMV against
its int8-activation arithmetic in float64, on shapes with partial chunks (K % 512 != 0), K not a multiple of
32, and N not a multiple of the kernels' row tiles."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from glassbox.kernels import native
from glassbox.kernels.native import library
from glassbox.quant.formats import FORMATS
from glassbox.quant.fp4 import linear as fp4_linear
from glassbox.quant.fp4 import weights as fp4_quant
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.quantize import e2m1_codes, quantize, quantize_mxfp4, quantize_nvfp4
from glassbox.quant.fp4.weights import FP4Weights, from_mxfp4, from_nvfp4, mxfp4_experts

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
# (N, K): N off the 4-row tile; K: under one 512-value chunk, whole chunks, chunks + a partial one, and
# (NVFP4) K % 32 == 16
SHAPES = [(7, 64), (33, 96), (40, 1056), (5, 576)]
NV_SHAPES = [*SHAPES, (9, 48)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _nvfp4_tensors(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ModelOpt tensors: any byte of codes; E4M3 scales over the whole range (subnormals, negative
    ones, zero; no NaN); a per-tensor scale."""
    g = _gen(seed)
    weight = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    s = torch.randint(0, 256, (n, k // 16), generator=g, dtype=torch.uint8)
    s = torch.where((s & 0x7F) == 0x7F, s ^ 1, s)  # 0x7f / 0xff are E4M3's NaN
    return weight, s.view(torch.float8_e4m3fn), torch.tensor(0.0123, dtype=torch.float32)


def nvfp4_dequantize(weight: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """ModelOpt's NVFP4 definition: code 2i of a row in the low nibble of byte i, value E2M1[code], times
    (float(scale) * scale_2) per 16 values, that product rounded to float32 first."""
    lut = torch.tensor(E2M1)
    codes = torch.stack([weight & 15, weight >> 4], dim=-1).reshape(weight.shape[0], -1).long()
    per_block = scale.float() * scale_2.float()
    return (lut[codes].view(weight.shape[0], -1, 16) * per_block[..., None]).reshape(weight.shape[0], -1)


# ---- the formats as stored ------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_mxfp4_dequantizes_as_transformers(n: int, k: int) -> None:
    """gpt-oss's expert tensors (E, N, K/32, 16) / (E, N, K/32), as transformers' convert_moe_packed_tensors
    reads them (its result is (E, K, N)); scales from the subnormal 2^-127 up."""
    g = _gen(n * k)
    blocks = torch.randint(0, 256, (2, n, k // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 140, (2, n, k // 32), generator=g, dtype=torch.uint8)
    scales[0, 0, 0], scales[1, 0, 0], scales[1, -1, -1] = 0, 1, 254
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    for e, w in enumerate(mxfp4_experts(blocks, scales)):
        expected = ref[e].t()
        assert w.kind == "mxfp4" and (w.out_features, w.in_features) == (n, k)
        assert torch.equal(w.dequantize_reference(), expected)
        assert torch.equal(w.dequantize(torch.float32), expected)  # the kernels
        assert torch.equal(w.dequantize(torch.bfloat16), expected.bfloat16())
    bad = scales.clone()
    bad[0, 1, 0] = 255
    with pytest.raises(ValueError, match="E8M0's NaN"):
        from_mxfp4(blocks[0], bad[0])


@pytest.mark.parametrize(("n", "k"), NV_SHAPES)
def test_nvfp4_dequantizes_as_modelopt_defines(n: int, k: int) -> None:
    weight, scale, scale_2 = _nvfp4_tensors(n, k, seed=n + k)
    expected = nvfp4_dequantize(weight, scale, scale_2)
    w = from_nvfp4(weight, scale, scale_2)
    assert (w.out_features, w.in_features, w.kind) == (n, k, "nvfp4")
    assert torch.equal(w.dequantize_reference(), expected)
    assert torch.equal(w.dequantize(torch.float32), expected)
    assert torch.equal(w.dequantize(torch.bfloat16), expected.bfloat16())
    with pytest.raises(ValueError, match="expected"):
        from_nvfp4(weight, scale[:, 1:], scale_2)


def test_repack_makes_the_layouts_bytes() -> None:
    """The checkpoint bytes repacked directly equal the layout's definition on their codes, and read back."""
    for n, k in [(3, 32), (5, 48), (4, 1056), (2, 544)]:
        packed = torch.randint(0, 256, (n, k // 2), generator=_gen(k), dtype=torch.uint8)
        codes = fp4_quant.unpack_nibbles(packed)
        codes = torch.nn.functional.pad(codes, (0, -k % 32))
        assert torch.equal(fp4_quant.repack(packed), fp4_quant.interleave(codes))
        assert torch.equal(fp4_quant.deinterleave(fp4_quant.repack(packed)), codes)


def test_bits_per_weight_are_the_planners() -> None:
    """What the weights hold in memory, against perf/quant.py's formats (NVFP4's per-tensor scale is
    kept per row: 32 bits a row)."""
    n, k = 64, 2048
    mx = quantize(torch.randn(n, k), "mxfp4")
    nv = quantize(torch.randn(n, k), "nvfp4")
    assert 8 * mx.nbytes / (n * k) == FORMATS["mxfp4"].bits_per_weight == 4.25
    assert 8 * nv.nbytes / (n * k) == FORMATS["nvfp4"].bits_per_weight + 32 / k


def test_quantizers() -> None:
    """Ties round to the even code; weights on the grid survive exactly; others move by at most half a
    grid step (their scale times 1, the step between 4 and 6 being the widest)."""
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.3, -5.5])
    assert [E2M1[c] for c in e2m1_codes(x).tolist()] == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, -6.0]
    g = _gen(0)
    codes = torch.randint(0, 16, (6, 3, 32), generator=g)
    codes[..., 0] = 7  # each block's largest value is 6: its scale is exactly 2^e
    exponents = torch.randint(-8, 3, (6, 3, 1), generator=g)
    w = (torch.tensor(E2M1)[codes] * torch.ldexp(torch.ones(6, 3, 1), exponents)).view(6, 96)
    assert torch.equal(from_mxfp4(*quantize_mxfp4(w)).dequantize(), w)
    for kind in ("mxfp4", "nvfp4"):
        w = torch.randn(9, 80, generator=g)
        q = quantize(w, kind)
        per_value = q.group_scales().repeat_interleave(fp4_quant.GROUP[kind], dim=1)[:, :80]
        assert bool(((q.dequantize() - w).abs() <= per_value).all())
    weight, s, s2 = quantize_nvfp4(w)
    assert weight.dtype == torch.uint8 and s.dtype == torch.float8_e4m3fn and s2.shape == ()
    assert torch.equal(
        from_nvfp4(weight, s, s2, in_features=80).dequantize(), nvfp4_dequantize(weight, s, s2)[:, :80]
    )


# ---- the kernels ------------------------------------------------------------------------------------


def _int8_reference(x: torch.Tensor, w: FP4Weights) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's arithmetic: x in int8 blocks of 32 (d = max|x| / 127 in float32, codes rounded half away
    from zero) times the exact weight, in float64; and the sum of the terms' magnitudes (float32's rounding
    scales with it)."""
    kp = w.padded
    xb = torch.nn.functional.pad(x.float(), (0, kp - x.shape[1])).view(x.shape[0], -1, 32)
    dx = xb.abs().amax(-1, keepdim=True) / 127.0
    scaled = xb * torch.where(dx > 0, 1.0 / dx, 0.0)
    codes = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    xq = (codes.double() * dx.double()).view(x.shape[0], -1)[:, : x.shape[1]]
    wd = w.dequantize_reference().double()
    return xq @ wd.t(), xq.abs() @ wd.abs().t()


def fp4_gemv(w: FP4Weights, x: torch.Tensor, generic: bool, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """gb_fp4_quantize_rows + gb_fp4_gemv (the vector path or its plain-C twin), float32 out."""
    lib = lib or library()
    assert lib is not None
    m, kp = x.shape[0], w.padded
    qx = torch.empty(m, kp, dtype=torch.int8)
    dx = torch.empty(m, kp // 32)
    cs = torch.empty(m, kp // 16, dtype=torch.int32)
    dt = int(x.dtype == torch.bfloat16)
    lib.gb_fp4_quantize_rows(
        x.data_ptr(), m, w.in_features, kp, qx.data_ptr(), dx.data_ptr(), cs.data_ptr(), w.kind_code, dt, 2
    )
    out = torch.empty(m, w.out_features)
    lib.gb_fp4_gemv(
        *w.pointers(), None, w.out_features, kp, qx.data_ptr(), dx.data_ptr(), cs.data_ptr(), m,
        out.data_ptr(), w.out_features, 0, 2, int(generic),
    )  # fmt: skip
    return out


@needs_kernels
@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize(("n", "k"), [*SHAPES, (6, 40)])
def test_gemv_matches_its_arithmetic(kind: str, n: int, k: int) -> None:
    w = quantize(torch.randn(n, k, generator=_gen(k)) * 0.05, kind)
    for m in (1, 3, 16, 70):  # 70: past the 64 activation rows of one pass
        x = torch.randn(m, k, generator=_gen(n * k + m)).bfloat16()
        ref, terms = _int8_reference(x.float(), w)
        for xin in (x, x.float()):  # bf16 and float32 activations
            for generic in (False, True):
                err = (fp4_gemv(w, xin.contiguous(), generic).double() - ref).abs()
                assert bool((err <= 1e-6 * terms + 1e-9).all()), (m, generic, float((err / terms).max()))


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_linear_forward(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode rows (bf16) run the kernel, other rows and float32 the dequantized weight; bias added; and
    without the C kernels the PyTorch reference gives the same float32 result."""
    n, k = 24, 1056
    w = quantize(torch.randn(n, k, generator=_gen(1)) * 0.05, kind)
    bias = torch.randn(n, generator=_gen(2))
    lin = FP4Linear(w, bias)
    exact_w = w.dequantize_reference()
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (1, 5, 40):
            x = torch.randn(rows, k, generator=_gen(rows)).to(dtype)
            exact = x.float() @ exact_w.t() + bias
            y = lin(x)
            assert y.dtype == dtype and y.shape == (rows, n)
            tol = 1e-5 if dtype == torch.float32 else 0.03
            assert ((y.float() - exact).norm() / exact.norm()).item() < tol
    x = torch.randn(3, k, generator=_gen(3))
    with_kernels = lin(x)
    monkeypatch.setattr(fp4_linear, "native_library", lambda: None)
    monkeypatch.setattr(fp4_quant, "native_library", lambda: None)
    assert torch.equal(lin(x), with_kernels)
    assert lin(x.bfloat16()).dtype == torch.bfloat16


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """cpu_fp4.c and cpu_fp4_dequant.c built for the compiler's default target (no -march=native: on
    x86-64 no AVX-512), as on a machine without it."""
    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("portable") / "fp4.so"
    sources = [str(Path(native.__file__).with_name(n)) for n in ("cpu_fp4.c", "cpu_fp4_dequant.c")]
    subprocess.run([cc, "-O2", "-fopenmp", "-shared", "-fPIC", *sources, "-o", str(out), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    for name in ("gb_fp4_quantize_rows", "gb_fp4_gemv", "gb_fp4_dequant"):
        getattr(lib, name).argtypes = native._SIGNATURES[name]
    return lib


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_portable_build_matches_the_references(portable: ctypes.CDLL, kind: str) -> None:
    n, k = 21, 1056
    w = quantize(torch.randn(n, k, generator=_gen(5)) * 0.05, kind)
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.empty(n, k, dtype=dtype)
        codes, scales, g, code = w.pointers()
        portable.gb_fp4_dequant(
            codes, scales, g, code, n, w.padded, k, out.data_ptr(), int(dtype == torch.bfloat16), 1
        )
        assert torch.equal(out, w.dequantize_reference(dtype))
    x = torch.randn(3, k, generator=_gen(6)).bfloat16()
    ref, terms = _int8_reference(x.float(), w)
    err = (fp4_gemv(w, x, False, portable).double() - ref).abs()
    assert bool((err <= 1e-6 * terms + 1e-9).all())
