"""The runtime guard: verify a model directory once per process and serve frameworks verified bytes only.

Imports nothing itself: the start-up file imports `modelsec.verifier.guard.boot`, which stays light.
"""
