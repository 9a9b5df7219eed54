"""Which path k_conv takes for a convolution: one function that the kernel (pasted into generated
modules as a helper), the memory plan (its scratch bytes) and the cost model (its kernel kind)
all call, so their thresholds cannot drift apart.

The paths, in the order they are tried:

* ``native depthwise``: 2-D, one input channel per group and one output per group, float32, the C
  library loaded (native_kernels.c: one padded plane at a time);
* ``native gemm``: 2-D, one group, float32, the library loaded (native_gemm.c: the im2col'd input
  packed block by block straight into the micro-kernel's panels, weights packed once);
* ``1x1 matmul``: a 1x1 kernel without padding, one matmul over the (strided) input;
* ``depthwise taps``: numpy depthwise, one scaled window accumulated per kernel tap;
* ``im2col blocks``: 2-D, one group, where the whole im2col of one image would pass 2 MiB or the
  target has little memory: the columns of a block of output rows (~1 MiB) copied, one matmul each;
* ``im2col``: the windows copied once, one batched matmul (targets with large scratch);
* ``per-tap gemm``: low memory, one matmul per kernel tap accumulated.
"""

from __future__ import annotations

#: The native GEMM's K and N blocking (native_gemm.c: KC, NC); NR, the panel width, is per ISA.
GEMM_KC, GEMM_NC = 256, 2048


def conv_path(rank, c, m, group, one_by_one, padded, native, large_scratch, cols_bytes):
    """The path of a convolution of ``rank`` spatial dims, ``c`` input and ``m`` output channels in
    ``group`` groups; ``one_by_one``: every kernel dim is 1; ``padded``: any pad is non-zero;
    ``native``: float32 and the C library loaded where the module runs; ``large_scratch``: the
    target's TARGET_LARGE_SCRATCH; ``cols_bytes``: one image's whole im2col (C x taps x outputs x
    item size)."""
    depthwise = group == c and m == group
    if native and rank == 2 and depthwise:
        return "native depthwise"
    if native and rank == 2 and group == 1:
        return "native gemm"
    if one_by_one and not padded:
        return "1x1 matmul"
    if depthwise:
        return "depthwise taps"
    if group == 1 and rank == 2:
        return "im2col blocks" if not large_scratch or cols_bytes > 1 << 21 else "im2col"
    return "im2col" if large_scratch else "per-tap gemm"


def im2col_block_rows(out_rows, cols_per_row_bytes):
    """Output rows per block of the ``im2col blocks`` path: the block's columns near 1 MiB."""
    return max(1, min(out_rows, (1 << 20) // cols_per_row_bytes))


def gemm_scratch_bytes(c, spatial, kernel, strides, pads, dilations, out, nr):
    """Bytes the native GEMM allocates per call (native_gemm.c, cuvil_conv_gemm_f32): one packed B
    block (min(K, KC) rows of at most NC output columns, in panels of ``nr``), each column's window
    offset (int32), and the zero-bordered image when anything is padded (as far as windows reach)."""
    k, cols = c * kernel[0] * kernel[1], out[0] * out[1]
    block = -(-min(k, GEMM_KC) * -(-min(cols, GEMM_NC) // nr) * nr * 4 // 64) * 64
    reach = [
        max(pads[i] + spatial[i], (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1) for i in range(2)
    ]
    image = c * reach[0] * reach[1] * 4 if tuple(reach) != tuple(spatial) else 0
    return block + 4 * cols + image


def packed_weights_bytes(m, k, mr):
    """Bytes of a weight matrix (m x k) packed into MR-row panels, kept for the weights' lifetime."""
    return -(-m // mr) * mr * k * 4
