"""Training: model factories, optimizers, the compiled GradientTape step, the train loop, tf.distribute, TensorBoard."""
