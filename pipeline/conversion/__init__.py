"""Conversion: the SavedModel into every enabled artifact format (`registry`: ONNX, TFLite, TF.js), each in a child
process, each checked.
"""
