"""The data plane every transport calls: request types, validation against the signature contract,
dynamic batching, the model manager (versions, hot reload) and per-request memory bounds.
"""
