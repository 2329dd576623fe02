"""tfship: train, export, convert, prove and serve TensorFlow models.

Everything tfship installs is importable under this one name; the repository's top-level folders are its
subpackages (`tfship.core`, `tfship.serving`, `tfship.pipeline`, `tfship.signatures`, `tfship.tflite`,
`tfship.tfjs`, `tfship.deploy`), linked here so the source tree and the installed package have one layout.
"""
