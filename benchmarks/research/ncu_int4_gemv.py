"""What holds the 4-bit gate/up GEMV back (Nsight Compute on the H200: 24% occupancy, DRAM 27%: latency)?

A few launches of the gate/up int4 GEMV (17920 x 1536, SiLU(gate) * up output) for Nsight Compute to read.
A development tool, CUDA only:
  ncu --clock-control none -k regex:_int4_gemv_kernel --launch-skip 2 --launch-count 1 \\
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
      --section LaunchStats --section InstructionStats python -m benchmarks.research.ncu_int4_gemv
(--launch-skip 5 profiles the second config.)
"""

import torch

from model_loader import awq as fmt
from model_loader.kernels import int4_triton

CONFIGS = [(32, 4, 4, 3), (64, 4, 4, 3)]


def main() -> None:
    dev = torch.device("cuda")
    n, k, group = 17920, 1536, 128
    w = fmt.pair_gate_up(
        fmt.to_row_packed(
            torch.randint(0, 16, (k, n), device=dev),
            torch.randint(0, 16, (k // group, n), device=dev),
            (torch.rand(k // group, n, device=dev) * 0.02).half(),
            group,
        )
    )
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    for config in CONFIGS:
        for _ in range(3):
            int4_triton.int4_gemv(x, w, config, silu_output=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
