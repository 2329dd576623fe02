"""ONNX artifact format: tf2onnx's SavedModel route in child processes (`onnx_format.convert`), one file per
signature (`onnx_format.signatures`), external weights past 2 GiB (`onnx_format.large_models`); `FORMATS` in
`onnx_format.formats` is what the conversion registry collects. Served by `serving.runtimes.onnx`.

Named `onnx_format`, not `onnx`, so the folder never shadows the `onnx` library when the repository root is on
`sys.path`.
"""
