"""A TensorFlow Serving-compatible model server: transport -> data plane -> model manager -> runtimes."""
