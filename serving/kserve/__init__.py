"""The Open Inference Protocol (KServe V2 / Triton): gRPC `GRPCInferenceService` and REST under `/v2`."""
