"""`make bench-train`: steps/s of the train step (eager, tf.function, XLA; float32 and mixed precision)."""
