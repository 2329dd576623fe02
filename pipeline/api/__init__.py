"""tfship's Python API, re-exported by `tfship` itself (`tfship.ship`, `tfship.serve`, `tfship.Client`, ...).

Importing it imports no TensorFlow: `ship` and the stages load it when they run, and `serve` and `Client`
never do, so they work in the TensorFlow-free base install.
"""
