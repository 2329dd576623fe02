"""TF.js graph-model artifact: conversion in its own venv (`tfjs.venv`, `tfjs.convert`) and a Node.js runner
(`tfjs.node_runner`) so the parity gate runs it like every other artifact.
"""
