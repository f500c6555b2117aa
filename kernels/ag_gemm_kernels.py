"""The AllGather-GEMM's ``@triton.jit`` code: the wait on the peers' flags and the two
consumers (see :mod:`kernels.ag_gemm`).

Only Triton code lives here: its launcher is :mod:`kernels.ag_gemm_launch`. The kernels
keep their names and stay together in one module: their source hash
(:func:`registry.kernel_source_hash`, in every fingerprint) covers each name and the
helpers found among this module's globals, so a rename would retune every stored shape.
"""

# Triton kernels take untyped pointers and scalars, typed by Triton per launch.

from __future__ import annotations

import triton
import triton.language as tl

# Integers that change from call to call: specialised (divisible by 16, == 1) they would
# make a new kernel for most batch sizes, so no serving call could be warm.
M_DERIVED = ["M", "m_per_rank", "rank"]


@triton.jit  # type: ignore[untyped-decorator]
def _wait_for_rows(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD: tl.constexpr):
    """Spin until every shard holding rows [row_lo, row_hi] has landed (own rows excepted);
    a peer's copy engine raises the flag, hence the system scope."""
    first, last = row_lo // m_per_rank, row_hi // m_per_rank
    for src in tl.static_range(WORLD):
        if (src != rank) & (src >= first) & (src <= last):
            flag = tl.atomic_add(flags_ptr + src, 0, sem="acquire", scope="sys")
            while flag == 0:
                flag = tl.atomic_add(flags_ptr + src, 0, sem="acquire", scope="sys")


@triton.jit(do_not_specialize=["row_lo", "row_hi", "m_per_rank", "rank"])  # type: ignore[untyped-decorator]
def _wait_kernel(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD: tl.constexpr):
    """One program: the wait of a tile, before a library GEMM reads those rows."""
    _wait_for_rows(flags_ptr, row_lo, row_hi, m_per_rank, rank, WORLD)


@triton.jit
def _fence_async_proxy(x):
    """Order the flag's acquire before the TMA (async proxy) reads of the data it guards."""
    return tl.inline_asm_elementwise(
        "fence.proxy.async.global; mov.b32 $0, $1;",
        "=r,r",
        [x],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _tile_coords(
    tile,
    M,
    N,
    m_per_rank,
    rank,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Grouped tile order over M-tiles rotated to start at this rank's first row."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (tile // in_group) * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)
    rotated_m = first_m + (tile % in_group) % group_size
    pid_n = (tile % in_group) // group_size
    pid_m = (rotated_m + (rank * m_per_rank) // BLOCK_M) % tiles_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=M_DERIVED)  # type: ignore[untyped-decorator]
def _ag_gemm_portable_kernel(
    g_ptr,
    b_ptr,
    c_ptr,
    flags_ptr,
    M,
    N,
    K,
    m_per_rank,
    rank,
    stride_gm,
    stride_bk,
    stride_cm,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # g: [M, K] gathered A (own rows local, peers' rows as their flags rise); b: [K, N]
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, m_per_rank, rank, BLOCK_M, BLOCK_N, GROUP_M)
    row_lo = pid_m * BLOCK_M
    _wait_for_rows(flags_ptr, row_lo, min(row_lo + BLOCK_M, M) - 1, m_per_rank, rank, WORLD)
    rows = row_lo + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(
            g_ptr + rows[:, None] * stride_gm + (k0 + ks)[None, :],
            mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k0 + ks)[:, None] * stride_bk + cols[None, :],
            mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(
        c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask
    )


@triton.jit(do_not_specialize=M_DERIVED)  # type: ignore[untyped-decorator]
def _ag_gemm_tma_kernel(
    g_desc,
    b_desc,
    c_desc,
    flags_ptr,
    M,
    N,
    K,
    m_per_rank,
    rank,
    WORLD: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
):
    # Persistent: program p takes tiles p, p + NUM_SMS, ...; TMA loads, TMA store.
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_tiles, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, M, N, m_per_rank, rank, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        _wait_for_rows(flags_ptr, off_m, min(off_m + BLOCK_M, M) - 1, m_per_rank, rank, WORLD)
        _fence_async_proxy(M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = g_desc.load([off_m, kt * BLOCK_K])
            b = b_desc.load([kt * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc)
        if EPILOGUE_SUBTILE == 2:  # two half-width stores: half the shared memory
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
