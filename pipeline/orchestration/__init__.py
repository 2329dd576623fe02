"""Orchestration: the stage chain, resume, the run folder, publishing and the reports."""
