"""Serving signatures: forward-only `tf.Module` export, SignatureDef contract read-back and audits."""
