"""tfship pipeline: typed stages that take a model from data to a published, proven version.

Importing this package imports no TensorFlow; each stage module imports it when it runs.
"""
