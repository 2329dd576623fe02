"""TF Serving's own API: PredictionService/ModelService over gRPC, the REST API, its protobuf and JSON
codecs, its command line and model config, warm-up files and a TensorFlow-free client.
"""
