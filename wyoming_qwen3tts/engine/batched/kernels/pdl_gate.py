"""The programmatic-dependent-launch gate every kernel of this package starts with.

With PDL (``kernels.pdl``), a kernel may be running while the kernel before it in its stream
is still writing its inputs, so before touching memory it waits for that kernel
(``griddepcontrol.wait``: the earlier kernel has finished and its writes are visible), then
lets the kernel after it be scheduled (``griddepcontrol.launch_dependents``). Waiting first
keeps at most one grid waiting behind a running one. Without PDL (``PDL`` false: CPU,
interpreter, pre-Hopper GPUs, and by default every graph but the batch-1 ones; see
``kernels.pdl``) the gate compiles to nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def gate(PDL: tl.constexpr):
    """Wait for the previous kernel in the stream, then release the next (PDL only)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
