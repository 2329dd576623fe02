"""Placeholder for `tensorflow_decision_forests`, on the path of `.venv-tfjs` only.

`tensorflowjs.converters.tf_saved_model_conversion_v2` (4.22.0) runs `import tensorflow_decision_forests`
at import time and never uses the module: the import exists to register the TF-DF custom ops
(`SimpleMLCreateModelResource`, ...) so that decision-forest SavedModels load. The only TF-DF release
for Python 3.11 (1.12.0) pins tensorflow==2.19.0 and its `inference.so` fails to load under TensorFlow
2.21.0 (undefined symbol), so the real package cannot be imported next to the TensorFlow tfship uses.
tfship exports Keras models, never decision forests; a SavedModel that did contain TF-DF ops would fail
to load in the converter with TensorFlow's own "Op type not registered" error, which tfship reports as
the conversion's reason. Nothing here registers ops or fakes any result.
"""

__version__ = "0+tfship.placeholder"
