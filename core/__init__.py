"""tfship's bottom floor: the error root and its status table, dtype helpers and the signature contract.

Nothing here imports TensorFlow, grpc or any tfship package above it (see docs/architecture.md).
"""
