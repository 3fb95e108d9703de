"""Triton Inference Server backend: gRPC streaming in the vLLM-backend tensor contract."""
