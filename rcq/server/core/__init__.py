"""The replicated core: commands (what goes through the log) and the QueueStateMachine.

Pure: imports only itself, rcq.errors and standard modules without I/O, clock, randomness or
concurrency, so every replica applying the same log ends in the same state.
"""
