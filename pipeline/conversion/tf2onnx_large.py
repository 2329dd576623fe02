"""`python -m tfship.pipeline.conversion.tf2onnx_large ARGS`: tf2onnx's command line for its large-model path.

tf2onnx 1.17's `--large_model` path calls `numpy.product`, which NumPy 2.0 removed (the pinned NumPy is
2.x), so that path fails with AttributeError before writing anything. This entry point, run only in the
converter's own child process, provides `numpy.product` as NumPy's documented replacement `numpy.prod`
when it is missing, then runs tf2onnx's unchanged `main()` with the same arguments. Nothing else differs.
"""

from __future__ import annotations

import numpy as np

if not hasattr(np, "product"):
    np.product = np.prod  # the name NumPy < 2 had for the same function

from tf2onnx.convert import main

if __name__ == "__main__":
    main()
