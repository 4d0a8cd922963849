"""Writes trace.csv, the example arrival trace: 400 chat requests arriving as a Poisson
stream at 3 requests/s, prompts lognormal around 1,500 tokens and outputs around 250
(sigma 0.8 and 0.6, the shape of ShareGPT-like chat), seed 7.

    python examples/serving/make_trace.py [OUT.csv]
"""

import sys
from pathlib import Path

import numpy as np

rng = np.random.default_rng(7)
n, rate = 400, 3.0
arrival = np.cumsum(rng.exponential(1.0 / rate, n))
inputs = np.clip(np.rint(rng.lognormal(np.log(1500) - 0.8**2 / 2, 0.8, n)), 16, 30000).astype(int)
outputs = np.clip(np.rint(rng.lognormal(np.log(250) - 0.6**2 / 2, 0.6, n)), 1, 4000).astype(int)
lines = ["request_id,arrival_s,input_len,output_len"]
rows = zip(arrival, inputs, outputs, strict=True)
lines += [f"r{i:04d},{t:.3f},{a},{b}" for i, (t, a, b) in enumerate(rows)]
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "trace.csv"
out.write_text("\n".join(lines) + "\n")
