"""Export-only mode: a user's own model (`--model`) and data set (`--data`) instead of the built-in trainer."""
