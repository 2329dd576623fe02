"""The gate: parity of every artifact against the SavedModel, behavioural checks and the serve-check."""
